"""vLLM's own serve parser read from its source (issue 23 item 9): the flags vLLM-Omni's parser
takes from vLLM pass or fail with vLLM's file:line, the values the flag sets pass are held
against the choices the parser states, and an OOM's error path is the EngineGenerateError
branch. A synthetic vLLM tree, shaped as vLLM 0.31.0 defines them."""

from __future__ import annotations

from pathlib import Path

import pytest

from omniprobe.config.hosts import load_hosts
from omniprobe.upstream.checks import check_http, check_serve_flags, serve_flag_values
from omniprobe.upstream.source import open_source
from omniprobe.upstream.vllm_parser import serve_flags

from .conftest import REPO
from .upstream_tree import FILES, write_tree

CLI_ARGS = "vllm/entrypoints/launchers/cli_args.py"
ARG_UTILS = "vllm/engine/arg_utils.py"
MODEL = "vllm/config/model.py"
VLLM = {
    "vllm/__init__.py": "",
    "vllm/_version.py": "__version__ = version = '0.31.0'\n",
    CLI_ARGS: '''\
from dataclasses import dataclass


class BaseFrontendArgs:
    lora_modules: list[str] | None = None

    @classmethod
    def add_cli_args(cls, parser):
        from vllm.engine.arg_utils import get_kwargs

        frontend_kwargs = get_kwargs(cls)
        group = parser.add_argument_group(title="Frontend")
        for key, value in frontend_kwargs.items():
            extra_flags = value.pop("flags", [])
            group.add_argument(*extra_flags, f"--{key.replace('_', '-')}", **value)
        return parser


@dataclass
class FrontendArgs(BaseFrontendArgs):
    host: str | None = None
    port: int = 8000


def make_arg_parser(parser):
    parser.add_argument("model_tag", type=str, nargs="?")
    parser = FrontendArgs.add_cli_args(parser)
    return parser
''',
    ARG_UTILS: '''\
from vllm.config.model import ModelConfig


def get_kwargs(cls):
    return {}


class EngineArgs:
    @staticmethod
    def add_cli_args(parser):
        model_kwargs = get_kwargs(ModelConfig)
        model_group = parser.add_argument_group(title="ModelConfig")
        model_group.add_argument("--quantization", "-q", **model_kwargs["quantization"])
        model_group.add_argument("--enforce-eager", **model_kwargs["enforce_eager"])
        model_group.add_argument("--served-model-name", **model_kwargs["served_model_name"])
        return parser
''',
    MODEL: '''\
from vllm.model_executor.layers.quantization import QuantizationMethods


class ModelConfig:
    quantization: QuantizationMethods | str | None = None
    enforce_eager: bool = False
    served_model_name: str | list[str] | None = None
''',
    "vllm/model_executor/layers/quantization/__init__.py": '''\
from typing import Literal

QuantizationMethods = Literal["awq", "fp8", "gptq"]
''',
}


def _vllm(tmp_path: Path, doctor: dict[str, str] | None = None):
    for path, text in {**VLLM, **(doctor or {})}.items():
        (tmp_path / "vllm-tree" / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "vllm-tree" / path).write_text(text)
    return open_source(tmp_path / "vllm-tree", "vllm")


def _checks(tmp_path: Path, vllm) -> dict:
    omni = open_source(write_tree(tmp_path / "omni"))
    return {c.name: c for c in check_serve_flags(omni, load_hosts(REPO / "hosts.toml"), vllm)}


def test_vllms_flags_come_from_its_calls_and_its_frontend_dataclass_fields(tmp_path):
    flags = serve_flags(_vllm(tmp_path))
    assert {f: str(flags[f].where) for f in ("--host", "--port", "--lora-modules",
                                             "--quantization", "--enforce-eager")} == {
        "--host": f"{CLI_ARGS}:21", "--port": f"{CLI_ARGS}:22", "--lora-modules": f"{CLI_ARGS}:5",
        "--quantization": f"{ARG_UTILS}:13", "--enforce-eager": f"{ARG_UTILS}:14"}
    quant = flags["--quantization"]
    assert (quant.field_type, str(quant.type_at)) == ("QuantizationMethods | str | None",
                                                      f"{MODEL}:5")
    assert quant.literals == ("awq", "fp8", "gptq") and quant.free_string
    assert quant.choices is None  # str admitted: a metavar, any string parses


