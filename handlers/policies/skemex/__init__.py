"""SkeMex (seed 001): a self-evolving skill memory with a Read–Write–Assess–Govern lifecycle."""
