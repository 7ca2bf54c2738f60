"""The versions of the code that shaped a run's events: recorded in `run.started`, compared by `verify`.

A run records `{"policy": N, "stages": {stage: N, ...}}`: its policy class's `code_version` and
each stage's (`STAGE_VERSIONS`, handlers/stages.py). A commit that changes the event bytes a policy
or stage writes bumps its number, so a log recorded before re-executes with this build to a
divergence that `verify` explains ("act: recorded by version 1, this build is 2") instead of a bare
one. Logs written before runs recorded versions have none; they re-execute without any (the
re-execution copies what the log recorded), so their bytes and fingerprints stay the same.
"""

from __future__ import annotations

from typing import Any

from grandrounds.handlers.stages import STAGE_VERSIONS


def code_versions(policy: Any) -> dict[str, Any]:
    """This build's versions for a run of `policy` (a policy config); with the field de-identifier
    (`deidentify_patterns` 3 or 4) also its settings: the tool, its version, our rules' version and a digest
    of the configuration (handlers/field_deidentifier.py `settings`)."""
    out: dict[str, Any] = {"policy": type(policy).code_version, "stages": dict(STAGE_VERSIONS)}
    patterns = getattr(policy, "deidentify_patterns", 1)
    if patterns >= 3:
        from grandrounds.handlers.field_deidentifier import rules_version, settings

        out["deidentifier"] = settings(rules_version(patterns))
    return out


def differences(recorded: dict[str, Any] | None, build: dict[str, Any]) -> list[str]:
    """What differs between the versions a run recorded and this build's, one line per part."""
    if not recorded:
        return ["recorded before runs recorded their code versions (this build: "
                f"{describe(build)})"]
    out = []
    if recorded.get("policy") != build["policy"]:
        out.append(f"policy: recorded by version {recorded.get('policy')}, this build is {build['policy']}")
    stages = recorded.get("stages") or {}
    for stage in sorted(set(stages) | set(build["stages"])):
        if stages.get(stage) != build["stages"].get(stage):
            out.append(f"{stage}: recorded by version {stages.get(stage)}, this build is {build['stages'].get(stage)}")
    if recorded.get("deidentifier") != build.get("deidentifier"):
        out.append(f"de-identifier: recorded with {_settings(recorded.get('deidentifier'))}, this build has "
                   f"{_settings(build.get('deidentifier'))}")
    return out


def _settings(found: dict | None) -> str:
    if not found:
        return "none"
    return (f"{found.get('tool')} {found.get('tool_version')}, rules {found.get('rules_version')}, "
            f"configuration {str(found.get('config_digest'))[:16]}")


def describe(code: dict[str, Any]) -> str:
    stages = ", ".join(f"{s} {v}" for s, v in code["stages"].items())
    tail = f"; de-identifier {_settings(code['deidentifier'])}" if code.get("deidentifier") else ""
    return f"policy {code['policy']}; stages {stages}{tail}"
