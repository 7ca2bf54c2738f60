"""Signed run heads: HMAC-SHA256 over (run id, last seq, event count, chain value, chain version).

The hash chain shows that nothing was edited *without recomputing the chain*; anyone who can
write the file can recompute it from the genesis. A head signed with a key the file does not
hold closes that: rewriting and re-chaining a log changes its head, and a new signature needs
the key. The key comes from the environment (`GRANDROUNDS_SIGNING_KEY`) or a key file and is
never written to the database or to events; the file holds the signature and a key id (an HMAC
of a fixed label, so the key cannot be read back from it) that tells which key signed.
"""

from __future__ import annotations

from grandrounds.store.errors import InvalidInput
import hmac
import os
from dataclasses import dataclass
from hashlib import sha256
from pathlib import Path

import duckdb

from grandrounds.store import integrity
from grandrounds.store.canonical import canonical_json

KEY_ENV = "GRANDROUNDS_SIGNING_KEY"
MIN_KEY_BYTES = 16
HEAD_FORMAT = 1

SCHEMA = """CREATE TABLE IF NOT EXISTS signed_heads (
    run_id VARCHAR PRIMARY KEY, last_seq BIGINT NOT NULL, events BIGINT NOT NULL, chain VARCHAR NOT NULL,
    chain_version INTEGER NOT NULL, key_id VARCHAR NOT NULL, mac VARCHAR NOT NULL)"""


class SigningKeyError(InvalidInput, ValueError):
    """A signing key that cannot be used (bad input: exit code 2)."""


@dataclass(frozen=True)
class SigningKey:
    secret: bytes
    origin: str
    """Where it came from (an env var name or a file path): for messages, never the key."""

    def __repr__(self) -> str:  # never print the secret
        return f"SigningKey(origin={self.origin!r}, id={self.key_id})"

    @property
    def key_id(self) -> str:
        return hmac.new(self.secret, b"grandrounds/signing-key-id/v1", sha256).hexdigest()[:16]

    def mac(self, head: "RunHead") -> str:
        return hmac.new(self.secret, head.message(), sha256).hexdigest()


KEY_HOME = "a folder of its own outside the database's (e.g. ~/.config/grandrounds/signing.key, mode 0600), or $GRANDROUNDS_SIGNING_KEY"
"""Where a signing key belongs, named in every refusal."""


def check_key_apart(key_file: str | os.PathLike, db: str | os.PathLike | None) -> None:
    """Refuse a signing key file that lives with the data it vouches for: the database itself, its WAL, its
    key file (or any grandrounds key file), or any file in the database's folder. Whoever holds that folder
    holds the key too, and could sign a forged log's head: `verify` would call it valid."""
    from grandrounds.store.dbfile import protected_files, same_file
    from grandrounds.store.keyring import is_key_file

    if db is None or str(db) in ("", ":memory:"):
        return
    path = Path(os.path.abspath(os.fspath(key_file)))
    for protected, name in protected_files(db).items():
        if same_file(path, protected):
            raise SigningKeyError(f"--key-file {str(key_file)!r} is {name} ({protected}), not a signing key; "
                                  f"keep the signing key in {KEY_HOME}")
    if is_key_file(path):
        raise SigningKeyError(f"--key-file {str(key_file)!r} is a grandrounds key file (sealed content's keys), not "
                              f"a signing key; keep the signing key in {KEY_HOME}")
    folder = Path(os.path.realpath(os.path.dirname(os.path.abspath(os.fspath(db)))))
    if Path(os.path.realpath(path)).parent == folder:
        raise SigningKeyError(f"--key-file {str(key_file)!r} is in the database's folder ({folder}): anyone holding "
                              f"the folder could sign a forged head; keep the signing key in {KEY_HOME}")


def load_key(key_file: str | None = None, environ: dict | None = None,
             db: str | os.PathLike | None = None) -> SigningKey | None:
    """The key from `key_file` if given, else from $GRANDROUNDS_SIGNING_KEY, else None.

    A key file holds the key bytes (one trailing newline is ignored, as editors add one). With `db`, the
    database the key signs or checks, a key file kept with that database is refused (`check_key_apart`)."""
    env = os.environ if environ is None else environ
    if key_file:
        check_key_apart(key_file, db)
        path = Path(key_file)
        if not path.is_file():
            raise SigningKeyError(f"--key-file {key_file!r}: no such file")
        try:
            secret = path.read_bytes()
        except OSError as exc:
            raise SigningKeyError(f"--key-file {key_file!r}: cannot be read ({exc.strerror or exc})") from None
        if secret.endswith(b"\n"):
            secret = secret[:-1]
            if secret.endswith(b"\r"):
                secret = secret[:-1]
        origin = key_file
    elif env.get(KEY_ENV):
        secret, origin = env[KEY_ENV].encode("utf-8"), f"${KEY_ENV}"
    else:
        return None
    if len(secret) < MIN_KEY_BYTES:
        raise SigningKeyError(f"signing key from {origin} is {len(secret)} bytes; use at least {MIN_KEY_BYTES} "
                              "(e.g. `head -c 32 /dev/urandom | base64 > signing.key`)")
    return SigningKey(secret, origin)


