"""Hostile input, table-driven (issue 12): each case breaks one thing in a private copy of the
project and runs the command line in process. It asserts the exit code, that no traceback is
printed, and that the message names the file and the field (or, for valid unusual input, that the
command accepts it)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from PIL import Image

from omniprobe import cli
from omniprobe.config.project import Project

PROBE = "evidence/sim/2026-11-30T095416Z-sim-probe"
OFFLINE = "evidence/sim/2026-11-30T095539Z-sim-offline"
FIXTURES = "fixtures/fixtures.json"
REPORT_SETTINGS = "templates/report.toml"
SIM_REF = "fixtures/sim/ref-a.png"
_COMMITTED = json.loads((Path(__file__).resolve().parent.parent / FIXTURES).read_text())
AT = {f["id"]: i for i, f in enumerate(_COMMITTED["fixtures"])}  # a fixture's index in the file
SINGLE, PAIR, T2I = AT["sim-single"], AT["sim-pair"], AT["sim-t2i"]


# --- how a case breaks the project ----------------------------------------------------------


def write(rel: str, data: bytes | str) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return apply


def text_edit(file: str, old: str, new: str) -> Callable[[Path], None]:
    """Replace one exact piece of a text file of the project."""
    def apply(root: Path) -> None:
        path = root / file
        text = path.read_text()
        assert old in text, old
        path.write_text(text.replace(old, new, 1))
    return apply


def hosts(old: str, new: str) -> Callable[[Path], None]:
    return text_edit("hosts.toml", old, new)


def sim(old: str, new: str) -> Callable[[Path], None]:
    return text_edit("sim.toml", old, new)


def report_settings(old: str, new: str) -> Callable[[Path], None]:
    return text_edit(REPORT_SETTINGS, old, new)


def json_edit(rel: str, edit: Callable[[dict], object]) -> Callable[[Path], None]:
    """Edit a JSON file as a dict; `edit` changes it in place."""
    def apply(root: Path) -> None:
        path = root / rel
        data = json.loads(path.read_text())
        edit(data)
        path.write_text(json.dumps(data, indent=2, allow_nan=True))
    return apply


def fixtures(edit: Callable[[dict], object]) -> Callable[[Path], None]:
    return json_edit(FIXTURES, edit)


def requests(edit: Callable[[list], object]) -> Callable[[Path], None]:
    return json_edit(f"{PROBE}/requests.json", lambda d: edit(d["requests"]))


def set_in(path: list, value) -> Callable[[object], None]:
    """An edit that sets data[p0][p1]... = value."""
    def edit(data) -> None:
        for key in path[:-1]:
            data = data[key]
        data[path[-1]] = value
    return edit


def replace_with_folder(rel: str) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        (root / rel).unlink()
        (root / rel).mkdir()
    return apply


def replace_with_fifo(rel: str) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        path = root / rel
        path.unlink(missing_ok=True)
        os.mkfifo(path)
    return apply


def symlink_out(rel: str, outside: Path) -> Callable[[Path], None]:
    """Move `rel` (a file or folder) outside the project and leave a symlink to it."""
    def apply(root: Path) -> None:
        path = root / rel
        path.rename(outside)
        path.symlink_to(outside, target_is_directory=outside.is_dir())
    return apply


def duplicate_first(records: list) -> None:
    records.append(dict(records[0]))


def contradict_first(records: list) -> None:
    """A second record of the first one's cell that says OOM, consistent in itself."""
    first = {k: v for k, v in records[0].items()
             if k not in ("artifact", "image", "output_sha256", "pixels_sha256")}
    records.append({**first, "outcome": "oom", "structure": "unchecked",
                    "oom": {"phase": "request"}, "error": "CUDA out of memory"})


# --- the cases ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    id: str
    kind: str  # the class: loader, strict, path, option, repeat, digest, image
    argv: list[str]
    exit_code: int
    says: tuple[str, ...] = ()
    breaks: Callable[[Path], None] | None = None


DEEP_TOML = "deep = " + "[" * 5000 + "]" * 5000 + "\n"
DEEP_JSON = '{"format_version": 2, "attempt": ' + "[" * 100000 + "]" * 100000 + "}"

