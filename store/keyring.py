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
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from grandrounds.store.errors import InvalidInput

KEYS_ENV = "GRANDROUNDS_KEYS"
"""A key file to use instead of `<db>.keys` (Kafka workers that hand runs to each other share one)."""

HEADER = "grandrounds-keyring"


class KeyRingError(InvalidInput, RuntimeError):
    """The key file is not one, or cannot take a key (a read-only database): fix the file or the call."""


class KeyFileMissing(KeyRingError):
    """Sealed content asked for while the database's key file is absent: a file is missing, nothing was
    erased (a database copied, moved or backed up without its `<db>.keys`)."""

    reason = "key_missing"

    def __init__(self, path: Path):
        self.path = path
        super().__init__(f"key file {path} not found: case content cannot be opened; was the database copied "
                         "without it? (put it back beside the database, `grandrounds keys restore`, or point "
                         f"${KEYS_ENV} at it)")


class KeyFileUnreadable(KeyRingError):
    """The key file exists but cannot be read (permissions, not UTF-8, not a key file)."""

    reason = "key_missing"


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
        self._tombstoned: set[str] = set()
        """Every ref the file holds a tombstone for, a key made after it or not (`was_erased`)."""
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
        for kind, value, key in _parse(self.path):
            if kind == "secret":
                self._secret = key
            elif kind == "key":
                self._keys[value] = key
                self._erased.discard(value)
            else:
                self._erased.add(value)
                self._tombstoned.add(value)
                self._keys.pop(value, None)

    def reload(self) -> None:
        with self._lock:
            self._secret, self._keys, self._erased, self._tombstoned = None, _KeyTable(), set(), set()
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
        write_lines(self.path, items)

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

    def was_erased(self, ref: str) -> bool:
        """Whether the file holds a tombstone for the subject (erased on purpose), even if a key was made
        for it afterwards (a new case about them): content sealed before the erasure stays gone."""
        with self._lock:
            self._ensure_loaded()
            return ref in self._tombstoned

    def file_missing(self) -> bool:
        """No key file at all, none made by this ring either: sealed rows cannot have been written through
        it, so a sealed row read with it means the file was lost, not that anything was erased."""
        with self._lock:
            self._ensure_loaded()
            return self._secret is None and not self.path.exists()

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
            self._tombstoned.add(ref)
            assert self._secret is not None
            # Every tombstone stays, a revived subject's too (`was_erased`); before the keys: a later key
            # revives.
            self._write_all(keyring_lines(self._secret, self._tombstoned, self._keys.items()))
            self._pending.clear()  # the rewrite holds every key this ring knows
            return True


# --- the file as a whole: parsing, atomic writes, backup and restore (`grandrounds keys`) ------------


def _parse(path: Path) -> Iterator[tuple[str, str, bytes | None]]:
    """("secret", "", secret) | ("key", ref, key) | ("erased", ref, None) for each line of a key file, in
    order. A missing header, a line that is not one, or a file that cannot be read is a `KeyRingError`
    naming the file (and line)."""
    try:
        text = path.read_bytes().decode("utf-8")
    except PermissionError as exc:
        raise KeyFileUnreadable(f"key file {path} cannot be read ({exc.strerror}): case content cannot be "
                                "opened") from None
    except UnicodeDecodeError as exc:
        raise KeyFileUnreadable(f"key file {path}: not UTF-8 text at byte {exc.start}, not a key file") from None
    except IsADirectoryError:
        raise KeyFileUnreadable(f"key file {path} is a directory") from None
    lines = text.splitlines()
    seen_header = False
    for n, line in enumerate(lines, 1):
        try:
            item = json.loads(line)
            if not isinstance(item, dict):
                raise ValueError("not an object")
            if HEADER in item:
                seen_header = True
                yield "secret", "", _unb64(item["secret"])
            elif "ref" in item:
                yield "key", str(item["ref"]), _unb64(item["key"])
            elif "erased" in item:
                yield "erased", str(item["erased"]), None
            else:
                raise ValueError("no header, ref or erased field")
        except (ValueError, KeyError, TypeError, AttributeError):  # JSONDecodeError and bad base64 included
            if n == len(lines) and seen_header:
                continue  # a torn final append: its events were never committed
            raise KeyRingError(f"{path}:{n}: not a key file line") from None
    if not seen_header:
        raise KeyRingError(f"{path}: no key file header (not a grandrounds key file)")


