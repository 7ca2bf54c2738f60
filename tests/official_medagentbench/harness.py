"""The official MedAgentBench harness around refsol, transcribed for the differential test.

From `src/server/tasks/medagentbench/__init__.py` (upstream 99260117137b), MIT, Copyright (c) 2025
Stanford Machine Learning Group (see LICENSE.MIT): `start_sample`'s loop (the model replaced by a
list of scripted replies, AgentBench's session by a list of history items), `calculate_overall`'s
grading of one task and `eval.py`. The control flow, string handling and texts are the official
ones, line for line; only the AgentBench plumbing is stubbed.
"""

import json
from dataclasses import dataclass, field

from official_medagentbench import refsol
from official_medagentbench.utils import send_get_request

MedAgentBench_prompt = "{api_base}{functions}{context}{question}"  # the text does not affect grading


@dataclass
class ChatHistoryItem:
    role: str
    content: str


@dataclass
class TaskOutput:
    status: str
    history: list
    result: object = None
    index: int = 0


@dataclass
class Session:
    replies: list
    history: list = field(default_factory=list)

    def inject(self, item):
        self.history.append(ChatHistoryItem(**item))

    def action(self):  # AgentBench appends the agent's reply (or its status when empty) to the history
        content = self.replies.pop(0) if self.replies else ""
        self.history.append(ChatHistoryItem(role="agent", content=content or "AGENT_CONTEXT_LIMIT"))
        return content


def start_sample(case, replies, fhir_api_base, funcs, max_round=8):
    session = Session(list(replies))
    session.inject({"role": "user", "content": MedAgentBench_prompt.format(api_base=fhir_api_base,
                                                                           functions=json.dumps(funcs),
                                                                           context=case['context'],
                                                                           question=case['instruction'])})
    try:
        for round in range(max_round):
            res = session.action()
            r = res.strip().replace('```tool_code', '').replace('```', '').strip()

            if r.startswith('GET'):
                url = r[3:].strip() + '&_format=json'
                get_res = send_get_request(url)
                if "data" in get_res:
                    session.inject({"role": "user", "content": f"Here is the response from the GET request:\n{get_res['data']}. Please call FINISH if you have got answers for all the questions and finished all the requested tasks"})
                else:
                    session.inject({"role": "user", "content": f"Error in sending the GET request: {get_res['error']}"})

            elif r.startswith('POST'):
                try:
                    payload = json.loads('\n'.join(r.split('\n')[1:]))
                except Exception as e:
                    session.inject({"role": "user", "content": "Invalid POST request"})
                else:
                    session.inject({"role": "user", "content": "POST request accepted and executed successfully. Please call FINISH if you have got answers for all the questions and finished all the requested tasks"})
            elif r.startswith('FINISH('):
                return TaskOutput(status="completed", result=r[len('FINISH('):-1], history=session.history)
            else:
                return TaskOutput(status="agent invalid action", history=session.history)

    except Exception as e:
        return TaskOutput(status="task error", result={"error": str(e)}, history=session.history)

    return TaskOutput(status="task limit reached", history=session.history)


def official_eval(case_data, results, fhir_api_base):
    """eval.py"""
    task_id = case_data['id'].split('_')[0]
    grader_func = getattr(refsol, task_id)
    try:
        if grader_func(case_data, results, fhir_api_base) is True:
            return True
    except Exception as e:
        return False


def official_correct(case_data, results, fhir_api_base) -> bool:
    """calculate_overall, for one task: graded only when it has a result."""
    if getattr(results, "result") is not None:
        return official_eval(case_data, results, fhir_api_base) is True
    return False