CASES = [
    # 1. the loaders: bytes, nesting, folders and FIFOs where a file belongs, malformed text
    Case("hosts-not-utf8", "loader", ["validate"], 1, ("hosts.toml", "line 1", "not UTF-8"),
         write("hosts.toml", b"\xff\xfe[stack]\n")),
    Case("sim-not-utf8", "loader", ["validate"], 1, ("sim.toml", "line 1", "not UTF-8"),
         write("sim.toml", b"\xff\xfe[capacity.sim]\n")),
    Case("fixtures-not-utf8", "loader", ["validate"], 1, (FIXTURES, "not UTF-8"),
         write(FIXTURES, b'{"source": "\xc3\x28"}')),
    Case("evidence-not-utf8", "loader", ["validate"], 1, (f"{PROBE}/runs.json", "not UTF-8"),
         write(f"{PROBE}/runs.json", b'{"format_version": 2, "runs": ["\xe9"]}')),
    Case("hosts-deep", "loader", ["validate"], 1, ("hosts.toml", "nested deeper than 64"),
         lambda root: (root / "hosts.toml").write_text(DEEP_TOML + (root / "hosts.toml").read_text())),
    Case("fixtures-deep", "loader", ["validate"], 1, (FIXTURES, "nested deeper than 64"),
         write(FIXTURES, "[" * 100000 + "]" * 100000)),
    Case("evidence-deep", "loader", ["validate"], 1, (f"{PROBE}/attempt.json", "nested deeper"),
         write(f"{PROBE}/attempt.json", DEEP_JSON)),
    Case("fixtures-deep-in-a-string-is-text", "loader", ["validate"], 1,
         (FIXTURES, "$.fixtures[0].note", "valid string"),
         fixtures(set_in(["fixtures", 0, "note"], ["[" * 100]))),
    Case("hosts-folder", "loader", ["validate"], 1, ("hosts.toml", "is a folder"),
         replace_with_folder("hosts.toml")),
    Case("fixtures-folder", "loader", ["validate"], 1, (FIXTURES, "is a folder"),
         replace_with_folder(FIXTURES)),
    Case("evidence-file-folder", "loader", ["validate"], 1, (f"{PROBE}/requests.json", "is a folder"),
         replace_with_folder(f"{PROBE}/requests.json")),
    Case("fixtures-fifo", "loader", ["validate"], 1, (FIXTURES, "not a regular file"),
         replace_with_fifo(FIXTURES)),
    Case("evidence-truncated", "loader", ["validate"], 1,
         (f"{PROBE}/runs.json", "line 1 column 21", "not valid JSON"),
         write(f"{PROBE}/runs.json", '{"format_version": 2')),
    Case("hosts-bad-toml", "loader", ["validate"], 1, ("hosts.toml", "not valid TOML"),
         hosts("[serve]\n", "[serve\n")),
    Case("hosts-nul", "loader", ["validate"], 1, ("hosts.toml", "not valid TOML"),
         hosts('served_model_name = "', 'served_model_name = "\x00')),
    Case("evidence-not-an-object", "loader", ["validate"], 1,
         (f"{PROBE}/runs.json", "$.runs", "valid array"), write(f"{PROBE}/runs.json", "42")),
    Case("timeline-bad-line", "loader", ["timeline", "s.jsonl"], 2, ("s.jsonl", "line 2", "finite"),
         write("s.jsonl", '{"t": 0, "device_mib": 1}\n{"t": "x", "device_mib": 1}\n'
                          '{"t": 1, "device_mib": 2}\n')),
    Case("timeline-not-an-object", "loader", ["timeline", "s.jsonl"], 2, ("s.jsonl", "line 1"),
         write("s.jsonl", '[1, 2]\n{"t": 1, "device_mib": 2}\n')),
    Case("timeline-nan", "loader", ["timeline", "s.jsonl"], 2, ("s.jsonl", "line 1"),
         write("s.jsonl", '{"t": NaN, "device_mib": 1}\n{"t": 1, "device_mib": 2}\n')),
    Case("timeline-not-utf8", "loader", ["timeline", "s.jsonl"], 2, ("s.jsonl", "not UTF-8"),
         write("s.jsonl", b'{"t": 0, "device_mib": \xff}\n')),
    Case("timeline-folder", "loader", ["timeline", "s.jsonl"], 2, ("s.jsonl", "is a folder"),
         lambda root: (root / "s.jsonl").mkdir()),
    Case("timeline-torn-last-line-is-fine", "loader", ["timeline", "s.jsonl"], 0, ("wrote",),
         write("s.jsonl", '{"t": 0, "device_mib": 1}\n{"t": 1, "device_mib": 2}\n{"t": 2, "dev')),

    # 2. strict input models: no coercion, finite floats, bounded ints, checked placeholders
    Case("port-string", "strict", ["validate"], 1, ("hosts.toml", "[serve] key 'port'", "'8091'"),
         hosts("port = 8091", 'port = "8091"')),
    Case("port-bool", "strict", ["validate"], 1, ("hosts.toml", "[serve] key 'port'", "True"),
         hosts("port = 8091", "port = true")),
    Case("port-float", "strict", ["validate"], 1, ("hosts.toml", "[serve] key 'port'", "integer"),
         hosts("port = 8091", "port = 8091.0")),
    Case("port-out-of-range", "strict", ["validate"], 1, ("hosts.toml", "[serve] key 'port'"),
         hosts("port = 8091", "port = 70000")),
    Case("timeout-nan", "strict", ["validate"], 1,
         ("hosts.toml", "[serve] key 'ready_timeout_s'", "finite"),
         hosts("port = 8091", "port = 8091\nready_timeout_s = nan")),
    Case("timeout-inf", "strict", ["validate"], 1,
         ("hosts.toml", "[serve] key 'request_timeout_s'", "finite"),
         hosts("port = 8091", "port = 8091\nrequest_timeout_s = inf")),
    Case("timeout-int-for-float-is-fine", "strict", ["validate"], 0, ("valid",),
         hosts("port = 8091", "port = 8091\nrequest_timeout_s = 12")),
    Case("bool-string", "strict", ["validate"], 1, ("hosts.toml", "[serve] key 'enforce_eager'"),
         hosts("enforce_eager = true", 'enforce_eager = "true"')),
    Case("vram-string", "strict", ["validate"], 1, ("hosts.toml", "[hosts.rtx3090] key 'vram_gb'"),
         hosts("vram_gb = 24", 'vram_gb = "24"')),
    Case("ram-minus-inf", "strict", ["validate"], 1,
         ("hosts.toml", "[hosts.rtx5080] key 'host_ram_gib'", "finite"),
         hosts("host_ram_gib = 30", "host_ram_gib = -inf")),
    Case("fraction-nan", "strict", ["validate"], 1,
         ("hosts.toml", "[structure] key 'min_opaque_fraction'", "finite"),
         hosts("min_opaque_fraction = 0.9", "min_opaque_fraction = nan")),
    Case("layout-format-spec", "strict", ["validate"], 1,
         ("hosts.toml", "[quality] key 'baseline_layout'", "format spec"),
         hosts('baseline_layout = "{fixture}/{seed}.png"', 'baseline_layout = "{fixture}/{seed:s}.png"')),
    Case("layout-conversion", "strict", ["validate"], 1,
         ("hosts.toml", "[quality] key 'baseline_layout'", "conversion"),
         hosts('baseline_layout = "{fixture}/{seed}.png"', 'baseline_layout = "{fixture}/{seed!r}.png"')),
    Case("layout-positional", "strict", ["validate"], 1,
         ("hosts.toml", "[quality] key 'baseline_layout'"),
         hosts('baseline_layout = "{fixture}/{seed}.png"', 'baseline_layout = "{fixture}/{seed}{}.png"')),
    Case("layout-unbalanced", "strict", ["validate"], 1,
         ("hosts.toml", "[quality] key 'baseline_layout'"),
         hosts('baseline_layout = "{fixture}/{seed}.png"', 'baseline_layout = "{fixture}/{seed.png"')),
    Case("serve-placeholder-typo", "strict", ["validate"], 1,
         ("hosts.toml", "[serve] key 'command'", "unknown placeholder", "modle"),
         hosts('"vllm", "serve", "{model}"', '"vllm", "serve", "{modle}"')),
    Case("serve-json-argument-is-fine", "strict", ["validate"], 0, ("valid",),
         hosts('"vllm", "serve", "{model}", "--omni"',
               '"vllm", "serve", "{model}", "--omni", "--hf-overrides", "{\\"a\\": 1}"')),
    Case("host-serve-placeholder", "strict", ["validate"], 1,
         ("hosts.toml", "[hosts.sim] key 'serve_command'", "runner"),
         hosts('serve_command = ["{python}"', 'serve_command = ["{runner}"')),
    Case("offline-placeholder", "strict", ["validate"], 1,
         ("hosts.toml", "[hosts.sim] key 'offline_command'", "model"),
         hosts('offline_command = ["{python}"', 'offline_command = ["{model}"')),
    Case("seed-string", "strict", ["validate"], 1, (FIXTURES, "$.sampling.seeds[0]", "'2301'"),
         fixtures(set_in(["sampling", "seeds", 0], "2301"))),
    Case("seed-bool", "strict", ["validate"], 1, (FIXTURES, "$.sampling.seeds[0]"),
         fixtures(set_in(["sampling", "seeds", 0], True))),
    Case("seed-negative", "strict", ["validate"], 1, (FIXTURES, "$.sampling.seeds[0]"),
         fixtures(set_in(["sampling", "seeds", 0], -1))),
    Case("seed-huge", "strict", ["validate"], 1, (FIXTURES, "$.sampling.seeds[0]"),
         fixtures(set_in(["sampling", "seeds", 0], 2**70))),
    Case("width-string", "strict", ["validate"], 1, (FIXTURES, f"$.fixtures[{T2I}].width"),
         fixtures(set_in(["fixtures", T2I, "width"], "1024"))),
    Case("width-too-large", "strict", ["validate"], 1, (FIXTURES, f"$.fixtures[{T2I}].width", "4096"),
         fixtures(set_in(["fixtures", T2I, "width"], 12000))),
    Case("cfg-nan", "strict", ["validate"], 1, (FIXTURES, "$.sampling.true_cfg_scale", "finite"),
         fixtures(set_in(["sampling", "true_cfg_scale"], float("nan")))),
    Case("cfg-int-for-float-is-fine", "strict", ["validate"], 0, ("valid",),
         fixtures(set_in(["sampling", "true_cfg_scale"], 4))),
    Case("record-seed-string", "strict", ["validate"], 1,
         (f"{PROBE}/requests.json", "$.requests[0].seed", "'2301'"),
         requests(set_in([0, "seed"], "2301"))),
    Case("record-wall-nan", "strict", ["validate"], 1,
         (f"{PROBE}/requests.json", "$.requests[0].wall_s", "finite"),
         requests(set_in([0, "wall_s"], float("nan")))),
    Case("record-wall-inf", "strict", ["validate"], 1,
         (f"{PROBE}/requests.json", "$.requests[0].wall_s", "finite"),
         requests(set_in([0, "wall_s"], float("inf")))),
    Case("record-peak-minus-inf", "strict", ["validate"], 1,
         (f"{PROBE}/requests.json", "$.requests[0].server_peak_mb", "finite"),
         requests(set_in([0, "server_peak_mb"], float("-inf")))),
    Case("record-wall-int-is-fine", "strict", ["validate"], 0, ("valid",),
         requests(set_in([0, "wall_s"], 12))),
    Case("record-lifetime-bool", "strict", ["validate"], 1,
         (f"{PROBE}/requests.json", "$.requests[0].lifetime"),
         requests(set_in([0, "lifetime"], True))),
    Case("record-started-garbage", "strict", ["validate"], 1,
         (f"{PROBE}/attempt.json", "$.attempt.provenance.simulated.started_at"),
         json_edit(f"{PROBE}/attempt.json", set_in(["attempt", "provenance", "started_at"], "soon"))),
    Case("record-seed-float", "strict", ["validate"], 1,
         (f"{PROBE}/requests.json", "$.requests[0].seed"),
         requests(set_in([0, "seed"], 2301.0))),

    # 3. paths a file names stay inside their folder
    Case("reference-absolute", "path", ["validate"], 1,
         (FIXTURES, f"$.fixtures[{SINGLE}].references[0].file", "absolute"),
         fixtures(set_in(["fixtures", SINGLE, "references", 0, "file"], "/etc/passwd"))),
    Case("reference-climbs-out", "path", ["validate"], 1,
         (FIXTURES, f"$.fixtures[{SINGLE}].references[0].file", "'..'"),
         fixtures(set_in(["fixtures", SINGLE, "references", 0, "file"], "sim/../../../etc/passwd"))),
    Case("reference-home", "path", ["validate"], 1,
         (FIXTURES, f"$.fixtures[{SINGLE}].references[0].file", "absolute"),
         fixtures(set_in(["fixtures", SINGLE, "references", 0, "file"], "~/.ssh/id_rsa"))),
    Case("deploy-absolute", "path", ["validate"], 1,
         ("hosts.toml", "[deploy_configs.sim-kvfp8v] key 'path'"),
         hosts('path = "deploy/sim-kvfp8v.yaml"', 'path = "/etc/hosts"')),
    Case("deploy-climbs-out", "path", ["validate"], 1,
         ("hosts.toml", "[deploy_configs.sim-kvfp8v] key 'path'", "'..'"),
         hosts('path = "deploy/sim-kvfp8v.yaml"', 'path = "deploy/../../x.yaml"')),
    Case("deploy-outside-deploy", "path", ["validate"], 1,
         ("hosts.toml", "[deploy_configs.sim-kvfp8v] key 'path'", "deploy/"),
         hosts('path = "deploy/sim-kvfp8v.yaml"', 'path = "fixtures/fixtures.json"')),
    Case("snapshot-manifest-absolute", "path", ["validate"], 1,
         ("hosts.toml", "[env] key 'checks.snapshot_manifest'", "absolute"),
         hosts("[env.checks]\n", '[env.checks]\nsnapshot_manifest = "/etc/passwd"\n')),
    Case("artifact-climbs-out", "path", ["validate"], 1,
         (f"{PROBE}/requests.json", "$.requests[0].artifact", "'..'"),
         requests(set_in([0, "artifact"], "../../../etc/passwd"))),
    Case("artifact-absolute", "path", ["validate"], 1,
         (f"{PROBE}/requests.json", "$.requests[0].artifact", "absolute"),
         requests(set_in([0, "artifact"], "/etc/passwd"))),
    Case("log-absolute", "path", ["validate"], 1,
         (f"{PROBE}/runs.json", "$.runs[0].lifetimes[0].log.path", "absolute"),
         json_edit(f"{PROBE}/runs.json",
                   set_in(["runs", 0, "lifetimes", 0, "log", "path"], "/var/log/syslog"))),

    Case("quality-layout-absolute", "path",
         ["quality", "--baseline", ".", "--layout", "/etc/{fixture}/{seed}.png"], 2,
         ("--layout", "$.baseline_layout", "inside the baseline folder")),
    Case("quality-layout-climbs-out", "path",
         ["quality", "--baseline", ".", "--layout", "{fixture}/../../{seed}.png"], 2,
         ("--layout", "$.baseline_layout", "inside the baseline folder")),
    Case("quality-layout-format-spec", "strict",
         ["quality", "--baseline", ".", "--layout", "{fixture}/{seed:s}.png"], 2,
         ("--layout", "$.baseline_layout", "format spec")),

    # 4. command-line options, refused by argparse before any work
    *[Case(f"option{argv[1]}={argv[2]}", "option", [verb, *argv[1:]], 2, (argv[1], argv[2]))
      for verb, argv in [
          ("probe-serve", ["", "--request-timeout", "-5"]),
          ("probe-serve", ["", "--request-timeout", "nan"]),
          ("probe-serve", ["", "--request-timeout", "inf"]),
          ("probe-serve", ["", "--request-timeout", "0"]),
          ("probe-init", ["", "--ready-timeout", "-0.5"]),
          ("probe-serve", ["", "--sample-hz", "0"]),
          ("probe-serve", ["", "--sample-hz", "nan"]),
          ("probe-init", ["", "--port", "70000"]),
          ("probe-init", ["", "--port", "0"]),
          ("probe-init", ["", "--port", "80a"]),
          ("probe-serve", ["", "--grace", "-1"]),
          ("probe-serve", ["", "--idle-timeout", "-1"]),
          ("probe-serve", ["", "--gpu-index", "-1"]),
          ("probe-offline", ["", "--seed", "-1"]),
          ("probe-offline", ["", "--request-timeout", "0"]),
          ("probe-offline", ["", "--grace", "nan"]),
          ("propagation", ["", "--port", "0"]),
          ("propagation", ["", "--seed", "x"]),
      ]],

    # 5. one record per cell
    Case("duplicate-request", "repeat", ["validate"], 1,
         (f"{PROBE}/requests.json", "$.requests[", "a second record", "$.requests[0]"),
         requests(duplicate_first)),
    Case("contradictory-request", "repeat", ["validate"], 1,
         (f"{PROBE}/requests.json", "a second record of (flag set, fixture, seed)"),
         requests(contradict_first)),
    Case("duplicate-run", "repeat", ["validate"], 1,
         (f"{PROBE}/runs.json", "a second record of flag set"),
         json_edit(f"{PROBE}/runs.json", lambda d: d["runs"].append(d["runs"][0]))),
    Case("duplicate-offline-request", "repeat", ["validate"], 1,
         (f"{OFFLINE}/offline-requests.json", "(kwarg set, fixture, seed)"),
         json_edit(f"{OFFLINE}/offline-requests.json",
                   lambda d: d["offline_requests"].append(d["offline_requests"][0]))),
    # templates/report.toml: the report's words, apart from hosts.toml
    Case("report-table-left-in-hosts", "strict", ["validate"], 1,
         ("hosts.toml", "[report]", "templates/report.toml"),
         hosts("[probe]\n", '[report]\ntitle = "x"\n\n[probe]\n')),
    Case("report-settings-unknown-key", "strict", ["validate"], 1,
         (REPORT_SETTINGS, "key 'subtitle'", "unknown key"),
         report_settings("title = ", 'subtitle = "x"\ntitle = ')),
    Case("report-settings-missing", "loader", ["report", "--check"], 2,
         (REPORT_SETTINGS, "file not found"),
         lambda root: (root / REPORT_SETTINGS).unlink()),
]


