"""Event envelopes, the payload registry and the upcaster path.

A domain event is a pydantic payload model registered under a dotted type name with a
`schema_version`. The store persists `payload` (state) apart from `meta` (wall clock,
latency, host: never read when folding state). Old payload versions are upcast on read,
one version step at a time, so stored bytes are never rewritten.
"""

from __future__ import annotations

from grandrounds.store.errors import InvalidInput
from dataclasses import dataclass, field, fields
from typing import Any, Callable, ClassVar, TypeVar, get_type_hints

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer

from grandrounds.store.canonical import canonical_json


class EventPayload(BaseModel):
    """Base class of every event payload. Subclasses set `event_type` and `schema_version`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    event_type: ClassVar[str]
    schema_version: ClassVar[int] = 1
    carries_memory: ClassVar[bool] = False
    """Whether the event changes memory a later run can start from (offline mode copies these)."""


class GrowingPayload(EventPayload):
    """A payload type that gained fields after logs existed. The fields named in `omit_if_default` are
    left out of the payload while they hold their default, so events of runs that do not use them keep
    their bytes (and fingerprints). Only these types pay for the wrap serializer."""

    omit_if_default: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _omit_defaults(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        for name, default in _defaults_of(type(self)).items():
            if name in data and getattr(self, name) == default:
                del data[name]
        return data


_DEFAULTS: dict[type, dict[str, Any]] = {}


def _defaults_of(cls: type[GrowingPayload]) -> dict[str, Any]:
    """The defaults of a type's omittable fields, worked out once: pydantic's get_default inspects the
    default factory's signature on every call (0.5 ms, on every retrieval event)."""
    found = _DEFAULTS.get(cls)
    if found is None:
        found = _DEFAULTS[cls] = {name: cls.model_fields[name].get_default(call_default_factory=True)
                                  for name in sorted(cls.omit_if_default)}
    return found


_REGISTRY: dict[str, type[EventPayload]] = {}
_UPCASTERS: dict[tuple[str, int], Callable[[dict[str, Any]], dict[str, Any]]] = {}

P = TypeVar("P", bound=type[EventPayload])


def event(type_name: str, version: int = 1) -> Callable[[P], P]:
    """Class decorator registering a payload model under `type_name` at `version`."""

    def register(cls: P) -> P:
        if type_name in _REGISTRY and _REGISTRY[type_name] is not cls:
            raise ValueError(f"event type {type_name!r} registered twice")
        cls.event_type = type_name
        cls.schema_version = version
        _REGISTRY[type_name] = cls
        return cls

    return register


def upcaster(type_name: str, from_version: int) -> Callable[[Callable], Callable]:
    """Register a function turning a `from_version` payload dict into `from_version + 1`."""

    def register(fn: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable:
        _UPCASTERS[(type_name, from_version)] = fn
        return fn

    return register


class UnknownEventType(InvalidInput, LookupError):
    pass


def payload_class(type_name: str) -> type[EventPayload]:
    try:
        return _REGISTRY[type_name]
    except KeyError:
        raise UnknownEventType(f"unknown event type {type_name!r}") from None


def upcast(type_name: str, version: int, payload: dict[str, Any]) -> dict[str, Any]:
    """Bring a stored payload dict up to the registered version of its type."""
    target = payload_class(type_name).schema_version
    if version > target:
        raise ValueError(f"{type_name} v{version} is newer than this code (v{target}); upgrade grandrounds")
    while version < target:
        try:
            step = _UPCASTERS[(type_name, version)]
        except KeyError:
            raise ValueError(f"no upcaster for {type_name} v{version} -> v{version + 1}") from None
        payload = step(payload)
        version += 1
    return payload


@dataclass(frozen=True)
class NewEvent:
    """An event about to be appended; the store assigns `seq`."""

    payload: EventPayload
    case_id: str | None = None
    causation_seq: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    dumped: dict[str, Any] | None = field(default=None, compare=False, repr=False)
    """`payload.model_dump(mode="json")` where the emitter already made it (de-identification dumps every
    memory event to scan it): the store writes it instead of dumping the payload again. Not part of the
    event's identity."""

    @property
    def type(self) -> str:
        return self.payload.event_type

    def payload_dict(self) -> dict[str, Any]:
        return self.dumped if self.dumped is not None else self.payload.model_dump(mode="json")


@dataclass(frozen=True)
class StoredEvent:
    """An event as the log holds it: its envelope and payload (plaintext once read: sealed content is
    opened). A stored row is decoded into one in one place, the store's mapper (store/mapper.py)."""

    run_id: str
    seq: int
    type: str
    schema_version: int
    case_id: str | None
    causation_seq: int | None
    payload: dict[str, Any]
    meta: dict[str, Any]
    chain: str
    payload_json: str | None = field(default=None, compare=False, repr=False)
    """The payload's canonical JSON where the writer already computed it (for the chain hash), so the
    INSERT and the changelog do not serialise it again. Not part of the event's identity."""
    meta_json: str | None = field(default=None, compare=False, repr=False)
    """The same for meta (the chain covers a digest of it)."""

    def canonical_payload(self) -> str:
        return self.payload_json if self.payload_json is not None else canonical_json(self.payload)

    def canonical_meta(self) -> str:
        if self.meta_json is not None:
            return self.meta_json
        return canonical_json(self.meta) if self.meta else "{}"

    def decode(self) -> EventPayload:
        """The payload as its current typed model (upcast when stored at an older version)."""
        data = upcast(self.type, self.schema_version, self.payload)
        return payload_class(self.type).model_validate(data)


def stored_columns() -> dict[str, Any]:
    """A stored event's columns, in row order, with their types: its identity (`payload_json` and
    `meta_json`, texts cached by a writer, are not part of it). What a copy of a stored event carries
    (a changelog message, streams/messages.py), so the copy's shape follows the store's."""
    hints = get_type_hints(StoredEvent)
    return {f.name: hints[f.name] for f in fields(StoredEvent) if f.compare}

