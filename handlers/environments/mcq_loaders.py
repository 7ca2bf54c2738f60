"""MCQ loaders for the real benchmark files in ../shared/data (DESIGN §7).

ChestAgentBench (Evo-MedAgent's preprocessed `real_cases.json`): the options are the
"A) ..." lines inside `question`, the stem is what precedes them, the gold letter is the
start of `ground_truth`. `case_descriptor` is never read: it quotes the answer's
explanation. Images are not distributed, so questions that point at "Figure 1" are asked
text-only. AgentClinic NEJM: five `answers`, exactly one `correct` (bool, or the strings
"True"/"False" in the 15-case file); the image itself is only a URL and is not shown.
Both grade by exact option-letter match (the feedback stage).
"""

from __future__ import annotations

from grandrounds.store.errors import InvalidInput
import json
import re
from pathlib import Path
from typing import Iterable

from grandrounds.handlers.cases import Case

FORMATS = ("chestagentbench", "agentclinic-nejm")
_OPTION = re.compile(r"^\s*([A-Z])[).]\s+(.+?)\s*$")


class BenchmarkFormatError(InvalidInput, ValueError):
    pass


def chest_case(item: dict, case_id: str) -> Case:
    stem: list[str] = []
    options: dict[str, str] = {}
    for line in item["question"].splitlines():
        m = _OPTION.match(line)
        if m and m.group(1) not in options and (options or m.group(1) == "A"):
            options[m.group(1)] = m.group(2)
        elif not options:
            stem.append(line)
        elif line.strip():  # a wrapped option line belongs to the option above it
            last = next(reversed(options))
            options[last] = f"{options[last]} {line.strip()}"
    gold = _OPTION.match(item["ground_truth"])
    if gold is None or gold.group(1) not in options:
        raise BenchmarkFormatError(f"{case_id}: ground truth {item['ground_truth'][:40]!r} is not an option")
    return Case(case_id=case_id, kind="mcq", question="\n".join(stem).strip(), options=options,
                answer=gold.group(1), category=item.get("category") or "general")


def load_chestagentbench(path: str | Path, limit: int | None = None) -> list[Case]:
    """Case ids are `cab-<source case>-q<n>`: several questions share one source case."""
    items = json.loads(Path(path).read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    cases = []
    for item in items[:limit]:
        src = str(item["case_id"])
        seen[src] = seen.get(src, 0) + 1
        cases.append(chest_case(item, f"cab-{src}-q{seen[src]}"))
    return cases


def _is_true(value) -> bool:
    return value is True or (isinstance(value, str) and value.strip().lower() == "true")


def nejm_case(item: dict, case_id: str) -> Case:
    answers = item["answers"]
    letters = [chr(ord("A") + i) for i in range(len(answers))]
    correct = [letter for letter, a in zip(letters, answers) if _is_true(a.get("correct"))]
    if len(correct) != 1:
        raise BenchmarkFormatError(f"{case_id}: {len(correct)} answers marked correct, expected 1")
    types = item.get("type") or []
    category = types[0] if isinstance(types, list) and types else "nejm"
    return Case(case_id=case_id, kind="mcq", question=item["question"].strip(),
                options={k: a["text"].strip() for k, a in zip(letters, answers)}, answer=correct[0],
                category=str(category))


def load_agentclinic_nejm(path: str | Path, limit: int | None = None) -> list[Case]:
    lines = [ln for ln in Path(path).read_text(encoding="utf-8").splitlines() if ln.strip()]
    return [nejm_case(json.loads(ln), f"nejm-{i:03d}") for i, ln in enumerate(lines[:limit], start=1)]


def load_benchmark(fmt: str, path: str | Path, limit: int | None = None) -> list[Case]:
    if fmt == "chestagentbench":
        return load_chestagentbench(path, limit)
    if fmt == "agentclinic-nejm":
        return load_agentclinic_nejm(path, limit)
    raise BenchmarkFormatError(f"unknown format {fmt!r} (available: {', '.join(FORMATS)})")


def write_cases(cases: Iterable[Case], out: str | Path) -> int:
    n = 0
    with open(out, "w", encoding="utf-8") as f:
        for c in cases:
            f.write(json.dumps(c.model_dump(mode="json"), ensure_ascii=False) + "\n")
            n += 1
    return n
