"""MedAgentBench (Stanford ML Group): the official tasks, the FHIR client, the official text protocol
and refsol grading, each in its own module:

- `tasks`: the task file and function specs (FhirCase, FhirFunction, constants);
- `client`: an async HTTP client that sends URLs as the official `requests` client does;
- `protocol`: how a reply becomes an action under the official harness;
- `trajectory`: what an episode leaves for grading (calls, FINISH text, the conversation);
- `tools`: the benchmark's GET/POST semantics over the client (`FhirTools`);
- `grading`: refsol and `calculate_overall` as read from the official code;
- `environment`: the run's environment (tools per case, grading from the recorded answer);
- `run`: option checks and preparation of `grandrounds run --env medagentbench`.
"""

from grandrounds.handlers.environments.medagentbench.grading import Grade, calculate_age, grade, reference
from grandrounds.handlers.environments.medagentbench.protocol import Action, finish_payload, parse_action
from grandrounds.handlers.environments.medagentbench.tasks import (ACTION_TASK_TYPES, FULL_SERVER_TASK_TYPES, NOW,
                                                                   OFFLINE_TASK_TYPES, REFERENCE_PATTERNS,
                                                                   TASK8_COMMENT, FhirFunction, NeedsFullServer,
                                                                   load_functions, load_tasks, needs_full_server,
                                                                   task_case, template_terms)
from grandrounds.handlers.environments.medagentbench.tools import FhirTools
from grandrounds.handlers.environments.medagentbench.trajectory import FhirCall, FhirTrajectory, Message

__all__ = ["ACTION_TASK_TYPES", "FULL_SERVER_TASK_TYPES", "NOW", "OFFLINE_TASK_TYPES", "REFERENCE_PATTERNS",
           "TASK8_COMMENT", "Action", "FhirCall", "FhirFunction", "FhirTools", "FhirTrajectory", "Grade", "Message",
           "NeedsFullServer", "calculate_age", "finish_payload", "grade", "load_functions", "load_tasks",
           "needs_full_server", "parse_action", "reference", "task_case", "template_terms"]
