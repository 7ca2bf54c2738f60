"""The SkeMex context guard: how the history is rendered into the next prompt — never stored.

Three mechanisms (SkeMex appendix A.4, defaults from §B): budget-aware trimming (estimate
the prompt's tokens; above `trim_ratio`·budget, observations older than the last
`keep_last` steps are cut to `obs_chars` characters and a trim notice is added), loop
breaking (the same action with the same input `loop_repeats` times in a row adds a notice)
and pinned findings (from step `pin_at_step` on, the tool results seen so far are pinned
under their own marker). SkeMex summarises findings with a small model call; here they are
the tool observations themselves, verbatim — no extra call, nothing invented.

A RetroSum summary (`handlers/agent/retrosum.py`), when there is one, is rendered after the
raw turns, before the notices: the actor sees the whole raw history plus the latest summary.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GuardConfig:
    token_budget: int = 16_384
    trim_ratio: float = 0.8
    keep_last: int = 3
    obs_chars: int = 200
    loop_repeats: int = 3
    pin_at_step: int = 5


@dataclass(frozen=True)
class HistoryTurn:
    """One past step: what the model said, what it was told back, and its action signature."""

    output: str
    observation: str
    signature: str | None = None
    finding: bool = False
    """A tool result worth pinning (not a format error)."""


def estimate_tokens(text: str) -> int:
    return (len(text) + 3) // 4  # ~4 characters a token: only ever compared with the budget


TRIM_NOTICE = ("[Context trimmed: earlier observations were shortened. Rely on the pinned findings "
               "and the most recent steps.]")
LOOP_NOTICE = ("[Loop notice: you repeated the same action with the same input {n} times without progress. "
               "Change strategy, use a different tool, or give your final <response> if the evidence suffices.]")
FINAL_NOTICE = ("[Final step: tools are disabled. Give <reasoning>...</reasoning> and then your final answer, "
                "exactly one of the option letters inside <response></response>, now.]")
# No placeholder word a model could copy (a small model answered `<response>LETTER</response>`).


SUMMARY_HEADER = "## Retrospective summary (written after step {step}; the raw history above is complete)"


def render(system: str, task: str, history: list[HistoryTurn], step: int, final: bool,
           cfg: GuardConfig = GuardConfig(), summary: tuple[int, str] | None = None,
           summary_header: str | None = None) -> list[dict[str, str]]:
    """Messages for `step` (1-based): system, task (with memory), then the turns, then the latest
    RetroSum summary (`(written after step, text)`) if any, then notices. `summary_header`: the
    summary's heading when `history` is not the whole history (RetroSum's `summariser` context)."""
    notices: list[str] = []
    if summary is not None:
        notices.append((summary_header or SUMMARY_HEADER).format(step=summary[0]) + "\n" + summary[1])
    full = estimate_tokens(system) + estimate_tokens(task) + sum(
        estimate_tokens(t.output) + estimate_tokens(t.observation) for t in history) + sum(
        estimate_tokens(n) for n in notices)
    trim = full > cfg.trim_ratio * cfg.token_budget
    cut_before = len(history) - cfg.keep_last
    messages = [{"role": "system", "content": system}, {"role": "user", "content": task}]
    for i, t in enumerate(history):
        obs = t.observation
        if trim and i < cut_before and len(obs) > cfg.obs_chars:
            obs = obs[: cfg.obs_chars] + " …[trimmed]"
        messages.append({"role": "assistant", "content": t.output})
        messages.append({"role": "user", "content": f"Observation: {obs}"})
    if trim:
        notices.append(TRIM_NOTICE)
    sigs = [t.signature for t in history[-cfg.loop_repeats:]]
    if len(sigs) == cfg.loop_repeats and sigs[0] is not None and len(set(sigs)) == 1:
        notices.append(LOOP_NOTICE.format(n=cfg.loop_repeats))
    if step >= cfg.pin_at_step:
        findings = [t.observation for t in history if t.finding]
        if findings:
            notices.append("## Pinned findings\n" + "\n".join(f"- {f[: cfg.obs_chars]}" for f in findings))
    if final:
        notices.append(FINAL_NOTICE)
    if notices:
        last = messages[-1]
        messages[-1] = {"role": last["role"], "content": last["content"] + "\n\n" + "\n\n".join(notices)}
    return messages
