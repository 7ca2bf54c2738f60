"""SELSM: State-Enhanced Logical-Skill Memory (seed 000; DESIGN §6)."""
