"""Case content sealed per subject (AES-GCM-SIV), so that erasing a subject's key erases it.

What is sealed: the fields of an event that hold case content — the case itself, the agent's answer
and steps, the reflection, model exchanges, failures, SELSM judgements and rejected skills
(`SEALED_FIELDS`). What stays clear: the envelope (type, seq, case id), the fields state folds read
(correctness, outcomes, indexes, token usage), and memory items, which are de-identified before they
are written (`handlers/deidentify.py`) and must stay foldable after an erasure.

A sealed event is stored as its clear fields plus
    "$sealed": {"s": <subject ref>, "f": {field: kind}, "c": <b64 AES-GCM-SIV ciphertext>}
where the ciphertext holds the canonical JSON of the sealed fields and `kind` (s/l/d/n: string, list,
object, other) says what stands in for a field once its key is gone ("[erased]", [], {"erased":
"[erased]"}, null). The nonce is derived, not drawn: HMAC-SHA256(key, run|seq|type)[:12], unique per
event and key; AES-GCM-SIV stays safe even if a (key, nonce) pair ever repeated. The associated data
binds a ciphertext to its run, seq, type and subject, so a sealed blob cannot be moved to another row.

The event store calls `seal` when it builds a row and `open` when it reads one (`EventStore(codec=)`):
everything above the store sees plaintext payloads, or the stand-ins once the subject is erased. The
chain covers the stored (sealed) bytes; the fingerprint covers the plaintext (see README, "Patient data").
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections import OrderedDict
from typing import Any, Callable

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCMSIV

from grandrounds.store.canonical import canonical_json
from grandrounds.store.errors import GrandroundsError
from grandrounds.store.keyring import KeyFileMissing, KeyRing, keys_path_for

SEALED_KEY = "$sealed"
SUBJECT_REF_SQL = "json_extract_string(payload, '$.\"$sealed\".s')"
"""SQL over the `events` table: the subject ref a row's payload is sealed under (NULL: not sealed)."""
SUBJECT_SCHEME = 2
"""The default-subject scheme a sealed row's envelope records (`v`): 1 (no `v`, builds before issue 43) is
`legacy_subject`, `case:ID` shared by every run of the file; 2 is `default_subject`, the case within its
run. A row keeps the scheme, and the subject reference, it was sealed under: a later build never
re-reads an old row's subject under a new rule."""
SUBJECT_SCHEME_SQL = f"coalesce(TRY_CAST(json_extract_string(payload, '$.\"{SEALED_KEY}\".v') AS INTEGER), 1)"
"""SQL over the `events` table: the default-subject scheme a sealed row was written under."""
ERASED = "[erased]"
"""What erased text reads as (audit, export, the web view)."""

SEALED_FIELDS: dict[str, tuple[str, ...]] = {
    "case.received": ("case",),
    "answer.given": ("answer", "steps"),
    "reflection.recorded": ("summary", "guideline", "edits"),
    "llm.exchange": ("messages", "response", "error"),
    "case.failed": ("reason", "steps"),
    "selsm.trajectory.judged": ("answer", "steps"),
    "selsm.skill.rejected": ("violations", "text"),
    # Memory events are de-identified before they are written; the fields that copy the case verbatim
    # (the question as an episode descriptor or a record's query, the trace) are sealed as well, so an
    # erased case leaves only what was distilled from it (rules, skills, lessons, guidelines).
    "episode.stored": ("descriptor", "trace"),
    "selsm.record.stored": ("query",),
    "experience.stored": ("context",),
    "skill.trajectory_recorded": ("question", "options", "trace"),
    # The context rendered for the case (it quotes the de-identified items retrieved, an evo-medagent
    # precedent quotes an earlier case's question): the case's own prompt, sealed with it.
    "memory.retrieved": ("prefix",),
}
"""Event type -> the fields holding case content."""

