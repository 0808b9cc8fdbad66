"""A single catalogue: the named contract checks of the harness against one upstream source, each
read off upstream's code (never imported): PASS, FAIL or NOT FOUND, with the `file:line` that decides it.

What the harness sends and reads is taken from where the harness declares it as data (hosts.toml
and its options, omniprobe/protocol.py: the client's form fields and paths, the offline runner's
calls), so a change on either side shows.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from omniprobe import protocol
from omniprobe.config.command_rules import HARNESS_OPTIONS
from omniprobe.config.host_entry import model_folders
from omniprobe.config.hosts import HostsConfig
from omniprobe.evidence.upstream import UpstreamCheck
from omniprobe.protocol import DEPLOY_IGNORED_WARNING, EDITS_PATH, GENERATIONS_PATH, IMAGE_PART
from omniprobe.safe_io import DuplicateKey, json_loads
from omniprobe.upstream import code
from omniprobe.upstream.code import Found
from omniprobe.upstream.source import Source
from omniprobe.upstream.vllm_parser import VllmFlag
from omniprobe.upstream.vllm_parser import serve_flags as vllm_parser_flags

ENTRYPOINTS = "vllm_omni/entrypoints/"
CLI = "vllm_omni/entrypoints/cli/"
OPENAI = "vllm_omni/entrypoints/openai/"
REGISTRY = "vllm_omni/config/pipeline_registry.py"
# The harness adds the first three to every serve command (env/serve_command.py server_command),
# --enforce-eager where [serve] asks and --deploy-config where a flag set names one.
*HARNESS_SERVE_FLAGS, ENFORCE_EAGER, DEPLOY_CONFIG = HARNESS_OPTIONS
# Response fields the client reads (harness/serve/client.py, parse_success and _metric).
STAGE_METRIC = "denoise_step_latency_ms"
# The request output's field of the diffusion worker's peak, at the pinned commit.
WORKER_PEAK = "peak_memory_mb"


def _check(name: str, status: str, where: Found | str | None, detail: str) -> UpstreamCheck:
    return UpstreamCheck(name=name, status=status, where=str(where) if where else None,
                         detail=detail)


def _routes_files(source: Source) -> list[str]:
    return source.under(ENTRYPOINTS)


# --- serve flags --------------------------------------------------------------------------


def serve_flags_used(cfg: HostsConfig) -> dict[str, list[str]]:
    """Every flag the probe passes to `vllm serve`, with who passes it."""
    users: dict[str, list[str]] = {}

    def use(flag: str, who: str) -> None:
        users.setdefault(flag, [])
        if who not in users[flag]:
            users[flag].append(who)

    for arg in cfg.serve.command:
        if arg.startswith("--"):
            use(arg, "[serve]")
    for flag in [*HARNESS_SERVE_FLAGS, *([ENFORCE_EAGER] if cfg.serve.enforce_eager else [])]:
        use(flag, "[serve]")
    for name, flag_set in cfg.flag_sets.items():
        for arg in flag_set.args:
            if arg.startswith("--"):
                use(arg.split("=", 1)[0], f"flag set {name}")
        if flag_set.deploy_config:
            use(DEPLOY_CONFIG, f"flag set {name}")
    return users


def serve_flag_values(cfg: HostsConfig) -> dict[str, dict[str, list[str]]]:
    """flag -> value -> the flag sets that pass it (`--flag value` or `--flag=value`)."""
    values: dict[str, dict[str, list[str]]] = {}
    for name, flag_set in cfg.flag_sets.items():
        args = flag_set.args
        for i, arg in enumerate(args):
            flag, eq, value = arg.partition("=")
            if not flag.startswith("--"):
                continue
            if not eq:
                if i + 1 >= len(args) or args[i + 1].startswith("-"):
                    continue
                value = args[i + 1]
            values.setdefault(flag, {}).setdefault(value, []).append(f"flag set {name}")
    return values


def _vllm_flag_check(name: str, flag: str, who: str, found: VllmFlag,
                     values: dict[str, list[str]]) -> UpstreamCheck:
    """A flag of vLLM's serve parser, and the values the flag sets pass where it states choices."""
    defined = (f"{flag} (used by {who}) is defined by vLLM's serve parser, which vLLM-Omni's "
               "starts from (make_arg_parser)")
    typed = (f"; its type is {found.field_type} ({found.type_at})"
             if found.field_type and found.type_at and found.type_at != found.where else "")
    if not values:
        return _check(name, "pass", found.where, defined + typed)
    choices = found.choices
    if choices is not None:
        bad = {v: users for v, users in values.items() if v not in choices}
        if bad:
            return _check(name, "fail", found.where, defined + typed + "; its choices are "
                          + ", ".join(choices) + "; not among them: "
                          + "; ".join(f"{v} ({', '.join(u)})" for v, u in sorted(bad.items())))
        return _check(name, "pass", found.where, defined + typed + "; every value passed is "
                      "among its choices: " + ", ".join(sorted(values)))
    if found.literals:  # a metavar only: any string parses
        named = sorted(v for v in values if v in found.literals)
        other = sorted(v for v in values if v not in found.literals)
        return _check(name, "pass", found.where, defined + typed + "; the parser states no "
                      "choices (the type admits any string; its Literal is a metavar only), so "
                      "every value parses: " + ", ".join(
                          [f"{v} (one of vLLM's own)" for v in named]
                          + [f"{v} (not one of vLLM's own: passed on as given)" for v in other]))
    return _check(name, "pass", found.where, defined + typed + "; the parser states no choices: "
                  "every value parses (" + ", ".join(sorted(values)) + ")")