# --- round 2 (issue 24): evidence that disagrees with itself, the harness's own options, URLs,
# names, absurd numbers, secrets and environment, references, the file system ---------------

_ROOT = Path(__file__).resolve().parent.parent
EMULATED = str(next((_ROOT / "evidence" / "sim-emulated").glob("*-32768mib-probe"))
               .relative_to(_ROOT))  # the sim-account emulation at a 32 GiB cap
MATRIX = "evidence/rtx3090/seed-3090-1-serve-matrix"
_REQUESTS = json.loads((Path(__file__).resolve().parent.parent / PROBE / "requests.json")
                       .read_text())["requests"]
SOUND = next(i for i, r in enumerate(_REQUESTS) if r["structure"] == "sound")
BROKEN = next(i for i, r in enumerate(_REQUESTS) if r["structure"] == "broken")
OOM = next(i for i, r in enumerate(_REQUESTS) if r["outcome"] == "oom")
REQ = f"{PROBE}/requests.json"
RUNS = f"{PROBE}/runs.json"
CPUOFF = 1  # runs.json index of the probe attempt's cpuoff run
TMP_NAME = re.compile(r"\.[^/\s]+\.[a-z0-9_]{8}\.tmp\b")  # a temp file of atomic.py


def both(*steps: Callable[[Path], None]) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        for step in steps:
            step(root)
    return apply


def drop(path: list) -> Callable[[object], None]:
    def edit(data) -> None:
        for key in path[:-1]:
            data = data[key]
        del data[path[-1]]
    return edit


def duplicate_key(rel: str, key: str) -> Callable[[Path], None]:
    """Repeat the first `"key": value` of a JSON file with another value just after it."""
    def apply(root: Path) -> None:
        path = root / rel
        text = path.read_text()
        match = re.search(rf'"{key}": ("[^"]*"|[^,\n}}]+)', text)
        assert match, key
        text = text[:match.end()] + f', "{key}": "the second"' + text[match.end():]
        path.write_text(text)
    return apply


def reference_is(data: bytes | Callable[[Path], bytes]) -> Callable[[Path], None]:
    """Replace sim/ref-a.png and pin its new digest everywhere it is bound: only the file's kind
    is wrong, never its digest."""
    def apply(root: Path) -> None:
        path = root / SIM_REF
        new = data(path) if callable(data) else data
        path.write_bytes(new)
        digest = hashlib.sha256(new).hexdigest()
        suite = json.loads((root / FIXTURES).read_text())
        for fixture in suite["fixtures"]:
            for ref in fixture.get("references") or []:
                if ref["file"] == "sim/ref-a.png":
                    ref["sha256"] = digest
        (root / FIXTURES).write_text(json.dumps(suite, indent=2))
    return apply


def huge_png(path: Path) -> bytes:
    buffer = io.BytesIO()
    Image.new("1", (13000, 13000)).save(buffer, "PNG")
    return buffer.getvalue()


def hard_link_from_outside(root: Path) -> None:
    """The reference's bytes (its pin still right) in a file outside fixtures/, linked in."""
    path = root / SIM_REF
    outside = root.parent / f"{root.name}-outside.png"
    path.rename(outside)
    os.link(outside, path)


def flag_args(name: str, *args: str) -> Callable[[Path], None]:
    old = {"cpuoff": 'args = ["--enable-cpu-offload"]\n\n[flag_sets.cpuoff-layerwise]'}[name]
    extra = "".join(f', "{a}"' for a in args)
    return hosts(old, f'args = ["--enable-cpu-offload"{extra}]\n\n[flag_sets.cpuoff-layerwise]')


def serve(key: str, value: str) -> Callable[[Path], None]:
    return hosts('health_path = "/health"\n', f'health_path = "/health"\n{key} = {value}\n'
                 if key != "health_path" else f"health_path = {value}\n")


VALIDATE = ["validate"]
HOSTS = "hosts.toml"
FLAGS = "[flag_sets.cpuoff] key 'args'"
NAME_RULE = "lower-case letters, digits and '-', starting with a letter"
PROBE_SIM = ["probe-serve", "--host", "sim", "--port", "18931", "--grace", "1"]

