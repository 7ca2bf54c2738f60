"""The hash chain linking a run's events, by version.

v2 (written since the chain was widened) links every column stored for an event: the run id,
seq, type, schema version, case id, causation seq, the canonical payload, and a sha256 of the
canonical meta. Its genesis is derived from the run id, and every v2 link is written with a
`v2:` prefix, so a row says which rule made it.

v1 (files written before) covered seq, type, schema version, case id, causation and payload
from one constant genesis: not the run id and not meta. Such runs still verify, as v1, and are
reported as such; new events appended to a v1 run (a resumed legacy run) continue in v1 so the
chain stays one rule from end to end.

What a chain alone proves, and what it does not (anyone who can write the file can recompute
it from genesis), is in the README's "Integrity" section; `store.signing` adds the part that
needs a key.
"""

from __future__ import annotations

import hashlib

from grandrounds.store.canonical import canonical_json, sha256_hex

CHAIN_VERSION = 2
"""The version new runs are chained with."""

GENESIS_V1 = sha256_hex("grandrounds/event-chain/v1")
_V2 = "v2:"
EMPTY_META_DIGEST = sha256_hex("{}")


def genesis(run_id: str, version: int = CHAIN_VERSION) -> str:
    """The chain value "before seq 0" of a run."""
    if version == 1:
        return GENESIS_V1
    return _V2 + sha256_hex(f"grandrounds/event-chain/v2\n{run_id}")


def version_of(chain: str) -> int:
    """The chain version a stored chain value (or a genesis) was made by."""
    return 2 if chain.startswith(_V2) else 1


def meta_digest(meta_json: str) -> str:
    # Meta ({} for most events) is hashed apart from the link body, so the link's size does not
    # grow with it and the digest can be shown next to a row when an edit is reported.
    return EMPTY_META_DIGEST if meta_json == "{}" else sha256_hex(meta_json)


def link(prev: str, version: int, run_id: str, seq: int, type_: str, schema_version: int,
         case_id: str | None, causation_seq: int | None, payload_json: str, meta_json: str) -> str:
    """The chain value of one event after `prev` (the previous event's, or the genesis)."""
    if version == 1:
        body = canonical_json([seq, type_, schema_version, case_id, causation_seq])
        return sha256_hex(f"{prev}\n{body}\n{payload_json}")
    body = canonical_json([run_id, seq, type_, schema_version, case_id, causation_seq])
    h = hashlib.sha256()
    h.update(f"{prev}\n{body}\n".encode("utf-8"))
    h.update(payload_json.encode("utf-8"))
    h.update(f"\n{meta_digest(meta_json)}".encode("utf-8"))
    return _V2 + h.hexdigest()