@dataclass(frozen=True)
class RunHead:
    """The state of a run's log a signature vouches for."""

    run_id: str
    last_seq: int
    events: int
    chain: str

    @property
    def chain_version(self) -> int:
        return integrity.version_of(self.chain)

    def message(self) -> bytes:
        return canonical_json({"format": HEAD_FORMAT, "run_id": self.run_id, "last_seq": self.last_seq,
                               "events": self.events, "chain": self.chain,
                               "chain_version": self.chain_version}).encode("utf-8")

    def as_dict(self) -> dict:
        return {"last_seq": self.last_seq, "events": self.events, "chain": self.chain,
                "chain_version": self.chain_version}


def current_head(store, run_id: str) -> RunHead:
    row = store.conn.execute("SELECT max(seq), count(*), arg_max(chain, seq) FROM events WHERE run_id = ?",
                             [run_id]).fetchone()
    if row is None or row[0] is None:
        return RunHead(run_id, -1, 0, integrity.genesis(run_id))
    return RunHead(run_id, int(row[0]), int(row[1]), row[2])


class SignedByAnotherKey(SigningKeyError):
    """The run's head is signed by a key other than the one given: replacing it would silently move the
    run's trust to the new key (what an attacker who rewrote the log would do). `--force` replaces it."""

    def __init__(self, run_id: str, key_id: str, signed_seq: int, given: str):
        self.run_id, self.key_id, self.signed_seq = run_id, key_id, signed_seq
        super().__init__(f"run {run_id!r}: its head (seq {signed_seq}) is signed by another key, key id {key_id} "
                         f"(the key given is {given}); not replaced. Check the log with that key "
                         "(`grandrounds verify --key-file`), or replace it with this one: `grandrounds sign --force`")


def signed_by(store, run_id: str) -> tuple[str, int] | None:
    """(key id, signed last seq) of the run's signed head, or None when it has none."""
    try:
        row = store.conn.execute("SELECT key_id, last_seq FROM signed_heads WHERE run_id = ?", [run_id]).fetchone()
    except duckdb.CatalogException:
        return None
    return None if row is None else (row[0], int(row[1]))


def sign_head(store, run_id: str, key: SigningKey, force: bool = False) -> RunHead:
    """Sign the run's head as the file holds it now, replacing an earlier signature by the same key; one
    by another key only with `force` (else `SignedByAnotherKey`, naming that key's id)."""
    head = current_head(store, run_id)
    if head.last_seq < 0:
        raise SigningKeyError(f"no run {run_id!r} to sign in {store.path}")
    earlier = signed_by(store, run_id)
    if earlier is not None and earlier[0] != key.key_id and not force:
        raise SignedByAnotherKey(run_id, earlier[0], earlier[1], key.key_id)
    conn = store.conn
    row = [head.last_seq, head.events, head.chain, head.chain_version, key.key_id, key.mac(head), run_id]
    try:
        # UPDATE first: DuckDB's INSERT OR REPLACE costs several times an UPDATE.
        updated = conn.execute("UPDATE signed_heads SET last_seq = ?, events = ?, chain = ?, chain_version = ?, "
                               "key_id = ?, mac = ? WHERE run_id = ?", row).fetchone()
    except duckdb.CatalogException:
        conn.execute(SCHEMA)
        updated = None
    if not updated or not updated[0]:
        conn.execute("INSERT INTO signed_heads VALUES (?, ?, ?, ?, ?, ?, ?)", [run_id, *row[:-1]])
    return head


@dataclass(frozen=True)
class HeadCheck:
    status: str
    """`valid`, `not checked` (no key given), `absent`, `other key`, `bad signature`, `log differs`."""
    signed: dict | None
    detail: str

    @property
    def ok(self) -> bool:
        return self.status == "valid"

    def as_dict(self) -> dict:
        return {"status": self.status, "signed": self.signed, "detail": self.detail}


def check_head(store, run_id: str, key: SigningKey | None) -> HeadCheck:
    """Compare the run's log with its signed head (the signature is checked only with a key)."""
    try:
        row = store.conn.execute("SELECT last_seq, events, chain, chain_version, key_id, mac FROM signed_heads "
                                 "WHERE run_id = ?", [run_id]).fetchone()
    except duckdb.CatalogException:  # no run of this file was ever signed
        row = None
    if row is None:
        if key is None:
            return HeadCheck("not checked", None, "no signed head in the file, and no key given")
        return HeadCheck("absent", None, f"run {run_id!r} has no signed head in {store.path}")
    signed = RunHead(run_id, int(row[0]), int(row[1]), row[2])
    signed_dict = dict(signed.as_dict(), key_id=row[4])
    if key is None:
        return HeadCheck("not checked", signed_dict, "the file holds a signed head; give the key to check it")
    if row[4] != key.key_id:
        return HeadCheck("other key", signed_dict, f"signed with key {row[4]}, not the key given ({key.key_id})")
    if int(row[3]) != signed.chain_version or not hmac.compare_digest(row[5], key.mac(signed)):
        return HeadCheck("bad signature", signed_dict, "the signed head's fields do not match its signature")
    now = current_head(store, run_id)
    if now != signed:
        return HeadCheck("log differs", signed_dict,
                         f"the log's head (seq {now.last_seq}, {now.events} events, chain {now.chain[:16]}…) is not "
                         f"the signed one (seq {signed.last_seq}, {signed.events} events, chain {signed.chain[:16]}…)")
    return HeadCheck("valid", signed_dict, f"head signed by key {key.key_id} matches the log")
