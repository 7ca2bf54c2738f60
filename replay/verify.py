"""Determinism verification: re-execute a run from its own log and compare event by event.

The run's spec (first event) and case log (`case.received` payloads) are all a re-execution
needs. It runs into a scratch in-memory store sharing the embedding cache, and its events
are compared with the recorded ones as (seq, type, payload) — what the fingerprint covers —
so a difference is reported as the first event that differs, with the first differing field.
The recorded log's hash chain is checked first, for every run: an event edited behind the API's
back breaks the chain at that seq even when its content would replay the same. With a signing key
the run's signed head is checked against the log (a log rewritten and re-chained from genesis no
longer matches it). A run whose log is not whole (fewer completed cases than `run.started`
declares, or no `run.completed`) is never reported identical. Runs made with a model are served
their own recorded exchanges by request hash: no endpoint is needed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from grandrounds.handlers.cases import FhirCase
from grandrounds.handlers.code_versions import code_versions, differences
from grandrounds.handlers.environments.base import EnvironmentRecord
from grandrounds.handlers.llm.errors import ReplayDivergence
from grandrounds.handlers.llm.record import RecordedExchanges
from grandrounds.handlers.runs import is_declared_count
from grandrounds.replay.caselog import case_log, require_spec, seeded_memory
from grandrounds.replay.environment import EnvironmentUnavailable, fhir_case_log  # noqa: F401 (fhir_case_log: re-exported)
from grandrounds.replay.environment import recorded_environment as _recorded_environment
from grandrounds.replay.environment import reopen_environment as _reopen_environment
from grandrounds.replay.execute import execute
from grandrounds.store.canonical import canonical_json
from grandrounds.store.embeddings import EmbeddingCache
from grandrounds.store.eventstore import EventStore
from grandrounds.store.read_model import EventLog
from grandrounds.store.sealing import ContentErased, ContentUnreadable
from grandrounds.store.events import StoredEvent
from grandrounds.store.signing import HeadCheck, SigningKey, check_head


class NotVerifiable(EnvironmentUnavailable):
    """The run cannot be re-executed here (bad input: exit code 2)."""


@dataclass(frozen=True)
class Divergence:
    seq: int
    case_id: str | None
    recorded_type: str | None
    replayed_type: str | None
    path: str
    """Where the payloads first differ: `type`, a dotted field path, or `end of log`."""
    recorded: Any
    replayed: Any

    def as_dict(self) -> dict:
        return {"seq": self.seq, "case_id": self.case_id, "recorded_type": self.recorded_type,
                "replayed_type": self.replayed_type, "path": self.path,
                "recorded": _clip(self.recorded), "replayed": _clip(self.replayed)}


def _clip(value: Any, limit: int = 300) -> Any:
    text = canonical_json(value) if not isinstance(value, str) else value
    return value if len(text) <= limit else text[:limit] + "…"


def first_difference(a: Any, b: Any, path: str = "payload") -> tuple[str, Any, Any] | None:
    """The first (path, a, b) where two JSON values differ, depth first in key order."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                return f"{path}.{key}", a.get(key), b.get(key)
            d = first_difference(a[key], b[key], f"{path}.{key}")
            if d:
                return d
        return None
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{path}[{i}]")
            if d:
                return d
        if len(a) != len(b):
            return f"{path}.length", len(a), len(b)
        return None
    if canonical_json(a) != canonical_json(b):
        return path, a, b
    return None


def compare_logs(recorded: list[StoredEvent], replayed: list[StoredEvent]) -> Divergence | None:
    for r, p in zip(recorded, replayed):
        if r.type != p.type:
            return Divergence(r.seq, r.case_id, r.type, p.type, "type", r.type, p.type)
        if canonical_json(r.payload) != canonical_json(p.payload):
            path, a, b = first_difference(r.payload, p.payload) or ("payload", r.payload, p.payload)
            return Divergence(r.seq, r.case_id, r.type, p.type, path, a, b)
    if len(recorded) != len(replayed):
        n = min(len(recorded), len(replayed))
        longer = recorded if len(recorded) > n else replayed
        e = longer[n]
        return Divergence(e.seq, e.case_id, e.type if longer is recorded else None,
                          e.type if longer is replayed else None, "end of log",
                          len(recorded), len(replayed))
    return None


from grandrounds.handlers.backbones import RECORDED_BACKBONES as MODEL_BACKBONES  # recorded=True (agent too)


