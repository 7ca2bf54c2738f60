"""Which tool-task environments there are: the record a run's `run.started` meta holds for each, how
it is opened for a run (and built again by verify and replay), and the kind of case it serves.

Built-ins are listed here; a third party registers one through the `grandrounds.environments`
entry-point group (handlers/plugins.py), naming an `EnvironmentRegistration`. The entry point's name is
the environment's name, which is the `name` field of its record in the meta (`base.META_KEY`), so a
recorded run names the environment it needs and nothing else (DESIGN: payloads never hold machinery).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ContextManager

from grandrounds.handlers.plugins import Registry, RegistryError, load_path

GROUP = "grandrounds.environments"
DEFAULT = "medagentbench"
"""The environment of a record without a `name` (MedAgentBench runs recorded before the field existed)."""


def _resolve(obj: Any) -> Any:
    return load_path(obj) if isinstance(obj, str) else obj


@dataclass(frozen=True)
class EnvironmentRegistration:
    record: type | str
    """The pydantic model of the environment's record (`base.EnvironmentRecord`): validated from the
    `run.started` meta, with a `name` field equal to the registered name. A string: `module:attr`."""
    open: Callable[[Any], ContextManager] | str
    """record -> a context manager yielding the environment (`base.Environment`) for one run."""
    case_kind: str
    """`kind` of the cases the environment serves (`case.received` payloads)."""
    case: type | str
    """The pydantic model those cases validate as."""

    def record_class(self) -> type:
        return _resolve(self.record)

    def case_class(self) -> type:
        return _resolve(self.case)

    def opener(self) -> Callable[[Any], ContextManager]:
        return _resolve(self.open)


def _check(obj: Any) -> EnvironmentRegistration:
    if not isinstance(obj, EnvironmentRegistration):
        raise TypeError(f"names a {type(obj).__name__}, not a "
                        "grandrounds.handlers.environments.registry.EnvironmentRegistration")
    return obj


MEDAGENTBENCH = EnvironmentRegistration(
    record="grandrounds.handlers.environments.base:EnvironmentRecord",
    open="grandrounds.handlers.environments.medagentbench.environment:open_environment",
    case_kind="fhir", case="grandrounds.handlers.cases:FhirCase")
AGENTCLINIC = EnvironmentRegistration(
    record="grandrounds.handlers.environments.osce_env:OsceEnvironmentRecord",
    open="grandrounds.handlers.environments.osce_env:open_environment",
    case_kind="osce", case="grandrounds.handlers.environments.agentclinic_osce:OsceCase")

ENVIRONMENT_REGISTRY: Registry[EnvironmentRegistration] = Registry(
    "environment", GROUP,
    {"medagentbench": "grandrounds.handlers.environments.registry:MEDAGENTBENCH",
     "agentclinic": "grandrounds.handlers.environments.registry:AGENTCLINIC"},
    _check)


def known_environments() -> list[str]:
    return ENVIRONMENT_REGISTRY.names()


def registration(name: str) -> EnvironmentRegistration:
    """KeyError for a name nobody registered; RegistryError (naming it) for a broken entry point."""
    return ENVIRONMENT_REGISTRY.get(name)


def record_from_meta(data: dict[str, Any]) -> Any:
    """The environment record of a `run.started` meta entry (`base.META_KEY`), as its environment's model."""
    name = data.get("name", DEFAULT)
    try:
        found = registration(name)
    except KeyError:
        raise RegistryError(f"the run was made in environment {name!r}, which is not registered here "
                            f"(known: {', '.join(known_environments())})") from None
    return found.record_class().model_validate(data)


def open_recorded(record: Any) -> ContextManager:
    """The environment of `record` opened for a run (`with open_recorded(record) as env:`)."""
    return registration(record.name).opener()(record)


def case_kinds() -> dict[str, EnvironmentRegistration]:
    """Case kind -> the environment that serves it (MCQ cases, kind `mcq`, need none)."""
    return {reg.case_kind: reg for reg in (registration(n) for n in known_environments())}
