"""`long-context`: the most recent past cases and their outcomes in the prompt, up to a token budget.

The baseline recent work on agent memory finds hard to beat: no retrieval by similarity, no
distillation, no valuation; memory is the last cases themselves, newest first. config.py holds its
parameters, memory.py the fold of its `episode.stored` events, policy.py what it shows and writes.
"""
