"""Environments: adapters that turn benchmark data into cases (and own tools and grading)."""