def is_key_file(path: str | Path) -> bool:
    """Whether `path` is an existing file that starts like a key file (its header line): an output path
    that is one is refused whatever database it belongs to."""
    try:
        with open(path, "rb") as fh:
            first = fh.readline(4096)
    except OSError:
        return False
    try:
        item = json.loads(first)
    except ValueError:
        return False
    return isinstance(item, dict) and HEADER in item


def keyring_lines(secret: bytes, erased, keys) -> list[dict]:
    """The lines of a whole key file: header, tombstones (before the keys: a later key revives), keys."""
    items: list[dict] = [{HEADER: 1, "secret": _b64(secret)}]
    items += [{"erased": r} for r in sorted(erased)]
    items += [{"ref": r, "key": _b64(k)} for r, k in keys]
    return items


def write_lines(path: Path, items: list[dict]) -> None:
    """A key file written whole from its lines (`write_bytes`)."""
    write_bytes(path, "".join(json.dumps(i) + "\n" for i in items).encode("utf-8"))


def write_bytes(path: Path, data: bytes) -> None:
    """A key file written whole: a temporary beside it (0600 from the start, and kept 0600 if one was left
    behind), fsynced, renamed over `path`, the directory fsynced. The only way a key file is replaced."""
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # O_CREAT's mode applies to a new file only: a stale temporary keeps its own
        view = memoryview(data)
        while view:  # os.write may write less than asked
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(tmp, path)
    try:  # the rename itself durable
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


@dataclass
class KeyFileContent:
    """What a key file holds, as sets (a backup, a restore): fine for files of any size one reads whole."""

    path: Path
    secret: bytes
    keys: dict[str, bytes]
    erased: set[str]
    """Refs with a tombstone and no key made after it."""
    tombstoned: set[str]
    """Every ref with a tombstone."""

    @classmethod
    def read(cls, path: str | Path) -> "KeyFileContent":
        path = Path(path)
        if not path.exists():
            raise KeyFileMissing(path)
        secret, keys, erased, tombstoned = b"", {}, set(), set()
        for kind, ref, key in _parse(path):
            if kind == "secret":
                secret = key
            elif kind == "key":
                keys[ref] = key
                erased.discard(ref)
            else:
                keys.pop(ref, None)
                erased.add(ref)
                tombstoned.add(ref)
        return cls(path, secret, keys, erased, tombstoned)

    def lines(self) -> list[dict]:
        return keyring_lines(self.secret, self.tombstoned, sorted(self.keys.items()))


class KeyCustodyError(KeyRingError):
    """A backup or restore that would lose or revive keys (bad input: exit 2); nothing was written."""


def _same_path(a: Path, b: Path) -> bool:
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def backup_key_file(key_file: Path, out: Path) -> dict:
    """Copy a key file to `out` (atomic, 0600). `out` may exist only as a byte-identical copy (nothing to
    do) or an older backup of the same file (every key and tombstone it holds is in the key file now):
    a backup never drops a key another backup holds."""
    current = KeyFileContent.read(key_file)  # a key file that does not parse is not backed up
    if _same_path(key_file, out):
        raise KeyCustodyError(f"--out {out} is the key file itself")
    data = key_file.read_bytes()
    action = "written"
    if out.exists():
        if out.is_dir():
            raise KeyCustodyError(f"--out {out} is a directory")
        if out.read_bytes() == data:
            action = "unchanged (already a byte-identical copy)"
        else:
            older = KeyFileContent.read(out)
            lost = _lost(older, current)
            if lost:
                raise KeyCustodyError(f"--out {out} holds {lost} that {key_file} does not: not replaced "
                                      "(choose another file, or move it away yourself)")
            action = "replaced an older backup of the same key file"
    if not action.startswith("unchanged"):
        write_bytes(out, data)  # the bytes as they are (checked above to be a whole key file)
    return {"key_file": str(key_file), "backup": str(out), "action": action, "subjects": len(current.keys),
            "erased": len(current.tombstoned), "mode": oct(out.stat().st_mode & 0o777)}


