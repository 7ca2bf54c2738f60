"""Evo-MedAgent (seed 003): episodic memory, procedural rules and tool governance."""