def check_serve_flags(source: Source, cfg: HostsConfig,
                      vllm: Source | None = None) -> list[UpstreamCheck]:
    """Each flag the probe passes: vLLM-Omni's own, else vLLM's (read from `vllm`, its serve
    parser's source; None: not read, so NOT FOUND)."""
    # The serve command's own file first: other subcommands define flags of the same name.
    files = source.under(ENTRYPOINTS)
    defined = code.argparse_flags(source, sorted(files, key=lambda p: p != f"{CLI}serve.py"))
    vllm_parser = code.calls(source, source.under(CLI), "make_arg_parser")
    vllm_flags = vllm_parser_flags(vllm) if vllm is not None and vllm_parser else {}
    values = serve_flag_values(cfg)
    checks = []
    for flag, users in serve_flags_used(cfg).items():
        name, who = f"serve-flag:{flag}", ", ".join(users)
        if flag in defined:
            checks.append(_check(name, "pass", defined[flag],
                                 f"`vllm serve --omni` defines {flag} (used by {who})"))
        elif flag in vllm_flags:
            checks.append(_vllm_flag_check(name, flag, who, vllm_flags[flag],
                                           values.get(flag, {})))
        elif vllm_parser and vllm is not None:
            checks.append(_check(name, "fail", vllm_parser[0], (
                f"{flag} (used by {who}) is defined neither by vLLM-Omni nor by vLLM "
                f"{vllm.identity.version}'s serve parser")))
        elif vllm_parser:
            checks.append(_check(name, "not-found", vllm_parser[0], (
                f"{flag} (used by {who}) is not defined by vLLM-Omni; its serve parser starts "
                "from vLLM's own (make_arg_parser), which this source does not contain")))
        else:
            checks.append(_check(name, "fail", None,
                                 f"no add_argument defines {flag} (used by {who})"))
    return checks


# --- HTTP ----------------------------------------------------------------------------------


def _annotation_names(annotation: str | None) -> list[str]:
    return re.findall(r"[A-Za-z_][A-Za-z0-9_]*", annotation or "")


