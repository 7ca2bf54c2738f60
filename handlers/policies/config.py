"""Policy configuration: presets and TOML files, validated by pydantic.

Defaults are the papers' numbers (DESIGN §6). Where a paper leaves a value open we say so
next to the field.
"""

from __future__ import annotations

from grandrounds.store.errors import InvalidInput
import tomllib
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, SerializeAsAny, ValidationError, WithJsonSchema


class _Config(BaseModel):
    # Attribute docstrings become field descriptions: `grandrounds policies` prints them.
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class PolicyBase(_Config):
    """What every policy config has: its name, and the ablation switches its papers report."""

    name: str
    memory_min_subjects: int = Field(3, ge=1)
    """The k-subjects rule (handlers/subject_gate.py): a word of a case's text that the field tool flags
    as a possible name or place (deidentify_patterns = 3 or 4; every word with 2) enters memory text
    (trigger, summary, guideline, rule, skill, lesson, episode) only once the cases of at least this many
    distinct subjects hold it, so a surname or a village that one patient's cases alone hold never
    becomes memory, while an eponym (Kussmaul, Crohn) does. 1: off (runs recorded before the rule)."""
    deidentify_patterns: int = Field(4, ge=1, le=4)
    """The de-identifier's pattern set: 4 (the default since issue 41's held-out check) is 3 with the field
    tool's rules version 2: ages over 89 in words, social-media handles, web addresses without digits,
    weekday and ordinal dates, codes a context word introduces; and what is medicine or allowed stays (a
    capitalised word before what it names, "Kussmaul breathing", "Addison disease"; number words; a
    country or US state after a place cue; a season not of a year). 3 adds a field de-identification tool (philter-lite, pinned, with
    the Safe Harbor rules it lacks: handlers/field_deidentifier.py) read on the case text, and the
    k-subjects rule then decides only the words the tool flags but cannot place (eponyms pass, a
    patient's surname does not); every other word of the case is kept. 2: names without an honorific,
    international phone formats, addresses, record numbers and more date formats read from the case
    text, and the k-subjects rule on every word (runs recorded before issue 41); 1: the set before them
    (runs recorded before issue 32)."""
    ablations: ClassVar[dict[str, dict[str, Any]]] = {}
    """Switch name -> the fields it sets (`replay --ablation NAME`, `run --ablation NAME`)."""
    recorded_defaults: ClassVar[dict[str, Any]] = {}
    """Fields added after runs were recorded without them -> the value that reproduces those runs.
    A run's `run.started` holds its full config, so a field missing there predates the field: the
    run is rebuilt with this value (not the class default, which is what new runs get). This is how
    a deliberate change of behaviour keeps old runs (and the golden logs) re-executable."""
    shared_recorded_defaults: ClassVar[dict[str, Any]] = {"memory_min_subjects": 1, "deidentify_patterns": 1}
    """`recorded_defaults` of the fields every policy has: merged into each class's own."""
    code_version: ClassVar[int] = 1
    """The version of this policy's code that shapes its events (retrieval, memory writes,
    governance), recorded in `run.started`. Bump it in the commit that changes the bytes of the events
    the policy writes (see `STAGE_VERSIONS` in handlers/stages.py)."""

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls.recorded_defaults = {**PolicyBase.shared_recorded_defaults, **cls.recorded_defaults}


