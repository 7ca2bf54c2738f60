"""The read-only web view of a DuckDB event log (`grandrounds ui`)."""
