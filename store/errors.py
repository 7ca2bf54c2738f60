"""The root of every exception grandrounds raises on purpose, by what the caller should do about it.

- `InvalidInput`: the request or a file it names is wrong (a case file, a policy, a run id that
  names another configuration, a bad `--db`). Fix the input; retrying the same thing fails the
  same way. The CLI exits 2 and writes nothing.
- `Retryable`: the infrastructure failed (model endpoint, FHIR server, a locked database file).
  Nothing about the request is wrong: the same command later can succeed and resumes where it
  stopped. The CLI exits 1.
- `Bug`: an invariant of grandrounds itself broke (an agent loop whose steps and tool calls do not
  pair up, a backbone that answered outside the options). Neither input nor retry will fix it.
  The CLI exits 1 and says so.
- anything else deriving `GrandroundsError` directly is a definite failure of this operation that
  is none of the above (a re-execution diverging from its record, a store refusing an append).

Project exceptions keep the builtin base they had (`ValueError`, `LookupError`, `OSError`, ...)
as a second base, so code written against those keeps working. It lives in the store, the lowest
layer, so every layer can raise these without importing a higher one. Exit codes are mapped in
one place, `grandrounds/errors.py`.
"""

from __future__ import annotations


class GrandroundsError(Exception):
    exit_code: int = 1


class InvalidInput(GrandroundsError):
    exit_code = 2


class Retryable(GrandroundsError):
    exit_code = 1


class Bug(GrandroundsError):
    exit_code = 1


def where_raised(exc: BaseException) -> str | None:
    """'at case C (S stage, component)' when `exc` escaped a case's stage: handlers/pipeline.py marks it
    there (`mark_where`), and every boundary (grandrounds/errors.py, the HTTP and MCP servers, the Kafka
    worker) reads it here, so an error after the first commit is named by where it came from."""
    return getattr(exc, "grandrounds_where", None)