def check_http(source: Source, cfg: HostsConfig) -> list[UpstreamCheck]:
    files = _routes_files(source)
    checks = []
    health = code.route(source, files, "get", cfg.serve.health_path)
    edits = code.route(source, files, "post", EDITS_PATH)
    generations = code.route(source, files, "post", GENERATIONS_PATH)
    for path, found, method in ((cfg.serve.health_path, health, "GET"),
                                (EDITS_PATH, edits, "POST"),
                                (GENERATIONS_PATH, generations, "POST")):
        checks.append(_check(f"route:{path}", "pass" if found else "fail", found,
                             f"{method} {path} is served" if found
                             else f"no handler is decorated for {method} {path}"))
    fields = list(protocol.FORM_FIELDS)
    checks += _edit_form_checks(edits, fields)
    checks += _generation_json_checks(source, generations, fields)
    checks += _response_checks(source, [h for h in (edits, generations) if h])
    checks.append(_error_path_check(edits))
    return checks


def _edit_form_checks(edits: Found | None, fields: list[str]) -> list[UpstreamCheck]:
    sent = [IMAGE_PART, *fields]
    if edits is None:
        return [_check(f"edits-form:{f}", "not-found", None,
                       f"no {EDITS_PATH} handler to read") for f in sent]
    params = {p.name: p for p in code.handler_params(edits.node)}
    checks = []
    for field in sent:
        param = params.get(field)
        where = Found(edits.file, param.line) if param else edits
        if param and param.kind in ("Form", "File"):
            checks.append(_check(f"edits-form:{field}", "pass", where,
                                 f"the edits handler takes {field!r} as {param.kind}"))
        else:
            checks.append(_check(f"edits-form:{field}", "fail", where, (
                f"the edits handler has no form field {field!r}: FastAPI drops an unknown "
                "form field without an error, so the server never sees it")))
    return checks


def _generation_json_checks(source: Source, generations: Found | None,
                            fields: list[str]) -> list[UpstreamCheck]:
    if generations is None:
        return [_check(f"generations-json:{f}", "not-found", None,
                       f"no {GENERATIONS_PATH} handler to read") for f in fields]
    body_class, model_fields = None, {}
    for param in code.handler_params(generations.node):
        for name in _annotation_names(param.annotation):
            found_fields = code.class_fields(source, name)
            if found_fields:
                body_class, model_fields = name, found_fields
                break
        if body_class:
            break
    checks = []
    for field in fields:
        name = f"generations-json:{field}"
        if body_class is None:
            checks.append(_check(name, "not-found", generations,
                                 "the handler's JSON body model is not in this source"))
        elif field in model_fields:
            checks.append(_check(name, "pass", model_fields[field],
                                 f"{body_class} has the field {field!r}"))
        else:
            checks.append(_check(name, "fail", generations,
                                 f"{body_class} has no field {field!r}"))
    return checks


def _response_checks(source: Source, handlers: list[Found]) -> list[UpstreamCheck]:
    """The fields the client reads, in the response model the image handlers return."""
    names = [n for h in handlers if h.node.returns is not None
             for n in _annotation_names(ast.unparse(h.node.returns))]
    response_class = next((n for n in names if code.find_class(source, n)), None)
    edits = handlers[0] if handlers else None
    fields = code.class_fields(source, response_class) if response_class else {}
    checks = []
    data = fields.get("data")
    item_class = next((n for n in _annotation_names(ast.unparse(data.node.annotation))
                       if code.find_class(source, n)), None) if data else None
    item_fields = code.class_fields(source, item_class) if item_class else {}
    if "b64_json" in item_fields:
        checks.append(_check("response:data[].b64_json", "pass", item_fields["b64_json"],
                             f"{response_class}.data is a list of {item_class} with b64_json"))
    else:
        checks.append(_check("response:data[].b64_json", "fail", data or edits,
                             f"no b64_json in the images of {response_class or 'the response'}"))
    metrics = fields.get("metrics")
    peak = code.string_key(source, source.under(OPENAI), "peak_memory_mb")
    if metrics and peak:
        checks.append(_check("response:metrics.peak_memory_mb", "pass", peak,
                             f"{response_class}.metrics carries peak_memory_mb (it may be null)"))
    else:
        checks.append(_check("response:metrics.peak_memory_mb", "fail", metrics or edits, (
            f"{response_class or 'the response'} has no metrics field" if not metrics
            else "nothing writes peak_memory_mb into the response's metrics")))
    metrics_first = sorted(source.python_files, key=lambda p: "/metrics/" not in p)
    stage = code.string_key(source, metrics_first, "stage_metrics")
    latency = _stage_metric_key(source)
    if stage and latency:
        checks.append(_check(f"response:stage_metrics.{STAGE_METRIC}", "pass", latency, (
            f"stage metrics are returned under 'stage_metrics' ({stage}) with "
            f"{STAGE_METRIC} per stage; the client reads them under metrics or at the top")))
    else:
        checks.append(_check(f"response:stage_metrics.{STAGE_METRIC}", "fail", stage, (
            f"no stage metric named {STAGE_METRIC}" if stage else "no 'stage_metrics' key")))
    return checks


