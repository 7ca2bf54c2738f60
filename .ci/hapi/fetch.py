"""Fetch the jars of a real HAPI FHIR JPA server into $HAPI_LIBS (default ~/.cache/grandrounds/hapi-libs,
outside the repo), without Maven: plain HTTPS downloads from Maven Central of the set in hapi-jars.txt
(the runtime set Maven resolves for pom.xml beside this file), each checked against its listed sha1.
Standard library only. Idempotent: `.complete` (the list's pom sha256) is written into a complete,
checked folder that is then renamed into place; when it matches, nothing is downloaded.

    python3 .ci/hapi/fetch.py
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
CENTRAL = os.environ.get("MAVEN_CENTRAL", "https://repo.maven.apache.org/maven2")


def jar_list() -> tuple[str, list[tuple[str, str, str, str, str]]]:
    digest, jars = "", []
    for line in (HERE / "hapi-jars.txt").read_text().splitlines():
        if line.startswith("# pom.xml sha256 "):
            digest = line.split()[-1]
        if not line.strip() or line.startswith("#"):
            continue
        coord, sha1 = line.split()
        g, a, v, *c = coord.split(":")
        jars.append((g, a, v, c[0] if c else "", sha1))
    return digest, jars


def fetch(target: Path) -> None:
    digest, jars = jar_list()
    if digest != hashlib.sha256((HERE / "pom.xml").read_bytes()).hexdigest():
        sys.exit("fetch.py: hapi-jars.txt was listed for another pom.xml: regenerate it")
    marker = target / ".complete"
    if marker.is_file() and marker.read_text().strip() == digest:
        print(f"fetch.py: HAPI FHIR jars already in {target}")
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp.", dir=target.parent))
    try:
        def one(jar):
            g, a, v, c, sha1 = jar
            name = f"{a}-{v}{'-' + c if c else ''}.jar"
            url = f"{CENTRAL}/{g.replace('.', '/')}/{a}/{v}/{name}"
            with urllib.request.urlopen(url, timeout=120) as r:  # noqa: S310 (Maven Central)
                data = r.read()
            if hashlib.sha1(data).hexdigest() != sha1:  # noqa: S324 (Maven's own checksum)
                raise RuntimeError(f"{name}: sha1 differs from hapi-jars.txt")
            (tmp / name).write_bytes(data)

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(one, jars))
        (tmp / ".complete").write_text(digest + "\n")
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    print(f"fetch.py: {len(jars)} jars in {target}")


if __name__ == "__main__":
    fetch(Path(os.environ.get("HAPI_LIBS", Path.home() / ".cache" / "grandrounds" / "hapi-libs")))
