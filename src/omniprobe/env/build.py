"""`omniprobe env build`: make a host's pinned probe environment from hosts.toml with uv.

A build provides the pinned Python (uv installs it where the machine lacks it), clones each git
pin into a cache and checks its commit out, creates the venv afresh, then runs the [[env.install]]
steps in order, each constrained by every pin. The venv's stamp is written 'incomplete' before
the first install and 'complete' after the last, so an interrupted or failed build is never
taken for a good one, and the next build repairs it. When the stamp is complete for the current
pins, a build only verifies. Every command is an argument list; `--dry-run` prints them.
"""

from __future__ import annotations

import shlex
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from omniprobe.atomic import write_text_atomic
from omniprobe.config.hosts import HostsConfig, load_hosts
from omniprobe.config.project import Project, find_project
from omniprobe.config.stack import InstallStep
from omniprobe.env.check_record import describe_checks
from omniprobe.env.checks import Verification, machine_refusal, planned_checks, verify_env
from omniprobe.env.download_size import download_notice
from omniprobe.env.manifest import make_manifest, record_manifest
from omniprobe.env.resolve import (
    compile_command,
    index_pyproject,
    override_args,
    override_lines,
    plan_files,
    require_recipe_agrees,
    resolve_plan,
    unreachable,
)
from omniprobe.env.state import (
    CommandRun,
    EnvBuildError,
    EnvName,
    EnvNotReady,
    EnvPaths,
    Runner,
    Stamp,
    build_command,
    env_label,
    env_paths,
    install_steps,
    pins_hash,
    stamp_state,
    uv_command,
    write_stamp,
)
from omniprobe.env.upstream_clone import contract_warnings
from omniprobe.evidence.models.environment import EnvManifest

Echo = Callable[[str], None]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# --- the commands, shared by the build and its dry run ----------------------------------


def _python_find(uv: str, version: str) -> list[str]:
    # --system: skip virtual environments (an active one, or a .venv near the working folder).
    return [uv, "python", "find", "--system", version]


def _python_install(uv: str, version: str) -> list[str]:
    return [uv, "python", "install", version]


def _venv(uv: str, python: str, paths: EnvPaths) -> list[str]:
    return [uv, "venv", "--clear", "--python", python, str(paths.venv)]


def _clone(step: InstallStep, dest: Path) -> list[str]:
    return ["git", "clone", "--no-checkout", "--quiet", str(step.git), str(dest)]


def _has_commit(dest: Path, commit: str) -> list[str]:
    return ["git", "-C", str(dest), "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"]


def _fetch(dest: Path) -> list[str]:
    return ["git", "-C", str(dest), "fetch", "--quiet", "origin"]


def _checkout(dest: Path, commit: str) -> list[str]:
    return ["git", "-C", str(dest), "checkout", "--detach", "--quiet", commit]


def _head(dest: Path) -> list[str]:
    return ["git", "-C", str(dest), "rev-parse", "HEAD"]


def _requirement(step: InstallStep, paths: EnvPaths, commit: str) -> list[str]:
    if step.kind == "index":
        return [f"{step.name}=={step.version}"]
    clone = paths.clone_dir(step)
    if step.editable:
        return ["--editable", str(clone)]
    # From the verified local clone at its full commit: uv records that commit for the check.
    return [f"{step.name} @ git+{clone.as_uri()}@{commit}"]


def _step_project(step: InstallStep, paths: EnvPaths) -> Path:
    """Where a step with its own index gets its requirement from: a pyproject.toml taking its
    package from that index only, the rest from the default one (resolve.index_pyproject)."""
    return paths.venv / f"omniprobe-step-{step.name}" / "pyproject.toml"


def _step_project_text(step: InstallStep) -> str:
    return index_pyproject(f"omniprobe-step-{step.name}", [f"{step.name}=={step.version}"], [step])