def _stage_metric_key(source: Source) -> Found | None:
    """Where the stage metric's key is defined: a constant resolving to it, or the literal."""
    for path in source.python_files:
        if "/metrics/" in path:
            for _name, (value, line) in code.module_constants(source, path).items():
                if value == STAGE_METRIC:
                    return Found(path, line)
    return code.string_key(source, source.python_files, STAGE_METRIC)


def _engine_error_branch(edits: Found) -> ast.ExceptHandler | None:
    """The handler's `except (EngineGenerateError, ...)`: the branch a failed generation (an OOM
    among them) takes where upstream has one."""
    for node in ast.walk(edits.node):
        if (isinstance(node, ast.ExceptHandler) and node.type is not None
                and "EngineGenerateError" in ast.unparse(node.type)):
            return node
    return None


def _error_path_check(edits: Found | None) -> UpstreamCheck:
    """A generation that fails (an OOM): the branch of the edits handler it takes, answering 500
    with the error's message. Where the handler catches EngineGenerateError, an OOM takes that
    branch (a stage's error result is raised as one), not the generic handler after it."""
    name = "error-path:edits-500"
    if edits is None:
        return _check(name, "not-found", None, f"no {EDITS_PATH} handler to read")
    branch = _engine_error_branch(edits)
    if branch is not None:
        answers = [n.func.id for n in ast.walk(branch) if isinstance(n, ast.Call)
                   and isinstance(n.func, ast.Name)]
        return _check(name, "pass", Found(edits.file, branch.lineno), (
            "a failed generation (a CUDA OOM among them) reaches the edits handler as "
            f"{ast.unparse(branch.type)}: a stage's error result is raised as "
            "EngineGenerateError; this branch answers with "
            f"{answers[0] if answers else 'an error response'}, vLLM's error body "
            "{\"error\": {\"message\": ...}} with status 500, which the client reads"))
    for call in code.raises_in(edits.node, "HTTPException"):
        status = code.keyword(call, "status_code")
        detail = code.keyword(call, "detail")
        text = ast.unparse(status) if status is not None else ""
        if ("INTERNAL_SERVER_ERROR" in text or text == "500") and isinstance(detail, ast.JoinedStr):
            prefix = next((v.value for v in detail.values if isinstance(v, ast.Constant)), "")
            return _check(name, "pass", Found(edits.file, call.lineno), (
                f"an exception during generation answers HTTP 500 with detail "
                f"{prefix!r} + the exception text; vLLM's handler renders it as "
                "{\"error\": {\"message\": ...}}, and the client reads that and {\"detail\"} alike"))
    return _check(name, "fail", edits, "the edits handler raises no HTTP 500 carrying the error text")


# --- offline engine -------------------------------------------------------------------------


def _kwargs_read(source: Source, class_name: str) -> dict[str, Found]:
    """Keys an `__init__` takes out of **kwargs (`kwargs.pop("k")` / `kwargs.get("k")`)."""
    found = code.find_class(source, class_name)
    keys: dict[str, Found] = {}
    if found is None:
        return keys
    for node in ast.walk(found.node):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("pop", "get") and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "kwargs" and node.args
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            keys.setdefault(node.args[0].value, Found(found.file, node.lineno))
    return keys


