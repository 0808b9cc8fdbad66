"""Small readers of upstream's Python by its AST: argparse flags, FastAPI routes and their
parameters, class fields, dict keys and module constants. Each answers with the `file:line` where
it found the thing, or None."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

from omniprobe.upstream.source import Source


@dataclass(frozen=True)
class Found:
    file: str
    line: int
    node: ast.AST | None = None

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


def _walk(source: Source, files: list[str], needle: str | None = None,
          ) -> Iterator[tuple[str, ast.AST]]:
    """Every node of the files, in order; only files whose text holds `needle` are parsed."""
    for path in files:
        if needle is not None and needle not in (source.text(path) or ""):
            continue
        tree = source.tree(path)
        if tree is not None:
            for node in ast.walk(tree):
                yield path, node


def _call_name(node: ast.Call) -> str | None:
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def _str(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def argparse_flags(source: Source, files: list[str]) -> dict[str, Found]:
    """Every `--flag` (and its aliases) given to an `add_argument` call, first definition wins."""
    flags: dict[str, Found] = {}
    for path, node in _walk(source, files, "add_argument"):
        if isinstance(node, ast.Call) and _call_name(node) == "add_argument":
            for arg in node.args:
                name = _str(arg)
                if name and name.startswith("-"):
                    flags.setdefault(name, Found(path, node.lineno, node))
    return flags


def calls(source: Source, files: list[str], name: str) -> list[Found]:
    return [Found(path, node.lineno, node) for path, node in _walk(source, files, name)
            if isinstance(node, ast.Call) and _call_name(node) == name]


def route(source: Source, files: list[str], method: str, path: str) -> Found | None:
    """The handler decorated `@<router|app>.<method>("<path>", ...)`; Found.node is the def."""
    for file, node in _walk(source, files, path):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for deco in node.decorator_list:
                if (isinstance(deco, ast.Call) and isinstance(deco.func, ast.Attribute)
                        and deco.func.attr == method.lower() and deco.args
                        and _str(deco.args[0]) == path):
                    return Found(file, deco.lineno, node)
    return None


@dataclass(frozen=True)
class Param:
    name: str  # the name on the wire: the alias where one is given
    kind: str | None  # Form, File, ... (the default's call), or None
    annotation: str | None
    line: int


def handler_params(handler: ast.FunctionDef | ast.AsyncFunctionDef) -> list[Param]:
    """A FastAPI handler's parameters as the request names them."""
    args = handler.args.args + handler.args.kwonlyargs
    defaults = ([None] * (len(handler.args.args) - len(handler.args.defaults))
                + list(handler.args.defaults) + list(handler.args.kw_defaults))
    params = []
    for arg, default in zip(args, defaults, strict=True):
        name, kind = arg.arg, None
        if isinstance(default, ast.Call):
            kind = _call_name(default)
            alias = next((_str(k.value) for k in default.keywords if k.arg == "alias"), None)
            name = alias or name
        annotation = ast.unparse(arg.annotation) if arg.annotation is not None else None
        params.append(Param(name, kind, annotation, arg.lineno))
    return params


def find_class(source: Source, name: str, files: list[str] | None = None) -> Found | None:
    files = files if files is not None else source.python_files
    for file, node in _walk(source, files, f"class {name}"):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return Found(file, node.lineno, node)
    return None


def class_fields(source: Source, name: str, files: list[str] | None = None,
                 _seen: frozenset[str] = frozenset()) -> dict[str, Found]:
    """Annotated fields of a class and of those of its bases found in the source."""
    found = find_class(source, name, files)
    if found is None or name in _seen:
        return {}
    node = found.node
    assert isinstance(node, ast.ClassDef)
    fields: dict[str, Found] = {}
    for base in node.bases:
        base_name = base.id if isinstance(base, ast.Name) else None
        if base_name:
            fields.update(class_fields(source, base_name, files, _seen | {name}))
    for item in node.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            fields[item.target.id] = Found(found.file, item.lineno, item)
    return fields


def string_key(source: Source, files: list[str], key: str) -> Found | None:
    """Where `key` is used as a dict key or written as a subscript (`d["key"] = ...`)."""
    for file, node in _walk(source, files, key):
        if isinstance(node, ast.Dict) and any(_str(k) == key for k in node.keys if k):
            return Found(file, node.lineno, node)
        if (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store)
                and _str(node.slice) == key):
            return Found(file, node.lineno, node)
    return None


def module_constants(source: Source, path: str) -> dict[str, tuple[str, int]]:
    """Module-level string constants, f-strings of earlier ones resolved: name -> (value, line)."""
    tree = source.tree(path)
    values: dict[str, tuple[str, int]] = {}
    for node in tree.body if tree else []:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)):
            continue
        value = _str(node.value)
        if isinstance(node.value, ast.JoinedStr):
            parts = []
            for part in node.value.values:
                if _str(part) is not None:
                    parts.append(_str(part))
                elif (isinstance(part, ast.FormattedValue) and isinstance(part.value, ast.Name)
                      and part.value.id in values):
                    parts.append(values[part.value.id][0])
                else:
                    break
            else:
                value = "".join(parts)
        if value is not None:
            values[node.targets[0].id] = (value, node.lineno)
    return values


def dict_keys(source: Source, path: str, name: str) -> dict[str, Found]:
    """The string keys of a module-level dict literal `name = {...}` (or `name: T = {...}`)."""
    tree = source.tree(path)
    for node in tree.body if tree else []:
        target = (node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1
                  else node.target if isinstance(node, ast.AnnAssign) else None)
        if (isinstance(target, ast.Name) and target.id == name
                and isinstance(node.value, ast.Dict)):
            return {_str(k): Found(path, k.lineno) for k in node.value.keys if _str(k)}
    return {}


def defs(source: Source, path: str, name: str) -> list[Found]:
    """Every function or class named `name` in a file; Found.node is the definition."""
    tree = source.tree(path)
    return [Found(path, node.lineno, node) for node in ast.walk(tree) if tree
            and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            and node.name == name] if tree else []


def raises_in(handler: ast.AST, exception: str) -> list[ast.Call]:
    """The `raise <exception>(...)` calls inside a function."""
    return [node.exc for node in ast.walk(handler)
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)
            and _call_name(node.exc) == exception]


def keyword(call: ast.Call, name: str) -> ast.AST | None:
    return next((k.value for k in call.keywords if k.arg == name), None)