def _install(uv: str, step: InstallStep, paths: EnvPaths, commit: str,
             steps: list[InstallStep]) -> list[str]:
    requirement = (["-r", str(_step_project(step, paths))] if step.index
                   else _requirement(step, paths, commit))
    return [uv, "pip", "install", "--python", str(paths.python),
            "--constraint", str(paths.constraints), *override_args(steps, paths.overrides),
            *requirement]


def _overrides(steps: list[InstallStep], paths: EnvPaths, commits: dict[str, str]) -> str:
    return override_lines(steps, lambda step: _requirement(step, paths, commits.get(step.name, "")))


def _constraints(steps: list[InstallStep], paths: EnvPaths, commits: dict[str, str]) -> str:
    # Every pin constrains every step, so a later step's dependencies cannot move an earlier
    # pin; uv takes no editable constraint, and the editable step is the pin itself.
    lines = [" ".join(_requirement(step, paths, commits.get(step.name, "")))
             for step in steps if not step.editable]
    return "".join(f"{line}\n" for line in lines)


def _full_commit_placeholder(step: InstallStep) -> str:
    return f"<full commit of {step.commit}>"


def _upstream_step(cfg: HostsConfig, steps: list[InstallStep]) -> InstallStep | None:
    """The install step of the upstream clone ([stack] upstream_repo), where recipes live."""
    return next((s for s in steps if s.git == cfg.stack.upstream_repo), None)


def _source(step: InstallStep, cfg: HostsConfig) -> str:
    where = step.index or "the default index"
    if step.recipe:
        return (f"{where}; version from {step.recipe} of {cfg.stack.upstream_repo} at "
                f"{cfg.stack.upstream_commit}")
    return step.git or where


# --- dry run ----------------------------------------------------------------------------