def check_offline(source: Source, cfg: HostsConfig) -> list[UpstreamCheck]:
    checks = []
    omni = code.find_class(source, "Omni", source.under(ENTRYPOINTS))
    exported = "Omni" in (source.text("vllm_omni/__init__.py") or "")
    checks.append(_check("offline:Omni", "pass" if omni and exported else "fail", omni, (
        "`from vllm_omni import Omni` names the offline engine class" if omni and exported
        else "vllm_omni exports no Omni class")))
    generate = _method_params(source, "Omni", "generate")
    checks.append(_check("offline:generate.sampling_params_list",
                         "pass" if "sampling_params_list" in generate[0] else "fail",
                         generate[1] or omni, "Omni.generate takes sampling_params_list"
                         if "sampling_params_list" in generate[0]
                         else "Omni.generate has no sampling_params_list parameter"))
    sp_file = "vllm_omni/inputs/data.py"
    sp_fields = code.class_fields(source, "OmniDiffusionSamplingParams", [sp_file])
    for name in protocol.SAMPLING_PARAMS:
        found = sp_fields.get(name)
        checks.append(_check(f"sampling-param:{name}", "pass" if found else "fail",
                             found or code.find_class(source, "OmniDiffusionSamplingParams"),
                             f"OmniDiffusionSamplingParams (vllm_omni.inputs.data) "
                             f"{'has' if found else 'has no'} field {name!r}"))
    checks += _kwarg_set_checks(source, cfg)
    return checks


def _method_params(source: Source, class_name: str, method: str) -> tuple[list[str], Found | None]:
    found = code.find_class(source, class_name, source.under(ENTRYPOINTS))
    if found is None:
        return [], None
    names: list[str] = []
    where = None
    for item in found.node.body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name == method:
            names += [a.arg for a in item.args.args + item.args.kwonlyargs]
            where = where or Found(found.file, item.lineno)
    return names, where


def accepted_omni_kwargs(source: Source) -> tuple[dict[str, Found], Found | None]:
    """Keys `Omni(...)` acts on for a diffusion model: those its base takes out of **kwargs, the
    fields of OmniDiffusionConfig, and those the default diffusion stage renames into them; and
    where the rest are filtered out."""
    accepted = dict(_kwargs_read(source, "OmniBase"))
    accepted.update(code.class_fields(source, "OmniDiffusionConfig", ["vllm_omni/diffusion/data.py"]))
    filter_at = None
    for path in source.under("vllm_omni/config/"):
        text = source.text(path) or ""
        if "fields(OmniDiffusionConfig)" in text:
            line = next(i for i, ln in enumerate(text.splitlines(), 1)
                        if "fields(OmniDiffusionConfig)" in ln)
            filter_at = Found(path, line)
            for node in ast.walk(source.tree(path)):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr == "pop" and isinstance(node.func.value, ast.Name)
                        and node.func.value.id == "kwargs" and node.args
                        and isinstance(node.args[0], ast.Constant)):
                    accepted.setdefault(node.args[0].value, Found(path, node.lineno))
            break
    return accepted, filter_at


def _kwarg_set_checks(source: Source, cfg: HostsConfig) -> list[UpstreamCheck]:
    accepted, filter_at = accepted_omni_kwargs(source)
    checks = []
    for name, kwarg_set in cfg.offline_kwarg_sets.items():
        check = f"offline-kwargs:{name}"
        if kwarg_set.kwargs is None:
            checks.append(_check(check, "not-found", None,
                                 "hosts.toml states no kwargs for this set; nothing to check"))
            continue
        dropped = [k for k in kwarg_set.kwargs if k not in accepted]
        if dropped:
            checks.append(_check(check, "fail", filter_at, (
                f"{', '.join(dropped)} reach no engine setting: only OmniDiffusionConfig fields "
                "pass the default diffusion stage's filter")))
        else:
            first = accepted[next(iter(kwarg_set.kwargs))] if kwarg_set.kwargs else filter_at
            checks.append(_check(check, "pass", first, "every kwarg is read: " + ", ".join(
                f"{k} ({accepted[k]})" for k in kwarg_set.kwargs)))
    return checks


