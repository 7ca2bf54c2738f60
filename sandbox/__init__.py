"""Test and benchmark servers that stand in for external systems (installed as `grandrounds.sandbox`).

Nothing here is part of a run's logic: the MedAgentBench environment talks HTTP to whatever FHIR base
it is given, and this package only provides a local one for offline tests and benchmarks. It imports
nothing above `grandrounds.store`.
"""