def dry_run(project: Project, host: str, *, venv: str | Path | None = None,
            which: EnvName = "probe") -> str:
    """The commands a build of `host`'s env `which` runs, shell-quoted, in order; runs nothing."""
    cfg = load_hosts(project.hosts_file)
    steps = install_steps(cfg, project.hosts_file, which)
    paths = env_paths(cfg, project, host, venv, which)
    uv, version = uv_command(), cfg.stack.python
    _, state = stamp_state(paths, pins_hash(cfg, project, which))
    git_steps = [step for step in steps if step.kind == "git"]
    commits = {step.name: _full_commit_placeholder(step) for step in git_steps}

    def line(argv: list[str], note: str = "") -> str:
        return shlex.join(argv) + (f"  # {note}" if note else "")

    out = [f"# {build_command(host, which)}: the commands a build of the {which} env runs, in "
           "order (dry run: nothing was run)",
           f"# venv: {paths.venv}",
           f"# git cache: {paths.git_cache}",
           f"# stamp now: {state} (a current stamp makes a build only verify)",
           "# first, before anything is downloaded: this machine against the host entry "
           "(host.hostname, and NVML's gpu.name, gpu.compute_capability, gpu.memory); a "
           "mismatch stops the build there, naming the host to use or `omniprobe host add`",
           download_notice(which, steps),
           line(_python_find(uv, version)),
           line(_python_install(uv, version), "only if the line above finds none")]
    for step in git_steps:
        dest = paths.clone_dir(step)
        out += [line(_clone(step, dest), "only if not cloned yet"),
                line(_has_commit(dest, str(step.commit))),
                line(_fetch(dest), f"only if the clone lacks {step.commit}"),
                line(_checkout(dest, str(step.commit))),
                line(_head(dest), f"HEAD must start with {step.commit}")]
    upstream = _upstream_step(cfg, steps)
    for step in steps:
        if step.recipe:
            clone = paths.clone_dir(upstream) if upstream else "<no upstream clone in the plan>"
            out.append(f"# check {step.name} {step.version} against {clone}/{step.recipe} "
                       "(a mismatch stops the build; an absent file is said and the pin stands)")
    python = f"<python {version} found by uv>"
    overridden = [step for step in steps if step.override]
    out += [f"# override: {step.name} {step.pin} replaces every other requirement on "
            f"{step.name} (uv --override), chosen by {step.override.chosen_by}: "
            f"{step.override.reason}" for step in overridden]
    out += [f"# pin: {step.name} {step.pin}, chosen by {step.chosen.chosen_by}: "
            f"{step.chosen.reason}" for step in steps if step.chosen]
    project_text, editable_text = plan_files(
        steps, lambda step: _requirement(step, paths, commits.get(step.name, "")))
    out.append("# the plan, a pyproject.toml: a step's own index serves its package only "
               "(explicit), every other package comes from the default index:")
    out += [f"#   {text}" for text in project_text.splitlines() if text]
    out += [f"#   and {text}" for text in editable_text.splitlines()]
    out.append(line(compile_command(uv, python, Path("<the plan's pyproject.toml above>"),
                                    Path("<its editables above>") if editable_text else None,
                                    Path("<pins.txt: the constraints below>"), steps,
                                    Path("<overrides.txt: the overrides below>")),
                    "resolve the whole plan first; a clash stops the build, nothing installed"))
    out.append(line(_venv(uv, python, paths)))
    out.append(f"# write {paths.stamp}: incomplete")
    out.append(f"# write {paths.constraints}:")
    out += [f"#   {c}" for c in _constraints(steps, paths, commits).splitlines()]
    if overridden:
        out.append(f"# write {paths.overrides}:")
        out += [f"#   {o}" for o in _overrides(steps, paths, commits).splitlines()]
    for step in steps:
        if step.index:
            out.append(f"# write {_step_project(step, paths)}:")
            out += [f"#   {t}" for t in _step_project_text(step).splitlines() if t]
    out += [line(_install(uv, step, paths, commits.get(step.name, ""), steps),
                 f"{step.name} {step.pin} from {_source(step, cfg)}") for step in steps]
    out.append(f"# write {paths.stamp}: complete; then every check of `omniprobe env check`, "
               "in order" + (", the serve preflight among them (before any GPU time):"
                             if which == "probe" else ":"))
    out += [f"#   {text}" for text in planned_checks(cfg, project, host, paths, which)]
    return "\n".join(out) + "\n"


# --- the build --------------------------------------------------------------------------


def _step(runner: Runner, echo: Echo, argv: list[str], what: str, *, after: str) -> None:
    """One build step, its output shown as it runs; its stderr is read back so that an index or
    remote it cannot reach is named as such."""
    echo(f"$ {shlex.join(argv)}")
    proc = runner.run(argv, capture=False, tee=True)
    if proc.returncode != 0:
        offline = unreachable(proc.stderr or "", argv)
        if offline is not None:
            raise offline
        raise EnvBuildError(f"{what} failed (exit {proc.returncode}; its output is above):\n"
                            f"  {shlex.join(argv)}\n{after}")


def _provide_python(uv: str, version: str, runner: Runner, echo: Echo) -> str:
    found = runner.run(_python_find(uv, version))
    if found.returncode == 0:
        return found.stdout.strip()
    echo(f"$ {shlex.join(_python_install(uv, version))}  # no Python {version} found")
    installed = runner.run(_python_install(uv, version))
    if installed.returncode != 0:
        raise EnvBuildError(
            f"Python {version} is not on this machine and uv could not install it "
            f"(`{shlex.join(_python_install(uv, version))}` exit {installed.returncode}):\n"
            f"{installed.stderr.strip()[-800:]}\nnothing was changed; provide Python {version} "
            "(a uv-managed or system interpreter uv can find) and re-run")
    found = runner.run(_python_find(uv, version))
    if found.returncode != 0:
        raise EnvBuildError(f"uv installed Python {version} but "
                            f"`{shlex.join(_python_find(uv, version))}` still finds none: "
                            f"{found.stderr.strip()[-400:]}")
    return found.stdout.strip()


