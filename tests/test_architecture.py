"""The shape of the code: no import cycles, no lower layer importing a higher one (between the top-level
packages, and between the ordered packages inside handlers/), a policy in one package.

The graph comes from the source (ast, nothing imported) by scripts/import_graph.py, the script that
prints it for people; every import counts, including deferred ones inside functions.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _graph_module():
    spec = importlib.util.spec_from_file_location("_import_graph", ROOT / "scripts" / "import_graph.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["_import_graph"] = module
    spec.loader.exec_module(module)
    return module


ig = _graph_module()


@pytest.fixture(scope="module")
def graph():
    return ig.module_graph()


def test_the_graph_sees_the_whole_namespace(graph):
    assert "grandrounds.store.eventstore" in graph and "grandrounds.cli" in graph
    assert "grandrounds.store.events" in graph["grandrounds.store.eventstore"]
    assert len(graph) > 100


def test_no_import_cycles(graph):
    assert ig.cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert ig.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    # a module importing its own package is run after the package: no cycle
    assert ig.cycles({"p": {"p.m"}, "p.m": {"p"}}) == []


FORBIDDEN = {
    "grandrounds.store": ("grandrounds.sandbox", "grandrounds.handlers", "grandrounds.streams", "grandrounds.replay",
                          "grandrounds"),
    "grandrounds.sandbox": ("grandrounds.handlers", "grandrounds.streams", "grandrounds.replay", "grandrounds"),
    "grandrounds.handlers": ("grandrounds.streams", "grandrounds.replay", "grandrounds"),
    # replay re-executes runs through the streams' runners: replay sits above streams, never the reverse
    "grandrounds.streams": ("grandrounds.replay", "grandrounds"),
    "grandrounds.replay": ("grandrounds",),
}


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_no_layer_imports_a_higher_one(graph, layer):
    bad = [(m, t) for m, targets in graph.items() if ig.layer_of(m) == layer
           for t in sorted(targets) if ig.layer_of(t) in FORBIDDEN[layer]]
    assert bad == []


def test_replay_is_above_streams():
    assert ig.LAYERS["grandrounds.streams"] < ig.LAYERS["grandrounds.replay"] < ig.LAYERS["grandrounds"]


HANDLER_ORDER = ["grandrounds.handlers.plugins", "grandrounds.handlers.llm", "grandrounds.handlers.environments",
                 "grandrounds.handlers.agent", "grandrounds.handlers.policies", "grandrounds.handlers.backbones"]


def test_the_handler_packages_are_ordered():
    # backbones run the agent loops; the agent loops reach memory through their own contract
    # (handlers/agent/step_memory.py) and fail with handlers/llm's CaseFailure, never importing a backbone
    assert sorted(ig.HANDLER_LAYERS, key=ig.HANDLER_LAYERS.get) == HANDLER_ORDER


def test_no_handler_package_imports_one_above_it(graph):
    assert ig.upward_handler_imports(graph) == []
    assert ig.upward_imports(graph) == []


def test_an_upward_import_inside_handlers_is_found():
    synthetic = {
        "grandrounds.handlers.agent.react": {"grandrounds.handlers.backbones.base", "grandrounds.handlers.llm.errors"},
        "grandrounds.handlers.backbones.openai_backbone": {"grandrounds.handlers.agent.react"},
        "grandrounds.handlers.llm.gateway": {"grandrounds.handlers.policies.base", "grandrounds.store.events"},
        "grandrounds.handlers.environments.osce_env": {"grandrounds.handlers.agent.osce_dialogue",
                                                       "grandrounds.handlers.cases"},
        "grandrounds.handlers.cases": {"grandrounds.handlers.backbones"},  # not an ordered package: not checked
        "grandrounds.handlers.plugins": {"grandrounds.handlers.llm.errors"},
    }
    expected = [("grandrounds.handlers.agent.react", "grandrounds.handlers.backbones.base"),
                ("grandrounds.handlers.environments.osce_env", "grandrounds.handlers.agent.osce_dialogue"),
                ("grandrounds.handlers.llm.gateway", "grandrounds.handlers.policies.base"),
                ("grandrounds.handlers.plugins", "grandrounds.handlers.llm.errors")]
    assert ig.upward_handler_imports(synthetic) == expected
    assert ig.upward_imports(synthetic) == expected


def test_streams_importing_replay_is_found():
    synthetic = {"grandrounds.streams.session": {"grandrounds.replay.verify"},
                 "grandrounds.replay.execute": {"grandrounds.streams.session"}}
    assert ig.upward_imports(synthetic) == [("grandrounds.streams.session", "grandrounds.replay.verify")]


def test_policy_events_and_folds_live_with_their_policy():
    # a policy's events and memory fold sit in its package, beside its logic; the store keeps the shared parts
    for name in ("skemex", "selsm", "retrosum"):
        for part in ("events.py", "memory.py", "policy.py", "config.py"):
            assert (ROOT / "handlers" / "policies" / name / part).is_file(), (name, part)
    assert (ROOT / "handlers" / "policies" / "evo_medagent" / "policy.py").is_file()
    stray = sorted(p.name for p in (ROOT / "store").glob("*.py")
                   if p.name.startswith(("skill_", "selsm_", "experience_")))
    assert stray == []


def test_every_policy_registers_its_memory_fold():
    from grandrounds.handlers.policies.registry import known_policies
    from grandrounds.store.policy_memory import part_for

    for name in known_policies():
        part_for(name, 4, 16)  # raises UnknownPolicy when a policy forgot to register
