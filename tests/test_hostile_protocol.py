"""Issue 35 class 7: a runner that breaks the protocol is the runner's fault (exit 5), named by
its event and field, never a settled cell; a re-run retries it."""

from __future__ import annotations

import json

import pytest

from .conftest import in_process

READY = {"event": "init", "outcome": "ready", "wall_s": 0.1}
REQUEST = {"event": "request", "id": "sim-t2i-2301", "fixture": "sim-t2i", "seed": 2301,
           "outcome": "ok", "wall_s": 0.1}


@pytest.mark.parametrize(("lines", "words"), [
    ([], "exited 0 without its 'init' event"),                          # no results at all
    ([{**READY, "outcome": "fine"}], "'init' event, field 'outcome'"),   # an unknown outcome
    ([{**READY, "facts": [1]}], "'init' event, field 'facts'"),          # a list for facts
    ([{**READY, "wall_s": "NaN"}], "'init' event, field 'wall_s'"),      # NaN for wall_s
    ([{**READY, "wall_s": "Infinity"}], "'init' event, field 'wall_s'"),
    ([{**READY, "wall_s": "1"}], "'init' event, field 'wall_s'"),        # a string, not coerced
    ([{**READY, "surprise": 1}], "'init' event, field 'surprise'"),      # a key it lacks
    ([{"event": "hello"}], "an event of kind 'hello'"),
    ([[1, 2]], "an event of kind 'list'"),
    ([READY], "exited 0 without the result of 'sim-t2i-2301'"),          # ready, then nothing
    ([READY, {**REQUEST, "peak_mib": 1e30}], "'request' event, field 'peak_mib'"),
    ([READY, {**REQUEST, "peak_mib": "9"}], "'request' event, field 'peak_mib'"),
    ([READY, {**REQUEST, "outcome": "maybe"}], "'request' event, field 'outcome'"),
    ([READY, {**REQUEST, "wall_s": -1}], "'request' event, field 'wall_s'"),
    ([READY, {**REQUEST, "seed": True}], "'request' event, field 'seed'"),
    ([READY, {**REQUEST, "measured": {"process_mib": "x"}}],
     "'request' event, field 'measured.process_mib'"),
    # A figure protocol.Measures does not declare: neither carried nor named as a drop.
    ([READY, {**REQUEST, "measured": {"new_figure_mib": 1}}],
     "'request' event, field 'measured.new_figure_mib': extra inputs are not permitted"),
    ([READY, {**REQUEST, "measured": []}], "'request' event, field 'measured'"),
    ([READY, {"event": "done"}], "expected the result of 'sim-t2i-2301'"),
])
def test_a_runner_breaking_the_protocol_is_named_and_settles_nothing(project, tmp_path, lines,
                                                                     words):
    script = tmp_path / "liar.py"
    # NaN and Infinity are written bare, as Python's json writes them.
    text = "\n".join(json.dumps(line).replace('"NaN"', "NaN").replace('"Infinity"', "Infinity")
                     for line in lines)
    script.write_text("import sys\n"
                      "results = sys.argv[sys.argv.index('--results') + 1]\n"
                      f"open(results, 'a').write({text + chr(10) if lines else ''!r})\n")
    hosts = project.hosts_file.read_text().replace(
        'offline_command = ["{python}", "-m", "omniprobe.sim", "offline", "--hosts-file", '
        '"{hosts_file}", "--sim-host", "{host}"]', f'offline_command = ["{{python}}", "{script}"]')
    project.hosts_file.write_text(hosts)
    args = ["probe-offline", "--host", "sim", "--grace", "2", "--kwarg-set", "sim-offline-bf16",
            "--fixture", "sim-t2i"]
    code, out = in_process(project, args)
    assert code == 5, out
    assert words in out and "Traceback" not in out, out
    assert not list((project.evidence_dir / "sim").glob("*/offline.json"))  # nothing settled
    code, out = in_process(project, args)  # a re-run tries again, and is refused again
    assert code == 5 and words in out, out
