"""Where a number stops being plausible for its unit: every loader, model and option that takes
one of these refuses what lies beyond, and says the bound (no pydantic here: the CLI's option
types use it before anything heavy is imported)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

MAX_WAIT_S = 7 * 24 * 3600  # a timeout or wait: a week
MAX_VRAM_GB = 1024  # a card's marketed memory: far above any GPU made
MAX_BYTES = 2**40  # a capacity, cap or allocation: 1 TiB
MAX_MIB = MAX_BYTES // 2**20
MAX_SEED = 2**32 - 1  # a seed: 32 bits, as every generator the stacks use accepts
MAX_ISSUE = 10**7  # an issue number
EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)  # evidence older than this was not made by omniprobe
CLOCK_SKEW = timedelta(days=1)
MIB = 2**20


@dataclass(frozen=True)
class ArchiveLimits:
    """How large an evidence archive may be, and what it may hold; pack keeps within them too,
    so what it writes unpacks. Each refusal names its limit."""

    archive_bytes: int = 256 * MIB  # the .tar.gz itself
    member_bytes: int = 64 * MIB  # one member, unpacked (an evidence file's own read limit)
    unpacked_bytes: int = 512 * MIB  # all members together, unpacked
    members: int = 10_000  # the files it holds, the manifest included


ARCHIVE_LIMITS = ArchiveLimits()


def require_timestamp(value: datetime) -> datetime:
    """`value`, if it lies between EARLIEST and now (a day of clock skew allowed)."""
    aware = value if value.tzinfo else value.replace(tzinfo=UTC)
    latest = datetime.now(UTC) + CLOCK_SKEW
    if not EARLIEST <= aware <= latest:
        raise ValueError(f"a timestamp from {EARLIEST:%Y-%m-%d} up to now (a day of clock skew "
                         f"allowed: {latest:%Y-%m-%d}); got {value.isoformat()}")
    return value