def _completeness(store: EventStore, run_id: str, chain_version: int | None) -> dict:
    """Whether the log holds the whole run: every declared case completed and `run.completed` written.

    A run written before runs declared their case count (no `cases` in `run.started`, v1 chain) can
    only be judged by "every received case completed", which a cut at a case boundary passes: such a
    run is reported with `complete: null` and a warning, never as proven whole."""
    started = store.read(run_id, upto_seq=0)
    declared = started[0].payload.get("cases") if started and started[0].type == "run.started" else None
    counts = EventLog(store).counts_by_type(run_id)
    received, completed = int(counts.get("case.received", 0)), int(counts.get("case.completed", 0))
    run_completed = int(counts.get("run.completed", 0)) > 0
    out = {"declared_cases": declared, "received_cases": received, "completed_cases": completed,
           "run_completed": run_completed}
    contradictions = _contradictions(store, run_id, declared, received, int(counts.get("run.completed", 0)))
    if contradictions:  # never "all N declared cases completed" beside a count that says otherwise
        return dict(out, complete=False, inconsistent=True, completeness="inconsistent: " + ", ".join(contradictions))
    if isinstance(declared, int):
        if completed < declared or not run_completed:
            missing = [] if run_completed else ["no run.completed event"]
            if completed < declared:
                missing.insert(0, f"{completed} of {declared} declared cases completed")
            return dict(out, complete=False, completeness="incomplete: " + ", ".join(missing))
        return dict(out, complete=True, completeness=f"all {declared} declared cases completed, run.completed present")
    if chain_version == 1:
        whole = received == completed
        return dict(out, complete=None if whole else False,
                    completeness=("legacy run (written before runs declared their case count): every received "
                                  "case completed, but a cut at a case boundary cannot be seen") if whole else
                    f"incomplete: {completed} of {received} received cases completed")
    return dict(out, complete=False, completeness="incomplete: run.started declares no case count")


def _contradictions(store: EventStore, run_id: str, declared, received: int, run_completions: int) -> list[str]:
    """What in the log contradicts the run it declares: a count that is not a positive integer, more cases
    than declared, more than one `run.completed`, or a case taken in after `run.completed`. Builds before
    runs were closed (issue 43) accepted such cases; a log that holds one is never whole."""
    out = []
    if declared is not None and not is_declared_count(declared):
        out.append(f"run.started declares {declared!r} cases, not a positive count")
    elif isinstance(declared, int) and received > declared:
        out.append(f"{received} cases received where run.started declares {declared}")
    if run_completions > 1:
        out.append(f"{run_completions} run.completed events")
    if run_completions:
        log = EventLog(store)
        closed_at, _ = log.seq_span(run_id, "run.completed")
        _, last_case = log.seq_span(run_id, "case.received")
        if last_case is not None and closed_at is not None and last_case > closed_at:
            out.append(f"a case received after run.completed (seq {closed_at})")
    return out


REASON_ORDER = ("expect_mismatch", "expect_head_mismatch", "chain_broken", "ciphertext_tampered", "head_mismatch",
                "head_bad_signature", "head_other_key", "head_absent", "key_missing", "expect_unverifiable", "erased",
                "inconsistent", "incomplete", "diverged", "code_changed")
"""Reason codes of `verify --json`, the most telling first: `reason` is the first of them present. See
docs/trust.md ("Verify reason codes")."""

_HEAD_CODES = {"absent": "head_absent", "other key": "head_other_key", "bad signature": "head_bad_signature",
               "log differs": "head_mismatch"}


class _Verdict:
    """Reasons a run is not verified, each with its code (`reasons` stay the words, `reason_codes` the codes)."""

    def __init__(self) -> None:
        self.reasons: list[str] = []
        self.codes: list[str] = []

    def add(self, code: str, text: str) -> None:
        assert code in REASON_ORDER, code
        self.reasons.append(text)
        self.codes.append(code)


@dataclass(frozen=True)
class AnchorCheck:
    """`--expect` / `--expect-head`: the log's value against one published elsewhere."""

    expected: str
    actual: str | None
    ok: bool

    def as_dict(self) -> dict:
        return {"expected": self.expected, "actual": self.actual, "ok": self.ok}


