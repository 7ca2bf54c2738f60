"""The public Python API: a memory for your own agent, recorded as a run like any other.

```python
from grandrounds import Memory

with Memory.open("memory.duckdb", namespace="ward-7", cases=20) as memory:
    shown = memory.recall(case)              # what to put in front of your agent
    memory.record(case.case_id, answer="B")  # what your agent did
    changes = memory.feedback(case.case_id, outcome="B")  # the gold answer: memory learns
```

A namespace is one run (its run id): one memory, one case order, one policy. Driven through this API it
is an ordinary run of the `agent` backbone (handlers/backbones/agent.py): the agent's replies are recorded
as exchanges, so `grandrounds verify` re-executes it without the agent, `grandrounds replay` permutes it
(asking the agent again only where a permutation shows it memory it was never shown: pass `agent=`), and
`grandrounds ui` browses it. The same cases and replies through `grandrounds run --agent` give the same
event bytes.

How a case enters the log: `recall` reads memory and opens the case (nothing is written); `record` holds
the agent's reply; `feedback` runs the five stages for the case — retrieve (re-read, and checked to be
what `recall` showed), act (the held reply, recorded), feedback, reflect, govern — and commits them as one
transaction. So the log always ends at a case boundary, and a case whose feedback never comes leaves
nothing. Cases are handled strictly in order (memory after case i-1 is what case i sees): one case is
open at a time per namespace; `recall` of another waits for it (`wait=` seconds) or is refused
(`CaseOpen`).
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from grandrounds.handlers.backbones.agent import (AgentCallable, AgentMemory, AgentReply, RecalledItem,
                                                  agent_memory)
from grandrounds.handlers.cases import Case, CaseView
from grandrounds.handlers.policies.config import PolicyConfig, load_policy
from grandrounds.handlers.runs import RunSpec, check_declared_count
from grandrounds.store.errors import Bug, InvalidInput
from grandrounds.store.event_types import AgentStep
from grandrounds.store.llm_events import TokenUsage
from grandrounds.streams.session import Session

__all__ = ["AsyncMemory", "CaseInput", "CaseOpen", "FeedbackResult", "Memory", "MemoryChange", "MemoryHub",
           "NamespaceConfig", "Recall", "Recorded", "UnknownCase"]

CASE_FLOW_TYPES = frozenset({"case.received", "memory.retrieved", "llm.exchange", "answer.given",
                             "feedback.recorded", "case.completed", "case.failed", "run.completed"})
"""Events of a case that are not memory changes (the case going through its stages)."""
DEFAULT_AGENT = "agent"


class CaseOpen(InvalidInput):
    """Another case of this namespace is open (recalled, no feedback yet): cases are handled in order."""


class UnknownCase(InvalidInput):
    """A `record` or `feedback` for a case that is not the open one, or a case the namespace already holds."""


class CaseInput(BaseModel):
    """A multiple-choice case as the API takes it. The gold answer may come now or with `feedback`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    case_id: str = Field(min_length=1, max_length=200)
    kind: Literal["mcq"] = "mcq"
    question: str = Field(min_length=1)
    options: dict[str, str]
    answer: str | None = None
    """The gold option letter, if known already; it is shown to feedback only, never to the agent."""
    category: str = Field(default="general", min_length=1)
    tools: list[str] = Field(default_factory=list)
    subject: str | None = Field(default=None, min_length=1)
    """Whom the case is about (a patient id): its content is sealed under that subject's key."""

    def with_gold(self, gold: str) -> Case:
        data = self.model_dump(exclude={"answer"}, exclude_none=True)
        return Case(**data, answer=gold)

    def view(self) -> CaseView:
        return CaseView(case_id=self.case_id, kind=self.kind, question=self.question, options=self.options,
                        category=self.category, tools=self.tools)