def _check_out(step: InstallStep, paths: EnvPaths, runner: Runner, echo: Echo) -> str:
    """Clone (once), check out the pinned commit, and return the verified full HEAD."""
    dest, commit = paths.clone_dir(step), str(step.commit)
    unchanged = "  nothing in the venv was changed."
    if not (dest / ".git").is_dir():
        if dest.exists():
            shutil.rmtree(dest)  # a clone cut short; this cache folder is ours to redo
        _step(runner, echo, _clone(step, dest), f"cloning {step.name}", after=unchanged)
    if runner.run(_has_commit(dest, commit)).returncode != 0:
        _step(runner, echo, _fetch(dest), f"fetching {step.name}", after=unchanged)
        if runner.run(_has_commit(dest, commit)).returncode != 0:
            raise EnvBuildError(f"{step.name}: commit {commit} is not in {step.git} (or the "
                                f"abbreviation is ambiguous); check [[env.install]] {step.name}")
    _step(runner, echo, _checkout(dest, commit), f"checking out {step.name} {commit}",
          after=unchanged)
    head = runner.run(_head(dest)).stdout.strip()
    if not head.startswith(commit):
        raise EnvBuildError(f"{dest}: HEAD is {head or 'unreadable'} after checkout, "
                            f"not the pinned {commit}")
    return head


def _build(cfg: HostsConfig, host: str, which: EnvName, steps: list[InstallStep],
           paths: EnvPaths, runner: Runner, echo: Echo, want_hash: str) -> None:
    uv = uv_command()
    python = _provide_python(uv, cfg.stack.python, runner, echo)
    commits = {step.name: _check_out(step, paths, runner, echo)
               for step in steps if step.kind == "git"}
    upstream = _upstream_step(cfg, steps)
    for step in steps:
        if step.recipe:
            echo(require_recipe_agrees(step, paths.clone_dir(upstream), commits[upstream.name])
                 if upstream else f"# {step.name} {step.version}: cannot check against "
                                  f"{step.recipe}: the plan clones no {cfg.stack.upstream_repo}")
    # Before the venv is touched: a plan that does not resolve leaves the old env as it was.
    resolve_plan(uv, python, steps, _constraints(steps, paths, commits),
                 lambda step: _requirement(step, paths, commits.get(step.name, "")), runner, echo)
    repair = (f"  the env at {paths.venv} is marked incomplete; fix the cause and re-run "
              f"`{build_command(host, which)}` to repair it.")
    _step(runner, echo, _venv(uv, python, paths), "creating the venv", after=repair)
    started = datetime.now(UTC)
    write_stamp(paths, Stamp(state="incomplete", host=host, pins_hash=want_hash, python=python,
                             started_at=started))
    write_text_atomic(paths.constraints, _constraints(steps, paths, commits))
    if any(step.override for step in steps):
        write_text_atomic(paths.overrides, _overrides(steps, paths, commits))
    for step in steps:
        if step.index:
            _step_project(step, paths).parent.mkdir(exist_ok=True)
            write_text_atomic(_step_project(step, paths), _step_project_text(step))
    for step in steps:
        _step(runner, echo, _install(uv, step, paths, commits.get(step.name, ""), steps),
              f"installing {step.name} {step.pin}", after=repair)
    write_stamp(paths, Stamp(state="complete", host=host, pins_hash=want_hash, python=python,
                             started_at=started, finished_at=datetime.now(UTC)))


@dataclass
class BuildResult:
    action: Literal["built", "verified"]
    paths: EnvPaths
    verification: Verification
    manifest: EnvManifest
    attempt: Path | None
    attempt_written: bool
    ran: list[CommandRun]


