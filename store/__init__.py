"""Event store (DuckDB), event types and upcasters, projections, embeddings and snapshots."""
