"""A registry of named implementations (backbones, environments): built-ins listed in code, third
parties added through Python entry points.

Built-ins are listed in code, not as entry points of this distribution, so a checkout that was never
installed (no dist-info on the path) still has every one of them. A third-party distribution adds one
with an entry point in its own pyproject.toml, e.g.

    [project.entry-points."grandrounds.backbones"]
    vendor = "vendor_pkg.backbone:registration"

whose target is the registration object (`BackboneRegistration`, `EnvironmentRegistration`).

Refusals, never a silent choice: an entry point whose name is a built-in's, or another entry point's,
is an error naming both (whichever `grandrounds` reads first would otherwise win, and a run's spec
names its backbone by name only: two implementations of one name make a log mean two things). The
names are read from the installed metadata (again whenever sys.path changes), which imports nothing; an entry point's
module is imported only when its registration is needed (its name is used, or every registration is
listed, as iterating `RECORDED_BACKBONES` does), so a broken plugin stops what needs it, with an error
that names the entry point and its distribution, and never the lookups of other names.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Callable, Generic, Iterator, TypeVar

from grandrounds.store.errors import InvalidInput

T = TypeVar("T")


class RegistryError(InvalidInput, ValueError):
    """A broken or clashing registration (bad input, exit code 2): the message names the entry point."""


def load_path(path: str) -> Any:
    """The object `module:attr` names (attr may be dotted)."""
    module, _, attr = path.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split(".") if attr else []:
        obj = getattr(obj, part)
    return obj


def _describe(ep: metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    where = f" from distribution {dist.name} {dist.version}" if dist is not None else ""
    return f"entry point {ep.name!r} = {ep.value!r} in group {ep.group!r}{where}"


@dataclass(frozen=True)
class _Found:
    name: str
    origin: str
    """`built-in` or the entry point as `_describe` writes it."""
    path: str | None = None
    entry_point: metadata.EntryPoint | None = None


class Registry(Generic[T]):
    """Names -> registrations of one kind (`what`: "backbone"), read from `builtins` and entry-point `group`.

    `check` turns a loaded object into a registration, or raises TypeError saying what it is not."""

    def __init__(self, what: str, group: str, builtins: dict[str, str], check: Callable[[Any], T]):
        self.what = what
        self.group = group
        self._builtins = dict(builtins)
        self._check = check
        self._loaded: dict[tuple[str, str], T] = {}
        """(name, origin) -> registration: an entry point is imported once per process."""
        self._scanned: tuple[tuple, list[metadata.EntryPoint]] | None = None

    def _entry_points(self) -> list[metadata.EntryPoint]:
        # Scanning every installed distribution's metadata costs ~6 ms, and order replay asks whether a
        # backbone is recorded per run: the scan is kept until the import path changes (a distribution
        # added to sys.path, as tests do) or `entry_points` itself is replaced (tests patch it).
        key = (tuple(sys.path), metadata.entry_points)
        if self._scanned is None or self._scanned[0] != key:
            eps = sorted(metadata.entry_points(group=self.group), key=lambda e: (e.name, e.value))
            self._scanned = (key, eps)
        return self._scanned[1]

    def _entries(self) -> dict[str, _Found]:
        found = {name: _Found(name, "built-in", path=path) for name, path in self._builtins.items()}
        for ep in self._entry_points():
            if ep.name in found:
                raise RegistryError(f"{_describe(ep)}: {self.what} {ep.name!r} is already registered "
                                    f"({found[ep.name].origin}); a {self.what} name has one implementation — "
                                    "uninstall one of them or rename the entry point")
            found[ep.name] = _Found(ep.name, _describe(ep), entry_point=ep)
        return found

    def names(self) -> list[str]:
        """Built-ins first, in their listed order, then entry points by name."""
        return list(self._entries())

    def builtin_names(self) -> list[str]:
        return list(self._builtins)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._entries()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def origin(self, name: str) -> str:
        return self._entries()[name].origin

    def get(self, name: str) -> T:
        """The registration of `name`; KeyError when none is registered, RegistryError when it is broken."""
        entry = self._entries()[name]
        key = (name, entry.origin)
        if key not in self._loaded:
            if entry.entry_point is None:
                self._loaded[key] = self._check(load_path(entry.path or ""))  # ours: a failure is a bug, raised as is
            else:
                self._loaded[key] = self._load_entry_point(entry)
        return self._loaded[key]

    def _load_entry_point(self, entry: _Found) -> T:
        assert entry.entry_point is not None
        try:
            obj = entry.entry_point.load()
        except Exception as exc:  # any failure of a third party's import is reported, naming it
            raise RegistryError(f"{entry.origin}: cannot be loaded ({type(exc).__name__}: {exc})") from exc
        try:
            return self._check(obj)
        except TypeError as exc:
            raise RegistryError(f"{entry.origin}: {exc}") from None