CASES_2 = [
    # 1. the harness owns its options: a flag set cannot give them again
    *[Case(f"flag-set-gives-{cid}", "harness-option", VALIDATE, 1, (HOSTS, FLAGS, option),
           flag_args("cpuoff", *args))
      for cid, args, option in [
          ("host", ("--host", "0.0.0.0"), "--host"),
          ("host-equals", ("--host=0.0.0.0",), "--host"),
          ("port", ("--port", "18199"), "--port"),
          ("port-equals", ("--port=18199",), "--port"),
          ("served-model-name", ("--served-model-name", "decoy"), "--served-model-name"),
          ("underscored-name", ("--served_model_name=decoy",), "--served-model-name"),
          ("abbreviated-host", ("--ho", "0.0.0.0"), "--host"),
          ("deploy-config", ("--deploy-config", "/etc/x.yaml"), "--deploy-config"),
          ("enforce-eager", ("--enforce-eager",), "--enforce-eager"),
      ]],
    Case("serve-command-gives-host", "harness-option", VALIDATE, 1,
         (HOSTS, "[serve] key 'command'", "--host"),
         hosts('command = ["vllm", "serve", "{model}", "--omni"]',
               'command = ["vllm", "serve", "{model}", "--omni", "--host", "0.0.0.0"]')),
    Case("host-serve-command-gives-port", "harness-option", VALIDATE, 1,
         (HOSTS, "[hosts.sim] key 'serve_command'", "--port"),
         hosts('"--sim-host", "{host}"]\noffline_command',
               '"--sim-host", "{host}", "--port=1"]\noffline_command')),
    Case("flag-set-option-sharing-a-prefix-is-fine", "harness-option", VALIDATE, 0, ("valid",),
         flag_args("cpuoff", "--host-ip", "10.0.0.1")),

    # 2. server paths are paths: no '@', scheme, host, '..' or query
    *[Case(f"health-path-{cid}", "url", VALIDATE, 1,
           (HOSTS, "[serve] key 'health_path'", "starting with '/'"), serve("health_path", value))
      for cid, value in [
          ("decoy-host", '"@127.0.0.1:18199/health"'), ("no-slash", '"health"'),
          ("scheme", '"http://127.0.0.1:18199/health"'), ("climbs", '"/v1/../health"'),
          ("double-slash", '"//127.0.0.1:18199/health"'), ("query", '"/health?next=x"'),
          ("escaped", '"/%2e%2e/health"'), ("space", '"/health now"'),
      ]],
    Case("ready-path-decoy", "url", VALIDATE, 1, (HOSTS, "[serve] key 'ready_path'", "'/ready@x'"),
         serve("ready_path", '"/ready@x"')),
    Case("health-path-unusual-is-fine", "url", VALIDATE, 0, ("valid",),
         serve("health_path", '"/v1/health-check_2.0~"')),

    # 3. evidence that disagrees with itself, by file, record and field
    Case("structure-sound-image-broken", "consistency", VALIDATE, 1,
         (REQ, f"$.requests[{BROKEN}]", "structure: 'sound' disagrees", "image.verdict 'broken'"),
         requests(set_in([BROKEN, "structure"], "sound"))),
    Case("report-refuses-a-structure-its-image-denies", "consistency", ["report", "--check"], 2,
         (REQ, f"$.requests[{BROKEN}]", "structure: 'sound' disagrees"),
         requests(set_in([BROKEN, "structure"], "sound"))),
    Case("structure-broken-image-sound", "consistency", VALIDATE, 1,
         (REQ, f"$.requests[{SOUND}]", "structure: 'broken' disagrees"),
         requests(set_in([SOUND, "structure"], "broken"))),
    Case("oom-rewritten-as-ok", "consistency", VALIDATE, 1,
         (REQ, f"$.requests[{OOM}]", "artifact and output_sha256: required"),
         requests(lambda r: r[OOM].update(outcome="ok"))),
    Case("oom-rewritten-as-ok-and-sound", "consistency", VALIDATE, 1,
         (REQ, f"$.requests[{OOM}]", "needs the image check"),
         requests(lambda r: r[OOM].update(outcome="ok", structure="sound", artifact="x.png",
                                          output_sha256="0" * 64))),
    Case("ok-without-its-digest", "consistency", VALIDATE, 1,
         (REQ, f"$.requests[{SOUND}]", "output_sha256: required"),
         requests(drop([SOUND, "output_sha256"]))),
    Case("ok-without-its-artifact", "consistency", VALIDATE, 1,
         (REQ, f"$.requests[{SOUND}]", "artifact: required"), requests(drop([SOUND, "artifact"]))),
    Case("sound-without-its-image-check", "consistency", VALIDATE, 1,
         (REQ, f"$.requests[{SOUND}]", "structure: 'sound' needs the image check"),
         requests(drop([SOUND, "image"]))),
    Case("oom-without-signature-or-text", "consistency", VALIDATE, 1,
         (REQ, f"$.requests[{OOM}]", "oom: required"),
         requests(lambda r: [r[OOM].pop("oom"), r[OOM].pop("error")])),
    Case("oom-without-signature-but-its-text-is-fine", "consistency", VALIDATE, 0, ("valid",),
         requests(drop([OOM, "oom"]))),
    Case("ok-with-an-oom-signature", "consistency", VALIDATE, 1,
         (REQ, f"$.requests[{SOUND}]", "oom: a 'ok' record holds no OOM signature"),
         requests(set_in([SOUND, "oom"], {"phase": "request"}))),
    Case("oom-judged-sound", "consistency", VALIDATE, 1,
         (REQ, f"$.requests[{OOM}]", "structure: 'sound' judges an image"),
         requests(set_in([OOM, "structure"], "sound"))),
    Case("peak-negative", "consistency", VALIDATE, 1,
         (REQ, f"$.requests[{SOUND}].server_peak_mb", "greater than or equal to 0"),
         requests(set_in([SOUND, "server_peak_mb"], -5.0))),
    Case("latency-negative", "consistency", VALIDATE, 1,
         (REQ, f"$.requests[{SOUND}].denoise_step_latency_ms", "greater than or equal to 0"),
         requests(set_in([SOUND, "denoise_step_latency_ms"], -1.0))),
    Case("peak-over-the-gpu", "consistency", VALIDATE, 1,
         (REQ, f"$.requests[{SOUND}].server_peak_mb", "exceeds the GPU's memory",
          "24,576 MiB (the simulated card's [capacity] vram_mib)"),
         requests(set_in([SOUND, "server_peak_mb"], 30000.0))),
    Case("run-peak-over-the-gpu", "consistency", VALIDATE, 1,
         (RUNS, f"$.runs[{CPUOFF}].gpu_peak_mib", "exceeds the GPU's memory"),
         json_edit(RUNS, set_in(["runs", CPUOFF, "gpu_peak_mib"], 99999))),
    Case("timeline-peak-over-the-gpu", "consistency", VALIDATE, 1,
         (RUNS, f"$.runs[{CPUOFF}].lifetimes[1].timeline.device_peak_mib", "exceeds"),
         json_edit(RUNS, set_in(["runs", CPUOFF, "lifetimes", 1, "timeline", "device_peak_mib"],
                                1e9))),
    Case("transcribed-peak-over-the-card", "consistency", VALIDATE, 1,
         (f"{MATRIX}/runs.json", "$.runs[1].cells[0].server_peak_mb.max",
          "24,576 MiB (vram_gb 24 of hosts.toml, read as GiB)"),
         json_edit(f"{MATRIX}/runs.json",
                   set_in(["runs", 1, "cells", 0, "server_peak_mb"], {"min": 1, "max": 24577}))),
    Case("transcribed-peak-at-the-card-is-fine", "consistency", VALIDATE, 0, ("valid",),
         json_edit(f"{MATRIX}/runs.json",
                   set_in(["runs", 1, "cells", 0, "server_peak_mb"], {"min": 1, "max": 24576}))),
    Case("emulated-peak-over-its-cap", "consistency", VALIDATE, 1,
         (f"{EMULATED}/runs.json", "$.runs[0].gpu_peak_mib",
          "32,768 MiB (the emulated cap the simulated account took as its total)"),
         json_edit(f"{EMULATED}/runs.json", set_in(["runs", 0, "gpu_peak_mib"], 40000))),
    Case("offline-peak-negative", "consistency", VALIDATE, 1,
         (f"{OFFLINE}/offline-requests.json", "$.offline_requests[0].peak_mib"),
         json_edit(f"{OFFLINE}/offline-requests.json",
                   set_in(["offline_requests", 0, "peak_mib"], -1.0))),
    Case("offline-structure-disagrees", "consistency", VALIDATE, 1,
         (f"{OFFLINE}/offline-requests.json", "$.offline_requests[0]", "disagrees"),
         json_edit(f"{OFFLINE}/offline-requests.json",
                   set_in(["offline_requests", 0, "structure"], "broken"))),
    Case("wall-1e300", "consistency", VALIDATE, 1,
         (REQ, f"$.requests[{SOUND}].wall_s", "less than or equal to 604800"),
         requests(set_in([SOUND, "wall_s"], 1e300))),
    Case("wall-over-the-recorded-timeout", "consistency", VALIDATE, 1,
         (REQ, f"$.requests[{SOUND}].wall_s", "exceeds the request timeout in force, 10 s",
          "plus 30 s"),
         both(json_edit(RUNS, set_in(["runs", CPUOFF, "lifetimes", 1, "request_timeout_s"], 10)),
              requests(set_in([SOUND, "wall_s"], 100.0)))),
    Case("wall-within-the-recorded-timeout-is-fine", "consistency", VALIDATE, 0, ("valid",),
         json_edit(RUNS, set_in(["runs", CPUOFF, "lifetimes", 1, "request_timeout_s"], 10))),
    Case("duplicate-key-in-a-record", "consistency", VALIDATE, 1,
         (REQ, "the key 'outcome' appears twice"), duplicate_key(REQ, "outcome")),
    Case("duplicate-key-in-attempt", "consistency", VALIDATE, 1,
         (f"{PROBE}/attempt.json", "the key 'host' appears twice"),
         duplicate_key(f"{PROBE}/attempt.json", "host")),
    Case("duplicate-key-in-fixtures", "consistency", VALIDATE, 1,
         (FIXTURES, "the key 'prompt' appears twice"), duplicate_key(FIXTURES, "prompt")),
    Case("duplicate-key-in-a-timeline", "consistency", ["timeline", "s.jsonl"], 2,
         ("s.jsonl", "line 1"),
         write("s.jsonl", '{"t": 0, "device_mib": 1, "device_mib": 9}\n{"t": 1, "device_mib": 2}\n')),
    Case("timestamp-year-9999", "consistency", VALIDATE, 1,
         (f"{PROBE}/attempt.json", "started_at", "a timestamp from 2000-01-01 up to now"),
         json_edit(f"{PROBE}/attempt.json",
                   set_in(["attempt", "provenance", "started_at"], "9999-01-01T00:00:00Z"))),
    Case("timestamp-1970", "consistency", VALIDATE, 1,
         (f"{PROBE}/attempt.json", "started_at", "a timestamp from 2000-01-01"),
         json_edit(f"{PROBE}/attempt.json",
                   set_in(["attempt", "provenance", "started_at"], "1970-01-01T00:00:00Z"))),
    Case("lifetime-started-in-9999", "consistency", VALIDATE, 1,
         (RUNS, f"$.runs[{CPUOFF}].lifetimes[0].started_at", "a timestamp from 2000-01-01"),
         json_edit(RUNS, set_in(["runs", CPUOFF, "lifetimes", 0, "started_at"],
                                "9999-12-31T23:59:59Z"))),

    # 5. names are names
    Case("host-name-climbs-out", "name", VALIDATE, 1,
         (HOSTS, "[hosts] name '../../../x'", NAME_RULE),
         hosts("[hosts.rtx3090-on-h200]\n", '[hosts."../../../x"]\n')),
    Case("host-name-with-a-space", "name", VALIDATE, 1, (HOSTS, "[hosts] name 'my sim'", NAME_RULE),
         hosts("[hosts.sim-emulated]\n", '[hosts."my sim"]\n')),
    Case("host-name-capitalised", "name", VALIDATE, 1, (HOSTS, "[hosts] name 'Sim'"),
         hosts("[hosts.sim-emulated]\n", "[hosts.Sim]\n")),
    Case("flag-set-name-capitalised", "name", VALIDATE, 1, (HOSTS, "[flag_sets] name 'CpuOff'"),
         hosts("[flag_sets.int8]\n", "[flag_sets.CpuOff]\n")),
    Case("flag-set-name-dotdot", "name", VALIDATE, 1, (HOSTS, "[flag_sets] name '..'", NAME_RULE),
         hosts("[flag_sets.int8]\n", '[flag_sets.".."]\n')),
    Case("flag-set-name-with-a-slash", "name", VALIDATE, 1, (HOSTS, "[flag_sets] name 'a/b'"),
         hosts("[flag_sets.int8]\n", '[flag_sets."a/b"]\n')),
    Case("kwarg-set-name-underscored", "name", VALIDATE, 1,
         (HOSTS, "[offline_kwarg_sets] name 'offline_fp8'"),
         hosts("[offline_kwarg_sets.offline-fp8-encoder-only]\n",
               "[offline_kwarg_sets.offline_fp8]\n")),
    Case("deploy-config-name-dotted", "name", VALIDATE, 1,
         (HOSTS, "[deploy_configs] name 'deploy.fp8v'"),
         hosts("[deploy_configs.deploy-fp8v]\n", '[deploy_configs."deploy.fp8v"]\n')),
    Case("name-too-long", "name", VALIDATE, 1, (HOSTS, "at most 64 characters"),
         hosts("[flag_sets.int8]\n", f"[flag_sets.{'a' * 65}]\n")),
    Case("fixture-id-climbs-out", "name", VALIDATE, 1,
         (FIXTURES, f"$.fixtures[{T2I}].id", NAME_RULE),
         fixtures(set_in(["fixtures", T2I, "id"], "../x"))),
    Case("fixture-id-starts-with-a-digit", "name", VALIDATE, 1, (FIXTURES, f"$.fixtures[{T2I}].id"),
         fixtures(set_in(["fixtures", T2I, "id"], "2pair"))),
    Case("fixture-id-capitalised", "name", VALIDATE, 1, (FIXTURES, f"$.fixtures[{T2I}].id"),
         fixtures(set_in(["fixtures", T2I, "id"], "Sim-T2i"))),
    Case("a-new-name-of-the-pattern-is-fine", "name", VALIDATE, 0, ("valid",),
         hosts("[flag_sets.int8]\n", '[flag_sets.x9-b]\ndescription = "x"\n\n[flag_sets.int8]\n')),

    # 6. the probe never writes evidence validate rejects: refused at load instead
    Case("seeds-repeated", "numbers", VALIDATE, 1, (FIXTURES, "$.sampling", "repeated: [2301]"),
         fixtures(set_in(["sampling", "seeds"], [2301, 2302, 2301]))),

    # 13. absurd numbers, with the bound
    Case("vram-over-1024", "numbers", VALIDATE, 1,
         (HOSTS, "[hosts.rtx3090] key 'vram_gb'", "less than or equal to 1024"),
         hosts("vram_gb = 24", "vram_gb = 1025")),
    Case("vram-zero", "numbers", VALIDATE, 1, (HOSTS, "[hosts.rtx3090] key 'vram_gb'", "greater than 0"),
         hosts("vram_gb = 24", "vram_gb = 0")),
    Case("issue-negative", "numbers", VALIDATE, 1,
         (REPORT_SETTINGS, "key 'serving_profile_issue'", "greater than or equal to 1"),
         report_settings("serving_profile_issue = 27", "serving_profile_issue = -27")),
    Case("issue-absurd", "numbers", VALIDATE, 1,
         (REPORT_SETTINGS, "key 'topology_issue'", "less than or equal to 10000000"),
         report_settings("topology_issue = 164", "topology_issue = 99999999999")),
    Case("seed-at-2-32", "numbers", VALIDATE, 1,
         (FIXTURES, "$.sampling.seeds[0]", "less than or equal to 4294967295"),
         fixtures(set_in(["sampling", "seeds", 0], 2**32))),
    Case("seed-at-2-32-minus-1-is-fine", "numbers", VALIDATE, 0, ("valid",),
         fixtures(set_in(["sampling", "seeds", 0], 2**32 - 1))),
    Case("record-seed-over-2-32", "numbers", VALIDATE, 1,
         (REQ, f"$.requests[{SOUND}].seed", "4294967295"),
         requests(set_in([SOUND, "seed"], 2**40))),
    Case("sim-capacity-over-2-40-bytes", "numbers", VALIDATE, 1,
         ("sim.toml", "[capacity.sim] key 'vram_mib'", "less than or equal to 1048576"),
         sim("vram_mib = 24576", f"vram_mib = {2**21}")),
    Case("sim-weights-over-2-40-bytes", "numbers", VALIDATE, 1,
         ("sim.toml", "[capacity.sim] key 'dit_mib.bf16'", "1048576"),
         sim("dit_mib = { bf16 = 14336", f"dit_mib = {{ bf16 = {2**30}")),
    Case("emulation-cap-over-2-40-bytes", "numbers", VALIDATE, 1,
         (HOSTS, "[hosts.sim-emulated] key 'emulation.capacity_mib'", "1048576"),
         hosts('[hosts.sim-emulated.emulation]\nemulates = "sim"\n',
               f'[hosts.sim-emulated.emulation]\nemulates = "sim"\ncapacity_mib = {2**22}\n')),
    Case("evidence-cap-over-2-40-bytes", "numbers", VALIDATE, 1,
         (f"{EMULATED}/attempt.json", "cap_mib", "less than or equal to 1048576"),
         json_edit(f"{EMULATED}/attempt.json",
                   set_in(["attempt", "provenance", "cap_mib"], 2**30))),
    Case("request-timeout-over-a-week", "numbers", VALIDATE, 1,
         (HOSTS, "[serve] key 'request_timeout_s'", "604800"),
         serve("request_timeout_s", "1e7")),
    Case("grace-over-an-hour", "numbers", VALIDATE, 1, (HOSTS, "[serve] key 'stop_grace_s'", "3600"),
         serve("stop_grace_s", "1e9")),
    Case("host-ram-negative", "numbers", VALIDATE, 1,
         (HOSTS, "[hosts.rtx5080] key 'host_ram_gib'", "greater than 0"),
         hosts("host_ram_gib = 30", "host_ram_gib = -30")),
    # A malformed --caps is a bad argument (2), as every other (issue 34; it was a refusal, 3).
    *[Case(f"caps-{cid}", "numbers", ["probe-serve", "--host", "sim-emulated", "--caps", caps], 2,
           ("--caps", "from 1 MiB (0.001) up to 1024 GiB (2**40 bytes)", repr(item)))
      for cid, caps, item in [("tiny", "0.0001", "0.0001"), ("huge", "12,2000", "2000"),
                              ("nan", "nan", "nan"), ("negative", "-4", "-4")]],
    *[Case(f"option{argv[1]}={argv[2]}", "numbers", [verb, *argv[1:]], 2, (argv[1], argv[2]))
      for verb, argv in [
          ("probe-serve", ["", "--sample-hz", "1e-300"]),
          ("probe-init", ["", "--sample-hz", "0.05"]),
          ("probe-offline", ["", "--seed", str(2**32)]),
          ("propagation", ["", "--seed", str(2**40)]),
          ("probe-serve", ["", "--request-timeout", "1e9"]),
      ]],

    # 12. secrets and environment
    *[Case(f"env-{var.lower()}-undeclared", "environment", VALIDATE, 1,
           (HOSTS, "[flag_sets.cpuoff-expandable]", var, "deliberate_env"),
           hosts('env = { PYTORCH_CUDA_ALLOC_CONF = "expandable_segments:True" }\n\n'
                 '[flag_sets.fp8]',
                 f'env = {{ PYTORCH_CUDA_ALLOC_CONF = "expandable_segments:True", {var} = "/x" }}'
                 '\n\n[flag_sets.fp8]'))
      for var in ("LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")],
    Case("kwarg-set-env-pythonpath", "environment", VALIDATE, 1,
         (HOSTS, "[offline_kwarg_sets.offline-fp8v-expandable]", "PYTHONPATH"),
         hosts('env = { PYTORCH_CUDA_ALLOC_CONF = "expandable_segments:True" }\n\n'
               '[offline_kwarg_sets.offline-fp8-no-img-mlp]',
               'env = { PYTHONPATH = "/tmp/evil" }\n\n[offline_kwarg_sets.offline-fp8-no-img-mlp]')),
    Case("env-deliberate-is-fine", "environment", VALIDATE, 0, ("valid",),
         hosts('env = { PYTORCH_CUDA_ALLOC_CONF = "expandable_segments:True" }\n\n'
               '[flag_sets.fp8]',
               'env = { LD_LIBRARY_PATH = "/opt/cuda/lib64" }\ndeliberate_env = ["LD_LIBRARY_PATH"]'
               '\n\n[flag_sets.fp8]')),
    Case("env-deliberate-but-unset", "environment", VALIDATE, 1,
         (HOSTS, "deliberate_env names LD_PRELOAD, which env does not set"),
         hosts('env = { PYTORCH_CUDA_ALLOC_CONF = "expandable_segments:True" }\n\n'
               '[flag_sets.fp8]',
               'env = { PYTORCH_CUDA_ALLOC_CONF = "x" }\ndeliberate_env = ["LD_PRELOAD"]'
               '\n\n[flag_sets.fp8]')),
    *[Case(f"memory-file-env-{value.lower()}", "environment", VALIDATE, 1,
           (HOSTS, "[hosts.sim] key 'memory_file_env'", "OMNIPROBE_"),
           hosts('memory_file_env = "OMNIPROBE_SIM_STATE"   # where',
                 f'memory_file_env = "{value}"   # where'))
      for value in ("LD_PRELOAD", "HOME", "OMNIPROBE_")],
    *[Case(f"serve-command-{cid}", "environment", VALIDATE, 1, (HOSTS, where, "is a shell"),
           hosts(old, new))
      for cid, where, old, new in [
          ("bin-sh", "[serve] key 'command'", 'command = ["vllm", "serve"',
           'command = ["/bin/sh", "-c", "vllm serve"'),
          ("bash", "[serve] key 'command'", 'command = ["vllm", "serve"',
           'command = ["bash", "-c", "vllm serve"'),
          ("env-then-sh", "[hosts.sim] key 'serve_command'",
           'serve_command = ["{python}", "-m", "omniprobe.sim", "serve", "{model}", "--omni", '
           '"--hosts-file", "{hosts_file}", "--sim-host", "{host}"]\noffline_command',
           'serve_command = ["/usr/bin/env", "A=1", "sh", "-c", "x"]\noffline_command'),
          ("offline-dash", "[hosts.sim] key 'offline_command'",
           'offline_command = ["{python}", "-m", "omniprobe.sim", "offline", "--hosts-file", '
           '"{hosts_file}", "--sim-host", "{host}"]\nmodel_code = ["omniprobe/sim/model"]   # the',
           'offline_command = ["dash", "-c", "x"]\nmodel_code = ["omniprobe/sim/model"]   # the'),
      ]],

    # 10. references are images of their own, in place, of sane size (pins kept right)
    Case("reference-hard-link-from-outside", "reference", VALIDATE, 1,
         (FIXTURES, f"$.fixtures[{SINGLE}].references[0].file", "has 2 hard links"),
         hard_link_from_outside),
    Case("reference-13000-square", "reference", VALIDATE, 1,
         (FIXTURES, "13000x13000 is 169000000 pixels, over the limit of 16777216"),
         reference_is(huge_png)),
    Case("reference-truncated", "reference", VALIDATE, 1,
         (FIXTURES, "ref-a.png: does not decode completely"),
         reference_is(lambda p: p.read_bytes()[: len(p.read_bytes()) // 2])),
    Case("reference-a-shell-script", "reference", VALIDATE, 1,
         (FIXTURES, "not an image Pillow can identify"), reference_is(b"#!/bin/sh\nrm -rf ~\n")),
    Case("reference-empty", "reference", VALIDATE, 1, (FIXTURES, "not an image"),
         reference_is(b"")),
    Case("reference-over-the-hosts-bound", "reference", VALIDATE, 1,
         (FIXTURES, "over the limit of 100 (hosts.toml [probe] max_reference_pixels)"),
         hosts("max_reference_pixels = 16777216", "max_reference_pixels = 100")),
    Case("reference-bound-over-4096-square", "reference", VALIDATE, 1,
         (HOSTS, "[probe] key 'max_reference_pixels'", "16777216"),
         hosts("max_reference_pixels = 16777216", "max_reference_pixels = 16777217")),
    Case("reference-truncated-never-reaches-a-server", "reference",
         [*PROBE_SIM, "--fixture", "sim-single"], 2,
         ("reference 'sim-ref-a' of fixture 'sim-single'", "does not decode completely"),
         reference_is(lambda p: p.read_bytes()[:200])),

    # 11. the file system: an error line naming the path, never a temp file's name
    Case("report-md-a-folder", "filesystem", ["report"], 4,
         ("REPORT.md: is a folder where a file belongs",), replace_with_folder("REPORT.md")),
    Case("report-check-md-a-folder", "filesystem", ["report", "--check"], 4,
         ("REPORT.md: Is a directory",), replace_with_folder("REPORT.md")),
    Case("schemas-a-file", "filesystem", ["schema"], 4,
         ("schemas: a file where a folder belongs",),
         lambda root: (shutil.rmtree(root / "schemas"), (root / "schemas").write_text("x"))),
    Case("templates-missing", "filesystem", ["report"], 2,
         ("templates/report.toml: file not found",),
         lambda root: shutil.rmtree(root / "templates")),
    Case("template-missing", "filesystem", ["report"], 2,
         ("templates/report.md.j2: template not found",),
         lambda root: (root / "templates" / "report.md.j2").unlink()),
    Case("template-broken", "filesystem", ["report"], 2,
         ("templates/report.md.j2: line 1: not a valid template",),
         write("templates/report.md.j2", "{% if %}\n")),
    Case("timeline-output-a-folder", "filesystem", ["timeline", "s.jsonl", "-o", "out.svg"], 4,
         ("out.svg: is a folder where a file belongs",),
         both(write("s.jsonl", '{"t": 0, "device_mib": 1}\n{"t": 1, "device_mib": 2}\n'),
              lambda root: (root / "out.svg").mkdir())),
]


def _run(argv: list[str], root: Path, capsys) -> tuple[int, str]:
    """`omniprobe ARGV` run in `root`; the working folder is put back after (a passed test's
    tmp_path is removed: a later test must not start in it)."""
    before = os.getcwd()
    os.chdir(root)
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse refuses an option
        code = exc.code
    finally:
        os.chdir(before)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@pytest.fixture
def hostile(repo_copy: Project, monkeypatch) -> Project:
    monkeypatch.setenv("OMNIPROBE_ROOT", str(repo_copy.root))
    monkeypatch.chdir(repo_copy.root)
    return repo_copy


@pytest.fixture(autouse=True)
def _no_hang():
    """A case that blocks (a FIFO read) fails instead of hanging the suite."""
    def stop(*_):
        raise TimeoutError("the command hung")
    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


ALL_CASES = CASES + CASES_2


@pytest.mark.parametrize("case", ALL_CASES, ids=[c.id for c in ALL_CASES])
def test_hostile_input(case: Case, hostile: Project, capsys):
    if case.breaks:
        case.breaks(hostile.root)
    code, output = _run(case.argv, hostile.root, capsys)
    assert "Traceback" not in output
    assert not TMP_NAME.search(output), output  # a temp file is never shown as the user's
    assert code == case.exit_code, output
    for text in case.says:
        assert text in output, f"{text!r} not in:\n{output}"


# --- cases that need more than one file changed ---------------------------------------------


def test_symlinked_attempt_folder_from_outside(hostile: Project, tmp_path_factory, capsys):
    outside = tmp_path_factory.mktemp("elsewhere") / "attempt"
    symlink_out(PROBE, outside)(hostile.root)
    code, output = _run(["validate"], hostile.root, capsys)
    assert "Traceback" not in output
    assert code == 1
    assert f"{PROBE}: a symlink to {outside}" in output


def test_symlinked_evidence_file_from_outside(hostile: Project, tmp_path_factory, capsys):
    outside = tmp_path_factory.mktemp("elsewhere") / "requests.json"
    symlink_out(f"{PROBE}/requests.json", outside)(hostile.root)
    code, output = _run(["validate"], hostile.root, capsys)
    assert code == 1
    assert f"{PROBE}/requests.json: a symlink to {outside}" in output


def test_symlinked_reference_from_outside_is_refused(hostile, tmp_path_factory, capsys):
    """A reference whose digest matches but whose file lies outside fixtures/ is not read."""
    outside = tmp_path_factory.mktemp("elsewhere") / "ref-a.png"
    symlink_out(SIM_REF, outside)(hostile.root)
    code, output = _run(["validate"], hostile.root, capsys)
    assert "Traceback" not in output
    assert code == 1
    assert (f"{FIXTURES}: $.fixtures[{SINGLE}].references[0].file: sim/ref-a.png: resolves "
            f"outside {hostile.root / 'fixtures'}") in output
    code, output = _run(["env", "check", "--host", "sim"], hostile.root, capsys)
    assert code == 1 and "FAIL fixtures.references: sim/ref-a.png: resolves outside" in output


def test_a_wrong_pin_is_not_hidden_by_a_right_one(hostile: Project, capsys):
    """sim-single and sim-pair both pin sim/ref-a.png; a wrong digest on one fails the check."""
    fixtures(set_in(["fixtures", PAIR, "references", 0, "sha256"], "0" * 64))(hostile.root)
    code, output = _run(["validate"], hostile.root, capsys)
    assert code == 1
    assert (f"{FIXTURES}: $.fixtures[{PAIR}].references[0].sha256: sim/ref-a.png: sha256 "
            "differs from the pinned 000000000000") in output
    assert f"$.fixtures[{SINGLE}]" not in output
    code, output = _run(["env", "check", "--host", "sim"], hostile.root, capsys)
    assert code == 1
    assert "FAIL fixtures.references: sim/ref-a.png: sha256 differs from the pinned 0000" in output


def test_right_pins_on_a_shared_file_pass(hostile: Project, capsys):
    code, output = _run(["env", "check", "--host", "sim"], hostile.root, capsys)
    assert code == 0, output
    assert "PASS fixtures.references" in output and "files match the fixtures' sha256" in output


def _big_png(path: Path, side: int) -> Path:
    Image.new("1", (side, side)).save(path)  # 1 bit a pixel: a few KB on disk
    return path


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
@pytest.mark.parametrize("name, make, says", [
    ("fifo", lambda p: os.mkfifo(p), "is not a regular file"),
    ("huge", lambda p: _big_png(p, 12000), "12000x12000 is 144000000 pixels, over the limit"),
    ("text", lambda p: p.write_text("not an image"), "not an image Pillow can identify"),
    ("empty", lambda p: p.write_bytes(b""), "not an image"),
    ("device", lambda p: p.symlink_to("/dev/zero"), "is not a regular file"),
])
def test_image_check_refuses(name, make, says, tmp_path, capsys):
    path = tmp_path / f"{name}.png"
    make(path)
    code, output = _run(["image-check", str(path)], tmp_path, capsys)
    assert "Traceback" not in output
    assert code == 2
    assert f"{path}: {says}" in output


def test_image_check_skips_a_fifo_when_searching_a_folder(tmp_path, capsys):
    os.mkfifo(tmp_path / "pipe.png")
    Image.new("RGBA", (16, 16), (10, 200, 30, 255)).save(tmp_path / "ok.png")
    code, output = _run(["image-check", str(tmp_path)], tmp_path, capsys)
    assert "ok.png" in output and "pipe.png" not in output
    assert code in (0, 1)


def test_the_image_limit_is_the_largest_output_a_fixture_asks_for():
    from omniprobe.classify.imaging import MAX_IMAGE_PIXELS
    from omniprobe.config.fixtures import MAX_SIDE_PX

    assert MAX_IMAGE_PIXELS == MAX_SIDE_PX ** 2


def test_the_text_loader_refuses_an_oversized_file(tmp_path):
    from omniprobe.errors import InputError
    from omniprobe.safe_io import read_text

    path = tmp_path / "big.json"
    path.write_text("x" * 11)
    with pytest.raises(InputError, match="big.json: larger than the limit of 10 bytes"):
        read_text(path, max_bytes=10)
    assert read_text(path, max_bytes=11) == "x" * 11


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="needs Linux's /proc")
def test_a_file_longer_than_its_stated_size_is_read_whole_and_still_bounded():
    """The read is sized by the file's stat: a file that holds more (it grew, or /proc's, which
    say 0 bytes) is read on to its end, and the bound still holds."""
    from omniprobe.errors import InputError
    from omniprobe.safe_io import read_bytes

    path = Path("/proc/self/status")
    assert path.stat().st_size == 0
    data = read_bytes(path)
    assert data.startswith(b"Name:") and data.endswith(b"\n") and len(data) > 100
    with pytest.raises(InputError, match="larger than the limit of 10 bytes"):
        read_bytes(path, max_bytes=10)


@pytest.mark.parametrize("relative, ok", [
    ("sim/ref-a.png", True), ("a/./b.png", True), ("/etc/passwd", False), ("../x", False),
    ("a/../../x", False), ("~root/x", False), ("a\\..\\x", False), ("", False), (" a", False),
])
def test_confine_relative_paths(relative, ok, tmp_path):
    from omniprobe.errors import InputError
    from omniprobe.safe_io import confine

    if ok:
        assert confine(tmp_path, relative, file="f.json", field="$.x").is_relative_to(tmp_path)
    else:
        with pytest.raises(InputError, match=r"f\.json: \$\.x: "):
            confine(tmp_path, relative, file="f.json", field="$.x")


def test_valid_unusual_options_are_accepted():
    args = cli.build_parser().parse_args(["probe-serve", "--grace", "0", "--idle-timeout", "0",
                                          "--port", "65535", "--request-timeout", "0.5",
                                          "--sample-hz", "1000"])
    assert (args.grace, args.idle_timeout, args.port, args.request_timeout, args.sample_hz) == (
        0, 0, 65535, 0.5, 1000)


def test_the_hostile_table_covers_every_class():
    def counts(cases):
        found: dict[str, int] = {}
        for case in cases:
            found[case.kind] = found.get(case.kind, 0) + 1
        return found

    assert set(counts(CASES)) == {"loader", "strict", "path", "option", "repeat"}
    assert len(CASES) >= 60
    assert set(counts(CASES_2)) == {"consistency", "harness-option", "url", "name", "numbers",
                                    "environment", "reference", "filesystem"}
    assert len(CASES_2) >= 60
    assert len({c.id for c in CASES_2}) == len(CASES_2) and not {c.id for c in CASES_2} & {
        c.id for c in CASES}


# --- faults and concurrency -----------------------------------------------------------------


def test_a_full_artifacts_disk_loses_no_record_shown_as_ok(project, port, monkeypatch):
    """Image writes fail with ENOSPC after the second (the write itself stands in for the disk,
    so this runs anywhere; the tmpfs test below fills a real one): the probe stops as the
    machine's failure,
    every request the console showed is on disk, and a resume completes the attempt."""
    import errno
    import re

    from omniprobe.evidence.load import load_attempt
    from omniprobe.evidence.validate import load_project
    from omniprobe.harness.common import recorder  # the one recorder writes images

    from .conftest import in_process, probe_argv

    real, writes = recorder.write_bytes_atomic, []

    def full_disk(path, data):
        writes.append(path)
        if len(writes) > 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real(path, data)

    monkeypatch.setattr(recorder, "write_bytes_atomic", full_disk)
    argv = probe_argv("probe-serve", port, "--flag-set", "cpuoff")
    code, out = in_process(project, argv)
    assert "Traceback" not in out
    assert code == 4, out
    assert "could not be written (" in out and "No space left on device" in out
    [folder] = (project.evidence_dir / "sim").iterdir()
    attempt, problems = load_attempt(folder)
    assert problems == []
    shown = set(re.findall(r"\] (\S+) seed (\d+): (\w+)", out))
    on_disk = {(r.fixture, str(r.seed), r.outcome) for r in attempt.requests}
    assert len(shown) == 3 and shown == on_disk  # two images written, and the OOM (no image)

    monkeypatch.setattr(recorder, "write_bytes_atomic", real)
    code, out = in_process(project, argv)
    assert code == 0, out
    attempt, problems = load_attempt(folder)
    assert problems == []
    assert len(attempt.requests) == 5
    assert load_project(project)[1] == []


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs of its own (mounting one needs root, as CI runs), unmounted after."""
    import subprocess

    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)],
                             capture_output=True, text=True, timeout=30)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True, timeout=30)


@pytest.mark.parametrize(("fills_when", "exit_code", "stops_on"), [
    # mid-run: the image writes fail; what the console showed is on disk
    ("*.png", 4, "No space left on device"),
    # at the server's start: it dies writing its log; its init is the environment's, not the card's
    ("server.log", 4, "no space left on the disk of"),
])
# The e2e tier, as a real disk: the default run holds the same where the write itself stands in
# for the disk (the test above).
@pytest.mark.e2e
def test_an_artifacts_disk_that_fills_mid_run_loses_no_record_shown_as_ok(
        project, port, small_disk, monkeypatch, fills_when, exit_code, stops_on):
    """A real full disk: artifacts on a small tmpfs that a filler takes up once the first file
    named `fills_when` is there. Every write there may fail now (images, the server's log, the
    timeline): the probe stops without a traceback, every request the console showed is on disk,
    and once space is back a resume completes the attempt and the evidence validates."""
    import re
    import threading

    from omniprobe.evidence.load import load_attempt
    from omniprobe.evidence.validate import load_project

    from .conftest import in_process, probe_argv

    monkeypatch.setenv("OMNIPROBE_ARTIFACTS", str(small_disk / "artifacts"))
    monkeypatch.setenv("OMNIPROBE_SIM_TIME_SCALE", "0.2")  # 80 ms a request: the filler wins
    filler = small_disk / "filler"
    done = threading.Event()

    def fill_once_it_is_there() -> None:
        while not done.is_set():
            if any((small_disk / "artifacts").rglob(fills_when)):
                # Unbuffered: the write that meets ENOSPC leaves nothing for the close to flush.
                with open(filler, "wb", buffering=0) as handle:
                    try:
                        while True:
                            handle.write(b"\0" * 65536)
                    except OSError:
                        pass  # ENOSPC: the disk is full
                return
            done.wait(0.005)

    watcher = threading.Thread(target=fill_once_it_is_there, daemon=True)
    watcher.start()
    argv = probe_argv("probe-serve", port, "--flag-set", "cpuoff")
    try:
        code, out = in_process(project, argv)
    finally:
        done.set()
        watcher.join(10)
    assert filler.exists(), out  # the disk did fill during the run
    assert "Traceback" not in out
    assert code == exit_code and stops_on in out, out
    [folder] = (project.evidence_dir / "sim").iterdir()
    attempt, problems = load_attempt(folder)
    assert problems == []
    shown = set(re.findall(r"\] (\S+) seed (\d+): ok\b", out))
    on_disk = {(r.fixture, str(r.seed)) for r in attempt.requests if r.outcome == "ok"}
    assert shown <= on_disk, (shown, on_disk, out)
    assert len(attempt.requests) < 5

    filler.unlink()  # space is back
    code, out = in_process(project, argv)
    assert code == 0, out
    attempt, problems = load_attempt(folder)
    assert problems == []
    assert {(r.fixture, r.seed) for r in attempt.requests
            if not r.transport_failure} == {(f, 2301) for f in (
                "standin-single", "standin-pair", "standin-three", "standin-four", "standin-t2i")}
    assert [r.init.outcome for r in attempt.runs] == ["ready"]
    assert load_project(project)[1] == []


def test_a_second_open_attempt_in_a_loop_leaves_a_writing_probe_alone(project):
    """Before the fix, opening the attempt deleted the writer's in-flight temp file."""
    SEEDS = 40
    import threading

    from omniprobe.evidence.attempts import AttemptBusy
    from omniprobe.evidence.load import load_attempt
    from omniprobe.evidence.models.requests import RequestRecord

    from .conftest import open_sim_attempt

    store = open_sim_attempt(project, ["omniprobe", "probe-serve"], fresh=True)
    stop, refused, failed = threading.Event(), [], []

    def intruder():
        while not stop.is_set():
            try:
                open_sim_attempt(project, ["omniprobe", "probe-serve"], fresh=False).close()
            except AttemptBusy:
                refused.append(True)
            except Exception as exc:  # noqa: BLE001 - the test reports what the intruder met
                failed.append(exc)

    thread = threading.Thread(target=intruder)
    thread.start()
    try:
        for seed in range(SEEDS):  # large records: each write's temp file lives a while
            store.add_request(RequestRecord(flag_set="cpuoff", fixture="sim-t2i", seed=seed,
                                            outcome="error", structure="unchecked", wall_s=0.1,
                                            error="stand-in " * 4000))
    finally:
        stop.set()
        thread.join()
        store.close()
    loaded, problems = load_attempt(store.folder)
    assert problems == []
    assert [r.seed for r in loaded.requests] == list(range(SEEDS))
    assert refused and failed == []


def test_rewritten_evidence_keeps_its_mode(tmp_path):
    from omniprobe.atomic import write_text_atomic

    path = tmp_path / "runs.json"
    write_text_atomic(path, "{}")
    umask = os.umask(0o022)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
    path.chmod(0o640)
    write_text_atomic(path, "[]")
    assert path.stat().st_mode & 0o777 == 0o640 and path.read_text() == "[]"



def _serve_with_the_server_killed_at_request_2(tmp_path, port, monkeypatch):
    """probe-serve of three seeds whose server hangs on request 2 and is SIGKILLed while it holds
    it; (project, argv, exit code, output)."""
    import threading

    from .conftest import in_process, make_project, probe_argv, processes_with, wait_for

    project = make_project(tmp_path, faults=["hang@2"], seeds=[2301, 2302, 2303])
    monkeypatch.setenv("OMNIPROBE_ROOT", str(tmp_path))
    argv = probe_argv("probe-serve", port, "--flag-set", "fp8", "--fixture", "sim-t2i",
                      "--request-timeout", "60")

    def kill_the_server_on_request_2():
        records = tmp_path / "evidence" / "sim"
        assert wait_for(lambda: any(records.glob("*/requests.json")), 60)
        time.sleep(0.5)  # request 2 hangs in the server
        for pid, cmdline in processes_with(f"--port {port}"):
            if "omniprobe.sim serve" in cmdline:
                os.kill(pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_the_server_on_request_2)
    killer.start()
    code, out = in_process(project, argv)
    killer.join()
    return project, argv, code, out

@pytest.mark.e2e
def test_a_request_lost_with_a_killed_server_is_sent_again_on_resume(tmp_path, port, monkeypatch):
    """The server is SIGKILLed while it holds request 2: that record says the transport failed,
    a resume sends it again and records it after, and the cell's summary takes the resend."""
    from omniprobe.analysis.summaries import cells_from_requests
    from omniprobe.evidence.load import load_attempt
    from omniprobe.evidence.validate import load_project

    from .conftest import in_process, processes_with

    project, argv, code, out = _serve_with_the_server_killed_at_request_2(tmp_path, port,
                                                                          monkeypatch)
    # The lost request measured nothing: the run is not done (issue 23).
    assert code == 1, out
    assert out.rstrip().endswith("re-run to measure them")
    assert "unsettled: fp8: 1 of 3 cell(s) not measured" in out
    [folder] = (project.evidence_dir / "sim").iterdir()
    attempt, _ = load_attempt(folder)
    assert [(r.seed, r.outcome, r.transport_failure) for r in attempt.requests] == [
        (2301, "ok", False), (2302, "error", True), (2303, "ok", False)], attempt.requests[1].error

    # The hang fault is per server process: the resume's server answers request 2302.
    code, out = in_process(project, argv)
    assert code == 0, out
    attempt, _ = load_attempt(folder)
    assert [(r.seed, r.outcome, r.transport_failure) for r in attempt.requests] == [
        (2301, "ok", False), (2302, "error", True), (2303, "ok", False), (2302, "ok", False)]
    assert load_project(project)[1] == []
    [cell] = cells_from_requests(attempt.requests)["fp8"]
    assert cell.outcome == "ok" and cell.seeds == [2301, 2302, 2303]
    assert not processes_with(str(tmp_path))


@pytest.mark.e2e
def test_a_server_the_kernel_killed_for_host_ram_is_the_hosts_failure_not_resent(
        tmp_path, port, monkeypatch):
    """Issue 23: the server is SIGKILLed while it holds request 2 and the host's available memory
    in the sampler's last readings is low: the host ran out of RAM. The record says so, is not a
    transport failure, and a re-run has nothing left to send."""
    from omniprobe.evidence.load import load_attempt
    from omniprobe.harness.common import sampler as sampler_module

    from .conftest import in_process, processes_with

    monkeypatch.setattr(sampler_module, "available_mib", lambda: 300.0)
    project, argv, code, out = _serve_with_the_server_killed_at_request_2(tmp_path, port,
                                                                          monkeypatch)
    assert code == 0, out  # every cell measured: the host's RAM is an answer
    [folder] = (project.evidence_dir / "sim").iterdir()
    attempt, _ = load_attempt(folder)
    lost = attempt.requests[1]
    assert (lost.seed, lost.outcome, lost.transport_failure) == (2302, "error", False)
    assert lost.cause.kind == "host"
    # The keeper or the server got the SIGKILL: -9 or 137.
    assert lost.cause.reason.startswith("host RAM exhausted: killed by SIGKILL (exit ")
    assert lost.cause.reason.endswith(") with the host's available memory at 300 MiB in the "
                                      "sampler's last readings")
    code, out = in_process(project, argv)
    assert code == 0 and "holds every cell asked for" in out
    assert not processes_with(str(tmp_path))


def test_a_server_killed_at_init_with_the_host_short_of_ram_is_the_hosts_init_failure(
        tmp_path, port, monkeypatch):
    from omniprobe.evidence.load import load_attempt
    from omniprobe.harness.common import probe_env
    from omniprobe.harness.common import sampler as sampler_module

    from .conftest import in_process, make_project, probe_argv

    monkeypatch.setattr(sampler_module, "available_mib", lambda: 200.0)
    monkeypatch.setattr(probe_env, "sim_preflight", lambda *a, **k: [])
    project = make_project(tmp_path)
    hosts = project.hosts_file.read_text()
    sim_serve = '["{python}", "-m", "omniprobe.sim", "serve", '
    project.hosts_file.write_text(hosts.replace(sim_serve, (
        '["{python}", "-c", "import os, signal, time; time.sleep(1); '
        'os.kill(os.getpid(), signal.SIGKILL)", '), 1))
    monkeypatch.setenv("OMNIPROBE_ROOT", str(tmp_path))
    code, out = in_process(project, probe_argv("probe-init", port, "--flag-set", "fp8"))
    assert code == 0, out
    [folder] = (project.evidence_dir / "sim").iterdir()
    [run] = load_attempt(folder)[0].runs
    assert run.init.outcome == "error" and run.init.cause.kind == "host"
    assert "killed by SIGKILL (exit 137) with the host's available memory at 200 MiB" in (
        run.init.cause.reason)


def test_a_server_that_crashes_on_its_own_is_a_measured_error():
    """An exit of the server's own (status 1: a CUDA error) is about the model: not resent."""
    from omniprobe.evidence.attempts import AttemptStore
    from omniprobe.evidence.models.requests import RequestRecord

    store = AttemptStore.__new__(AttemptStore)
    store.requests = [RequestRecord(flag_set="fp8", fixture="sim-t2i", seed=1, outcome="error",
                                    structure="unchecked", wall_s=1, transport_failure=False)]
    assert store.recorded("fp8", "sim-t2i", 1)
    store.requests = [store.requests[0].model_copy(update={"transport_failure": True})]
    assert not store.recorded("fp8", "sim-t2i", 1)


def test_unwritable_artifacts_are_refused_before_any_server_or_attempt(project, port,
                                                                       monkeypatch, tmp_path):
    from .conftest import in_process, probe_argv

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the artifacts folder should be")
    monkeypatch.setenv("OMNIPROBE_ARTIFACTS", str(blocker))
    code, out = in_process(project, probe_argv("probe-init", port, "--flag-set", "fp8"))
    assert "Traceback" not in out
    assert code == 4, out
    assert f"error: the artifacts folder {blocker}/sim cannot be written" in out
    assert "starting the server" not in out
    assert not list(project.evidence_dir.glob("sim/*"))  # no attempt, and the check left no trace


@pytest.mark.parametrize("records, kept", [(False, False), (True, True)])
def test_an_attempt_that_failed_early_is_not_left_to_be_resumed(project, records, kept):
    """A new attempt whose run fails before it records anything is removed; one that recorded
    something stays for the resume."""
    import io

    from omniprobe.errors import EnvironmentFailure
    from omniprobe.evidence.models.requests import RequestRecord
    from omniprobe.harness.common.session import Session, run_session

    from .conftest import open_sim_attempt

    class FailsEarly(Session):
        def prepare(self, ctx) -> None:
            pass

        def open_attempt(self, ctx):
            self.store = open_sim_attempt(ctx.project, ["omniprobe"], fresh=True,
                                          host_name=ctx.host_name)
            return self.store

        def run(self, ctx, store) -> int:
            if records:
                store.add_request(RequestRecord(flag_set="fp8", fixture="sim-t2i", seed=1,
                                                outcome="error", structure="unchecked", wall_s=1))
            raise EnvironmentFailure("the GPU is busy")

        def close(self) -> None:
            pass

        def interrupted(self, store) -> str:
            return "stopped"

    session = FailsEarly()
    with pytest.raises(EnvironmentFailure):
        run_session(project, session, "sim", io.StringIO())
    assert session.store.folder.exists() == kept


# --- secrets --------------------------------------------------------------------------------


@pytest.mark.parametrize("args, recorded", [
    (["--hf-token", "hf_abc"], ["--hf-token", "<redacted>"]),
    (["--api-key=sk-1"], ["--api-key=<redacted>"]),
    (["--token", "t", "--port", "8091"], ["--token", "<redacted>", "--port", "8091"]),
    (["--max-tokens", "5", "--tokenizer", "x"], ["--max-tokens", "5", "--tokenizer", "x"]),
    (["https://user:pw@hub.example/m"], ["https://user:<redacted>@hub.example/m"]),
    (["https://hub.example/m?rev=1&token=abc"], ["https://hub.example/m?rev=1&token=<redacted>"]),
    (['{"hf_token": "abc", "dtype": "bf16"}'], ['{"hf_token": "<redacted>", "dtype": "bf16"}']),
    (["serve", "Qwen/Qwen-Image-2.1", "--omni"], ["serve", "Qwen/Qwen-Image-2.1", "--omni"]),
    (["-H", "Authorization: Bearer abc.def"], ["-H", "Authorization: <redacted>"]),
    (["--header=authorization: Basic dXNlcjpw"], ["--header=authorization: <redacted>"]),
    (["Proxy-Authorization: Digest x"], ["Proxy-Authorization: <redacted>"]),
    (["--note", "Bearer s3cr3t-t0k"], ["--note", "Bearer <redacted>"]),
    (['{"Authorization": "Bearer q"}'], ['{"Authorization": "<redacted>"}']),
    (["--bearer-mode", "on"], ["--bearer-mode", "on"]),
])
def test_redacted_arguments(args, recorded):
    from omniprobe.redaction import redact_args

    assert redact_args(args) == recorded


def test_a_secret_in_the_command_is_recorded_nowhere(project, port):
    """--model with URL credentials reaches the server, but attempt.json, runs.json and the
    kept server log hold it redacted."""
    from .conftest import in_process, probe_argv

    model = "https://probe:hunter2@hub.example/Qwen?token=s3cr3t"
    code, out = in_process(project, probe_argv("probe-init", port, "--flag-set", "fp8",
                                               "--model", model))
    assert code == 0, out
    [folder] = (project.evidence_dir / "sim").iterdir()
    recorded = [folder / "attempt.json", folder / "runs.json",
                *project.artifacts_dir.glob("sim/*/*/*/server.log")]
    assert len(recorded) == 3
    for path in recorded:
        text = path.read_text()
        assert "hunter2" not in text and "s3cr3t" not in text, path
        assert "probe:<redacted>@hub.example" in text, path  # the sim logs its model
    runs = json.loads((folder / "runs.json").read_text())["runs"]
    assert ("https://probe:<redacted>@hub.example/Qwen?token=<redacted>"
            in runs[0]["lifetimes"][0]["command"])
    from omniprobe.evidence.validate import load_project

    assert load_project(project)[1] == []


def test_a_source_name_cannot_take_a_baseline_out_of_its_folder(tmp_path):
    from omniprobe.config.fixtures import Fixture
    from omniprobe.errors import InputError
    from omniprobe.harness.common.quality import baseline_path

    fixture = Fixture(id="f", kind="t2i", reference_count=0, source_name="../../etc/passwd")
    assert baseline_path(tmp_path, "{fixture}/{seed}.png", fixture, 1) == tmp_path / "f" / "1.png"
    with pytest.raises(InputError, match=r"baseline_layout: fixture 'f' seed 1: .*'\.\.'"):
        baseline_path(tmp_path, "{source_name}-{seed}.png", fixture, 1)


def test_an_unreadable_selection_hands_nothing_on(tmp_path):
    from omniprobe.config.selection import read_state

    path = tmp_path / "selection.json"
    for broken in (b"\xff\xfe", b"[" * 10000, b'{"invocation": "run-1"'):
        path.write_bytes(broken)
        assert read_state(path, "run-1") == {}
    path.unlink()
    path.mkdir()
    assert read_state(path, "run-1") == {}


@pytest.mark.parametrize("text, deep", [
    ("[" * 64 + "]" * 64, False),
    ("[" * 65 + "]" * 65, True),
    ('["' + "[" * 100 + '"]', False),  # brackets in a string are text
    ('["\\"' + "[" * 100 + '"]', False),  # after an escaped quote too
])
def test_the_nesting_limit_is_64_levels(text, deep, tmp_path):
    from omniprobe.errors import InputError
    from omniprobe.safe_io import parse_json

    if deep:
        with pytest.raises(InputError, match="x.json: line 1: nested deeper than 64 levels"):
            parse_json(tmp_path / "x.json", text)
    else:
        parse_json(tmp_path / "x.json", text)


# --- round 2: what needs a server (issue 24) ------------------------------------------------

DECOY = '''import http.server, sys
args = sys.argv[1:]
if "--check-args" in args:
    sys.exit(0)
port = int(args[args.index("--port") + 1])

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()

    def log_message(self, *_):
        pass

http.server.HTTPServer(("0.0.0.0", port), Health).serve_forever()  # whatever --host said
'''


def test_a_server_listening_beyond_loopback_is_stopped_and_the_run_fails(project, port):
    """Told --host 127.0.0.1, a server that binds every interface anyway (its own code, or an
    argument the harness did not see) is found by its sockets after start, stopped, and the
    run fails loudly: exit 5, naming the address."""
    from .conftest import in_process, probe_argv, processes_with

    decoy = project.root / "decoy_server.py"
    decoy.write_text(DECOY)
    text = project.hosts_file.read_text()
    old = ('serve_command = ["{python}", "-m", "omniprobe.sim", "serve", "{model}", "--omni", '
           '"--hosts-file", "{hosts_file}", "--sim-host", "{host}"]\noffline_command')
    assert old in text
    project.hosts_file.write_text(text.replace(
        old, f'serve_command = ["{{python}}", "{decoy}"]\noffline_command', 1))
    code, out = in_process(project, probe_argv("probe-init", port, "--flag-set", "cpuoff"))
    assert "Traceback" not in out
    assert code == 5, out
    assert f"the server listened on 0.0.0.0:{port} (pid " in out and "it was stopped" in out
    assert processes_with(str(decoy)) == []


def test_a_dead_sampler_fails_the_run_and_leaves_no_zero_peak(project, port):
    """The sampler's thread dies mid-lifetime (here: its reader raises OverflowError, as a
    1e-300 Hz wait once did): the run exits 5, the timeline is recorded as incomplete, the run
    quotes no peak, and the evidence still validates."""
    from omniprobe.evidence.load import load_attempt
    from omniprobe.evidence.validate import load_project
    from omniprobe.harness.common.lifetime import MEMORY_FILE
    from omniprobe.harness.common.sampler import PublishedMemoryReader

    from .conftest import in_process, probe_argv

    class DiesInTheSampler(PublishedMemoryReader):
        """The idle wait reads the process list once; the sampler's first read of it raises."""
        reads = 0

        def processes(self):
            DiesInTheSampler.reads += 1
            if DiesInTheSampler.reads > 1:
                raise OverflowError("timestamp too large to convert to C _PyTime_t")
            return super().processes()

    code, out = in_process(project, probe_argv("probe-serve", port, "--flag-set", "cpuoff",
                                               "--fixture", "sim-t2i"),
                           readers=lambda folder: DiesInTheSampler(folder / MEMORY_FILE))
    assert "Traceback" not in out
    assert code == 5, out
    assert "OverflowError" in out and "recorded as incomplete" in out
    [folder] = (project.evidence_dir / "sim").iterdir()
    [run] = load_attempt(folder)[0].runs
    assert run.lifetimes[0].timeline.state == "incomplete" and run.gpu_peak_mib is None
    assert load_project(project)[1] == []


ACCEPTED = [c for c in ALL_CASES if c.argv == ["validate"] and c.exit_code == 0 and c.breaks]


@pytest.mark.e2e
@pytest.mark.parametrize("case", ACCEPTED, ids=[c.id for c in ACCEPTED])
def test_the_probe_writes_only_evidence_that_validates(case, hostile, capsys, tmp_path_factory):
    """Every configuration the hostile table accepts, probed: what the probe writes validates.
    (The full table runs validate only; this serves one small fixture and seed per case.)"""
    from omniprobe.harness.common.process import free_port

    case.breaks(hostile.root)
    suite = json.loads((hostile.root / FIXTURES).read_text())
    suite["sampling"]["seeds"] = suite["sampling"]["seeds"][:1]
    for fixture in suite["fixtures"]:
        if fixture["id"] == "sim-t2i":
            fixture["width"] = fixture["height"] = 64
    (hostile.root / FIXTURES).write_text(json.dumps(suite, indent=2))
    os.environ["OMNIPROBE_ARTIFACTS"] = str(tmp_path_factory.mktemp("artifacts"))
    try:
        code, output = _run(["probe-serve", "--host", "sim", "--port", str(free_port()),
                             "--grace", "1", "--ready-timeout", "2", "--flag-set", "cpuoff",
                             "--fixture", "sim-t2i"], hostile.root, capsys)
    finally:
        del os.environ["OMNIPROBE_ARTIFACTS"]
    assert "Traceback" not in output
    # 1: the sim does not serve it (a health path it lacks); 4: its preflight refuses the flag
    assert code in (0, 1, 4), output
    code, output = _run(["validate"], hostile.root, capsys)
    assert code == 0, output


def test_the_emulation_hook_stays_first_on_a_deliberate_pythonpath(repo):
    """A flag set may set PYTHONPATH where hosts.toml marks it deliberate; the emulation hook's
    folder still comes first, so the cap is imposed whatever that path holds."""
    from omniprobe.config.hosts import load_hosts
    from omniprobe.harness.common.emulation import HOOK_DIR, emulation_env

    cfg = load_hosts(repo.hosts_file)
    env = emulation_env(cfg.host("sim-on-h200"), 24576, {"PYTHONPATH": "/opt/deliberate"})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(HOOK_DIR), "/opt/deliberate"]


@pytest.mark.parametrize("arg, option", [
    ("--host", "--host"), ("--host=0.0.0.0", "--host"), ("--ho", "--host"),
    ("--served_model_name", "--served-model-name"), ("--port=1", "--port"),
    ("--deploy-config", "--deploy-config"), ("--enforce-eager", "--enforce-eager"),
    ("--p", None),  # too short to be read as one option
    ("--host-ip", None), ("--hosts-file", None), ("--enable-cpu-offload", None),
    ("-p", None), ("--", None), ("0.0.0.0", None),
])
def test_which_argument_gives_a_harness_option(arg, option):
    from omniprobe.config.command_rules import harness_option

    assert harness_option(arg) == option


@pytest.mark.parametrize("hex_address, address", [
    ("0100007F", "127.0.0.1"), ("00000000", "0.0.0.0"), ("0101A8C0", "192.168.1.1"),
    ("00000000000000000000000001000000", "::1"),
    ("00000000000000000000000000000000", "::"),
])
def test_proc_net_tcp_addresses(hex_address, address):
    from omniprobe.harness.common.listening import Listener, _address

    assert _address(hex_address) == address
    assert Listener(address, 1, 1).loopback == (address in ("127.0.0.1", "::1"))


def test_the_listeners_of_a_process_tree_are_read_from_proc(children):
    """A child that binds every interface is found under its group; loopback is told apart."""
    import sys

    from omniprobe.harness.common.listening import listeners
    from omniprobe.harness.common.process import free_port

    from .conftest import wait_for

    port = free_port()
    code = (f"import socket, time\ns = socket.socket(); s.bind(('0.0.0.0', {port})); s.listen()\n"
            "t = socket.socket(); t.bind(('127.0.0.1', 0)); t.listen(); time.sleep(60)")
    proc = children.start([sys.executable, "-c", code, children.marker])
    found = wait_for(lambda: [item for item in listeners(proc.pid) if item.port == port], 10)
    assert [(item.address, item.pid, item.loopback) for item in found] == [
        ("0.0.0.0", proc.pid, False)]
    assert any(item.loopback for item in listeners(proc.pid))


def test_a_peak_beyond_the_gpu_is_never_written(project, port, monkeypatch):
    """A server that reports a peak above the card's memory broke its contract: the run stops
    with exit 5 before that record is written, so what the probe wrote still validates."""
    from dataclasses import replace

    from omniprobe.evidence.validate import load_project
    from omniprobe.harness.serve import client

    from .conftest import in_process, probe_argv

    real = client.send
    monkeypatch.setattr(client, "send", lambda *a, **k: replace(real(*a, **k),
                                                               server_peak_mb=1e9))
    code, out = in_process(project, probe_argv("probe-serve", port, "--flag-set", "cpuoff",
                                               "--fixture", "sim-t2i"))
    assert "Traceback" not in out
    assert code == 5, out
    assert ("sim-t2i seed 2301: the server reported 1,000,000,000.0 MiB exceeds the GPU's memory, "
            "24,576 MiB (the simulated card's [capacity] vram_mib); the record is not written"
            ) in out
    [folder] = (project.evidence_dir / "sim").iterdir()
    assert not (folder / "requests.json").exists()
    assert load_project(project)[1] == []