def stand_ins(env: dict, text: str = ERASED) -> dict:
    """What the sealed fields read as when they cannot be opened: `text` for a string, [] for a list, an
    object naming why for an object ({"erased": "[erased]"} after an erasure), null otherwise."""
    why = "erased" if text == ERASED else "unreadable"
    fields = env.get("f") if isinstance(env.get("f"), dict) else {}
    return {f: {"s": text, "l": [], "d": {why: text}}.get(k) for f, k in fields.items()}


def _kind(v: Any) -> str:
    return "s" if isinstance(v, str) else "l" if isinstance(v, list) else "d" if isinstance(v, dict) else "n"


def default_subject(run_id: str, case_id: str) -> str:
    """The subject of a case that names none: the case itself, within its run. Two runs (namespaces) of one
    file may each hold a case `c1` of a different patient; before issue 43 both were the subject
    `case:c1`, one key, and erasing one erased the other. The string is unambiguous whatever the ids hold
    (`grandrounds erase --subject case:ID --run RUN` names it). Rows sealed before keep the reference they
    were sealed under (every sealed row stores it), so their meaning does not change."""
    return "case:" + json.dumps([run_id, case_id], ensure_ascii=False, separators=(",", ":"))


def legacy_subject(case_id: str) -> str:
    """The default subject rows sealed before issue 43 carry: `case:<case_id>`, shared by every run of the file."""
    return f"case:{case_id}"


def subject_of(case: dict, case_id: str, run_id: str) -> str:
    """A case's subject: its `subject` field; MedAgentBench: the patient's MRN; else the case itself, within
    its run (`default_subject`)."""
    return str(case.get("subject") or case.get("eval_mrn") or default_subject(run_id, case_id))


def is_erased_case(case: dict) -> bool:
    """Whether a `case.received` case is the stand-in left by an erasure."""
    return case.get("erased") == ERASED and "case_id" not in case


class ContentUnreadable(GrandroundsError, LookupError):
    """Plaintext asked for (a fingerprint) of a sealed event that cannot be opened; `reason` says why, in
    the words `verify --json` uses. Only an erasure is expected: the others mean a file is missing or the
    row was changed, and they are never reported as an erasure."""

    reason = "unreadable"


class ContentErased(ContentUnreadable):
    """The subject was erased on purpose (`grandrounds erase`: a tombstone in the key file)."""

    reason = "erased"


class SubjectKeyMissing(ContentUnreadable):
    """The key file holds neither a key nor a tombstone for the row's subject: the wrong key file (another
    database's, an old backup), or one that lost lines; nothing says it was erased."""

    reason = "key_missing"


class ContentTampered(ContentUnreadable):
    """The ciphertext fails authentication with its subject's key: the row was edited, or moved to another
    run, seq or type (the associated data binds it to where it was written)."""

    reason = "ciphertext_tampered"


KEY_MISSING = "[key missing]"
TAMPERED = "[unreadable: fails authentication]"
"""What content reads as when its subject key is not in the key file, or its ciphertext does not
authenticate: never "[erased]", which only an erasure leaves."""