class EvoMedAgentPolicy(PolicyBase):
    """Evo-MedAgent: episodic E, procedural rules S, tool governance G."""

    name: Literal["evo-medagent"] = "evo-medagent"
    episodic: bool = True
    """Store and retrieve episodes (ablation: procedural only = false)."""
    procedural: bool = True
    """Store and retrieve priority rules (ablation: episodic only = false)."""
    governance: bool = True
    """Track tool records and relabel tools."""
    writing: bool = True
    """Reflect and write memory at all (false freezes memory: offline test mode)."""
    top_k_episodes: int = Field(1, ge=0)
    """K_E; the paper leaves it open (its published code: 3). 1: given precedents of different
    diagnoses, the local 1.5 B model followed the wrong one as often as the right one
    (benchmarks/bench_real_model.py); `precedent` shows 1 for the same reason."""
    top_k_rules: int = Field(5, ge=0)
    """K_S; the paper leaves it open, 5 as in the published code."""
    candidate_pool: int = Field(32, ge=1)
    """Rules scored per case: the nearest by cosine (HNSW above the exact limit)."""
    w_relevance: float = 0.4
    """Weight of cosine relevance in the rule selection score."""
    w_utility: float = 0.4
    """Weight of rule utility in the selection score (0: the no-valuation ablation)."""
    w_priority: float = 0.2
    """Weight of the priority bonus in the selection score."""
    priority_bonus: tuple[float, float, float] = (0.2, 0.1, 0.0)
    """Bonus for priority 0, 1, 2 (0 = highest clinical urgency)."""
    exploration_c: float = 0.15
    """c in utility = success rate + c·sqrt(ln(N+1)/(n+1))."""
    untested_utility: float = 0.8
    """Utility of a rule never selected yet."""
    duplicate_cosine: float = 0.85
    """A proposed rule this close to an active one escalates that rule's priority instead."""
    trusted_min_uses: int = 6
    """Trusted needs at least this many uses ..."""
    trusted_helpful_rate: float = 0.70
    """... a helpful rate above this, and no harmful output."""
    avoid_min_uses: int = 10
    """Avoid needs at least this many uses ..."""
    avoid_bad_rate: float = 0.60
    """... and (harmful + misuse_weight·misuse)/n above this."""
    misuse_weight: float = 0.5
    """Weight of a misuse (calling an Avoid tool) in the Avoid rate."""
    episode_floor: float = 0.5
    """Cosine (question embeddings) below which a past episode is not shown: with nothing relevant the
    prompt is the memory-free one. Not in the paper. Found with benchmarks/bench_real_model.py on its
    recurring stream (MiniLM): same diagnosis reworded p10 0.51 / median 0.62; other presentations
    median 0.38, p90 0.47; at 0.5 the nearest training precedent was shown for 28/28 held-out cases
    (23 of the same diagnosis)."""
    rule_floor: float = 0.25
    """Share of a rule's trigger terms that must occur in the case for the rule to be shown (rules
    with no trigger use their own key terms). Not in the paper; 0.25 is the overlap at which the sim
    backbone follows a rule, so sim learning curves are unchanged by the floor."""
    review_gate: bool = True
    """Reject proposed rules that are only a finding, only an answer's name, name an option by letter,
    or teach a wrong option of the case (handlers/policies/precedents.py); reasons recorded."""
    name_wrong_answers: bool = False
    """A precedent whose agent answered wrongly names that wrong answer ("the agent answered X, which
    was wrong"); false says only that the agent's answer was wrong. Measured with the local model
    (benchmarks/bench_real_model.py): a named wrong answer is copied as this case's answer, as the
    review gate's lessons that teach a wrong option would be. Runs recorded before this field: true."""

    episode_rerank: int = Field(8, ge=0)
    """MCQ cases: the nearest this many episodes by cosine (at or above the floor) are re-ranked by BM25
    over their shared findings (handlers/text.py `TermIndex`) before K_E are taken; 0: cosine order
    (runs recorded before this field). Not in the paper: on the real-model benchmark's held-out
    stream the first episode is of the case's own diagnosis for 25 of 28 cases, against 23 by cosine."""
    precedent_style: Literal[1, 2] = 2
    """2: a precedent says which option of this question its confirmed answer is, and shows the first
    240 characters of its guideline (handlers/policies/precedents.py); 1: runs recorded before."""
    episode_without_reflection: bool = True
    """A case whose reflection could not be obtained (the model's reply never fit the schema, or timed
    out) is still stored as an episode, with no summary and no guideline: its findings and confirmed
    answer are known without the model. Measured: the local model's reflection failed on 2 of 28
    training cases, and both held-out cases of one of those diagnoses then met a precedent of another
    diagnosis. false: runs recorded before this field (no episode after a failed reflection)."""
    strict_lessons: bool = True
    """The review gate keeps a guideline from a case the agent answered wrongly only when it concludes
    with the confirmed answer (measured: the 1.5 B model's lessons from its own errors restate its
    wrong diagnosis, e.g. "the most likely diagnosis is PID" for a confirmed ovarian torsion);
    false: runs recorded before this field."""

    ablations: ClassVar[dict[str, dict[str, Any]]] = {
        "no-writing": {"writing": False},
        "no-governance": {"governance": False},
        "no-valuation": {"w_utility": 0.0},
        "similarity-only": {"w_utility": 0.0, "w_priority": 0.0},
        "procedural-only": {"episodic": False},
        "episodic-only": {"procedural": False},
        "no-floors": {"episode_floor": -1.0, "rule_floor": 0.0},
        "no-review": {"review_gate": False},
        "cosine-only": {"episode_rerank": 0},
    }
    recorded_defaults: ClassVar[dict[str, Any]] = {"name_wrong_answers": True, "episode_rerank": 0,
                                                   "precedent_style": 1, "strict_lessons": False,
                                                   "episode_without_reflection": False}


