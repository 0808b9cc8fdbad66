"""Secrets kept out of what is recorded: the values of secret-bearing options (`--hf-token`,
`--api-key`, ...), credentials in URLs (`user:pass@`, `?token=`) and HTTP credentials
(`Authorization:` values, bearer tokens). The process that needs a
secret gets the real argument; attempt.json, runs.json and the server logs kept as artifacts get
REDACTED in its place.

Patterns miss a secret printed bare (a runner that prints HF_TOKEN's value), so the values of the
secret-bearing variables of this process's environment, which every server and runner it starts
inherits, are redacted by value too, wherever text goes through here: the hub's tokens (its
variables and its token file) and every variable the secret-name pattern matches, with a value of
at least MIN_SECRET_CHARS characters (so `TOKENIZERS_PARALLELISM=false` hides no "false")."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path

from omniprobe.atomic import write_text_atomic

REDACTED = "<redacted>"

# An option or key that names a secret: ends in token, key (api-key, access_key), secret,
# password or credential(s); `max_tokens` or `tokenizer` do not.
_SECRET_NAME = r"[\w.-]*?(?:token|api[_-]?key|access[_-]?key|secret|password|passwd|credentials?)"
_SECRET_OPTION = re.compile(rf"^--?{_SECRET_NAME}$", re.IGNORECASE)
_URL_USERINFO = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^/\s:@]+:)[^/\s@]+(@)", re.IGNORECASE)
_URL_QUERY = re.compile(rf"([?&]{_SECRET_NAME}=)[^&\s#'\"]+", re.IGNORECASE)
_ASSIGNED = re.compile(rf"(\b{_SECRET_NAME}['\"]?\s*[:=]\s*['\"]?)(?!{re.escape(REDACTED)})"
                       r"[^'\",\s}]+", re.IGNORECASE)
_OPTION_IN_TEXT = re.compile(rf"(--{_SECRET_NAME}[= ])(?!{re.escape(REDACTED)})\S+",
                             re.IGNORECASE)
# An HTTP credential: `Authorization: <scheme> <value>` (any scheme), and a bare `Bearer <token>`.
_AUTHORIZATION = re.compile(rf"(\b(?:proxy-)?authorization['\"]?\s*[:=]\s*['\"]?)"
                            rf"(?!{re.escape(REDACTED)})(?:[a-z]+\s+(?!{re.escape(REDACTED)}))?"
                            r"[^'\",\s}]+", re.IGNORECASE)
_BEARER = re.compile(rf"(\bbearer\s+)(?!{re.escape(REDACTED)})[\w.~+/=-]+", re.IGNORECASE)


MIN_SECRET_CHARS = 8
_SECRET_VARIABLE = re.compile(rf"^{_SECRET_NAME}$", re.IGNORECASE)
_HUB_TOKEN_FILE_BYTES = 4096  # a token file holds one token


def _hub_token_file(environ: Mapping[str, str]) -> Path:
    """Where huggingface_hub keeps its login token (HF_TOKEN_PATH, else HF_HOME's `token`)."""
    if environ.get("HF_TOKEN_PATH"):
        return Path(environ["HF_TOKEN_PATH"]).expanduser()
    home = environ.get("HF_HOME") or os.path.join(
        environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface")
    return Path(home).expanduser() / "token"


def secret_values(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The secrets to redact by value, longest first (a secret holding another is hidden whole)."""
    environ = os.environ if environ is None else environ
    values = {value for name, value in environ.items() if _SECRET_VARIABLE.match(name)}
    try:
        with open(_hub_token_file(environ), "rb") as handle:  # a token file is small and UTF-8
            values.add(handle.read(_HUB_TOKEN_FILE_BYTES).decode("utf-8", "replace").strip())
    except OSError:
        pass
    return tuple(sorted((v for v in values if len(v) >= MIN_SECRET_CHARS and REDACTED not in v),
                        key=lambda v: (-len(v), v)))


def redact_values(text: str, secrets: tuple[str, ...]) -> str:
    """`text` with each of `secrets` replaced, as written and as JSON writes it inside a string."""
    for secret in secrets:
        for form in dict.fromkeys((secret, json.dumps(secret)[1:-1])):
            text = text.replace(form, REDACTED)
    return text


def redact_bytes(data: bytes, secrets: tuple[str, ...]) -> bytes:
    """`data` (a file of any encoding) with each of `secrets`, UTF-8 encoded, replaced."""
    for secret in secrets:
        for form in dict.fromkeys((secret, json.dumps(secret)[1:-1])):
            data = data.replace(form.encode("utf-8"), REDACTED.encode())
    return data


def redact_text(text: str, secrets: tuple[str, ...] | None = None) -> str:
    """`text` with the environment's secrets (`secrets`: secret_values()), URL credentials and
    `name=value`, `name: value`, `--name value` secrets replaced (a log line, an error message,
    one argument)."""
    text = redact_values(text, secret_values() if secrets is None else secrets)
    text = _URL_USERINFO.sub(rf"\1{REDACTED}\2", text)
    text = _URL_QUERY.sub(rf"\1{REDACTED}", text)
    text = _OPTION_IN_TEXT.sub(rf"\1{REDACTED}", text)
    text = _AUTHORIZATION.sub(rf"\1{REDACTED}", text)
    text = _BEARER.sub(rf"\1{REDACTED}", text)
    return _ASSIGNED.sub(rf"\1{REDACTED}", text)


def redact_args(args: list[str]) -> list[str]:
    """A command line as it may be recorded: the value after a secret option (or after its
    `=`) and any credentials inside an argument are REDACTED."""
    out: list[str] = []
    hide_next = False
    secrets = secret_values()
    for arg in args:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
        elif _SECRET_OPTION.match(arg.split("=", 1)[0]):
            if "=" in arg:
                out.append(f"{arg.split('=', 1)[0]}={REDACTED}")
            else:
                out.append(arg)
                hide_next = True
        else:
            out.append(redact_text(arg, secrets))
    return out


def redact_file(*paths: Path) -> None:
    """Rewrite each text file kept as an artifact (a server log, a runner's results file) with
    its secrets redacted; a file without any is left as it is, and one never written is skipped."""
    secrets = secret_values()
    for path in paths:
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        redacted = "\n".join(redact_text(line, secrets) for line in text.split("\n"))
        if redacted != text:
            write_text_atomic(path, redacted)