@dataclass(frozen=True)
class VerifyResult:
    """What `verify` found for one run (DESIGN §8), however verification ended.

    Modelled on Temporal's `WorkflowReplayResult` (the run, whether it replayed, the failure): the
    fingerprints, the first divergence, the chain and signed-head checks, the anchors, and the reasons
    with their codes. A run whose sealed content does not open is not re-executed (`reexecutable` false):
    it carries its erased cases and its unreadable rows by cause instead of code versions (nothing ran to
    compare them with). `to_dict()` is the `verify --json` object, key for key and in the same order."""

    run_id: str
    fingerprint: str | None
    replayed_fingerprint: str | None
    identical: bool
    """Complete, and re-executed to the recorded events."""
    events: int
    cases: int
    complete: bool | None
    """None: a legacy run whose log cannot show a cut at a case boundary (never proven whole)."""
    completeness: str
    declared_cases: int | None
    completed_cases: int
    backbone: str
    replayed_from_record: bool
    first_divergence: Divergence | None
    chain_break_seq: int | None
    chain_version: int | None
    chain_head: str | None
    signed_head: HeadCheck
    reexecutable: bool
    reasons: tuple[str, ...] = ()
    reason_codes: tuple[str, ...] = ()
    """The code of each of `reasons`, in the same order."""
    warnings: tuple[str, ...] = ()
    expect: AnchorCheck | None = None
    expect_head: AnchorCheck | None = None
    code_versions: dict | None = None
    """Re-executed runs only: {"recorded", "build", "differences"}."""
    erased_cases: tuple[str, ...] = ()
    unreadable_seqs: dict[str, list[int]] = field(default_factory=dict)
    """Runs not re-executed only: the seqs of the sealed rows that do not open, by cause."""

    def __post_init__(self) -> None:
        if len(self.reasons) != len(self.reason_codes) or not set(self.reason_codes) <= set(REASON_ORDER):
            raise ValueError(f"reasons and reason codes do not pair up: {self.reason_codes!r}")

    @property
    def chain_intact(self) -> bool:
        return self.chain_break_seq is None

    @property
    def reason(self) -> str | None:
        """The most telling of `reason_codes` (REASON_ORDER); None when verified."""
        return next((code for code in REASON_ORDER if code in self.reason_codes), None)

    @property
    def ok(self) -> bool:
        """Verified: re-executed, and no reason against it."""
        return self.reexecutable and not self.reasons

    def to_dict(self) -> dict:
        out: dict[str, Any] = {"run_id": self.run_id, "fingerprint": self.fingerprint,
                               "replayed_fingerprint": self.replayed_fingerprint, "identical": self.identical,
                               "events": self.events, "cases": self.cases}
        if not self.reexecutable:  # where `verify --json` has always put them: after the counts
            out.update(erased_cases=list(self.erased_cases), unreadable_seqs=dict(self.unreadable_seqs),
                       reexecutable=False)
        out.update(complete=self.complete, completeness=self.completeness, declared_cases=self.declared_cases,
                   completed_cases=self.completed_cases, backbone=self.backbone,
                   replayed_from_record=self.replayed_from_record,
                   first_divergence=self.first_divergence.as_dict() if self.first_divergence else None,
                   chain_intact=self.chain_intact, chain_break_seq=self.chain_break_seq,
                   chain_version=self.chain_version, chain_head=self.chain_head, signed_head=self.signed_head.as_dict())
        for name, anchor in (("expect", self.expect), ("expect_head", self.expect_head)):
            if anchor is not None:  # only the anchors asked for have a key
                out[name] = anchor.as_dict()
        if self.code_versions is not None:
            out["code_versions"] = self.code_versions
        out.update(warnings=list(self.warnings), reasons=list(self.reasons), reason_codes=list(self.reason_codes),
                   reason=self.reason, ok=self.ok)
        return out


def _seqs(seqs: list[int]) -> str:
    return ", ".join(map(str, seqs[:8])) + (f" … ({len(seqs)} in all)" if len(seqs) > 8 else "")


def _content_reasons(verdict: _Verdict, store: EventStore, problems: dict) -> None:
    """Sealed rows that do not open, each cause named as what it is: only a tombstone means erased."""
    if problems.get("ciphertext_tampered"):
        seqs = problems["ciphertext_tampered"]
        verdict.add("ciphertext_tampered", f"{len(seqs)} sealed row(s) fail authentication (seq {_seqs(seqs)}): "
                    "their ciphertext was edited, or rows were moved (run, seq or type changed); this is "
                    "tampering, not an erasure")
    if problems.get("key_missing"):
        seqs = problems["key_missing"]
        where = store.codec.ring.path if store.codec is not None else "(none: GRANDROUNDS_ENCRYPT=0)"
        verdict.add("key_missing", f"the key file {where} holds no key and no erasure record for the subject of "
                    f"{len(seqs)} sealed row(s) (seq {_seqs(seqs)}): is it this database's key file? No erasure "
                    "is recorded for these subjects")
    if problems.get("erased"):
        cases = problems.get("erased_cases", [])
        verdict.add("erased", f"the content of {len(cases)} case(s) was erased (grandrounds erase: a tombstone in "
                    "the key file): they can no longer be re-executed: " + ", ".join(cases))