# --- deploy configs and pipeline resolution -------------------------------------------------


def _loader_keys(source: Source) -> tuple[set[str], Found | None]:
    """Top-level deploy YAML keys upstream's loader reads, and where the loader is."""
    loader = None
    for path in source.under("vllm_omni/config/"):
        for found in code.defs(source, path, "load_deploy_config"):
            loader = found
    if loader is None:
        return set(), None
    keys: set[str] = set()
    for node in ast.walk(loader.node):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get" and node.args and isinstance(node.args[0], ast.Constant)):
            keys.add(node.args[0].value)
        if isinstance(node, ast.For) and isinstance(node.iter, ast.Tuple):
            keys |= {e.value for e in node.iter.elts if isinstance(e, ast.Constant)}
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant):
            keys.add(node.left.value)
    return {k for k in keys if isinstance(k, str)}, loader


def check_deploy(source: Source, cfg: HostsConfig, root: Path) -> list[UpstreamCheck]:
    keys, loader = _loader_keys(source)
    checks = []
    for name, deploy in cfg.deploy_configs.items():
        check = f"deploy:{name}"
        path = root / deploy.path
        if not deploy.content_known or not path.is_file():
            checks.append(_check(check, "not-found", loader, (
                f"{deploy.path}: content not known (hosts.toml content_known = false)"
                if not deploy.content_known else f"{deploy.path} is not in this repository")))
            continue
        try:
            data = json_loads(path.read_text(encoding="utf-8"))
        except DuplicateKey as exc:
            checks.append(_check(check, "not-found", loader, f"{deploy.path}: {exc}"))
            continue
        except ValueError:
            checks.append(_check(check, "not-found", loader, (
                f"{deploy.path} is YAML beyond its JSON subset; this package reads only that")))
            continue
        problems = []
        if loader is None:
            problems.append("upstream has no load_deploy_config")
        if "stage_args" in data:
            problems.append("uses the removed `stage_args` schema")
        stages = data.get("stages")
        if not isinstance(stages, list) or not all(isinstance(s, dict) and "stage_id" in s
                                                   for s in stages):
            problems.append("`stages` is not a list of mappings that each have stage_id")
        ignored = sorted(k for k in data if k not in keys and k != "stages")
        note = f"; top-level keys the loader ignores: {', '.join(ignored)}" if ignored else ""
        checks.append(_check(check, "fail" if problems else "pass", loader,
                             ("; ".join(problems) if problems
                              else f"loads with load_deploy_config{note}")))
    return checks


def _normalized(text: str) -> str:
    return re.sub(r"[-_]", "", text.lower())


