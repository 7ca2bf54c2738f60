"""The own-agent examples run as users run them (subprocesses), against a fake OpenAI-compatible server, a
live `grandrounds serve` and a stdio `grandrounds mcp`; each prints one JSON line we check."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from fake_openai_server import FakeOpenAI

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
CLI = [sys.executable, "-c", "from grandrounds.cli import main; main()"]


def last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_own_agent_example_with_an_openai_compatible_server(tmp_path):
    with FakeOpenAI() as server:
        done = subprocess.run([sys.executable, str(EXAMPLES / "own_agent.py"), "--base-url", server.base_url,
                               "--model", "fake", "--db", str(tmp_path / "own.duckdb"), "--limit", "8"],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert len(server.requests) == 8  # one model call per case: the example's own loop
    out = last_json(done.stdout)
    assert out["cases"] == 8 and out["verified"]
    verify = subprocess.run([*CLI, "verify", "--db", str(tmp_path / "own.duckdb"), "own-agent", "--json"],
                            capture_output=True, text=True, timeout=300)
    assert verify.returncode == 0 and last_json(verify.stdout)["identical"]  # no model needed


def test_http_client_example(tmp_path):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    env = dict(os.environ, GRANDROUNDS_API_TOKEN="example-token")
    server = subprocess.Popen([*CLI, "serve", "--db", str(tmp_path / "http.duckdb"), "--port", str(port)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        done = subprocess.run([sys.executable, str(EXAMPLES / "http_client.py"), "--url", f"http://127.0.0.1:{port}",
                               "--limit", "6"], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
    finally:
        server.terminate()
        server.wait(30)
    out = last_json(done.stdout)
    assert out["cases"] == 6 and out["verified"]


def test_mcp_client_example(tmp_path):
    done = subprocess.run([sys.executable, str(EXAMPLES / "mcp_client.py"), "--db", str(tmp_path / "mcp.duckdb"),
                           "--limit", "4"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = last_json(done.stdout)
    assert out["cases"] == 4 and out["explained"]