def _lost(old: KeyFileContent, new: KeyFileContent) -> str | None:
    """What of `old` replacing it with `new` would lose, in words (None: `old` is a subset of `new`)."""
    if old.secret != new.secret:
        return "another secret (the key file of another database)"
    changed = [r for r, k in old.keys.items() if new.keys.get(r, k) != k]
    if changed:
        return f"{len(changed)} subject key(s) different from"
    missing = [r for r in old.keys if r not in new.keys and r not in new.tombstoned]
    if missing:
        return f"{len(missing)} subject key(s) missing from"
    if old.tombstoned - new.tombstoned:
        return f"{len(old.tombstoned - new.tombstoned)} erasure tombstone(s) missing from"
    return None


def restore_key_file(backup: Path, key_file: Path, erased_refs: set[str], sealed_refs: set[str]) -> dict:
    """Put a backup in place as `key_file` (atomic, 0600).

    - No key file: the backup is written, less the keys of subjects the database records as erased
      (`erased_refs`, its `erasures` table): a restore never undoes `grandrounds erase`.
    - A key file that is byte-identical: nothing to do.
    - A key file whose every key and tombstone the backup holds (the backup is newer, or the key file
      lost lines): the union is written, tombstones kept.
    - Anything else (another database's file, a key the backup lacks or holds differently): refused.
    `sealed_refs`: the subjects the database's sealed rows name; a backup holding none of them is not
    this database's and is refused."""
    restored = KeyFileContent.read(backup)
    if _same_path(backup, key_file):
        raise KeyCustodyError(f"{backup} is the key file itself")
    if sealed_refs and not (sealed_refs & (set(restored.keys) | restored.tombstoned)):
        raise KeyCustodyError(f"{backup} holds no key of this database's sealed content: the key file of "
                              "another database?")
    tombstones = set(restored.tombstoned) | erased_refs
    action = "written (no key file was there)"
    if key_file.exists():
        current = KeyFileContent.read(key_file)
        if key_file.read_bytes() == backup.read_bytes() and not (erased_refs & set(current.keys)):
            return _restore_report(backup, key_file, "unchanged (the key file is byte-identical)", restored,
                                   sealed_refs, set())
        lost = _lost(current, restored)
        if lost:
            raise KeyCustodyError(f"{key_file} holds {lost} {backup}: not replaced, nothing written")
        tombstones |= current.tombstoned
        action = "merged (the key file held a subset of the backup)"
    # A key of a subject the database records as erased, in a backup taken before the erasure (no tombstone
    # in it; a tombstone then a key is a new key, made for a later case about them): left out.
    withheld = {r for r in restored.keys if r in erased_refs and r not in restored.tombstoned}
    keys = {r: k for r, k in restored.keys.items() if r not in withheld}
    out = KeyFileContent(key_file, restored.secret, keys, set(), tombstones)
    key_file.parent.mkdir(parents=True, exist_ok=True)
    if keys == restored.keys and tombstones == restored.tombstoned:
        write_bytes(key_file, backup.read_bytes())  # nothing to add or leave out: the backup as it is
    else:
        write_lines(key_file, out.lines())
    return _restore_report(backup, key_file, action, out, sealed_refs, withheld)


def _restore_report(backup: Path, key_file: Path, action: str, content: KeyFileContent, sealed_refs: set[str],
                    withheld: set[str]) -> dict:
    uncovered = sorted(r for r in sealed_refs if r not in content.keys and r not in content.tombstoned)
    return {"backup": str(backup), "key_file": str(key_file), "action": action, "subjects": len(content.keys),
            "erased": len(content.tombstoned), "erased_keys_withheld": len(withheld),
            "sealed_subjects": len(sealed_refs), "sealed_subjects_without_key": len(uncovered),
            "mode": oct(key_file.stat().st_mode & 0o777)}