def check_pipeline(source: Source, cfg: HostsConfig) -> list[UpstreamCheck]:
    """Does the served model resolve a registered pipeline config? Without one, upstream builds
    the default diffusion stage from CLI arguments and a --deploy-config does not reach it."""
    model = cfg.serve.served_model_name
    registered = code.dict_keys(source, REGISTRY, "OMNI_PIPELINES")
    registry_at = code.find_class(source, "PipelineConfig")
    basename = _normalized(model.rsplit("/", 1)[-1])
    by_name = [k for k in registered if _normalized(k) and _normalized(k) in basename]
    family = re.sub(r"[^a-z]", "", basename)
    diffusers = sorted({_str_value(kw) for _, node in _all_calls(source, "PipelineConfig")
                        for kw in node.keywords if kw.arg == "diffusers_class_name"} - {None})
    by_class = [c for c in diffusers if _normalized(c).removesuffix("pipeline").startswith(family)]
    where = Found(REGISTRY, min(f.line for f in registered.values()) - 1) if registered else None
    name = f"pipeline:{model}"
    checks = []
    if not registered:
        checks.append(_check(name, "not-found", registry_at, "no OMNI_PIPELINES registry found"))
        resolves = None
    elif by_name or by_class:
        checks.append(_check(name, "pass", where, "registered pipeline(s) match: "
                             + ", ".join(by_name + by_class)))
        resolves = True
    else:
        checks.append(_check(name, "fail", where, (
            f"no OMNI_PIPELINES key matches {model!r} by name and no registered pipeline has a "
            f"diffusers class of its family ({len(registered)} keys read): the model takes the "
            "default single-stage diffusion path, built from CLI arguments only")))
        resolves = False
    warning = next((Found(p, i) for p in source.python_files
                    for i, line in enumerate(source.lines(p), 1)
                    if DEPLOY_IGNORED_WARNING in line), None)
    checks.append(_check("log-line:deploy-config-ignored", "pass" if warning else "not-found",
                         warning, (f"upstream logs {DEPLOY_IGNORED_WARNING!r} when it ignores a "
                                   "deploy config" if warning else
                                   f"no {DEPLOY_IGNORED_WARNING!r} line in this version: an "
                                   "ignored deploy config leaves no sign in the log")))
    default_stage = next(iter(code.calls(source, source.under("vllm_omni/config/"),
                                         "create_typed_default_diffusion")), None)
    for set_name, flag_set in cfg.flag_sets.items():
        if not flag_set.deploy_config:
            continue
        check = f"flag-set-deploy:{set_name}"
        if resolves is False:
            checks.append(_check(check, "fail", default_stage or where, (
                f"--deploy-config {flag_set.deploy_config} is ignored for {model}: no registered "
                "pipeline config resolves, so the default diffusion stage is built from CLI "
                "arguments only and this flag set measures its base configuration")))
        elif resolves:
            checks.append(_check(check, "pass", where,
                                 f"{model} resolves a registered pipeline; its deploy config is read"))
        else:
            checks.append(_check(check, "not-found", None, "pipeline resolution not readable"))
    return checks


def check_model_code(source: Source, cfg: HostsConfig) -> UpstreamCheck:
    """Does this version hold the served model's diffusion code? Found by the folder name the
    model's name gives (`Qwen-Image-2.1` -> `qwen_image_21` or `qwen_image_2_1`) among the
    diffusion registry's entries and the model folders."""
    model = cfg.serve.served_model_name
    wanted = {folder.split("/")[3] for folder in model_folders(model)}
    registry = "vllm_omni/diffusion/registry.py"
    entries = code.dict_keys(source, registry, "_DIFFUSION_MODELS")
    folders = {p.split("/")[3] for p in source.under("vllm_omni/diffusion/models/")
               if p.count("/") > 3}
    found = sorted(wanted & folders)
    name = f"model-code:{model}"
    where = Found(registry, min(f.line for f in entries.values()) - 1) if entries else None
    if found:
        return _check(name, "pass", Found(f"vllm_omni/diffusion/models/{found[0]}/__init__.py", 1)
                      if f"vllm_omni/diffusion/models/{found[0]}/__init__.py" in source.files
                      else where, f"the model's code is in diffusion/models/{found[0]}/")
    return _check(name, "fail", where, (
        f"no diffusion/models/{' or '.join(sorted(wanted))}/ in this version "
        f"({len(entries)} registered diffusion pipelines read): it predates {model} and cannot "
        "serve the probe's model; its other checks hold the harness's interface only"))


def _all_calls(source: Source, name: str):
    for path in source.python_files:
        if name in (source.text(path) or ""):
            for found in code.calls(source, [path], name):
                yield path, found.node


def _str_value(node: ast.AST) -> str | None:
    value = node.value
    return value.value if isinstance(value, ast.Constant) and isinstance(value.value, str) else None


# --- where the offline runner's assumptions meet upstream's behaviour ------------------------