def _anchor_reasons(verdict: _Verdict, fingerprint: str | None, head_chain: str | None, expect: str | None,
                    expect_head: str | None) -> tuple[AnchorCheck | None, AnchorCheck | None]:
    """`--expect` / `--expect-head`: the log against a value published elsewhere (no key needed)."""
    fp_check = head_check = None
    if expect is not None:
        want = expect.strip().lower()
        fp_check = AnchorCheck(want, fingerprint, fingerprint == want)
        if fingerprint is None:
            verdict.add("expect_unverifiable", "--expect: the run's fingerprint cannot be computed (see the other "
                        "reasons), so it cannot be compared with the published one")
        elif fingerprint != want:
            verdict.add("expect_mismatch", f"--expect: the log's fingerprint {fingerprint} is not the published "
                        f"{want}: the log was rewritten (or truncated) since that value was published")
    if expect_head is not None:
        want = expect_head.strip()
        actual = head_chain
        same = actual is not None and (actual == want or (not want.startswith("v2:") and actual == "v2:" + want))
        head_check = AnchorCheck(want, actual, same)
        if not same:
            verdict.add("expect_head_mismatch", f"--expect-head: the log's head chain value {actual} is not the "
                        f"published {want}: the log was rewritten, truncated or extended since")
    return fp_check, head_check


def _key_file_mode(store: EventStore) -> int | None:
    try:
        return store.codec.ring.path.stat().st_mode & 0o777 if store.codec is not None else None
    except OSError:
        return None


@dataclass
class _LogChecks:
    """What verify finds by reading the log alone (chain, signed head, completeness), before any
    re-execution, and the verdict and warnings it starts; `result` fills a VerifyResult's share of it."""

    run_id: str
    backbone: str
    chain_version: int | None
    chain_break_seq: int | None
    chain_head: str | None
    head: HeadCheck
    whole: dict
    key_given: bool
    verdict: _Verdict = field(default_factory=_Verdict)
    warnings: list[str] = field(default_factory=list)

    def chain_reason(self) -> None:
        if self.chain_break_seq is not None:
            self.verdict.add("chain_broken", f"hash chain broken at seq {self.chain_break_seq}")

    def incomplete_reason(self) -> None:
        if self.whole["complete"] is False:
            self.verdict.add("inconsistent" if self.whole.get("inconsistent") else "incomplete",
                             self.whole["completeness"])

    def head_reason(self) -> None:
        if self.key_given and not self.head.ok:
            self.verdict.add(_HEAD_CODES.get(self.head.status, "head_mismatch"),
                             f"signed head: {self.head.status} ({self.head.detail})")

    def result(self, **fields: Any) -> VerifyResult:
        """Called last: the reasons and warnings are taken as they stand."""
        w = self.whole
        return VerifyResult(run_id=self.run_id, complete=w["complete"], completeness=w["completeness"],
                            declared_cases=w["declared_cases"], completed_cases=w["completed_cases"],
                            backbone=self.backbone, chain_break_seq=self.chain_break_seq,
                            chain_version=self.chain_version, chain_head=self.chain_head, signed_head=self.head,
                            reasons=tuple(self.verdict.reasons), reason_codes=tuple(self.verdict.codes),
                            warnings=tuple(self.warnings), **fields)


def _check_log(store: EventStore, run_id: str, backbone: str, key: SigningKey | None) -> _LogChecks:
    from grandrounds.store.signing import current_head

    chain = store.check_chain(run_id)  # first, for every run: it reads nothing but the rows
    checks = _LogChecks(run_id, backbone, chain.version, chain.break_seq,
                        current_head(store, run_id).chain if chain.events else None, check_head(store, run_id, key),
                        _completeness(store, run_id, chain.version), key is not None)
    if chain.version == 1:
        checks.warnings.append("chain v1 (written before the chain covered run id and meta): an edit of run_id or "
                               "meta is not detected by it")
    if checks.whole["complete"] is None:
        checks.warnings.append(checks.whole["completeness"])
    if checks.head.status == "not checked" and checks.head.signed is not None:
        checks.warnings.append("the run has a signed head: give the key (GRANDROUNDS_SIGNING_KEY or --key-file) to "
                               "check it")
    mode = _key_file_mode(store)
    if mode is not None and mode & 0o077:
        checks.warnings.append(f"key file {store.codec.ring.path} is mode {mode:o}: others can read the keys of the "
                               "sealed content (chmod 600 it)")
    return checks


