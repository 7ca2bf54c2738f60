"""The root exception hierarchy (store/errors.py) and the one place the CLI maps it to exit codes."""

from __future__ import annotations

import ast
import importlib
import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from grandrounds.cli import main
from grandrounds.store.errors import Bug, GrandroundsError, InvalidInput, Retryable

ROOT = Path(__file__).resolve().parent.parent
LAYERS = {"store": "grandrounds.store", "sandbox": "grandrounds.sandbox", "handlers": "grandrounds.handlers",
          "streams": "grandrounds.streams", "replay": "grandrounds.replay", "grandrounds": "grandrounds"}


def _project_exceptions():
    """Every public class of the project that derives from an exception, found by reading the source."""
    found = []
    for folder, package in LAYERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text())
            classes = [n.name for n in tree.body if isinstance(n, ast.ClassDef) and not n.name.startswith("_")]
            if not classes:
                continue
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            module = importlib.import_module(".".join([package, *parts]))
            for name in classes:
                cls = getattr(module, name)
                if isinstance(cls, type) and issubclass(cls, BaseException) and cls.__module__ == module.__name__:
                    found.append(cls)
    return found


def test_every_project_exception_derives_from_the_root():
    found = _project_exceptions()
    assert len(found) >= 30  # the scan sees them (it would pass vacuously otherwise)
    outside = [f"{c.__module__}.{c.__name__}" for c in found if not issubclass(c, GrandroundsError)]
    assert outside == []


def _cls(path: str):
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("path, kind, old_base", [
    ("grandrounds.handlers.cases.CaseFileError", InvalidInput, ValueError),
    ("grandrounds.handlers.runs.RunMismatch", InvalidInput, ValueError),
    ("grandrounds.handlers.policies.config.PolicyError", InvalidInput, ValueError),
    ("grandrounds.store.dbfile.NotADuckDBFile", InvalidInput, ValueError),
    ("grandrounds.store.signing.SigningKeyError", InvalidInput, ValueError),
    ("grandrounds.replay.caselog.UnknownRun", InvalidInput, LookupError),
    ("grandrounds.replay.verify.NotVerifiable", InvalidInput, ValueError),
    ("grandrounds.streams.producer.RunRejected", InvalidInput, RuntimeError),
    ("grandrounds.handlers.llm.errors.ModelOutage", Retryable, RuntimeError),
    ("grandrounds.store.eventstore.StoreBusy", Retryable, RuntimeError),
    ("grandrounds.handlers.environments.medagentbench.client.FhirTransportError", Retryable, OSError),
    ("grandrounds.handlers.environments.medagentbench.environment.TrajectoryMismatch", Bug, RuntimeError),
    ("grandrounds.handlers.act.ActError", Bug, RuntimeError),
])
def test_exceptions_say_what_the_caller_should_do_and_keep_their_old_base(path, kind, old_base):
    cls = _cls(path)
    assert issubclass(cls, kind) and issubclass(cls, old_base)
    others = {InvalidInput, Retryable, Bug} - {kind}
    assert not any(issubclass(cls, o) for o in others)


def test_a_rejected_run_on_kafka_is_bad_input_and_other_dead_letters_are_not():
    from grandrounds.streams.producer import RunFailed, run_failed

    rejected, failed = run_failed("x", "rejected"), run_failed("y", "invalid")
    assert isinstance(rejected, RunFailed) and rejected.exit_code == 2 and rejected.reason == "rejected"
    assert type(failed) is RunFailed and failed.exit_code == 1


@pytest.fixture
def raising_command():
    """A throwaway command on the real group that raises what the test gives it."""
    box: dict = {}

    @main.command("_raise-for-test")
    @click.option("--json", "as_json", is_flag=True)
    def _raise(as_json):
        raise box["exc"]

    try:
        yield box
    finally:
        main.commands.pop("_raise-for-test", None)


@pytest.mark.parametrize("exc, code, hint", [
    (_cls("grandrounds.handlers.runs.RunMismatch")("run r names another configuration"), 2, None),
    (_cls("grandrounds.store.eventstore.StoreBusy")("db is locked by another process"), 1, "run again"),
    (_cls("grandrounds.handlers.act.ActError")("backbone answered 'Z'"), 1, "internal error"),
    (GrandroundsError("diverged"), 1, None),
])
def test_the_command_group_maps_an_escaping_error_to_its_exit_code(raising_command, exc, code, hint):
    raising_command["exc"] = exc
    res = CliRunner().invoke(main, ["_raise-for-test", "--json"])
    assert res.exit_code == code, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)  # never a traceback
    out = json.loads(res.stdout.strip().splitlines()[0])
    assert out["exit_code"] == code and str(exc) in out["error"]
    if hint:
        assert hint in out["error"]


def test_an_error_outside_the_hierarchy_is_not_swallowed(raising_command):
    raising_command["exc"] = KeyError("a real bug")
    res = CliRunner().invoke(main, ["_raise-for-test"])
    assert res.exit_code == 1 and isinstance(res.exception, KeyError)