def check_offline_behaviour(source: Source) -> list[UpstreamCheck]:
    """What upstream does that the offline runner must handle: a failed request closes the engine,
    the worker's peak rides on the output, the server keeps an upload's image mode."""
    checks = []
    closes = None
    generate = _method_params(source, "Omni", "generate")[1]
    omni = code.find_class(source, "Omni", source.under(ENTRYPOINTS))
    for item in omni.node.body if omni else []:
        if isinstance(item, ast.FunctionDef) and item.name == "generate":
            for handler in (n for n in ast.walk(item) if isinstance(n, ast.ExceptHandler)):
                calls = [n for n in ast.walk(handler) if isinstance(n, ast.Call)
                         and isinstance(n.func, ast.Attribute) and n.func.attr == "close"]
                if calls and any(isinstance(n, ast.Raise) for n in ast.walk(handler)):
                    closes = Found(omni.file, calls[0].lineno)
    reuses = not protocol.ENDS_AT_A_FAILED_REQUEST
    name = "offline-failure:engine-survives"
    if closes and reuses:
        checks.append(_check(name, "fail", closes, (
            "Omni.generate closes the engine on any exception and re-raises, but the offline "
            "runner recovers and goes on with the same engine (offline_runner.run): every later "
            "request of that runner fails")))
    else:
        checks.append(_check(name, "pass", closes or generate, (
            "Omni.generate closes the engine on any exception and re-raises; the offline "
            "runner ends at a failed request and the harness gives the rest a fresh runner"
            if closes
            else "Omni.generate leaves the engine open when a request fails")))
    output = code.class_fields(source, "OmniRequestOutput", source.under("vllm_omni/outputs/"))
    peak = output.get(WORKER_PEAK)
    reads = protocol.OUTPUT_PEAK == WORKER_PEAK
    checks.append(_check("offline-peak:worker-peak", "fail" if peak and not reads else "pass",
                         peak or code.find_class(source, "OmniRequestOutput"), (
        "the request output carries the worker's peak_memory_mb; the runner ignores it and "
        "reads torch in its own process, which runs no model" if peak and not reads
        else "the runner reads the output's peak_memory_mb" if peak
        else "the request output carries no peak_memory_mb")))
    checks.append(_reference_mode_check(source))
    return checks


def _reference_mode_check(source: Source) -> UpstreamCheck:
    name = "reference-mode:serve-equals-offline"
    files = _routes_files(source)
    edits = code.route(source, files, "post", EDITS_PATH)
    if edits is None:
        return _check(name, "not-found", None, f"no {EDITS_PATH} handler to read")
    load = next((n for n in ast.walk(edits.node) if isinstance(n, ast.Call)
                 and isinstance(n.func, ast.Name) and n.func.id == "_load_input_images"), None)
    normalize = code.keyword(load, "normalize_rgb") if load else None
    always_rgb = isinstance(normalize, ast.Constant) and normalize.value is True
    runner_rgb = protocol.REFERENCES_TO_RGB
    where = Found(edits.file, load.lineno) if load else edits
    if load is None:
        return _check(name, "not-found", edits, "the edits handler's image loading is not read")
    if runner_rgb != always_rgb:
        server = ("converts every upload to RGB" if always_rgb else "keeps an upload's mode "
                  f"unless normalize_rgb ({ast.unparse(normalize) if normalize else 'unset'}) holds")
        runner = "converts references to RGB" if runner_rgb else "keeps the files' modes"
        return _check(name, "fail", where, (
            f"the server {server}, while the offline runner {runner}: serve and offline runs "
            "of the same fixture are not given the same images"))
    return _check(name, "pass", where, "the server and the offline runner hand the pipeline "
                  "references in the same mode")


def run_checks(source: Source, cfg: HostsConfig, root: Path,
               vllm: Source | None = None) -> list[UpstreamCheck]:
    """Every named check, in a fixed order; `vllm`: vLLM's source, for the flags vLLM-Omni's
    serve parser takes from it."""
    return (check_serve_flags(source, cfg, vllm) + check_http(source, cfg)
            + check_offline(source, cfg)
            + check_offline_behaviour(source) + check_deploy(source, cfg, root)
            + check_pipeline(source, cfg) + [check_model_code(source, cfg)])
