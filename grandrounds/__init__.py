"""grandrounds: an event-sourced streaming learner giving clinical LLM agents an auditable memory."""

__version__ = "0.1.0"
