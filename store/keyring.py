"""Per-subject content keys, kept in a key file beside the database, never inside it.

A subject is whoever a case's content is about (its `subject` field; MedAgentBench: the patient's
MRN; else the case itself). Each subject gets a random 256-bit key the first time content about it
is written; `erase` destroys that key (crypto-shredding): every ciphertext sealed with it becomes
noise, while the rows themselves, and the hash chain over them, stay as they were. Deleted DuckDB
rows can survive in free blocks, which is why keys never go into the database.

The file is JSON lines, mode 0600:
    {"grandrounds-keyring": 1, "secret": <b64>}      header: the secret subject references are keyed with
    {"ref": <hex>, "key": <b64>}                     one per subject, appended (and fsynced) before the
                                                     events sealed with it are committed
    {"erased": <hex>}                                a tombstone: that subject was erased on purpose
A subject is named in events only by its reference, HMAC-SHA256(secret, subject): the file is
needed to tell which subject a row belongs to, so an MRN never appears in the database. Appends are
single writes of a whole line (a torn last line is ignored on load: its events were never committed);
`erase` rewrites the file to a temporary and renames it over the old one.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np

from grandrounds.store.errors import InvalidInput

KEYS_ENV = "GRANDROUNDS_KEYS"
"""A key file to use instead of `<db>.keys` (Kafka workers that hand runs to each other share one)."""

HEADER = "grandrounds-keyring"


class KeyRingError(InvalidInput, RuntimeError):
    """The key file is not one, or cannot take a key (a read-only database): fix the file or the call."""


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode("ascii")


def _unb64(s: str) -> bytes:
    return base64.b64decode(s.encode("ascii"), validate=True)


def keys_path_for(db_path: str) -> Path | None:
    """Where a database's key file is: `$GRANDROUNDS_KEYS`, else beside the file (`<db>.keys`);
    None for an in-memory database."""
    env = os.environ.get(KEYS_ENV)
    if env:
        return Path(env)
    if db_path in ("", ":memory:") or db_path.startswith(":memory:"):
        return None
    return Path(db_path + ".keys")


class _KeyTable:
    """ref -> key for every subject of a file, 48 bytes a subject instead of ~180 in a dict.

    Every case is a subject of its own unless it names one, so the key ring grew with the run (a
    dict of hex refs and key bytes: ~180 B a case, README "flat memory"). Refs made by `KeyRing.ref`
    (32 hex digits) and 32-byte keys go, past `merge_at` recent ones, into sorted numpy arrays (the
    ref as two big-endian 64-bit halves, the key as 32 raw bytes); anything else stays in a dict.
    """

    merge_at = 4096

    def __init__(self) -> None:
        self._recent: dict[str, bytes] = {}
        self._hi = np.empty(0, dtype=np.uint64)  # sorted by (hi, lo)
        self._lo = np.empty(0, dtype=np.uint64)
        self._key = np.empty((0, 32), dtype=np.uint8)

    @staticmethod
    def _halves(ref: str) -> tuple[int, int] | None:
        if len(ref) != 32:
            return None
        try:
            raw = bytes.fromhex(ref)
        except ValueError:
            return None
        if raw.hex() != ref:  # upper case or spaces: not how refs are written, keep it verbatim
            return None
        return int.from_bytes(raw[:8], "big"), int.from_bytes(raw[8:], "big")

    def _find(self, ref: str) -> int | None:
        h = self._halves(ref)
        if h is None or not len(self._hi):
            return None
        hi, lo = np.uint64(h[0]), np.uint64(h[1])
        start, end = np.searchsorted(self._hi, hi, "left"), np.searchsorted(self._hi, hi, "right")
        if start == end:
            return None
        at = start + int(np.searchsorted(self._lo[start:end], lo, "left"))
        return at if at < end and self._lo[at] == lo else None

    def get(self, ref: str) -> bytes | None:
        found = self._recent.get(ref)
        if found is not None:
            return found
        at = self._find(ref)
        return None if at is None else self._key[at].tobytes()

    def __contains__(self, ref: str) -> bool:
        return self.get(ref) is not None

    def __len__(self) -> int:
        return len(self._recent) + len(self._hi)

    def __setitem__(self, ref: str, key: bytes) -> None:
        self.pop(ref)
        self._recent[ref] = key
        if len(self._recent) >= self.merge_at:
            self._merge()

    def __delitem__(self, ref: str) -> None:
        if self.pop(ref) is None:
            raise KeyError(ref)

    def pop(self, ref: str, default: bytes | None = None) -> bytes | None:
        if ref in self._recent:
            return self._recent.pop(ref)
        at = self._find(ref)
        if at is None:
            return default
        key = self._key[at].tobytes()
        self._hi, self._lo, self._key = (np.delete(a, at, axis=0) for a in (self._hi, self._lo, self._key))
        return key

    def _merge(self) -> None:
        move = [(self._halves(r), k) for r, k in self._recent.items()]
        keep = {r: k for (h, k), r in zip(move, self._recent) if h is None or len(k) != 32}
        move = [(h, k) for h, k in move if h is not None and len(k) == 32]
        if move:
            hi = np.concatenate([self._hi, np.array([h[0] for h, _ in move], dtype=np.uint64)])
            lo = np.concatenate([self._lo, np.array([h[1] for h, _ in move], dtype=np.uint64)])
            key = np.concatenate([self._key, np.frombuffer(b"".join(k for _, k in move), dtype=np.uint8).reshape(-1, 32)])
            order = np.lexsort((lo, hi))
            self._hi, self._lo, self._key = hi[order], lo[order], key[order]
        self._recent = keep

    def items(self) -> Iterator[tuple[str, bytes]]:
        for i in range(len(self._hi)):
            ref = (int(self._hi[i]).to_bytes(8, "big") + int(self._lo[i]).to_bytes(8, "big")).hex()
            yield ref, self._key[i].tobytes()
        yield from list(self._recent.items())


class KeyRing:
    """The key file of one database (loaded lazily; created on the first key written)."""

    def __init__(self, path: str | Path, read_only: bool = False):
        self.path = Path(path)
        self.read_only = read_only
        self._secret: bytes | None = None
        self._keys = _KeyTable()
        self._erased: set[str] = set()
        self._lock = threading.Lock()
        self._loaded = False
        self._pending: dict[str, dict] = {}
        """Keys made inside a `deferred` block and not yet written: ref -> its line."""
        self._deferring = threading.local()

    # --- loading and writing -----------------------------------------------------------------

    def _load(self) -> None:
        self._loaded = True
        if not self.path.exists():
            return
        lines = self.path.read_text(encoding="utf-8").splitlines()
        for n, line in enumerate(lines, 1):
            try:
                item = json.loads(line)
            except json.JSONDecodeError:
                if n == len(lines):
                    continue  # a torn final append: its events were never committed
                raise KeyRingError(f"{self.path}:{n}: not a key file line") from None
            if HEADER in item:
                self._secret = _unb64(item["secret"])
            elif "ref" in item:
                self._keys[item["ref"]] = _unb64(item["key"])
                self._erased.discard(item["ref"])
            elif "erased" in item:
                self._erased.add(item["erased"])
                self._keys.pop(item["erased"], None)
        if self._secret is None:
            raise KeyRingError(f"{self.path}: no key file header")

    def reload(self) -> None:
        with self._lock:
            self._secret, self._keys, self._erased = None, _KeyTable(), set()
            self._load()
            for ref, item in self._pending.items():  # made here, not in the file yet: still ours
                self._keys[ref] = _unb64(item["key"])
                self._erased.discard(ref)

    def _ensure_loaded(self) -> None:
        if not self._loaded:
            self._load()

    def _create(self) -> None:
        """A new file with its header, written to a temporary and renamed (never half a header)."""
        if self.read_only:
            raise KeyRingError(f"{self.path} does not exist and the database is opened read-only")
        self._secret = secrets.token_bytes(32)
        self._write_all([{HEADER: 1, "secret": _b64(self._secret)}])

    def _write_all(self, items: list[dict]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + f".tmp-{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, "".join(json.dumps(i) + "\n" for i in items).encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        try:  # the rename itself durable
            dfd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError:
            pass

    def _append(self, items: list[dict]) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, "".join(json.dumps(i) + "\n" for i in items).encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)

    # --- subjects ------------------------------------------------------------------------------

    def ref(self, subject: str, create: bool = True) -> str | None:
        """The subject's reference in events (HMAC of the subject under the file's secret)."""
        with self._lock:
            self._ensure_loaded()
            if self._secret is None:
                if not create:
                    return None
                self._create()
            assert self._secret is not None
            return hmac.new(self._secret, subject.encode("utf-8"), hashlib.sha256).hexdigest()[:32]

    def key(self, ref: str) -> bytes | None:
        """The subject's key; None when erased or unknown to this file."""
        with self._lock:
            self._ensure_loaded()
            found = self._keys.get(ref)
        if found is None and ref not in self._erased and self.path.exists():
            self.reload()  # another process (a replay worker) may have added it
            found = self._keys.get(ref)
        return found

    def is_erased(self, ref: str) -> bool:
        with self._lock:
            self._ensure_loaded()
            return ref in self._erased

    def ensure(self, refs: list[str]) -> None:
        """Keys for every ref, new ones appended and fsynced: call before committing what they seal.

        Inside a `deferred` block of this thread the new keys are written when the block ends."""
        with self._lock:
            self._ensure_loaded()
            new = {}
            for r in dict.fromkeys(refs):
                if r not in self._keys:
                    if self.read_only:
                        raise KeyRingError(f"{self.path}: cannot add keys to a read-only database's key file")
                    # An erased subject seen again (a new case about them) starts a new key: the old
                    # content stays unreadable, the tombstone stays in the file.
                    self._erased.discard(r)
                    key = secrets.token_bytes(32)
                    self._keys[r] = key
                    new[r] = {"ref": r, "key": _b64(key)}
            self._pending.update(new)
            if getattr(self._deferring, "depth", 0):
                return
            # Written now: ours, and any another thread's block made but has not written yet (one of
            # `refs` may be among them, and whoever returns from here counts on it being on disk).
            self._flush()

    @contextmanager
    def deferred(self):
        """Keys `ensure` makes in this thread inside the block are written at its end, in one append
        and one fsync: a group commit of 64 cases, each its own subject, paid 64 fsyncs before. The
        caller commits what they seal after the block, so keys still reach the disk before their rows.
        A block that raises leaves its keys unwritten (nothing they seal was committed); the next
        `ensure` or block that writes takes them along."""
        depth = getattr(self._deferring, "depth", 0)
        self._deferring.depth = depth + 1
        try:
            yield self
        finally:
            self._deferring.depth = depth
        if depth == 0:
            with self._lock:
                self._flush()

    def _flush(self) -> None:
        """Append every pending key (called with the lock held). On failure they stay pending."""
        if self._pending:
            self._append(list(self._pending.values()))
            self._pending.clear()

    def erase(self, ref: str) -> bool:
        """Destroy a subject's key (the file rewritten without it, with a tombstone); False if none."""
        with self._lock:
            self._ensure_loaded()
            if ref not in self._keys:
                return False
            del self._keys[ref]
            self._erased.add(ref)
            assert self._secret is not None
            items = [{HEADER: 1, "secret": _b64(self._secret)}]
            items += [{"erased": r} for r in sorted(self._erased)]  # before keys: a later key revives
            items += [{"ref": r, "key": _b64(k)} for r, k in self._keys.items()]
            self._write_all(items)
            self._pending.clear()  # the rewrite holds every key this ring knows
            return True
