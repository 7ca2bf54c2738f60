"""Kafka without Docker or Maven: the jar list, its checked downloads, and `grandrounds kafka dev`."""

from __future__ import annotations

import hashlib
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from grandrounds.kafka_dev import jars
from kafka_broker import java_executable, kafka_libs_dir

ROOT = Path(__file__).resolve().parents[1]
POM = ROOT / ".ci" / "kafka" / "pom.xml"


def test_the_jar_list_is_the_one_resolved_for_the_ci_pom():
    text = POM.read_text()
    assert jars.list_digest() == hashlib.sha256(POM.read_bytes()).hexdigest(), \
        "pom.xml changed: regenerate grandrounds/kafka_dev/kafka-jars.txt (mvn dependency:list, then sha1s)"
    listed = {(j.group, j.artifact): j.version for j in jars.jar_list()}
    kafka = re.search(r"<kafka.version>(.+?)</kafka.version>", text).group(1)
    log4j = re.search(r"<log4j.version>(.+?)</log4j.version>", text).group(1)
    assert listed[("org.apache.kafka", "kafka_2.13")] == kafka == jars.kafka_version()
    assert listed[("org.apache.logging.log4j", "log4j-core")] == log4j
    assert listed[("org.slf4j", "slf4j-api")].startswith("2.")
    assert all(re.fullmatch(r"[0-9a-f]{40}", j.sha1) for j in jars.jar_list())
    assert jars.jar_list()[0].url() .startswith("https://repo1.maven.org/maven2/")


def _fake_central(tmp_path: Path, monkeypatch, contents: dict[str, bytes], published: dict[str, str] | None = None):
    """A file:// Maven layout holding the given jars, and a jar list naming them."""
    repo = tmp_path / "central"
    lines = ["# test list", "# pom.xml sha256 " + "ab" * 32]
    for name, data in contents.items():
        jar = jars.Jar("org.example", name, "1.0", hashlib.sha1(data).hexdigest())
        d = repo / "org" / "example" / name / "1.0"
        d.mkdir(parents=True)
        (d / jar.filename).write_bytes(data)
        (d / (jar.filename + ".sha1")).write_text((published or {}).get(name, jar.sha1) + "\n")
        lines.append(f"org.example:{name}:1.0 {jar.sha1}")
    monkeypatch.setattr(jars, "jar_list_text", lambda: "\n".join(lines) + "\n")
    return repo.as_uri()


def test_fetch_downloads_checks_and_marks_the_folder(tmp_path, monkeypatch):
    base = _fake_central(tmp_path, monkeypatch, {"alpha": b"alpha-bytes", "beta": b"beta-bytes"})
    libs = tmp_path / "libs"
    seen = []
    assert jars.fetch(libs, base=base, progress=lambda j, what: seen.append(what.split()[0])) == libs
    assert (libs / "alpha-1.0.jar").read_bytes() == b"alpha-bytes" and seen == ["downloaded", "downloaded"]
    assert (libs / ".complete").read_text().strip() == "ab" * 32 and jars.libs_dir(libs) == libs
    assert [p.name for p in tmp_path.iterdir() if ".tmp." in p.name] == []
    # complete: nothing fetched again, even with Central gone
    (tmp_path / "central").rename(tmp_path / "gone")
    assert jars.fetch(libs, base=base) == libs


def test_jars_already_there_with_the_right_sha1_are_kept(tmp_path, monkeypatch):
    base = _fake_central(tmp_path, monkeypatch, {"alpha": b"alpha-bytes", "beta": b"beta-bytes"})
    libs = tmp_path / "libs"
    libs.mkdir()
    (libs / "alpha-1.0.jar").write_bytes(b"alpha-bytes")  # no marker: an interrupted older fetch
    (libs / "beta-1.0.jar").write_bytes(b"stale")
    seen = []
    jars.fetch(libs, base=base, progress=lambda j, what: seen.append((j.artifact, what.split()[0])))
    assert seen == [("alpha", "cached"), ("beta", "downloaded")]
    assert (libs / "beta-1.0.jar").read_bytes() == b"beta-bytes"


def test_a_jar_whose_bytes_do_not_match_is_refused_and_nothing_is_left(tmp_path, monkeypatch):
    base = _fake_central(tmp_path, monkeypatch, {"alpha": b"alpha-bytes"})
    (tmp_path / "central" / "org" / "example" / "alpha" / "1.0" / "alpha-1.0.jar").write_bytes(b"tampered")
    libs = tmp_path / "libs"
    with pytest.raises(jars.JarFetchError, match="downloaded bytes have sha1"):
        jars.fetch(libs, base=base)
    assert not libs.exists() and list(tmp_path.glob("libs.tmp.*")) == []


def test_centrals_own_sha1_must_agree_with_the_list(tmp_path, monkeypatch):
    base = _fake_central(tmp_path, monkeypatch, {"alpha": b"alpha-bytes"}, published={"alpha": "0" * 40})
    with pytest.raises(jars.JarFetchError, match="Maven Central's .sha1"):
        jars.fetch(tmp_path / "libs", base=base)


def test_plain_http_downloads_are_refused(tmp_path, monkeypatch):
    _fake_central(tmp_path, monkeypatch, {"alpha": b"alpha-bytes"})
    with pytest.raises(jars.JarFetchError, match="non-HTTPS"):
        jars.fetch(tmp_path / "libs", base="http://repo.example.org/maven2")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.kafka
@pytest.mark.slow
@pytest.mark.skipif(kafka_libs_dir() is None or java_executable() is None,
                    reason="Kafka jars (bash .ci/kafka/fetch.sh) or java missing")
def test_kafka_dev_serves_a_broker_until_interrupted(tmp_path):
    from grandrounds.kafka_dev.broker import is_serving

    port, cport = _free_port(), _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "grandrounds", "kafka", "dev", "--port", str(port),
                             "--controller-port", str(cport), "--data", str(tmp_path / "data")],
                            stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        for line in proc.stderr:
            lines.append(line)
            if "Kafka is serving" in line or "error" in line:
                break
        assert f"kafka://127.0.0.1:{port}" in lines[-1], "".join(lines)
        assert is_serving(port)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
        assert not is_serving(port, timeout=1.0)
        assert (tmp_path / "data" / "logs" / "meta.properties").is_file()  # formatted once, kept
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