class Recall(BaseModel):
    """What `recall` returns: the memory to show the agent for this case, exactly as `memory.retrieved`
    records it once the case's feedback arrives."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    case_id: str
    index: int
    """The case's position in the namespace's stream (from 0)."""
    memory_seq: int
    """The memory version read: `as_of(memory_seq)` shows that memory whole."""
    text: str
    """The context prefix to put in front of the agent's prompt."""
    items: list[RecalledItem] = Field(default_factory=list)
    """Every item shown, with id, kind, relevance, score and why it was chosen."""

    def memory(self) -> AgentMemory:
        return AgentMemory(memory_seq=self.memory_seq, text=self.text, items=self.items)


class Recorded(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    case_id: str
    answer: str


class MemoryChange(BaseModel):
    """One memory event a case's feedback wrote (a rule added or edited, an episode stored, a tool relabelled...)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seq: int
    type: str
    payload: dict[str, Any]


class FeedbackResult(BaseModel):
    """What a case's feedback did: the grade, and the memory changes reflection and governance made."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    case_id: str
    index: int
    answer: str
    """The answer recorded ("" when the agent gave no valid answer, or the case failed)."""
    gold: str
    correct: bool
    first_seq: int
    last_seq: int
    """The seqs of the case's events in the log (all committed when this returns)."""
    changes: list[MemoryChange] = Field(default_factory=list)


@dataclass
class _OpenCase:
    case: CaseInput
    recall: Recall
    reply: AgentReply | None = None


def _policy(policy: str | PolicyConfig | None) -> PolicyConfig:
    if policy is None:
        return load_policy("evo-medagent")
    return load_policy(policy) if isinstance(policy, str) else policy


def _spec(policy: str | PolicyConfig | None, agent: str, seed: int, source: str | None) -> RunSpec:
    return RunSpec(policy=_policy(policy), backbone="agent", model=agent, seed=seed, source=source)


class AsyncMemory:
    """The asynchronous API: one namespace (run) of one DuckDB file. See the module docstring."""

    def __init__(self, lock: asyncio.Lock | None = None) -> None:
        """Use `AsyncMemory.open` (or `MemoryHub.open` for many namespaces of one file)."""
        self._session: Session | None = None
        self._spec: RunSpec | None = None
        self._open: _OpenCase | None = None
        self._turn = asyncio.Condition(lock)
        """Guards the open case; held through a feedback, so the memory a recall reads cannot move. Its lock
        is shared by every namespace of one store (`MemoryHub`): one DuckDB connection, one user at a time."""
        self._known: set[str] = set()
        self._dirty = False

    def _attach(self, session: Session, spec: RunSpec) -> None:
        self._session, self._spec = session, spec
        from grandrounds.store.read_model import EventLog

        self._known = set(EventLog(session.store).case_indexes(session.run_id))

    # --- opening and closing -------------------------------------------------------------------

    @classmethod
    async def open(cls, db: str | Path, *, namespace: str | None = None, policy: str | PolicyConfig | None = None,
                   agent: str = DEFAULT_AGENT, cases: int | None = None, seed: int = 0,
                   source: str | None = None) -> "AsyncMemory":
        """Open (or create) a namespace of the DuckDB file `db`.

        Args:
            db: the DuckDB file (created if missing).
            namespace: the run id (one memory per team, site or agent); default: derived from the config,
                as `grandrounds run` derives it.
            policy: a preset name (`evo-medagent`, `skemex`, `selsm`, `retrosum`, `none`), a TOML policy
                file, or a `PolicyConfig`. A namespace keeps the policy it was created with.
            agent: the agent's name, recorded as the model of its replies (`grandrounds run --agent` records
                its `--model`, default the module:callable).
            cases: how many cases the namespace will hold. A run that declares its count is complete (and
                `verify` can say so) after its last case; None leaves it open-ended: `verify` re-executes it
                but reports it incomplete.
            seed: the run's seed (randomness of the policies).
            source: what the cases come from, recorded in `run.started` (`grandrounds run` records its case
                file's sha256).
        """
        spec = _spec(policy, agent, seed, source)
        check_declared_count(cases, namespace or spec.default_run_id())  # bad input: before the file is opened
        memory = cls()
        # The agent backbone asks `memory._reply` for the case it acts on: the reply `record` holds.
        session = Session.open_file(db, namespace or spec.default_run_id(), spec, cases=cases, commit="case",
                                    backbone_options={"agent": memory._reply})
        memory._attach(session, spec)
        return memory

    @classmethod
    def on_store(cls, store, cache, *, namespace: str | None = None, policy: str | PolicyConfig | None = None,
                 agent: str = DEFAULT_AGENT, cases: int | None = None, seed: int = 0, source: str | None = None,
                 lock: asyncio.Lock | None = None) -> "AsyncMemory":
        """A namespace of an open store (the caller keeps the store): `MemoryHub` serves many this way."""
        spec = _spec(policy, agent, seed, source)
        memory = cls(lock)
        session = Session.open(store, cache, namespace or spec.default_run_id(), spec, cases=cases, commit="case",
                               backbone_options={"agent": memory._reply})
        memory._attach(session, spec)
        return memory

    async def aclose(self) -> None:
        """Checkpoint the projection (a reopen folds nothing), close the store. An open case is dropped."""
        if self._dirty:
            from grandrounds.store.projection import save_checkpoint

            save_checkpoint(self._session.store, self.namespace, self._session.ctx.projection)
        await self._session.aclose()
        self._session.close()

    async def __aenter__(self) -> "AsyncMemory":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def namespace(self) -> str:
        """The run id this memory is."""
        return self._session.run_id

    @property
    def store(self):
        """The event store (read it through `grandrounds.store.read_model.EventLog`)."""
        return self._session.store

    # --- the case cycle ------------------------------------------------------------------------

    async def recall(self, case: CaseInput | Case | dict, wait: float = 0.0) -> Recall:
        """Read memory for `case` and open it: the items to show the agent, as `retrieve` records them.

        Recalling the open case again returns the same memory. Another case open: waits up to `wait`
        seconds for its feedback, then raises `CaseOpen`. A case id the namespace holds already raises
        `UnknownCase` (a case is learnt from once)."""
        case = _case_input(case)
        async with self._turn:
            if self._open is not None and self._open.case.case_id == case.case_id:
                if self._open.case != case:
                    raise UnknownCase(f"case {case.case_id!r} is open with other content")
                return self._open.recall
            if self._open is not None:
                try:
                    await asyncio.wait_for(self._turn.wait_for(lambda: self._open is None), wait) if wait > 0 \
                        else None
                except asyncio.TimeoutError:
                    pass
                if self._open is not None:
                    raise CaseOpen(f"case {self._open.case.case_id!r} is open in namespace {self.namespace!r} "
                                   "(recalled, no feedback yet): cases are handled in order")
            if case.case_id in self._known:
                raise UnknownCase(f"namespace {self.namespace!r} already holds case {case.case_id!r}")
            ctx = self._session.ctx
            # The memory `retrieve` will record for this case: read now from the same projection, which
            # no other case can change until this one's feedback (one open case per namespace).
            preview = self._session.preview_retrieval(_retrieval_case(case))
            shown = agent_memory(preview)
            recall = Recall(case_id=case.case_id, index=ctx.projection.state.cases_completed,
                            memory_seq=shown.memory_seq, text=shown.text, items=shown.items)
            self._open = _OpenCase(case, recall)
            return recall

    async def record(self, case_id: str, answer: str, steps: list[AgentStep] | list[dict] | None = None,
                     used: list[str] | None = None, usage: TokenUsage | dict | None = None) -> Recorded:
        """What the agent did on the open case: its answer (an option letter), its trajectory, the refs of
        the memory items it relied on (`rule:<id>` ...: credited or blamed by the policy) and its token usage.
        Recorded as the agent's reply when the case's feedback arrives; a second `record` replaces the first."""
        reply = AgentReply.model_validate({"answer": answer, "steps": steps or [], "used": used or [],
                                           "usage": usage})
        async with self._turn:
            self._require_open(case_id).reply = reply
        return Recorded(case_id=case_id, answer=reply.answer)

    async def feedback(self, case_id: str, outcome: str | None = None) -> FeedbackResult:
        """The outcome of the open case — its gold option letter (may be omitted when the case carried
        it): grades the recorded answer, reflects and governs, commits the case, returns what changed."""
        async with self._turn:
            open_case = self._require_open(case_id)
            if open_case.reply is None:
                raise UnknownCase(f"case {case_id!r}: record the agent's answer before its feedback")
            gold = outcome if outcome is not None else open_case.case.answer
            if gold is None:
                raise UnknownCase(f"case {case_id!r}: feedback needs the outcome (the gold option letter)")
            if open_case.case.answer is not None and gold != open_case.case.answer:
                raise UnknownCase(f"case {case_id!r}: outcome {gold!r} differs from the answer the case carried")
            full = open_case.case.with_gold(gold)  # validates the gold against the options
            try:
                done = await self._session.process(full)
            except BaseException:
                await self._reopen()  # the projection folded events that were dropped: rebuild it from the log
                raise
            self._dirty = True
            self._known.add(case_id)
            self._open = None
            self._turn.notify_all()
        p = done.progress
        return FeedbackResult(case_id=case_id, index=done.completed.index, answer=p.answer.answer if p.answer else "",
                              gold=p.feedback.gold if p.feedback else gold, correct=done.completed.correct,
                              first_seq=done.events[0][0], last_seq=done.events[-1][0],
                              changes=[MemoryChange(seq=seq, type=t, payload=payload) for seq, t, payload in done.events
                                       if t not in CASE_FLOW_TYPES])

    async def cancel(self, case_id: str) -> None:
        """Drop the open case (nothing of it was written)."""
        async with self._turn:
            self._require_open(case_id)
            self._open = None
            self._turn.notify_all()

    # --- audit, verification, replay -----------------------------------------------------------

    async def history(self, item_id: str) -> dict[str, Any]:
        """Where an item (rule, episode, tool, skill) came from and every case it was shown to, with outcomes."""
        from grandrounds.replay.audit_history import history

        async with self._turn:
            return history(self.store, self.namespace, item_id)

    async def explain(self, case_id: str) -> dict[str, Any]:
        """What the agent saw on a case (items, scores, their provenance), what it answered, what memory learnt."""
        from grandrounds.replay.audit_explain import explain

        async with self._turn:
            return explain(self.store, self.namespace, case_id)

    async def as_of(self, seq: int | None = None, case: int | None = None) -> dict[str, Any]:
        """The memory as it was after folding events up to `seq` (or after case index `case`)."""
        from grandrounds.replay.audit_items import items

        async with self._turn:
            return items(self.store, self.namespace, as_of_case=case, as_of_seq=seq)

    async def verify(self) -> dict[str, Any]:
        """`grandrounds verify` of this namespace: chain, completeness, re-execution from the recorded replies.
        The `verify --json` object (`VerifyResult.to_dict()`), which is what HTTP and MCP send."""
        from grandrounds.replay.verify import verify_run

        # verify_run drives a re-execution in an event loop of its own: in a thread, holding the case lock
        # (nothing else touches the store's connection meanwhile).
        async with self._turn:
            result = await asyncio.to_thread(verify_run, self.store, self.namespace, self._session.cache)
        return result.to_dict()

    async def replay(self, orders: int = 5, seed: int = 0, agent: AgentCallable | None = None) -> dict[str, Any]:
        """`grandrounds replay`: the namespace's cases in `orders` seeded permutations, each a run of its own.
        A permutation shows the agent other memory, which its record cannot answer: give `agent` (the
        callable) to ask it; without it, the replay stops at the first such case (ReplayDivergence)."""
        from grandrounds.replay.order_replay import execute_plan, plan_replay

        async with self._turn:
            plan = plan_replay(self.store, self.namespace, orders, seed)
            return await asyncio.to_thread(execute_plan, self.store, self._session.cache, plan, workers=1,
                                           agent=agent)

    # --- internals -----------------------------------------------------------------------------

    def _require_open(self, case_id: str) -> _OpenCase:
        if self._open is None or self._open.case.case_id != case_id:
            which = f"case {self._open.case.case_id!r} is" if self._open else "no case is"
            raise UnknownCase(f"case {case_id!r} is not open in namespace {self.namespace!r} ({which} open): "
                              "recall it first")
        return self._open

    def _reply(self, view: CaseView, memory: AgentMemory) -> AgentReply:
        """The agent backbone's callable: the reply `record` holds, for the memory `recall` showed."""
        open_case = self._open
        if open_case is None or open_case.case.case_id != view.case_id or open_case.reply is None:
            raise Bug(f"case {view.case_id}: act ran without a recorded reply")
        if memory != open_case.recall.memory():
            # Never record a reply against memory the agent was not shown.
            raise Bug(f"case {view.case_id}: memory at feedback differs from what recall showed")
        return open_case.reply

    async def _reopen(self) -> None:
        old = self._session
        await old.aclose()
        old.cache.flush()
        self._session = Session.open(old.store, old.cache, old.run_id, self._spec, commit="case",
                                     cases=old.ctx.projection.state.declared_cases,
                                     backbone_options={"agent": self._reply}, owns_store=old.owns_store)


def _case_input(case: CaseInput | Case | dict) -> CaseInput:
    if isinstance(case, CaseInput):
        return case
    if isinstance(case, Case):
        return CaseInput.model_validate(case.model_dump(mode="json"))
    return CaseInput.model_validate(case)


def _retrieval_case(case: CaseInput) -> Case:
    """The case as retrieval reads it. Retrieval never reads the gold answer (the leakage guard compares
    question and options); when the gold is not known yet, a stand-in that is no option fills the field,
    so a policy that read it would retrieve differently and fail the check at feedback, never silently."""
    if case.answer is not None:
        return case.with_gold(case.answer)
    return Case.model_construct(**case.model_dump(exclude={"answer"}), answer="?")


class NamespaceConfig(BaseModel):
    """How a namespace is opened over HTTP or MCP: a preset policy only (a policy file would be a path on
    the server's disk)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: Literal["evo-medagent", "skemex", "selsm", "retrosum", "none"] = "evo-medagent"
    agent: str = Field(default=DEFAULT_AGENT, min_length=1, max_length=200)
    cases: int | None = Field(default=None, ge=1)
    seed: int = Field(default=0, ge=0)
    source: str | None = Field(default=None, max_length=200)


class MemoryHub:
    """Many namespaces of one DuckDB file, for a server (HTTP, MCP): one store, one embedding cache, one
    lock. DuckDB allows one writing process per file, so the server's process is the file's writer and
    every client goes through it; the lock makes the server's concurrent requests take turns."""

    def __init__(self, db: str | Path):
        from grandrounds.store.embeddings import EmbeddingCache, shared_minilm
        from grandrounds.store.eventstore import EventStore

        self.db = str(db)
        self.store = EventStore(self.db)
        self.cache = EmbeddingCache(shared_minilm(), self.store.conn)
        self.lock = asyncio.Lock()
        self._open: dict[str, tuple[NamespaceConfig, AsyncMemory]] = {}

    async def open(self, namespace: str, config: NamespaceConfig = NamespaceConfig()) -> AsyncMemory:
        """The namespace, opened (created, or resumed with the same configuration) once per server."""
        found = self._open.get(namespace)
        if found is not None:
            if found[0] != config:
                raise UnknownCase(f"namespace {namespace!r} is open with another configuration: {found[0].model_dump()}")
            return found[1]
        async with self.lock:
            memory = AsyncMemory.on_store(self.store, self.cache, namespace=namespace, lock=self.lock,
                                          **config.model_dump())
        self._open[namespace] = (config, memory)
        return memory

    def get(self, namespace: str) -> AsyncMemory:
        found = self._open.get(namespace)
        if found is None:
            raise KeyError(namespace)
        return found[1]

    async def aclose(self) -> None:
        for _, memory in self._open.values():
            await memory.aclose()
        self._open.clear()
        self.cache.flush()
        self.store.close()


class Memory:
    """The synchronous API over `AsyncMemory` (same methods, same arguments), on a private event loop.

    Use `AsyncMemory` inside a running event loop (an async web app, a notebook cell with `await`)."""

    def __init__(self, inner: AsyncMemory, loop: asyncio.AbstractEventLoop):
        self._inner = inner
        self._loop = loop
        self._guard = threading.Lock()  # one loop, one caller at a time

    def _run(self, coro):
        with self._guard:
            return self._loop.run_until_complete(coro)

    @classmethod
    def open(cls, db: str | Path, *, namespace: str | None = None, policy: str | PolicyConfig | None = None,
             agent: str = DEFAULT_AGENT, cases: int | None = None, seed: int = 0,
             source: str | None = None) -> "Memory":
        """Open (or create) a namespace of `db`: see `AsyncMemory.open` for the arguments."""
        loop = asyncio.new_event_loop()
        try:
            inner = loop.run_until_complete(AsyncMemory.open(db, namespace=namespace, policy=policy, agent=agent,
                                                             cases=cases, seed=seed, source=source))
        except BaseException:
            loop.close()
            raise
        return cls(inner, loop)

    @property
    def namespace(self) -> str:
        return self._inner.namespace

    @property
    def store(self):
        return self._inner.store

    def recall(self, case: CaseInput | Case | dict) -> Recall:
        """See `AsyncMemory.recall` (never waits: one caller drives a sync memory)."""
        return self._run(self._inner.recall(case))

    def record(self, case_id: str, answer: str, steps: list[AgentStep] | list[dict] | None = None,
               used: list[str] | None = None, usage: TokenUsage | dict | None = None) -> Recorded:
        """See `AsyncMemory.record`."""
        return self._run(self._inner.record(case_id, answer, steps, used, usage))

    def feedback(self, case_id: str, outcome: str | None = None) -> FeedbackResult:
        """See `AsyncMemory.feedback`."""
        return self._run(self._inner.feedback(case_id, outcome))

    def cancel(self, case_id: str) -> None:
        """See `AsyncMemory.cancel`."""
        return self._run(self._inner.cancel(case_id))

    def history(self, item_id: str) -> dict[str, Any]:
        """See `AsyncMemory.history`."""
        return self._run(self._inner.history(item_id))

    def explain(self, case_id: str) -> dict[str, Any]:
        """See `AsyncMemory.explain`."""
        return self._run(self._inner.explain(case_id))

    def as_of(self, seq: int | None = None, case: int | None = None) -> dict[str, Any]:
        """See `AsyncMemory.as_of`."""
        return self._run(self._inner.as_of(seq, case))

    def verify(self) -> dict[str, Any]:
        """See `AsyncMemory.verify`."""
        return self._run(self._inner.verify())

    def replay(self, orders: int = 5, seed: int = 0, agent: AgentCallable | None = None) -> dict[str, Any]:
        """See `AsyncMemory.replay`."""
        return self._run(self._inner.replay(orders, seed, agent))

    def close(self) -> None:
        """Checkpoint and close (an open case is dropped)."""
        try:
            self._run(self._inner.aclose())
        finally:
            self._loop.close()

    def __enter__(self) -> "Memory":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
