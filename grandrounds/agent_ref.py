"""`--agent module:callable`: a user's own agent for `run` and `replay` (the `agent` backbone).

The module is imported by name, as `python -m` would: this runs the user's own code, named by the user
on their command line — nothing read from a case file, a database or the network is ever executed.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path

from grandrounds.backbone_choice import BackboneChoice
from grandrounds.handlers.backbones import BackboneUnavailable
from grandrounds.handlers.backbones.agent import AGENT_NOTE, AgentCallable


def load_agent(ref: str) -> AgentCallable:
    """The callable `ref` names (`package.module:function`, or `module:object.method`); bad input otherwise.
    The working directory is importable, as it is for `python -m`."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise BackboneUnavailable(f"--agent {ref!r}: give it as module:callable (e.g. my_agent:answer)")
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        target = importlib.import_module(module_name)
    except ImportError as exc:
        raise BackboneUnavailable(f"--agent {ref!r}: cannot import {module_name!r}: {exc}") from None
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise BackboneUnavailable(f"--agent {ref!r}: {module_name!r} has no attribute {attr!r}") from None
    if not callable(target):
        raise BackboneUnavailable(f"--agent {ref!r}: {attr!r} is not callable")
    try:
        inspect.signature(target).bind(None, None)
    except TypeError:
        raise BackboneUnavailable(f"--agent {ref!r}: the agent is called as agent(case, memory)") from None
    except ValueError:  # no signature to inspect (a builtin): let the first call say
        pass
    return target


def agent_choice(ref: str, backbone: str | None, model: str | None) -> BackboneChoice:
    """The backbone choice of `grandrounds run --agent REF`: the agent's replies are recorded under
    `model` (default: REF itself), the name a run's spec and request hashes carry."""
    if backbone not in (None, "agent"):
        raise BackboneUnavailable(f"--agent and --backbone {backbone}: the agent is the backbone (omit --backbone)")
    name = model or ref
    return BackboneChoice("agent", name, AGENT_NOTE.format(name=name), {"agent": load_agent(ref)})
