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
from grandrounds.store.sealing import (SEALED_KEY, SUBJECT_REF_SQL, SUBJECT_SCHEME_SQL, ContentErased,
                                       require_key_file)

ERASURES_SCHEMA = """CREATE TABLE IF NOT EXISTS erasures (
    run_id VARCHAR NOT NULL, last_seq BIGINT NOT NULL, fingerprint VARCHAR NOT NULL, subject_ref VARCHAR NOT NULL,
    PRIMARY KEY (run_id, last_seq, subject_ref))"""


class NoSuchSubject(InvalidInput, LookupError):
    """Nothing of that subject is in this database (bad input)."""


class AmbiguousSubject(InvalidInput, LookupError):
    """A subject that names content of more than one run where it may mean different patients (a case id
    several namespaces share): refused, listing the matches (bad input)."""


class NotSealed(InvalidInput, RuntimeError):
    """The database has no key file (content stored in clear): nothing can be crypto-shredded."""


@dataclass(frozen=True)
class Erasure:
    subject_ref: str
    """The first of `subject_refs` (what older callers print)."""
    runs: dict[str, list[str]]
    """Run id -> the cases of that run whose content was erased."""
    fingerprints: dict[str, str]
    """Run id -> its fingerprint as recorded just before the key was destroyed (empty for a dry run)."""
    subject_refs: tuple[str, ...] = ()
    """Every key destroyed (or, dry run, that would be): one per run for a case's own subject."""
    dry_run: bool = False


def _runs_and_cases(store, ref: str, scheme: int | None = None) -> dict[str, list[str]]:
    """Run -> cases sealed under `ref`; with `scheme`, only the rows written under that default-subject
    scheme (store/sealing.py SUBJECT_SCHEME)."""
    only = f" AND {SUBJECT_SCHEME_SQL} = {int(scheme)}" if scheme is not None else ""
    rows = store.conn.execute(
        f"SELECT run_id, case_id FROM events WHERE type = 'case.received' AND {SUBJECT_REF_SQL} = ?{only} "
        "ORDER BY run_id, seq", [ref]).fetchall()
    out: dict[str, list[str]] = {}
    for run_id, case_id in rows:
        out.setdefault(run_id, []).append(case_id)
    return out


def _runs_with_case(store, case_id: str) -> list[str]:
    return [r[0] for r in store.conn.execute(
        "SELECT DISTINCT run_id FROM events WHERE type = 'case.received' AND case_id = ? ORDER BY run_id",
        [case_id]).fetchall()]


def find_subject(store, subject: str, run_id: str | None = None) -> dict[str, dict[str, list[str]]]:
    """Subject ref -> {run: [cases]} of the sealed content `subject` names. `case:ID` (a case that names no
    subject) is that case within each run holding it, or within `run_id`, plus the key an older build
    sealed every run's case `ID` under (`legacy_subject`); any other subject is one key, across runs (the
    same patient wherever they appear)."""
    from grandrounds.store.sealing import default_subject, legacy_subject

    ring = store.codec.ring
    if subject.startswith("case:"):
        case_id = subject[len("case:"):]
        runs = [run_id] if run_id is not None else _runs_with_case(store, case_id)
        # Each row is read under the scheme it was sealed under: `case:ID` is the case within its run
        # in rows of scheme 2, the key every run's case ID shared in an older build's rows (scheme 1).
        subjects = [(default_subject(r, case_id), 2) for r in runs] + [(legacy_subject(case_id), 1)]
    else:
        if run_id is not None:
            raise InvalidInput(f"--run scopes a case's own subject (case:ID); {subject!r} names one subject "
                               "across runs")
        subjects = [(subject, None)]
    found: dict[str, dict[str, list[str]]] = {}
    for name, scheme in dict.fromkeys(subjects):
        ref = ring.ref(name, create=False)
        if ref and ref not in found:
            runs_cases = _runs_and_cases(store, ref, scheme)
            if runs_cases and (run_id is None or run_id in runs_cases):
                found[ref] = runs_cases  # all its runs: a key shared with other runs cannot go for one
    return found


def erase_subject(store, subject: str, run_id: str | None = None, every_run: bool = False,
                  dry_run: bool = False) -> Erasure:
    """Destroy the key(s) of `subject`'s content (see the module). A `case:ID` held by several runs names a
    different patient in each: refused (`AmbiguousSubject`, listing the runs) unless `run_id` picks one or
    `every_run` says all; content an older build sealed under one key for every run's case `ID` can only go
    together, so it is refused unless `every_run`. `dry_run`: what would go, nothing destroyed."""
    codec = store.codec
    if codec is None:
        raise NotSealed(f"{store.path}: case content is not sealed (no key file), so it cannot be crypto-shredded")
    require_key_file(store)  # a lost key file is named, never reported as "no content of that subject"
    found = find_subject(store, subject, run_id)
    live = {ref: rc for ref, rc in found.items() if codec.ring.key(ref) is not None}
    if not live:
        if any(codec.ring.is_erased(r) for r in found):
            raise NoSuchSubject(f"subject {subject!r} is already erased from {store.path}")
        if found:
            raise NoSuchSubject(f"subject {subject!r}: its key is not in the key file, so there is nothing to "
                                "destroy (verify reports key_missing)")
        raise NoSuchSubject(f"no content of subject {subject!r} in {store.path}"
                            + (f" run {run_id!r}" if run_id else ""))
    runs = sorted({r for rc in live.values() for r in rc})
    if subject.startswith("case:") and len(runs) > 1 and not every_run:
        shared = [ref for ref, rc in live.items() if len(rc) > 1]
        how = ("an older build sealed them under one key, so they can only be erased together: add --every-run"
               if shared else "give --run RUN for the one to erase, or --every-run for all of them")
        raise AmbiguousSubject(f"subject {subject!r} is case {subject[5:]!r} of {len(runs)} runs "
                               f"({', '.join(runs)}), each its own patient: {how}")
    affected: dict[str, list[str]] = {}
    for rc in live.values():
        for r, cases in rc.items():
            affected.setdefault(r, []).extend(cases)
    refs = tuple(live)
    if dry_run:
        return Erasure(refs[0], affected, {}, refs, dry_run=True)
    store.conn.execute(ERASURES_SCHEMA)
    fingerprints = {}
    for r in affected:
        last = store.last_seq(r)
        fp = store.fingerprint(r)
        fingerprints[r] = fp
        for ref, rc in live.items():
            if r in rc:
                store.conn.execute("INSERT OR IGNORE INTO erasures VALUES (?, ?, ?, ?)", [r, last, fp, ref])
    # A saved projection holds memory folded from plaintext: dropped (it is rebuilt from the log, where
    # the erased fields now read as stand-ins). DuckDB may keep deleted blocks until it reuses them.
    for r in affected:
        try:
            store.conn.execute("DELETE FROM checkpoints WHERE run_id = ?", [r])
        except Exception:  # no checkpoints table in this file
            pass
    store.conn.execute("CHECKPOINT")
    # Only now, with the fingerprints safe, are the keys destroyed.
    for ref in refs:
        codec.ring.erase(ref)
        codec._aead.pop(ref, None)
    return Erasure(refs[0], affected, fingerprints, refs)


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
