"""Secrets kept out of what is recorded: the values of secret-bearing options (`--hf-token`,
`--api-key`, ...), credentials in URLs (`user:pass@`, `?token=`) and HTTP credentials
(`Authorization:` values, bearer tokens). The process that needs a
secret gets the real argument; attempt.json, runs.json and the server logs kept as artifacts get
REDACTED in its place."""

from __future__ import annotations

import re
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


def redact_text(text: str) -> str:
    """`text` with URL credentials and `name=value`, `name: value`, `--name value` secrets
    replaced (a log line, an error message, one argument)."""
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
            out.append(redact_text(arg))
    return out


def redact_file(path: Path) -> None:
    """Rewrite a text file kept as an artifact (a server log) with its secrets redacted; a file
    without any is left as it is."""
    text = path.read_text(encoding="utf-8", errors="replace")
    redacted = "\n".join(redact_text(line) for line in text.split("\n"))
    if redacted != text:
        write_text_atomic(path, redacted)