class NoMemoryPolicy(PolicyBase):
    """Memory-free ReAct baseline: the same pipeline, nothing retrieved or written."""

    name: Literal["none"] = "none"


class PolicyError(InvalidInput, ValueError):
    pass


def _coerce(value: Any) -> Any:
    if isinstance(value, PolicyBase):
        return value
    if isinstance(value, dict):
        return policy_from_dict(value)
    raise PolicyError(f"not a policy: {value!r}")


PolicyConfig = Annotated[
    SerializeAsAny[PolicyBase], BeforeValidator(_coerce),
    WithJsonSchema({"type": "object", "required": ["name"], "additionalProperties": True,
                    "properties": {"name": {"type": "string",
                                            "enum": ["evo-medagent", "none", "skemex", "selsm", "retrosum",
                                                     "precedent", "long-context"]}},
                    "description": "A memory policy's parameters; `name` picks the policy and its model "
                                   "(`grandrounds policies` lists every parameter)."})]
"""Any registered policy's config; validated by the class its `name` picks."""

PRESET_DIR = Path(__file__).parent / "presets"
"""The preset files shipped with grandrounds: `<name>.toml`, every parameter spelled out."""


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.toml"))


def policy_from_dict(data: dict, source: str = "policy", recorded: bool = False) -> PolicyBase:
    """`recorded`: `data` is a run's recorded config; fields it lacks predate it and take the class's
    `recorded_defaults` (the behaviour that run had)."""
    from grandrounds.handlers.policies.registry import config_class, known_policies

    name = data.get("name")
    if not isinstance(name, str):
        raise PolicyError(f"{source}: field 'name': required, one of {', '.join(known_policies())}")
    try:
        cls = config_class(name)
    except KeyError:
        raise PolicyError(f"{source}: field 'name': unknown policy {name!r} "
                          f"(known: {', '.join(known_policies())})") from None
    if recorded:
        data = {**{k: v for k, v in cls.recorded_defaults.items() if k not in data}, **data}
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        raise PolicyError(f"{source}: field {field!r}: {err['msg']}") from None


def read_policy_file(path: Path) -> PolicyBase:
    # Every way the file can fail to be read names the file (a bare codec or OS message names none).
    try:
        raw = path.read_bytes()
    except IsADirectoryError:
        raise PolicyError(f"{path}: is a directory, not a policy TOML file") from None
    except OSError as exc:
        raise PolicyError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise PolicyError(f"{path}:{line}: not UTF-8 text ({exc.reason} at byte {exc.start}); TOML files are "
                          "UTF-8") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"{path}: not valid TOML ({exc})") from None
    return policy_from_dict(data, source=str(path))


def load_policy(spec: str) -> PolicyBase:
    """A preset name, or a TOML file whose `name` picks the policy and whose keys override defaults."""
    preset = PRESET_DIR / f"{spec}.toml"
    if "/" not in spec and preset.exists():
        return read_policy_file(preset)
    path = Path(spec)
    if not path.exists():
        raise PolicyError(f"unknown policy {spec!r}: not a preset ({', '.join(preset_names())}) and no such file")
    return read_policy_file(path)


def with_ablations(policy: PolicyBase, ablations: list[str]) -> PolicyBase:
    """The policy with the named switches applied (validated again, so a clash is an error)."""
    if not ablations:
        return policy
    data = policy_to_dict(policy)
    for name in ablations:
        if name not in policy.ablations:
            known = ", ".join(policy.ablations) or "none"
            raise PolicyError(f"unknown ablation {name!r} for policy {policy.name!r} (known: {known})")
        data.update(policy.ablations[name])
    return policy_from_dict(data, source="ablation")


def policy_to_dict(policy: PolicyBase) -> dict:
    return policy.model_dump(mode="json")


def policy_record(policy: PolicyBase) -> dict:
    """The config as `run.started` records it: a field at its `recorded_defaults` value is left out,
    as runs recorded before the field had it, so such a run re-executes to the same bytes and
    `policy_from_dict(..., recorded=True)` gives the value back."""
    data = policy_to_dict(policy)
    for key, legacy in policy.recorded_defaults.items():
        if data.get(key) == legacy:
            del data[key]
    return data
