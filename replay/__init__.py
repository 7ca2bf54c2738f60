"""Re-execution, order-permutation replays, determinism verification, metrics, reports, audit."""
