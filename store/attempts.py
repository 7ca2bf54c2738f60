"""`llm_attempts`: failed transport attempts of model calls, kept beside the event log, not in it.

A refused connection, a timeout, a 5xx or a malformed body says nothing about the model: a run that
survived an outage must end with the same events (and fingerprint) as one that did not, so these
attempts are not events. They are kept here instead, one row per failed attempt, written at once in
their own statement: the attempts of a call that never succeeded stay visible although their case's
events were never written (the run stopped, to resume at that case). Like `meta`, nothing here is
state; `recorded_at` is wall-clock time. The API key never reaches a row (messages are scrubbed by
the transport); the endpoint is named by the error message only as the client phrased it.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

SCHEMA = """CREATE TABLE IF NOT EXISTS llm_attempts (
    run_id VARCHAR NOT NULL,
    case_id VARCHAR,
    stage VARCHAR,
    purpose VARCHAR,
    request_hash VARCHAR,
    attempt INTEGER,
    kind VARCHAR,
    error VARCHAR,
    latency_ms DOUBLE,
    wait_s DOUBLE,
    served VARCHAR,
    recorded_at VARCHAR
)"""


def note_attempt(store, run_id: str, case_id: str | None, stage: str, row: dict[str, Any]) -> None:
    conn = store.conn
    conn.execute(SCHEMA)
    conn.execute("INSERT INTO llm_attempts VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                 [run_id, case_id, stage, row.get("purpose"), row.get("request_hash"), row.get("attempt"),
                  row.get("kind"), row.get("error"), row.get("latency_ms"), row.get("wait_s"), row.get("served"),
                  datetime.now(timezone.utc).isoformat()])  # determinism-ok: a side table, never an event


def failed_attempts(store, run_id: str) -> list[dict[str, Any]]:
    conn = store.conn
    exists = conn.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'llm_attempts'").fetchone()[0]
    if not exists:
        return []
    cur = conn.execute("SELECT case_id, stage, purpose, request_hash, attempt, kind, error, latency_ms, wait_s, served, "
                       "recorded_at "
                       "FROM llm_attempts WHERE run_id = ? ORDER BY rowid", [run_id])
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]

