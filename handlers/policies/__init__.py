"""Memory policies: their configuration and the mechanisms of each seed paper."""
