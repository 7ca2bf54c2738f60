"""DuckDB settings that bound what a store's file keeps resident (issue 17, flat memory): opt-in.

DuckDB keeps every block of the file it has read or written in its buffer pool until `memory_limit`
is reached (default 80 % of RAM), so a long run's whole file stays in memory and peak RSS grows with
the number of cases (README, "Flat memory"). `GRANDROUNDS_DUCKDB_SET=memory_limit=128MB` bounds
that pool (name=value[,name=value] for the names in `NAMES`, sizes such as `256MB`; `off` or unset:
DuckDB's own defaults). None changes a byte written. It is not on by default: DuckDB must hold a
whole value in memory, so under a limit a large single value fails with OutOfMemory (with 128MB, a
40 MiB checkpoint blob, which an evo-medagent memory of a few thousand episodes reaches, or a large
`memory.seeded` event); a lower `checkpoint_threshold` or `allocator_flush_threshold` made peak RSS
higher, not lower (benchmarks/bench_memory_breakdown.py --duckdb-set ...). Applied to database
files only (an in-memory store has no file to evict blocks to).
"""

from __future__ import annotations

import os
import re

import duckdb

from grandrounds.store.errors import InvalidInput

SETTINGS_ENV = "GRANDROUNDS_DUCKDB_SET"

NAMES = ("memory_limit", "checkpoint_threshold", "allocator_flush_threshold")
"""The settings `GRANDROUNDS_DUCKDB_SET` may give."""

DEFAULTS: dict[str, str] = {}
"""Setting -> value for every file a store opens when the environment gives none: DuckDB's own
(see above for why `memory_limit` is not bounded by default)."""

_SIZE = re.compile(r"^\d+(\.\d+)?\s*(B|KB|MB|GB|KiB|MiB|GiB)$", re.IGNORECASE)


class DuckDBSettingError(InvalidInput, ValueError):
    """`GRANDROUNDS_DUCKDB_SET` names a setting or size this store does not take (exit code 2)."""


def duckdb_settings(env: str | None = None) -> dict[str, str]:
    """The settings to apply: `DEFAULTS`, overridden by `GRANDROUNDS_DUCKDB_SET` (or `env` when given)."""
    text = os.environ.get(SETTINGS_ENV, "") if env is None else env
    text = text.strip()
    if text.lower() == "off":
        return {}
    out = dict(DEFAULTS)
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or name not in NAMES:
            raise DuckDBSettingError(f"{SETTINGS_ENV}: {part!r} is not name=value for one of {', '.join(NAMES)}")
        if not _SIZE.match(value):
            raise DuckDBSettingError(f"{SETTINGS_ENV}: {name}={value!r} is not a size such as 256MB")
        out[name] = value
    return out


def apply_settings(conn: duckdb.DuckDBPyConnection, settings: dict[str, str]) -> None:
    """SET each one (names are checked against `NAMES`, values are bound parameters)."""
    for name, value in settings.items():
        if name not in NAMES:
            raise DuckDBSettingError(f"unknown DuckDB setting {name!r}")
        conn.execute(f"SET {name} = ?", [value])
