"""Right to erasure by crypto-shredding: destroy a subject's key, keep every row and the chain.

`erase_subject` first records, for each run holding content of the subject, the run's fingerprint as
it stands (computed from the plaintext while the key still exists), then destroys the key in the key
file. After that:
- the rows are unchanged, so `verify_chain` (which hashes the stored, sealed bytes) still holds;
- reads give the stand-ins ("[erased]"), so audit, export and the web view show the content as erased;
- the fingerprint of an affected run, which covers plaintext, can no longer be computed; the one
  recorded here is returned instead (as long as the run has not grown since); a run holding none of
  the subject's content is untouched and keeps computing its own;
- cases whose `case.received` is erased can no longer be re-executed (`erased_cases` names them;
  verify and replay refuse them by name).
The erasure records (table `erasures`) hold run ids, seqs, fingerprints and the subject's reference,
never the subject itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from grandrounds.store.errors import InvalidInput
from grandrounds.store.sealing import SEALED_KEY, SUBJECT_REF_SQL, ContentErased, require_key_file

ERASURES_SCHEMA = """CREATE TABLE IF NOT EXISTS erasures (
    run_id VARCHAR NOT NULL, last_seq BIGINT NOT NULL, fingerprint VARCHAR NOT NULL, subject_ref VARCHAR NOT NULL,
    PRIMARY KEY (run_id, last_seq, subject_ref))"""


class NoSuchSubject(InvalidInput, LookupError):
    """Nothing of that subject is in this database (bad input)."""


class NotSealed(InvalidInput, RuntimeError):
    """The database has no key file (content stored in clear): nothing can be crypto-shredded."""


@dataclass(frozen=True)
class Erasure:
    subject_ref: str
    runs: dict[str, list[str]]
    """Run id -> the cases of that run whose content was erased."""
    fingerprints: dict[str, str]
    """Run id -> its fingerprint as recorded just before the key was destroyed."""


def _runs_and_cases(store, ref: str) -> dict[str, list[str]]:
    rows = store.conn.execute(
        f"SELECT run_id, case_id FROM events WHERE type = 'case.received' AND {SUBJECT_REF_SQL} = ? "
        "ORDER BY run_id, seq", [ref]).fetchall()
    out: dict[str, list[str]] = {}
    for run_id, case_id in rows:
        out.setdefault(run_id, []).append(case_id)
    return out


def erase_subject(store, subject: str) -> Erasure:
    codec = store.codec
    if codec is None:
        raise NotSealed(f"{store.path}: case content is not sealed (no key file), so it cannot be crypto-shredded")
    require_key_file(store)  # a lost key file is named, never reported as "no content of that subject"
    ref = codec.ring.ref(subject, create=False)
    affected = _runs_and_cases(store, ref) if ref else {}
    if not affected or codec.ring.key(ref) is None:
        if ref and codec.ring.is_erased(ref):
            raise NoSuchSubject(f"subject {subject!r} is already erased from {store.path}")
        raise NoSuchSubject(f"no content of subject {subject!r} in {store.path}")
    store.conn.execute(ERASURES_SCHEMA)
    fingerprints = {}
    for run_id in affected:
        last = store.last_seq(run_id)
        fp = store.fingerprint(run_id)
        fingerprints[run_id] = fp
        store.conn.execute("INSERT OR IGNORE INTO erasures VALUES (?, ?, ?, ?)", [run_id, last, fp, ref])
    # A saved projection holds memory folded from plaintext: dropped (it is rebuilt from the log, where
    # the erased fields now read as stand-ins). DuckDB may keep deleted blocks until it reuses them.
    for run_id in affected:
        try:
            store.conn.execute("DELETE FROM checkpoints WHERE run_id = ?", [run_id])
        except Exception:  # no checkpoints table in this file
            pass
    store.conn.execute("CHECKPOINT")
    # Only now, with the fingerprints safe, is the key destroyed.
    codec.ring.erase(ref)
    codec._aead.pop(ref, None)
    return Erasure(ref, affected, fingerprints)


def recorded_fingerprint(store, run_id: str, upto_seq: int | None = None) -> str:
    """The fingerprint recorded when content of the run was erased (the plaintext is gone)."""
    last = store.last_seq(run_id) if upto_seq is None else upto_seq
    try:
        row = store.conn.execute("SELECT fingerprint FROM erasures WHERE run_id = ? AND last_seq = ? LIMIT 1",
                                 [run_id, last]).fetchone()
    except Exception:  # no erasures table: nothing was ever erased here
        row = None
    if row is None:
        raise ContentErased(f"run {run_id!r}: content was erased and no fingerprint was recorded at seq {last} "
                            "(the run grew after the erasure)")
    return row[0]


def erased_cases(store, run_id: str) -> list[str]:
    """Cases of the run whose content was erased (their subject's key destroyed, a tombstone in the key
    file). Content that does not open for another reason (a missing key, a ciphertext that fails
    authentication) is not erased: `content_problems` names it."""
    return content_problems(store, run_id, types=("case.received",)).get("erased_cases", [])


def content_problems(store, run_id: str, types: tuple[str, ...] | None = None) -> dict:
    """Every sealed row of the run that does not open, by cause: {"erased": [seq…], "key_missing": [seq…],
    "ciphertext_tampered": [seq…], "erased_cases": [case ids of erased `case.received` rows]}; causes
    with no row are left out. A key file that is missing altogether raises `KeyFileMissing` (bad input
    naming the file): nothing can be said of any row then."""
    where = "" if types is None else f" AND type IN ({', '.join('?' for _ in types)})"
    cur = store.conn.cursor()
    out: dict[str, list] = {}
    try:
        cur.execute("SELECT seq, type, case_id, payload FROM events WHERE run_id = ? AND contains(payload, ?)"
                    + where + " ORDER BY seq", [run_id, SEALED_KEY, *(types or ())])
        while True:
            page = cur.fetchmany(2048)
            if not page:
                break
            for seq, type_, case_id, payload in page:
                reason = store.mapper.problem(run_id, seq, type_, payload)  # the one reader of rows
                if reason is None:
                    continue
                out.setdefault(reason, []).append(int(seq))
                if reason == "erased" and type_ == "case.received":
                    out.setdefault("erased_cases", []).append(case_id)
    finally:
        cur.close()
    return out


def subject_refs(store) -> tuple[set[str], set[str]]:
    """(subject refs the database's sealed rows name, refs its `erasures` table records as erased): what
    `grandrounds keys restore` compares a backup with. Here, beside the other queries over sealed rows,
    so nothing above the store runs SQL over the events table."""
    import duckdb

    sealed = {r[0] for r in store.conn.execute(
        f"SELECT DISTINCT {SUBJECT_REF_SQL} FROM events WHERE {SUBJECT_REF_SQL} IS NOT NULL").fetchall()}
    try:
        erased = {r[0] for r in store.conn.execute("SELECT DISTINCT subject_ref FROM erasures").fetchall()}
    except duckdb.CatalogException:  # nothing was ever erased in this file
        erased = set()
    return sealed, erased
