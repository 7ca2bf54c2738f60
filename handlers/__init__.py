"""The five stages (retrieve, act, feedback, reflect, govern) and the memory policies they apply."""

# Every policy registers its event types and memory fold with the store on import.
from grandrounds.handlers.policies import catalog as _catalog  # noqa: F401