def _not_reexecutable(store: EventStore, checks: _LogChecks, problems: dict, expect: str | None,
                      expect_head: str | None) -> VerifyResult:
    """Content that does not open: the chain and the signed head still check, re-execution cannot run."""
    checks.chain_reason()
    _content_reasons(checks.verdict, store, problems)
    checks.head_reason()
    checks.incomplete_reason()
    try:
        fingerprint = store.fingerprint(checks.run_id)  # after an erasure: the one recorded at the erasure
    except ContentErased as exc:  # none recorded: the run grew after the erasure
        fingerprint = None
        checks.verdict.add("erased", str(exc))
    except ContentUnreadable:  # named above
        fingerprint = None
    expect_check, head_check = _anchor_reasons(checks.verdict, fingerprint, checks.chain_head, expect, expect_head)
    return checks.result(fingerprint=fingerprint, replayed_fingerprint=None, identical=False,
                         events=store.last_seq(checks.run_id) + 1, cases=checks.whole["received_cases"],
                         replayed_from_record=False, first_divergence=None, reexecutable=False,
                         expect=expect_check, expect_head=head_check,
                         erased_cases=tuple(problems.get("erased_cases", [])),
                         unreadable_seqs={k: v for k, v in problems.items() if k != "erased_cases"})


@dataclass(frozen=True)
class _Reexecution:
    cases: int
    fingerprint: str
    replayed_fingerprint: str
    divergence: Divergence | None
    error: str | None
    """The re-execution asked for a model exchange the record does not hold."""
    from_record: bool


def _reexecute(store: EventStore, run_id: str, spec, cache: EmbeddingCache, whole: dict) -> _Reexecution:
    """Re-execute the run into a scratch in-memory store and compare it with the log."""
    backbone_options = None
    if spec.backbone in MODEL_BACKBONES:
        # A model run re-executes against its own recorded exchanges, served by request hash: no
        # endpoint, no key, and a request the record does not hold is a divergence, never a live call.
        backbone_options = {"recorded": RecordedExchanges.from_store(store, run_id), "live_fallthrough": False}
    elif spec.backbone != "sim":
        raise NotVerifiable(f"run {run_id!r} used the {spec.backbone!r} backbone: verify re-executes sim runs and "
                            "model runs (openai, record) from their recorded exchanges")
    record = recorded_environment(store, run_id)
    if record is None:
        cases = case_log(store, run_id)
        opened = nullcontext(None)
    else:
        cases = fhir_case_log(store, run_id)
        opened = reopen_environment(record, run_id, spec.source, cases, store)
    head_seq = store.last_seq(run_id)
    # A log that contradicts its declared count (an older build took cases after run.completed) re-executes
    # as an open-ended run: a closed run would refuse the extra case (it is reported inconsistent anyway).
    declared = (whole["declared_cases"] if isinstance(whole["declared_cases"], int) and not whole.get("inconsistent")
                else None)

    cache.adopt_run(store, run_id)  # re-execute with the vectors the run recorded, not this machine's (DESIGN §3)
    scratch = EventStore(":memory:")
    replay_error = None
    try:
        try:
            with opened as environment:  # a FHIR run's sandbox: up for the re-execution only
                execute(scratch, cache, run_id, spec, cases, checkpoint=False, seeded=seeded_memory(store, run_id),
                        environment=environment, backbone_options=backbone_options, declared=declared)
        except ReplayDivergence as exc:
            replay_error = f"the re-execution asked for a model exchange the record does not hold: {exc}"
        # An interrupted run's log ends inside a case that the re-execution finishes: compare the
        # prefix the recorded log has (for the divergence report; such a run is never identical).
        upto = None if whole["complete"] is not False else head_seq
        recorded = store.read(run_id)
        replayed = scratch.read(run_id, upto_seq=upto)
        divergence = compare_logs(recorded, replayed)
        fingerprint = store.fingerprint(run_id)  # every sealed row opened: this cannot fail on content
        replayed_fp = scratch.fingerprint(run_id, upto_seq=upto)
    finally:
        scratch.close()
    if not store.read_only:  # a read-only copy stays as it is: vectors it lacked were embedded in memory only
        cache.flush()
    return _Reexecution(len(cases), fingerprint, replayed_fp, divergence, replay_error, backbone_options is not None)