def test_the_five_flags_pass_with_vllms_file_and_line(tmp_path):
    checks = _checks(tmp_path, _vllm(tmp_path))
    assert {f: (checks[f"serve-flag:{f}"].status, checks[f"serve-flag:{f}"].where) for f in (
        "--host", "--port", "--served-model-name", "--enforce-eager", "--quantization")} == {
        "--host": ("pass", f"{CLI_ARGS}:21"), "--port": ("pass", f"{CLI_ARGS}:22"),
        "--served-model-name": ("pass", f"{ARG_UTILS}:15"),
        "--enforce-eager": ("pass", f"{ARG_UTILS}:14"),
        "--quantization": ("pass", f"{ARG_UTILS}:13")}
    assert ("fp8 (one of vLLM's own), int8 (not one of vLLM's own: passed on as given)"
            in checks["serve-flag:--quantization"].detail)
    # Without vLLM's source they are NOT FOUND, as before.
    assert _checks(tmp_path, None)["serve-flag:--host"].status == "not-found"


def test_a_value_outside_the_choices_the_parser_states_fails(tmp_path):
    vllm = _vllm(tmp_path, {MODEL: VLLM[MODEL].replace(
        "QuantizationMethods | str | None", "QuantizationMethods | None")})
    check = _checks(tmp_path, vllm)["serve-flag:--quantization"]
    assert check.status == "fail" and check.where == f"{ARG_UTILS}:13"
    assert check.detail.endswith("its choices are awq, fp8, gptq; not among them: int8 (flag set "
                                 "int8)")
    assert serve_flag_values(load_hosts(REPO / "hosts.toml"))["--quantization"] == {
        "fp8": ["flag set fp8", "flag set fp8-expandable"], "int8": ["flag set int8"]}


def test_a_flag_neither_defines_fails(tmp_path):
    vllm = _vllm(tmp_path, {ARG_UTILS: VLLM[ARG_UTILS].replace('"--enforce-eager"', '"--eager"')})
    check = _checks(tmp_path, vllm)["serve-flag:--enforce-eager"]
    assert check.status == "fail" and "neither by vLLM-Omni nor by vLLM 0.31.0" in check.detail


ENGINE_BRANCH = '''    except (EngineGenerateError, EngineDeadError) as exc:
        return _create_engine_error_json_response(raw_request, exc)
    except Exception as e:'''


@pytest.mark.parametrize(("doctored", "at", "words"), [
    (False, "raise HTTPException(status_code=HTTPStatus.INTERNAL_SERVER_ERROR",
     "answers HTTP 500 with detail 'Image edit failed: '"),
    (True, "except (EngineGenerateError, EngineDeadError)",
     "reaches the edits handler as (EngineGenerateError, EngineDeadError)"),
])
def test_the_error_path_of_an_oom_is_the_engine_error_branch_where_there_is_one(
        tmp_path, doctored, at, words):
    api = "vllm_omni/entrypoints/openai/api_server.py"
    text = FILES[api].replace("    except Exception as e:", ENGINE_BRANCH) if doctored else FILES[api]
    omni = open_source(write_tree(tmp_path / "omni", {api: text}))
    [check] = [c for c in check_http(omni, load_hosts(REPO / "hosts.toml"))
               if c.name == "error-path:edits-500"]
    line = int(check.where.rsplit(":", 1)[1])
    assert check.status == "pass" and at in text.splitlines()[line - 1]
    assert words in check.detail


def test_a_check_without_vllms_source_takes_the_committed_reading_of_its_flags(
        tmp_path, monkeypatch):
    """CI downloads no vLLM wheel: `--check` then takes vLLM's own flags from the committed
    attempt that read them, naming that vLLM, and holds the rest fresh."""
    from omniprobe.cli import main
    from omniprobe.upstream.contract import attempt_id, check_source, record

    from .test_upstream import _project

    project = _project(tmp_path)
    tree = write_tree(tmp_path / "tree")
    _vllm(tmp_path)
    with_vllm = check_source(project, tree, tmp_path / "vllm-tree")
    assert attempt_id(with_vllm).endswith("-with-vllm-0.31.0-tree-" + with_vllm.vllm_source.sha256[:12])
    record(project, with_vllm, ["test"])
    without = check_source(project, tree)
    assert without.vllm_source == with_vllm.vllm_source
    assert {c.name: c.status for c in without.checks} == {c.name: c.status for c in with_vllm.checks}
    monkeypatch.setenv("OMNIPROBE_ROOT", str(project.root))
    assert main(["upstream", "check", "--source", str(tree), "--check"]) == 0