class _Recent(OrderedDict):
    """A dict of the `limit` entries used last. The codec's caches were plain dicts, one entry per case
    ever sealed (a cipher object and a ref per case: ~0.5 KB a case that never left memory); what they
    hold can always be had again (the key ring, the store's subject refs), so the oldest is dropped."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit = limit

    def get(self, key, default=None):
        if key in self:
            self.move_to_end(key)
            return self[key]
        return default

    def put(self, key, value) -> None:
        self[key] = value
        self.move_to_end(key)
        if len(self) > self.limit:
            self.popitem(last=False)


CACHE_LIMIT = 4096
"""Cases whose ref and cipher the codec keeps: far above the cases in flight (a commit group, `--lag`)."""


class SealingCodec:
    """Seals and opens payloads with the subject keys of one key file."""

    def __init__(self, ring: KeyRing):
        self.ring = ring
        self._refs: _Recent = _Recent(CACHE_LIMIT)
        """(run, case) -> subject ref of the case's `case.received`; past the limit, the store's lookup."""
        self._aead: _Recent = _Recent(CACHE_LIMIT)

    def _cipher(self, ref: str) -> AESGCMSIV | None:
        c = self._aead.get(ref)
        if c is None:
            key = self.ring.key(ref)
            if key is None:
                return None
            c = AESGCMSIV(key)
            self._aead.put(ref, c)
        return c

    @staticmethod
    def _nonce_and_aad(key_material: bytes, run_id: str, seq: int, type_: str, ref: str) -> tuple[bytes, bytes]:
        where = f"{run_id}\x00{seq}\x00{type_}".encode("utf-8")
        return hmac.new(key_material, where, hashlib.sha256).digest()[:12], where + b"\x00" + ref.encode("ascii")

    def _ref_for(self, run_id: str, type_: str, case_id: str, payload: dict,
                 lookup: Callable[[str, str], str | None] | None) -> str:
        if type_ == "case.received":
            ref = self.ring.ref(subject_of(payload.get("case") or {}, case_id, run_id))
            self._refs.put((run_id, case_id), ref)
            return ref
        ref = self._refs.get((run_id, case_id))
        if ref is None and lookup is not None:
            ref = lookup(run_id, case_id)
        if ref is None:
            ref = self.ring.ref(default_subject(run_id, case_id))
        self._refs.put((run_id, case_id), ref)
        return ref

    def seal(self, run_id: str, seq: int, type_: str, case_id: str | None, payload: dict,
             lookup: Callable[[str, str], str | None] | None = None) -> dict | None:
        """The stored form of a payload, or None when nothing in it is sealed. `lookup`: (run, case) -> the
        subject ref the store holds for that case's `case.received` row, for events of a case whose
        `case.received` this codec has not sealed (a resumed case)."""
        fields = SEALED_FIELDS.get(type_)
        if not fields or case_id is None:
            return None
        secret = {f: payload[f] for f in fields if f in payload}
        if not secret:
            return None
        ref = self._ref_for(run_id, type_, case_id, payload, lookup)
        self.ring.ensure([ref])  # on disk before the rows it seals are committed
        key = self.ring.key(ref)
        assert key is not None
        cipher = self._cipher(ref)
        nonce, aad = self._nonce_and_aad(key, run_id, seq, type_, ref)
        ct = cipher.encrypt(nonce, canonical_json(secret).encode("utf-8"), aad)
        out = {k: v for k, v in payload.items() if k not in secret}
        out[SEALED_KEY] = {"s": ref, "f": {f: _kind(v) for f, v in secret.items()},
                           "c": base64.b64encode(ct).decode("ascii"), "v": SUBJECT_SCHEME}
        return out

    def open(self, run_id: str, seq: int, type_: str, stored: dict, strict: bool = False) -> dict:
        """The plaintext payload; with the subject's key gone, the stand-ins (or `ContentErased` if strict)."""
        env = stored.get(SEALED_KEY)
        if env is None:
            return stored
        out = {k: v for k, v in stored.items() if k != SEALED_KEY}
        try:
            out.update(self._plaintext(run_id, seq, type_, env))
        except ContentUnreadable as exc:
            if strict:
                raise
            out.update(stand_ins(env, ERASED if isinstance(exc, ContentErased) else
                                 KEY_MISSING if isinstance(exc, SubjectKeyMissing) else TAMPERED))
        return out

    def _plaintext(self, run_id: str, seq: int, type_: str, env: dict) -> dict:
        """The sealed fields, or the `ContentUnreadable` that says why not. A key file that is not there at
        all is `KeyFileMissing` (bad input naming the file): a sealed row was written with a key file."""
        try:
            ref = env["s"]
            ciphertext = base64.b64decode(env["c"], validate=True)
            if not isinstance(env["f"], dict):
                raise TypeError("fields")
        except (KeyError, TypeError, ValueError):
            raise ContentTampered(f"run {run_id!r} seq {seq}: sealed envelope is malformed (edited)") from None
        key = self.ring.key(ref)
        if key is None:
            if self.ring.is_erased(ref):
                raise ContentErased(f"run {run_id!r} seq {seq}: content erased (subject key destroyed)")
            if self.ring.file_missing():
                raise KeyFileMissing(self.ring.path)
            raise SubjectKeyMissing(f"run {run_id!r} seq {seq}: key file {self.ring.path} holds no key and no "
                                    f"erasure record for subject {str(ref)[:12]}…: is it this database's key file?")
        nonce, aad = self._nonce_and_aad(key, run_id, seq, type_, ref)
        try:
            plain = json.loads(self._cipher(ref).decrypt(nonce, ciphertext, aad))
        except InvalidTag:
            if self.ring.was_erased(ref):  # a key made after an erasure of the same subject: the old content
                raise ContentErased(f"run {run_id!r} seq {seq}: content erased (subject key destroyed)") from None
            raise ContentTampered(f"run {run_id!r} seq {seq} ({type_}): sealed content fails authentication: the "
                                  "ciphertext was edited, or the row moved (run, seq or type changed)") from None
        if not isinstance(plain, dict):
            raise ContentTampered(f"run {run_id!r} seq {seq}: sealed content is not an object")
        return plain

    def problem(self, run_id: str, seq: int, type_: str, stored: dict) -> ContentUnreadable | None:
        """Why a stored payload's sealed content does not open (None: it opens, or nothing is sealed)."""
        env = stored.get(SEALED_KEY)
        if env is None:
            return None
        try:
            self._plaintext(run_id, seq, type_, env)
        except ContentUnreadable as exc:
            return exc
        return None

    def readable(self, stored: dict) -> bool:
        env = stored.get(SEALED_KEY)
        return env is None or self.ring.key(env["s"]) is not None