def build_env(host: str, *, project: Project | None = None, venv: str | Path | None = None,
              runner: Runner | None = None, nvml: Any = None, record: bool = True,
              command: list[str] | None = None, echo: Echo = _stderr,
              which: EnvName = "probe") -> BuildResult:
    """Build `host`'s env `which` unless its stamp is current, then check it and file the
    manifest."""
    start, started_at = time.perf_counter(), datetime.now(UTC)
    project = project or find_project()
    cfg = load_hosts(project.hosts_file)
    steps = install_steps(cfg, project.hosts_file, which)
    paths = env_paths(cfg, project, host, venv, which)
    runner = runner or Runner()
    want = pins_hash(cfg, project, which)
    current, why = stamp_state(paths, want)
    build_s = None
    if current:
        echo(f"# {env_label(which)} {host}: {why}; only verifying")
    else:
        refused = machine_refusal(cfg, project, host, nvml)
        if refused is not None:
            raise EnvNotReady(refused)
        echo(f"# {env_label(which)} {host}: building ({why})")
        echo(download_notice(which, steps))
        _build(cfg, host, which, steps, paths, runner, echo, want)
        build_s = time.perf_counter() - start
    return _verify_and_record(
        cfg, project, host, which, paths, runner, nvml, "verified" if current else "built",
        build_s=build_s, start=start, started_at=started_at, record=record,
        command=command or build_command(host, which).split())


def check_env(host: str, *, project: Project | None = None, venv: str | Path | None = None,
              runner: Runner | None = None, nvml: Any = None, record: bool = True,
              command: list[str] | None = None, which: EnvName = "probe") -> BuildResult:
    """Check `host`'s env `which` without building anything, and file the manifest."""
    start, started_at = time.perf_counter(), datetime.now(UTC)
    project = project or find_project()
    cfg = load_hosts(project.hosts_file)
    paths = env_paths(cfg, project, host, venv, which)
    return _verify_and_record(
        cfg, project, host, which, paths, runner or Runner(), nvml, "verified", build_s=None,
        start=start, started_at=started_at, record=record,
        command=command or build_command(host, which, "check").split())


def _verify_and_record(cfg: HostsConfig, project: Project, host: str, which: EnvName,
                       paths: EnvPaths, runner: Runner, nvml: Any,
                       action: Literal["built", "verified"], *, build_s: float | None,
                       start: float, started_at: datetime, record: bool,
                       command: list[str]) -> BuildResult:
    verification = verify_env(cfg, project, host, paths, runner=runner, nvml=nvml, which=which)
    manifest = make_manifest(verification, action, ran=runner.ran, build_s=build_s,
                             total_s=time.perf_counter() - start)
    attempt, written = None, False
    # A manifest describes a built env; checks of one never completely built stay unfiled.
    if record and verification.complete:
        attempt, written = record_manifest(project, cfg, manifest, command=command,
                                           started_at=started_at)
    return BuildResult(action=action, paths=paths, verification=verification, manifest=manifest,
                       attempt=attempt, attempt_written=written, ran=list(runner.ran))


def format_result(result: BuildResult, project: Project) -> str:
    """What `omniprobe env build|check` prints: one line per check, then where the manifest is."""
    v = result.verification.manifest
    lines = describe_checks(f"{env_label(v.env)} {v.host} ({result.action}) at "
                        f"{result.verification.paths.venv}", v.checks)
    if v.upstream is not None:
        held = sum(c.status == "pass" for c in v.upstream.checks)
        lines.append(f"upstream contract of its clone: {held} of {len(v.upstream.checks)} "
                     "checks hold")
    lines += [f"  {line}" for line in contract_warnings(v)]
    if result.attempt is None:
        lines.append("manifest: not filed (the env has no complete build)")
    else:
        where = result.attempt
        if where.is_relative_to(project.root):
            where = where.relative_to(project.root)
        state = "new" if result.attempt_written else "unchanged since that attempt"
        lines.append(f"manifest: {where}/environment.json ({state})")
    return "\n".join(lines) + "\n"
