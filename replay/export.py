"""Export a run's events to Parquet (DuckDB's writer) or JSON Lines, exactly as stored.

Each exported row is the stored envelope: run_id, seq, type, schema_version, case_id,
causation_seq, payload, meta, chain. Payloads are not upcast: an export is the record,
so its fingerprint and hash chain can be re-checked from the file alone.

The file is written under a temporary name in the target's directory and renamed into place
once complete, so an interrupted export leaves no partial file at the target. The target may not
be the database being read, and an existing file is replaced only when asked (`force`).
"""

from __future__ import annotations

from grandrounds.store.errors import InvalidInput
import json
import os
from pathlib import Path

from grandrounds.replay.caselog import require_spec
from grandrounds.store.eventstore import EventStore
from grandrounds.store.events import StoredEvent
from grandrounds.store.read_model import EventLog
from grandrounds.store.sealing import ContentUnreadable

FORMATS = ("parquet", "jsonl")


class ExportError(InvalidInput, ValueError):
    """Bad export request (exit code 2)."""


def format_of(path: str, fmt: str | None) -> str:
    if fmt:
        if fmt not in FORMATS:
            raise ExportError(f"unknown format {fmt!r} (one of {', '.join(FORMATS)})")
        return fmt
    suffix = Path(path).suffix.lower()
    if suffix in (".parquet", ".pq"):
        return "parquet"
    if suffix in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    raise ExportError(f"cannot tell the format of {path!r} from its extension: use .parquet or .jsonl, or --format")


def _check_target(store: EventStore, path: Path, force: bool) -> None:
    from grandrounds.store.dbfile import check_output_path

    # The database, its WAL, its key file (the store's own, wherever $GRANDROUNDS_KEYS put it) and any key
    # file: refused with or without --force, before the temporary is even created.
    check_output_path(path, None if store.path == ":memory:" else store.path, role="the database being exported")
    if store.codec is not None:
        from grandrounds.store.dbfile import same_file

        if same_file(path, Path(os.path.abspath(store.codec.ring.path))):
            raise ExportError(f"--out {str(path)!r} is the database's key file; choose another file")
    if path.is_dir():
        raise ExportError(f"--out {str(path)!r} is a directory")
    if path.exists() and not force:
        raise ExportError(f"--out {str(path)!r} exists; pass --force to replace it")


def export_runs(store: EventStore, run_ids: list[str], out: str, fmt: str | None = None, force: bool = False) -> dict:
    if not run_ids:
        raise ExportError("no runs to export")
    for rid in run_ids:
        require_spec(store, rid)
    fmt = format_of(out, fmt)
    final = Path(os.path.abspath(out))
    if not final.parent.exists():
        raise ExportError(f"directory {str(Path(out).parent)!r} does not exist")
    _check_target(store, final, force)
    # The fingerprints before the file is written: they open every sealed row, and a key file that is
    # missing is refused (exit 2) before anything is written, never after.
    fingerprints, unreadable = {}, {}
    for rid in run_ids:
        try:
            fingerprints[rid] = store.fingerprint(rid)
        except ContentUnreadable as exc:  # tampered or keyless rows: exported as stored, the cause named
            fingerprints[rid], unreadable[rid] = None, f"{exc.reason}: {exc}"
    path = final.with_name(f".{final.name}.partial-{os.getpid()}")
    try:
        n = _write(store, run_ids, path, fmt)
        os.replace(path, final)  # atomic within the directory: the target is whole or untouched
    finally:
        if path.exists():
            path.unlink()
    return {"runs": run_ids, "format": fmt, "path": str(out), "events": int(n), "fingerprints": fingerprints,
            **({"unreadable": unreadable} if unreadable else {})}


def _write(store: EventStore, run_ids: list[str], path: Path, fmt: str) -> int:
    log = EventLog(store)
    if fmt == "parquet":
        n = log.copy_to_parquet(run_ids, str(path))
    else:
        n = 0
        with path.open("w", encoding="utf-8") as fh:
            for r in log.stored_rows(run_ids):
                # payload and meta are stored canonical JSON: spliced in verbatim, not re-encoded
                head = json.dumps({"run_id": r[0], "seq": int(r[1]), "type": r[2], "schema_version": int(r[3]),
                                   "case_id": r[4], "causation_seq": None if r[5] is None else int(r[5])},
                                  ensure_ascii=False)
                fh.write(f'{head[:-1]},"payload":{r[6]},"meta":{r[7]},"chain":{json.dumps(r[8])}}}\n')
                n += 1
            fh.flush()
            os.fsync(fh.fileno())
    return int(n)


def load_jsonl(path: str | Path) -> list[StoredEvent]:
    """The events of a JSON Lines export (`export_runs`), as stored: ready for `EventStore.import_events`,
    which checks every chain hash. Payload and meta are data, parsed as JSON, never executed."""
    out = []
    with Path(path).open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            try:
                d = json.loads(line)
                out.append(StoredEvent(d["run_id"], int(d["seq"]), d["type"], int(d["schema_version"]), d["case_id"],
                                       d["causation_seq"], d["payload"], d["meta"], d["chain"]))
            except (ValueError, KeyError, TypeError) as exc:
                raise ExportError(f"{path}:{n}: not an exported event ({exc})") from None
    return out
