"""Evo-MedAgent's formulas and thresholds, at their boundaries (DESIGN §6)."""

from __future__ import annotations

import math

import pytest

from grandrounds.handlers.policies.config import EvoMedAgentPolicy, PolicyError, load_policy
from grandrounds.handlers.policies.evo_medagent.policy import render_prefix, rule_utility, selection_score, tool_label
from grandrounds.store.event_types import RetrievedEpisode, RetrievedRule, ToolGuidance
from grandrounds.handlers.policies.evo_medagent.memory import Rule, ToolRecord

CFG = EvoMedAgentPolicy()


def _rule(selected=0, helpful=0, priority=1):
    return Rule("rule-1", "t", [], priority, "c", 0, selected=selected, helpful=helpful, harmful=selected - helpful)


def test_untested_rule_utility_is_optimistic():
    assert rule_utility(_rule(), total_feedback=50, cfg=CFG) == 0.8


def test_utility_is_success_rate_plus_exploration_bonus():
    u = rule_utility(_rule(selected=4, helpful=3), total_feedback=20, cfg=CFG)
    assert u == pytest.approx(0.75 + 0.15 * math.sqrt(math.log(21) / 5))
    # The bonus shrinks as a rule is tested more: same success rate, more selections.
    assert rule_utility(_rule(selected=40, helpful=30), 20, CFG) < u


def test_selection_score_weights_and_priority_bonus():
    assert selection_score(0.5, 0.8, 0, CFG) == pytest.approx(0.4 * 0.5 + 0.4 * 0.8 + 0.2 * 0.2)
    assert selection_score(0.5, 0.8, 1, CFG) == pytest.approx(0.2 + 0.32 + 0.2 * 0.1)
    assert selection_score(0.5, 0.8, 2, CFG) == pytest.approx(0.2 + 0.32)


def _tool(total, helpful=0, harmful=0, misuse=0):
    return ToolRecord("t", total=total, helpful=helpful, harmful=harmful, misuse=misuse)


@pytest.mark.parametrize("rec,label", [
    (_tool(6, helpful=5), "Trusted"),            # 6 uses, 83 % helpful, no harm
    (_tool(5, helpful=5), "Caution"),            # too few uses
    (_tool(10, helpful=7), "Caution"),           # exactly 70 % is not > 70 %
    (_tool(10, helpful=8), "Trusted"),
    (_tool(20, helpful=19, harmful=1), "Caution"),  # one harm keeps it out of Trusted
    (_tool(10, harmful=7), "Avoid"),             # 10 uses, 70 % bad
    (_tool(9, harmful=9), "Caution"),            # too few uses for Avoid
    (_tool(10, harmful=6), "Caution"),           # exactly 60 % is not > 60 %
    (_tool(10, harmful=4, misuse=5), "Avoid"),   # (4 + 0.5*5)/10 = 0.65
    (_tool(10, harmful=4, misuse=4), "Caution"),  # (4 + 2)/10 = 0.60
])
def test_tool_label_thresholds(rec, label):
    assert tool_label(rec, CFG) == label


def test_context_prefix_follows_the_papers_order():
    text = render_prefix(
        [ToolGuidance(tool="xray", label="Avoid")],
        [RetrievedRule(rule_id="r", text="RULE", trigger=[], priority=0, relevance=1, utility=1, score=1)],
        [RetrievedEpisode(episode_id="e", source_case_id="c", summary="EPISODE", guideline="g",
                          trigger=[], relevance=1)])
    positions = [text.index(s) for s in ("## Protocol", "## Tool governance", "RULE", "EPISODE")]
    assert positions == sorted(positions)


def test_policy_files_are_validated(tmp_path):
    good = tmp_path / "p.toml"
    good.write_text('name = "evo-medagent"\ntop_k_rules = 2\nepisodic = false\n')
    pol = load_policy(str(good))
    assert pol.top_k_rules == 2 and pol.episodic is False
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "evo-medagent"\ntop_k_rulez = 2\n')
    with pytest.raises(PolicyError, match="top_k_rulez"):
        load_policy(str(bad))
    with pytest.raises(PolicyError, match="unknown policy"):
        load_policy("no-such-policy")
