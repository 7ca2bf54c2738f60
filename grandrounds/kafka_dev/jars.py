"""Apache Kafka's broker jars from Maven Central, without Maven: plain HTTPS downloads of the set
listed in kafka-jars.txt (the runtime set Maven resolves for .ci/kafka/pom.xml), each checked
against the sha1 in that list and against Central's own `.sha1` file, cached in
~/.cache/grandrounds/kafka-libs (or $KAFKA_LIBS).

The folder is filled in a scratch folder beside it and renamed into place when complete, with a
`.complete` marker (the sha256 of the pom.xml the list was resolved from) written last; a folder whose marker names another
list is fetched again. Nothing downloaded is executed here: the jars run in a JVM the user starts.
"""

from __future__ import annotations

from grandrounds.store.errors import Retryable
import hashlib
import os
import shutil
import tempfile
import urllib.request
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Callable

MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
DEFAULT_LIBS = Path.home() / ".cache" / "grandrounds" / "kafka-libs"
MARKER = ".complete"


class JarFetchError(Retryable, RuntimeError):
    """A download failed or a jar's checksum did not match (nothing is left half-written)."""


@dataclass(frozen=True)
class Jar:
    group: str
    artifact: str
    version: str
    sha1: str

    @property
    def filename(self) -> str:
        return f"{self.artifact}-{self.version}.jar"

    def url(self, base: str = MAVEN_CENTRAL) -> str:
        return f"{base.rstrip('/')}/{self.group.replace('.', '/')}/{self.artifact}/{self.version}/{self.filename}"


def jar_list_text() -> str:
    return resources.files("grandrounds.kafka_dev").joinpath("kafka-jars.txt").read_text(encoding="utf-8")


def jar_list() -> list[Jar]:
    jars = []
    for n, line in enumerate(jar_list_text().splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            coords, sha1 = line.split()
            group, artifact, version = coords.split(":")
        except ValueError:
            raise JarFetchError(f"kafka-jars.txt:{n}: expected 'group:artifact:version sha1'") from None
        jars.append(Jar(group, artifact, version, sha1.lower()))
    return jars


def list_digest() -> str:
    """What the `.complete` marker holds: the sha256 of the pom.xml the jar list was resolved from
    (its `# pom.xml sha256` line), the marker .ci/kafka/fetch.sh has always written."""
    for line in jar_list_text().splitlines():
        if line.startswith("# pom.xml sha256 "):
            return line.split()[-1]
    raise JarFetchError("kafka-jars.txt: no '# pom.xml sha256' line")


def libs_path() -> Path:
    return Path(os.environ.get("KAFKA_LIBS") or DEFAULT_LIBS)


def libs_dir(path: Path | None = None) -> Path | None:
    """The jar folder if it is complete for the current list, else None."""
    libs = path or libs_path()
    marker = libs / MARKER
    if not marker.is_file() or marker.read_text().strip() != list_digest():
        return None
    return libs


def kafka_version() -> str:
    return next(j.version for j in jar_list() if j.artifact.startswith("kafka_"))


def _sha1(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha1").hexdigest()  # streamed, never the whole jar in memory


def _get(url: str, timeout: float) -> bytes:
    if not url.startswith(("https://", "http://127.0.0.1", "http://localhost", "file://")):
        raise JarFetchError(f"refusing a non-HTTPS download: {url}")
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.read()
    except OSError as exc:
        raise JarFetchError(f"cannot download {url}: {exc}") from exc


def fetch(path: Path | None = None, base: str = MAVEN_CENTRAL, timeout: float = 120.0,
          progress: Callable[[Jar, str], None] | None = None) -> Path:
    """Make `path` (default $KAFKA_LIBS or ~/.cache/grandrounds/kafka-libs) hold every jar of the
    list, checked. Jars already there with the right sha1 are kept; returns the folder."""
    libs = path or libs_path()
    if libs_dir(libs) is not None:
        return libs
    jars = jar_list()
    libs.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=libs.name + ".tmp.", dir=libs.parent))
    try:
        for jar in jars:
            target = scratch / jar.filename
            old = libs / jar.filename
            if old.is_file() and _sha1(old) == jar.sha1:
                shutil.copyfile(old, target)
                if progress:
                    progress(jar, "cached")
                continue
            data = _get(jar.url(base), timeout)
            got = hashlib.sha1(data).hexdigest()
            published = _get(jar.url(base) + ".sha1", timeout).decode("ascii", "replace").split()
            if not published or published[0].lower() != jar.sha1:
                raise JarFetchError(f"{jar.filename}: Maven Central's .sha1 ({published[0] if published else 'empty'}) "
                                    f"is not the listed {jar.sha1}")
            if got != jar.sha1:
                raise JarFetchError(f"{jar.filename}: downloaded bytes have sha1 {got}, expected {jar.sha1}")
            target.write_bytes(data)
            if progress:
                progress(jar, f"downloaded {len(data) / 1e6:.1f} MB, sha1 ok, sha256 "
                              f"{hashlib.sha256(data).hexdigest()[:16]}…")
        (scratch / MARKER).write_text(list_digest() + "\n")
        if libs.exists():
            shutil.rmtree(libs)
        scratch.rename(libs)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return libs


def main() -> int:
    """`python -m grandrounds.kafka_dev.jars` (what .ci/kafka/fetch.sh runs): fetch, print the folder.
    Needs only the standard library, so it runs from a clone before anything is installed."""
    import sys

    try:
        path = fetch(progress=lambda jar, what: print(f"  {jar.filename}: {what}", file=sys.stderr))
    except JarFetchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{len(jar_list())} jars of Apache Kafka {kafka_version()} in {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
