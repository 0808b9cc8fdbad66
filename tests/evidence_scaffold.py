"""Writing evidence attempts into a test project, as the probe would file them, in the
unversioned format (version 1), so the tests that use it also exercise that migration."""

import json

MEASURED = {
    "kind": "measured",
    "host": "rtx5080",
    "hostname": "cachyos-9900x-o11d",
    "tool_version": "0.1.0",
    "command": ["omniprobe", "probe-serve"],
    "started_at": "2026-11-30T09:00:00Z",
}
SIMULATED = {
    "kind": "simulated",
    "tool_version": "0.1.0",
    "command": ["omniprobe", "probe-serve"],
    "started_at": "2026-11-30T09:00:00Z",
    "model": "test",
}
HOSTNAMES = {"rtx3090": "cachyos-alexander", "rtx5080": "cachyos-9900x-o11d"}

def add_attempt(repo_copy, host, attempt_id, runs=(), requests=(), provenance=None):
    """An attempt folder with attempt.json and, where given, runs.json and requests.json."""
    folder = repo_copy.evidence_dir / host / attempt_id
    folder.mkdir(parents=True)
    prov = dict(provenance or MEASURED)
    if prov["kind"] == "measured":
        prov.update(host=host, hostname=HOSTNAMES[host])
    (folder / "attempt.json").write_text(
        json.dumps(
            {
                "id": attempt_id,
                "host": host,
                "date": "2026-11-30",
                "description": "test attempt",
                "provenance": prov,
                "baseline": "2026-10-07T170729Z-q3-4r",
            }
        )
    )
    if runs:
        (folder / "runs.json").write_text(json.dumps(list(runs)))
    if requests:
        (folder / "requests.json").write_text(json.dumps(list(requests)))
    return folder


def empty_project(source, root):
    """A copy of `source`'s inputs (hosts.toml, fixtures/, models/, ...) with an empty evidence/:
    another machine's checkout, for evidence brought from elsewhere."""
    import shutil

    from omniprobe.config.project import Project

    root.mkdir(parents=True, exist_ok=True)
    for part in ("hosts.toml", "sim.toml", "fixtures", "deploy", "models", "templates", "schemas"):
        src = source.root / part
        if src.is_dir():
            shutil.copytree(src, root / part)
        elif src.exists():
            shutil.copy2(src, root / part)
    (root / "evidence").mkdir(parents=True)
    return Project(root)
