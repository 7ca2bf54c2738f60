"""Shared fixtures: example cases, an embedding cache over the packaged MiniLM, run helpers."""

from __future__ import annotations

import asyncio
import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# Tests never write the user's machine embedding cache (~/.cache/grandrounds/embeddings): the session
# gets its own, shared by its tests and the processes they start, removed at exit.
_EMBEDDINGS = tempfile.mkdtemp(prefix="grandrounds-test-embeddings-")
atexit.register(shutil.rmtree, _EMBEDDINGS, ignore_errors=True)
os.environ["GRANDROUNDS_EMBEDDING_CACHE"] = _EMBEDDINGS

from grandrounds.store.cpu_kernels import machine_kernels  # noqa: E402  (imports neither torch nor numpy)

# A session run under a torch CPU kernel this CPU lacks (.ci/run loops over every kernel name) is skipped
# whole, with the reason in the summary: torch trusts ATEN_CPU_CAPABILITY, so left set it kills this
# process and every child with SIGILL at the first vectorised op. Unset here, before torch dispatches.
_KERNEL_SKIP = (machine_kernels().skip_reason(os.environ["ATEN_CPU_CAPABILITY"])
                if os.environ.get("ATEN_CPU_CAPABILITY") else None)
if _KERNEL_SKIP:
    del os.environ["ATEN_CPU_CAPABILITY"]

from grandrounds.handlers.cases import Case, load_cases
from grandrounds.handlers.policies.config import EvoMedAgentPolicy, NoMemoryPolicy
from grandrounds.handlers.runs import RunSpec, open_run
from grandrounds.store.embeddings import EmbeddingCache, shared_minilm
from grandrounds.store.eventstore import EventStore
from grandrounds.streams.embedded import EmbeddedRunner

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "cases.jsonl"
SHARED_DATA = ROOT.parent / "shared" / "data"
MAB_TASKS = SHARED_DATA / "medagentbench" / "test_data_v2.json"
MAB_FUNCS = SHARED_DATA / "medagentbench" / "funcs_v1.json"
MAB_PATIENTS = SHARED_DATA / "medagentbench_rl_fork" / "patients_from_snapshot.json"
AGENTCLINIC = SHARED_DATA / "agentclinic"
AC_MEDQA = AGENTCLINIC / "agentclinic_medqa.jsonl"
AC_MEDQA_EXT = AGENTCLINIC / "agentclinic_medqa_extended.jsonl"
AC_NEJM = AGENTCLINIC / "agentclinic_nejm.jsonl"
AC_NEJM_EXT = AGENTCLINIC / "agentclinic_nejm_extended.jsonl"
needs_medagentbench = pytest.mark.skipif(
    not (MAB_TASKS.exists() and MAB_FUNCS.exists() and MAB_PATIENTS.exists()),
    reason=f"MedAgentBench data not found under {SHARED_DATA} (../shared/data)")


@pytest.fixture(scope="session")
def example_cases() -> list[Case]:
    return load_cases(EXAMPLES)[0]


@pytest.fixture
def store() -> EventStore:
    s = EventStore(":memory:")
    yield s
    s.close()


def copy_db(src, dst) -> Path:
    """A copy of a database file with its key file (store/keyring.py): without it, sealed case content
    reads as erased in the copy."""
    shutil.copy(src, dst)
    keys = Path(str(src) + ".keys")
    if keys.exists():
        shutil.copy(keys, str(dst) + ".keys")
    return Path(dst)


def run_in(store: EventStore, cases, spec: RunSpec, run_id: str = "r", commit: str = "case", declare: bool = False):
    """Run cases through the embedded runner; returns the run context. `declare`: the run declares its case
    count in run.started and ends with run.completed, as `grandrounds run` does (so `verify` calls it complete)."""
    cache = EmbeddingCache(shared_minilm(), store.conn)
    ctx, _ = open_run(store, run_id, spec, cache, cases=len(cases) if declare else None)
    asyncio.run(EmbeddedRunner(ctx, commit=commit).run(cases))
    cache.flush()
    return ctx


@pytest.fixture
def evo_spec() -> RunSpec:
    return RunSpec(policy=EvoMedAgentPolicy(), seed=0)


@pytest.fixture
def none_spec() -> RunSpec:
    return RunSpec(policy=NoMemoryPolicy(), seed=0)


def pytest_collection_modifyitems(config, items):
    if _KERNEL_SKIP:
        for item in items:
            item.add_marker(pytest.mark.skip(reason=_KERNEL_SKIP))
