"""The one pattern of every name a file gives to a host, flag set, fixture, kwarg set or profile:
such names become folder and file names (evidence/<host>/, artifacts/<flag set>/), so a name is
never a path, a space or a case variant of another."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field

NAME_PATTERN = r"^[a-z][a-z0-9-]*$"
MAX_NAME_LENGTH = 64
_NAME = re.compile(NAME_PATTERN)


def require_name(value: str) -> str:
    """`value`, if it is a name: lower-case letters, digits and '-', starting with a letter."""
    if not _NAME.match(value) or len(value) > MAX_NAME_LENGTH:
        raise ValueError(f"a name is lower-case letters, digits and '-', starting with a letter, "
                         f"at most {MAX_NAME_LENGTH} characters; got {value!r}")
    return value


Name = Annotated[str, AfterValidator(require_name),
                 Field(json_schema_extra={"pattern": NAME_PATTERN, "maxLength": MAX_NAME_LENGTH})]