def verify_run(store: EventStore, run_id: str, cache: EmbeddingCache, key: SigningKey | None = None,
               expect: str | None = None, expect_head: str | None = None) -> VerifyResult:
    """The DESIGN §8 verify result: the chain, the signed head (with a key), completeness, then
    re-execution (model runs are served their own recorded exchanges: no endpoint is called).

    `identical` is true only for a complete run whose re-execution gives the recorded events; `ok`
    also needs an intact chain, with a key a valid signed head matching the log, and the anchors given
    (`expect`: a published fingerprint; `expect_head`: a published head chain value) matching.
    A database whose key file is missing raises `KeyFileMissing` (bad input naming the file)."""
    from grandrounds.store.erasure import content_problems

    spec = require_spec(store, run_id)
    checks = _check_log(store, run_id, spec.backbone, key)
    problems = content_problems(store, run_id)  # KeyFileMissing propagates: a file is missing, nothing erased
    if problems.get("erased") or problems.get("key_missing") or problems.get("ciphertext_tampered"):
        return _not_reexecutable(store, checks, problems, expect, expect_head)

    done = _reexecute(store, run_id, spec, cache, checks.whole)
    same = done.fingerprint == done.replayed_fingerprint and done.divergence is None and done.error is None
    checks.chain_reason()
    checks.incomplete_reason()
    if done.error:
        checks.verdict.add("diverged", done.error)
    elif not same:
        checks.verdict.add("diverged", "the re-execution differs from the log" +
                           (f" (first at seq {done.divergence.seq})" if done.divergence else ""))
    checks.head_reason()
    expect_check, head_check = _anchor_reasons(checks.verdict, done.fingerprint, checks.chain_head, expect,
                                               expect_head)
    recorded_code = spec.code or None
    build_code = code_versions(spec.policy)
    code_diffs = differences(recorded_code, build_code) if recorded_code != build_code else []
    if code_diffs and recorded_code is not None:
        if same:
            checks.warnings.append("recorded by other code versions, yet re-executes identically: " +
                                   "; ".join(code_diffs))
        else:  # say why the bytes differ, not only where
            checks.verdict.add("code_changed", "recorded by other code versions: " + "; ".join(code_diffs))
    elif code_diffs and not same:
        checks.verdict.add("code_changed", code_diffs[0])
    return checks.result(fingerprint=done.fingerprint, replayed_fingerprint=done.replayed_fingerprint,
                         identical=same and checks.whole["complete"] is not False, events=store.last_seq(run_id) + 1,
                         cases=done.cases, replayed_from_record=done.from_record, first_divergence=done.divergence,
                         reexecutable=True, expect=expect_check, expect_head=head_check,
                         code_versions={"recorded": recorded_code, "build": build_code, "differences": code_diffs})


def verify_runs(store: EventStore, run_ids: Iterable[str], cache_factory: Callable[[EventStore], EmbeddingCache],
                key: SigningKey | None = None) -> Iterator[VerifyResult]:
    """`verify_run` for each of `run_ids` in turn, lazily (a run is re-executed when its result is asked
    for; one that cannot be verified raises as `verify_run` does). Each run gets a cache of its own,
    `cache_factory(store)` (`grandrounds.app.make_cache`): a run adopts the vectors its log recorded into
    the cache it re-executes with, and a cache shared between runs would lend one run's vectors to the next."""
    for run_id in run_ids:
        yield verify_run(store, run_id, cache_factory(store), key=key)


# --- runs of tool tasks (MedAgentBench): their environment is rebuilt from the recorded files --------
# (shared with order replays: replay/environment.py)


def recorded_environment(store: EventStore, run_id: str) -> EnvironmentRecord | None:
    return _recorded_environment(store, run_id, error=NotVerifiable)


def reopen_environment(record: EnvironmentRecord, run_id: str, source: str | None, cases: list[FhirCase],
                       store: EventStore | None = None):
    """The run's MedAgentBench environment built again (a fresh sandbox), once its files check out."""
    return _reopen_environment(record, run_id, source, cases, what="verify", error=NotVerifiable, store=store)
