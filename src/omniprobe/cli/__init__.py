"""The `omniprobe` command line; nox sessions call into it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from omniprobe.cli.options import add_options, options_from
from omniprobe.config.project import NoProject, find_project
from omniprobe.errors import EnvironmentFailure, InputError, Interrupted, OmniprobeError, Problem

Command = Callable[[argparse.Namespace], int]


def _validate(args: argparse.Namespace) -> int:
    from omniprobe.evidence.schema import stale_schemas
    from omniprobe.evidence.validate import load_project

    project = find_project()
    loaded, problems = load_project(project)
    stale = stale_schemas(project.schema_dir)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    for name in stale:
        print(f"error: schemas/{name} is stale; run `omniprobe schema`", file=sys.stderr)
    if problems or stale:
        print(f"{len(problems) + len(stale)} problem(s) found", file=sys.stderr)
        return 1
    assert loaded is not None
    print(f"valid: hosts.toml ({len(loaded.hosts.hosts)} hosts), "
          f"{len(loaded.fixtures.fixtures)} fixtures, {len(loaded.evidence.attempts)} attempts")
    return 0


def _evidence(args: argparse.Namespace) -> int:
    from omniprobe.evidence import archive

    project = find_project()
    if args.evidence_command == "unpack":
        ids = archive.unpack(args.archive, project.evidence_dir, project.artifacts_dir)
        print(f"unpacked {len(ids)} attempt(s) into {project.evidence_dir}: {', '.join(ids)}")
        return 0
    attempts = list(args.attempt) + sorted(
        p.name for host in args.host for p in (project.evidence_dir / host).glob("*")
        if (p / "attempt.json").is_file())
    if not attempts:
        print("error: name attempts with --attempt or --host", file=sys.stderr)
        return 2
    packed = archive.pack(project.evidence_dir, project.artifacts_dir, attempts, args.out,
                          artifact_max_bytes=int(args.artifact_max_mib * 2**20))
    print(f"packed {len(packed.attempts)} attempt(s), {packed.files} file(s) into {packed.path}")
    for path in packed.left_out:
        print(f"left out (over {args.artifact_max_mib:g} MiB): {path}")
    return 0


def _wheels(args: argparse.Namespace) -> int:
    from omniprobe.env.wheels import check_folder, download, read_pins

    if args.check:
        problems = check_folder(read_pins(args.list), args.dest)
        for line in problems:
            print(f"error: {line}", file=sys.stderr)
        print(f"{args.dest}: " + ("differs from the list" if problems else
                                  f"every wheel of {args.list} is there, each hash right"))
        return 1 if problems else 0
    pins = download(args.list, args.dest)
    print(f"downloaded {len(pins)} wheel(s) of {args.list} into {args.dest}, each hash checked")
    return 0


def _schema(args: argparse.Namespace) -> int:
    from omniprobe.evidence.schema import stale_schemas, write_schemas

    project = find_project()
    if args.check:
        stale = stale_schemas(project.schema_dir)
        for name in stale:
            print(f"stale: schemas/{name}", file=sys.stderr)
        return 1 if stale else 0
    for path in write_schemas(project.schema_dir):
        print(f"wrote {path.relative_to(project.root)}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from omniprobe.report.render import check_report, write_report

    project = find_project()
    if args.check:
        diff = check_report(project)
        if diff:
            sys.stderr.write(diff)
            print("REPORT.md is stale; run `nox -s report`", file=sys.stderr)
            return 1
        print("REPORT.md is fresh")
        return 0
    path = write_report(project)
    print(f"wrote {path.relative_to(project.root)}")
    return 0


def _image_check(args: argparse.Namespace) -> int:
    from omniprobe.cli.image_check import check_images, find_images, render_json, render_table
    from omniprobe.config.hosts import ImageChecks, load_hosts

    try:
        hosts_file = find_project().hosts_file
    except NoProject:
        cfg, source = ImageChecks(), "built-in defaults (no hosts.toml found)"
    else:
        cfg, source = load_hosts(hosts_file).quality, f"{hosts_file} [quality]"
    paths, problems = find_images(args.paths)
    checked, unreadable = check_images(paths, cfg)
    problems += unreadable
    if args.json:
        sys.stdout.write(render_json(checked, problems, cfg, source))
    else:
        if checked:
            print(render_table(checked))
        print(f"thresholds: {source}")
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        return 2
    return 1 if any(c.metrics.verdict == "broken" for c in checked) else 0


def _standins(args: argparse.Namespace) -> int:
    from omniprobe.cli.standins import draw, render, standin_problems
    from omniprobe.config.fixtures import load_fixtures

    project = find_project()
    drawn = draw(project.fixtures_file.parent, write=not args.check)
    print(render(drawn))
    found = standin_problems(load_fixtures(project.fixtures_file), drawn)
    for line in found:
        print(f"error: {line}", file=sys.stderr)
    return 1 if found else 0


def _quality(args: argparse.Namespace) -> int:
    from omniprobe.analysis.baseline_compare import run_quality
    from omniprobe.cli.tables import psnr_summary

    project = find_project()
    result = run_quality(project, args.baseline, attempt_id=args.attempt, layout=args.layout,
                         comparator=args.comparator, baseline_attempt=args.baseline_attempt)
    print(psnr_summary(result))
    for path in result.written:
        print(f"wrote {path}")
    return 0

def _env_command(args: argparse.Namespace) -> list[str]:
    return ["omniprobe", "env", args.env_command, "--host", args.host,
            *(["--env", args.env] if args.env != "probe" else []),
            *(["--venv", args.venv] if args.venv else [])]


def _sim_env(args: argparse.Namespace, project) -> tuple[int, list[str], str | None]:
    """`env build|check` of a simulated host: no build, the checks of what its server runs on;
    (exit status, failed checks, no venv)."""
    from omniprobe.config.hosts import load_hosts
    from omniprobe.env.simulated import check_sim_env, format_sim_env

    if args.dry_run:
        print(f"# omniprobe env build --host {args.host}: a simulated host; nothing to build "
              f"(dry run: nothing was run)\n# checks: {sys.executable} imports omniprobe.sim; "
              "the references of the fixtures it runs (simulated and stand-in)")
        return 0, [], None
    env = check_sim_env(load_hosts(project.hosts_file), project, args.host)
    print(format_sim_env(env), end="")
    return (0 if env.ok else 1), env.problems, None


def _pinned_env(args: argparse.Namespace, project) -> tuple[int, list[str], str | None]:
    """`env build|check` of a real host: (exit status, failed checks, venv)."""
    from omniprobe.env.build import build_env, check_env, dry_run, format_result
    from omniprobe.env.checks import failure_lines

    if args.dry_run:
        print(dry_run(project, args.host, venv=args.venv, which=args.env), end="")
        return 0, [], None
    run = build_env if args.env_command == "build" else check_env
    result = run(args.host, project=project, venv=args.venv, command=_env_command(args),
                 which=args.env)
    print(format_result(result, project), end="")
    problems = failure_lines(result.verification.checks)
    # The probe sessions run on the probe env's venv; the baseline env is found at its own folder.
    venv = str(result.paths.venv) if args.env == "probe" else None
    return (1 if problems else 0), problems, venv


def _env(args: argparse.Namespace) -> int:
    from omniprobe.config.hosts import load_hosts
    from omniprobe.config.selection import INVOCATION_ENV, record_env_failure, record_selection
    from omniprobe.env.state import EnvError

    project = find_project()
    simulated = load_hosts(project.hosts_file).host(args.host, "--host").simulated
    select = args.select and not args.dry_run
    if args.select and args.dry_run:
        record_env_failure(project, args.host, "it was a dry run (--dry-run): nothing was built "
                                               "or checked")
    elif select:  # until it ends well, this session has failed: a crash selects nothing either
        record_env_failure(project, args.host, "it did not finish (see its output)")
    try:
        code, problems, venv = (_sim_env if simulated else _pinned_env)(args, project)
    except EnvError as exc:
        if select:  # the probe sessions after refuse, saying why
            record_selection(project, args.host, [" ".join(str(exc).split())])
        raise
    if select:
        handed = record_selection(project, args.host, problems, venv=venv)
        if not handed:
            print(f"--select: not in a nox run ({INVOCATION_ENV} unset); nothing handed on")
        elif problems:
            print(f"env-{args.host} failed: no host selected; the probe sessions of this nox run "
                  "refuse")
        else:
            print(f"selected host {args.host} for the probe sessions of this nox run")
    return code


def _fetch_model(args: argparse.Namespace) -> int:
    from omniprobe.config.hosts import load_hosts
    from omniprobe.env.fetch_model import fetch_model

    fetch_model(load_hosts(find_project().hosts_file), revision=args.revision)
    return 0


def _select_host(args: argparse.Namespace) -> int:
    from omniprobe.config.hosts import load_hosts
    from omniprobe.config.selection import record_selection, resolve_host

    project = find_project()
    cfg = load_hosts(project.hosts_file)
    if args.name is None:
        name, why = resolve_host(project, cfg, args.host)
        print(f"host {name} ({why})")
        return 0
    cfg.host(args.name, "select-host")
    handed = record_selection(project, args.name, [])
    print(f"selected host {args.name} for the probe sessions of this nox run (its env is checked "
          "when a probe starts)" if handed else
          "not in a nox run: nothing handed on; pass --host to the probe instead")
    return 0


def _probe(args: argparse.Namespace) -> int:
    from omniprobe.harness.probe import run_probe

    return run_probe(find_project(), args.command, options_from(args), command=args.argv)


def _probe_offline(args: argparse.Namespace) -> int:
    from omniprobe.harness.offline import run_offline

    return run_offline(find_project(), options_from(args), command=args.argv)


def _probe_baseline(args: argparse.Namespace) -> int:
    from omniprobe.harness.baseline import run_baseline

    return run_baseline(find_project(), options_from(args), command=args.argv, out=sys.stderr,
                        build_env=args.build_env)


def _propagation(args: argparse.Namespace) -> int:
    from omniprobe.harness.propagation import run_propagation

    return run_propagation(find_project(), options_from(args), command=args.argv)


def _nox_args(args: argparse.Namespace) -> int:
    import json

    from omniprobe.cli.nox_args import route_options

    posargs = args.posargs[1:] if args.posargs[:1] == ["--"] else args.posargs
    print(json.dumps(route_options(build_parser(), args.session, args.run.split(","), posargs)))
    return 0


def _timeline(args: argparse.Namespace) -> int:
    from omniprobe.analysis.series import decimate, read_series
    from omniprobe.atomic import write_text_atomic
    from omniprobe.report.timeline_svg import render_svg

    svg = render_svg(decimate(read_series(args.series)), title=args.title or args.series.name)
    out = args.output or args.series.with_suffix(".svg")
    write_text_atomic(out, svg)
    print(f"wrote {out}")
    return 0


def _upstream(args: argparse.Namespace) -> int:
    from omniprobe.upstream.contract import check_source, differences, record, recorded, render

    project = find_project()
    contract = check_source(project, args.source, args.vllm_source)
    print(render(contract))
    if args.check:
        committed = recorded(project, contract)
        if committed is None:
            print("error: no committed evidence under evidence/upstream/ for this source; "
                  "record it with --record", file=sys.stderr)
            return 1
        diffs = differences(committed.upstream, contract)
        for line in diffs:
            print(f"differs: {line}", file=sys.stderr)
        if diffs:
            print(f"{len(diffs)} result(s) differ from {committed.path}", file=sys.stderr)
            return 1
        print(f"every result equals the committed {committed.path.relative_to(project.root)}")
        return 0
    if args.record:
        folder = record(project, contract, [
            "omniprobe", "upstream", "check", "--source", args.source.name,
            *(["--vllm-source", args.vllm_source.name] if args.vllm_source else []), "--record"])
        print(f"recorded {folder.relative_to(project.root)}")
    return 1 if any(c.status == "fail" for c in contract.checks) else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="omniprobe", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("validate", help="check hosts.toml, fixtures/, evidence/ and schemas/")
    p.set_defaults(func=_validate)

    p = sub.add_parser("schema", help="write JSON Schema for every file format to schemas/")
    p.add_argument("--check", action="store_true", help="exit 1 if the committed schemas are stale")
    p.set_defaults(func=_schema)

    p = sub.add_parser("report", help="render REPORT.md from the evidence")
    p.add_argument("--check", action="store_true", help="exit 1 if REPORT.md differs from a fresh render")
    p.set_defaults(func=_report)

    p = sub.add_parser("image-check", help="metrics and structure verdict of image files or "
                       "folders (exit 1: a broken image; 2: unreadable input)")
    p.add_argument("paths", nargs="+", metavar="PATH", help="image files, or folders to search "
                   "recursively for .png/.jpg/.jpeg/.webp")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_image_check)

    p = sub.add_parser("standins", help="draw the stand-in reference images under fixtures/ "
                       "(a file whose pixels are right is kept) and check the fixtures' digests")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 if a file or a pinned digest differs from a fresh draw")
    p.set_defaults(func=_standins)

    p = sub.add_parser("quality", help="PSNR of an attempt's outputs against a baseline attempt's "
                       "images, and determinism groups; writes psnr.json and determinism.json")
    p.add_argument("--baseline", type=Path, required=True, metavar="DIR",
                   help="folder of the baseline attempt's images")
    p.add_argument("--attempt", metavar="ID", help="attempt to check (default: the most recently "
                   "started one with image artifacts)")
    p.add_argument("--layout", metavar="PATTERN", help="baseline image path under DIR, e.g. "
                   "'{fixture}/{seed}.png' (default: hosts.toml [quality] baseline_layout)")
    p.add_argument("--comparator", choices=["rgba", "rgb"],
                   help="channels compared (default: hosts.toml [quality] comparator)")
    p.add_argument("--baseline-attempt", metavar="ID",
                   help="attempt id of the baseline images (default: the attempt's baseline)")
    p.set_defaults(func=_quality)

    p = sub.add_parser("evidence", help="bring evidence made on another machine back whole")
    ev_sub = p.add_subparsers(dest="evidence_command", required=True)
    q = ev_sub.add_parser("pack", help="pack attempts (their evidence, and their logs and "
                          "timelines within a size limit) into one archive with every digest")
    q.add_argument("--attempt", action="append", default=[], help="an attempt id (repeatable)")
    q.add_argument("--host", action="append", default=[],
                   help="every attempt of this host (repeatable)")
    q.add_argument("--out", type=Path, required=True, help="the archive to write (.tar.gz)")
    q.add_argument("--artifact-max-mib", type=float, default=4.0,
                   help="artifacts (.log, .jsonl) larger than this stay behind (0: none travel)")
    q.set_defaults(func=_evidence)
    q = ev_sub.add_parser("unpack", help="check an archive's digests and attempts, then move "
                          "them into evidence/ and artifacts/; refuses to overwrite anything")
    q.add_argument("archive", type=Path)
    q.set_defaults(func=_evidence)

    p = sub.add_parser("wheels", help="download a pinned wheel list (wheels/h200.txt) for a "
                       "machine that reaches no registry, every hash checked")
    p.add_argument("--list", type=Path, default=Path("wheels/h200.txt"), help="the wheel list")
    p.add_argument("--dest", type=Path, default=Path(".whl"), help="the folder to fill")
    p.add_argument("--check", action="store_true",
                   help="download nothing; check the folder against the list")
    p.set_defaults(func=_wheels)

    p = sub.add_parser("env", help="build or check a host's pinned probe environment")
    env_sub = p.add_subparsers(dest="env_command", required=True)
    for name, text in (
        ("build", "build the env from hosts.toml (only verifies when nothing changed); a "
                  "simulated host's env is omniprobe itself: only checked, nothing installed"),
        ("check", "check the env and file its manifest; builds nothing"),
    ):
        q = env_sub.add_parser(name, help=text)
        q.add_argument("--host", required=True, help="a hosts.toml host")
        q.add_argument("--venv", help="venv path (default: <[env] root>/envs/<host>, the "
                                      "baseline env's <[env] root>/envs/<host>-baseline)")
        q.add_argument("--env", choices=("probe", "baseline"), default="probe",
                       help="which env: the probe's ([env], default) or the Diffusers engine's "
                            "baseline env ([baseline_env]), each with its own venv and manifest")
        if name == "build":
            q.add_argument("--dry-run", action="store_true",
                           help="print the commands a build runs; run nothing")
            q.add_argument("--select", action="store_true",
                           help="then select the host, and this env, for the probe sessions of "
                                "the same nox run (env-<host>); failed checks make them refuse")
        q.set_defaults(func=_env, dry_run=False, select=False)

    q = env_sub.add_parser("fetch-model", help="download the pinned model snapshot ([stack] "
                           "model_snapshot) into the hub cache: the commit its short revision "
                           "names, found in the repository's commit list")
    q.add_argument("--revision", help="the full commit (default: the one of the main branch's "
                                      "commits that starts with the pinned revision)")
    q.set_defaults(func=_fetch_model)

    p = sub.add_parser("select-host", help="select the probe host without building its env "
                       "(env-<host> builds and selects); without NAME, show the probe's choice")
    p.add_argument("name", nargs="?", help="select this host; without it, show the probe's choice")
    p.add_argument("--host", help="as the probe sessions take it, when NAME is not given")
    p.set_defaults(func=_select_host)

    # The evidence-making commands: their flags generated from harness/options.py.
    for name, func, text in (
        ("probe-init", _probe, "start the server under each flag set; record init"),
        ("probe-serve", _probe, "serve every runnable fixture x seed per flag set"),
        ("probe-offline", _probe_offline, "generate the fixtures with an offline engine per "
         "offline kwarg set of the host (Omni(...)), or per Diffusers profile on a Diffusers "
         "host; resumes the newest offline attempt of this environment"),
        ("probe-baseline", _probe_baseline, "re-seal the seed's Diffusers baseline: "
         "probe-offline under the host's baseline profile (default seed-baseline), its images "
         "laid out where `quality --baseline DIR` reads them"),
        ("propagation", _propagation, "serve one fixture and seed with and without a deploy "
         "config; record whether its knob reached the model (a new attempt)"),
    ):
        p = sub.add_parser(name, help=text)
        add_options(p, name)
        p.set_defaults(func=func)
        if name == "probe-baseline":
            p.add_argument("--build-env", action="store_true",
                           help="first build (or, when nothing changed, only verify) the host's "
                                "baseline env, where its runner runs in one (`env build --env "
                                "baseline`); without it, a baseline env not built is refused")

    p = sub.add_parser("upstream", help="hold the harness against a real vLLM-Omni source")
    up_sub = p.add_subparsers(dest="upstream_command", required=True)
    q = up_sub.add_parser("check", help="the named contract checks and the code citations' state "
                          "in a source, read with ast (exit 1: a check fails; with --check: a "
                          "result differs from the committed evidence)")
    q.add_argument("--source", type=Path, required=True, metavar="PATH",
                   help="a vllm-omni .whl, an unpacked tree or a clone")
    q.add_argument("--vllm-source", type=Path, metavar="PATH",
                   help="a vllm .whl, tree or clone: the serve parser vLLM-Omni's starts from, "
                        "for the flags it takes from vLLM (default: the committed attempt's "
                        "reading of them, else NOT FOUND)")
    mode = q.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true",
                      help="exit 1 only if a result differs from the committed evidence")
    mode.add_argument("--record", action="store_true",
                      help="record the result as a new attempt under evidence/upstream/")
    q.set_defaults(func=_upstream)

    p = sub.add_parser("nox-args", help="the noxfile's router: which of the arguments after "
                       "`nox ... --` SESSION takes, as a JSON list (cli/nox_args.py): "
                       "omniprobe nox-args --run S1,S2 SESSION -- ARGS")
    p.add_argument("session", help="the nox session asking")
    p.add_argument("--run", required=True, help="the sessions of the nox run, comma-separated")
    p.add_argument("posargs", nargs=argparse.REMAINDER, help="the arguments after `--`")
    p.set_defaults(func=_nox_args)

    p = sub.add_parser("timeline", help="render a recorded GPU memory series (JSONL) as SVG")
    p.add_argument("series", type=Path)
    p.add_argument("-o", "--output", type=Path)
    p.add_argument("--title")
    p.set_defaults(func=_timeline)
    return parser


def run_command(command: Callable[[], int], out: TextIO | None = None) -> int:
    """Run one command: the one place where its errors become messages (every problem of an
    InputError, no traceback) and exit codes (errors.py: one per category); Ctrl-C exits 130."""
    out = out or sys.stderr
    try:
        return command()
    except Interrupted as exc:
        print(f"interrupted: {exc}", file=out)
        return exc.exit_code
    except FileNotFoundError as exc:  # a path given on the command line that does not exist
        where = str(exc.filename) if exc.filename is not None else str(exc)
        print(f"error: {Problem(where, '', 'file not found')}", file=out)
        return InputError.exit_code
    except OmniprobeError as exc:
        for line in exc.lines():
            print(f"error: {line}", file=out)
        return exc.exit_code
    except OSError as exc:  # the file system refused a named path: a folder where a file belongs
        if exc.filename is None:
            raise
        print(f"error: {Problem(str(exc.filename), '', exc.strerror or str(exc))}", file=out)
        return EnvironmentFailure.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=out)
        return Interrupted.exit_code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    args.argv = ["omniprobe", *argv]  # the command line an attempt records as its provenance
    return run_command(lambda: args.func(args))


if __name__ == "__main__":
    sys.exit(main())
