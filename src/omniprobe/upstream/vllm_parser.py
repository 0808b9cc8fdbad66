"""vLLM's own serve parser, read from its source with `ast`: the flags `vllm serve` defines (which
vLLM-Omni's parser starts from), where, and the choices the parser states for their values.

vLLM builds the parser in `make_arg_parser` from two kinds of definition:

- `add_argument("--flag", ..., **<cls>_kwargs["field"])` calls (vllm/engine/arg_utils.py,
  EngineArgs.add_cli_args), the field's type read from the config class `get_kwargs(<Cls>)`
  names;
- the fields of a frontend dataclass, each `--field-name` (`add_cli_args` loops over
  `get_kwargs(cls)` adding `f"--{key.replace('_', '-')}"`: FrontendArgs' host and port).

A field typed `Literal[...]` (or an alias of one) gets those choices; one whose type also admits
`str` gets them only as a metavar, so the parser accepts any string (vLLM's literal_to_kwargs).
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass

from omniprobe.upstream import code
from omniprobe.upstream.code import Found
from omniprobe.upstream.source import Source

# Where vLLM's serve parser is defined (its path moved between releases).
PARSER_FILES = ("vllm/entrypoints/launchers/cli_args.py", "vllm/entrypoints/openai/cli_args.py",
                "vllm/engine/arg_utils.py")
CONFIG_PREFIX = "vllm/"


@dataclass(frozen=True)
class VllmFlag:
    where: Found
    field_type: str | None = None  # the config field's annotation, where the flag has one
    type_at: Found | None = None
    literals: tuple[str, ...] = ()  # the values its Literal names
    free_string: bool = False  # the type also admits str: the literals are a metavar only

    @property
    def choices(self) -> tuple[str, ...] | None:
        """The values the parser accepts; None: it states no choices."""
        return self.literals if self.literals and not self.free_string else None


def _is_str_loop_flag(node: ast.AST) -> bool:
    """`f"--{key.replace('_', '-')}"`: a flag per field of the class."""
    return (isinstance(node, ast.JoinedStr) and node.values
            and isinstance(node.values[0], ast.Constant) and node.values[0].value == "--"
            and "replace" in ast.unparse(node))


def _classes(tree: ast.Module) -> dict[str, ast.ClassDef]:
    return {n.name: n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}


def _fields(cls: ast.ClassDef) -> dict[str, ast.AnnAssign]:
    return {n.target.id: n for n in cls.body
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def _field_flags(source: Source, path: str) -> dict[str, VllmFlag]:
    """The flags of every dataclass whose add_cli_args (its own or an in-file base's) adds one
    flag per field."""
    tree = source.tree(path)
    if tree is None:
        return {}
    classes = _classes(tree)
    looping = {name for name, cls in classes.items()
               if any(_is_str_loop_flag(n) for n in ast.walk(cls))}

    def lineage(name: str) -> list[ast.ClassDef]:
        out, todo = [], [name]
        while todo:
            cls = classes.get(todo.pop())
            if cls is not None and cls not in out:
                out.append(cls)
                todo += [b.id for b in cls.bases if isinstance(b, ast.Name)]
        return out

    flags: dict[str, VllmFlag] = {}
    for name in classes:
        chain = lineage(name)
        if not any(c.name in looping for c in chain):
            continue
        for cls in chain:
            for field, node in _fields(cls).items():
                flags.setdefault(f"--{field.replace('_', '-')}", VllmFlag(
                    Found(path, node.lineno), ast.unparse(node.annotation),
                    Found(path, node.lineno)))
    return flags


def _kwargs_classes(function: ast.AST) -> dict[str, str]:
    """`x_kwargs = get_kwargs(Cls)` in a function: variable -> class name."""
    out = {}
    for node in ast.walk(function):
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Name) and node.value.func.id == "get_kwargs"
                and node.value.args and isinstance(node.value.args[0], ast.Name)):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out[target.id] = node.value.args[0].id
    return out


def _field_of(call: ast.Call) -> tuple[str, str] | None:
    """(kwargs variable, field) of a `**x_kwargs["field"]` in the call."""
    for kw in call.keywords:
        value = kw.value
        if (kw.arg is None and isinstance(value, ast.Subscript) and isinstance(value.value, ast.Name)
                and isinstance(value.slice, ast.Constant) and isinstance(value.slice.value, str)):
            return value.value.id, value.slice.value
    return None


def _call_flags(source: Source, path: str) -> dict[str, VllmFlag]:
    tree = source.tree(path)
    if tree is None:
        return {}
    flags: dict[str, VllmFlag] = {}
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        kwargs_of = _kwargs_classes(function)
        for node in ast.walk(function):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "add_argument"):
                continue
            names = [a.value for a in node.args
                     if isinstance(a, ast.Constant) and isinstance(a.value, str)
                     and a.value.startswith("--")]
            ref = _field_of(node)
            field_type = type_at = None
            if ref is not None and ref[0] in kwargs_of:
                field = _config_field(source, kwargs_of[ref[0]], ref[1])
                if field is not None:
                    field_type, type_at = field
            for name in names:
                flags.setdefault(name, VllmFlag(Found(path, node.lineno), field_type, type_at))
    return flags


def _config_field(source: Source, cls: str, field: str) -> tuple[str, Found] | None:
    found = code.find_class(source, cls, source.under(CONFIG_PREFIX))
    if found is None:
        return None
    node = _fields(found.node).get(field)
    return (ast.unparse(node.annotation), Found(found.file, node.lineno)) if node else None


def _literal_alias(source: Source, name: str) -> tuple[str, ...]:
    """The strings of `name = Literal[...]` wherever vLLM defines it."""
    needle = f"{name} = Literal["
    for path in source.under(CONFIG_PREFIX):
        if needle not in (source.text(path) or ""):
            continue
        for node in ast.walk(source.tree(path) or ast.Module(body=[], type_ignores=[])):
            if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name
                                                     for t in node.targets)):
                return _literal_strings(node.value)
    return ()


def _literal_strings(node: ast.AST) -> tuple[str, ...]:
    if isinstance(node, ast.Subscript) and ast.unparse(node.value).endswith("Literal"):
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        return tuple(i.value for i in items if isinstance(i, ast.Constant)
                     and isinstance(i.value, str))
    return ()


_BUILTIN = frozenset({"str", "int", "float", "bool", "None", "dict", "list", "Any"})


def _typed(source: Source, flag: VllmFlag, aliases) -> VllmFlag:
    """The flag with its type's literals and whether it also admits any string."""
    if flag.field_type is None:
        return flag
    try:
        annotation = ast.parse(flag.field_type, mode="eval").body
    except SyntaxError:
        return flag
    members, todo = [], [annotation]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            todo += [node.left, node.right]
        else:
            members.append(node)
    literals: list[str] = []
    for member in members:
        literals += _literal_strings(member) or (
            aliases(member.id) if isinstance(member, ast.Name) and member.id not in _BUILTIN
            else ())
    free = any(isinstance(m, ast.Name) and m.id == "str" for m in members)
    return VllmFlag(flag.where, flag.field_type, flag.type_at, tuple(literals), free)


def serve_flags(source: Source) -> dict[str, VllmFlag]:
    """Every flag vLLM's serve parser defines, first definition wins."""
    flags: dict[str, VllmFlag] = {}
    for path in PARSER_FILES:
        if source.text(path) is None:
            continue
        for name, flag in {**_field_flags(source, path), **_call_flags(source, path)}.items():
            flags.setdefault(name, flag)
    aliases = functools.cache(lambda name: _literal_alias(source, name))
    return {name: _typed(source, flag, aliases) for name, flag in flags.items()}
