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