def stored_form(e) -> dict:
    """The payload of a `StoredEvent` as it is (or was) stored: the sealed form where the event was read
    from, or built for, a sealed row (its plaintext `payload` opened from `payload_json`), else `payload`."""
    if e.payload_json is not None and SEALED_KEY not in e.payload and SEALED_KEY in e.payload_json:
        stored = json.loads(e.payload_json)
        if SEALED_KEY in stored:
            return stored
    return e.payload


def sealed_ref(stored: dict) -> str | None:
    env = stored.get(SEALED_KEY)
    return env["s"] if env else None


ENCRYPT_ENV = "GRANDROUNDS_ENCRYPT"
"""Set to 0 to store case content in clear (benchmarks measure both; not advised with patient data)."""


def default_codec(db_path: str, read_only: bool = False) -> SealingCodec | None:
    """The codec a database file gets unless told otherwise: its key file beside it (created with the
    first subject), or none for an in-memory store or with GRANDROUNDS_ENCRYPT=0."""
    import os

    if os.environ.get(ENCRYPT_ENV, "1") == "0":
        return None
    path = keys_path_for(db_path)
    return None if path is None else SealingCodec(KeyRing(path, read_only=read_only))


def shared_codec(read_only: bool = False) -> SealingCodec | None:
    """The codec of a process whose runs move to other processes (a Kafka worker): the shared key file
    `$GRANDROUNDS_KEYS` when set, else none (content in clear). A worker's own `<db>.keys` would be
    useless to the worker a run moves to, which would read that run's content as erased."""
    import os

    from grandrounds.store.keyring import KEYS_ENV

    if os.environ.get(ENCRYPT_ENV, "1") == "0" or not os.environ.get(KEYS_ENV):
        return None
    return SealingCodec(KeyRing(os.environ[KEYS_ENV], read_only=read_only))


def require_key_file(store) -> None:
    """`KeyFileMissing` (bad input naming the file) when the store holds sealed rows and its key file is
    gone: for commands that would otherwise fail on every page or row (the web view), said once, up front."""
    if store.codec is None or not store.codec.ring.file_missing():
        return
    row = store.conn.execute("SELECT 1 FROM events WHERE contains(CAST(payload AS VARCHAR), ?) LIMIT 1",
                             [SEALED_KEY]).fetchone()
    if row is not None:
        raise KeyFileMissing(store.codec.ring.path)
