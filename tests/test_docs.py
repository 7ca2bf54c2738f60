"""The documentation: a short README, a docs site that builds strictly and renders, and commands that parse.

- the README stays a user's page (≤ 300 lines); depth lives in docs/ (mkdocs.yml);
- `mkdocs build --strict` passes: no broken link or anchor, no page left out of the nav, every
  `::: module` of the API reference resolves, the CLI reference renders (scripts/cli_reference.py);
- the built site renders in headless Chromium (Debian's, through Playwright's executable_path, as
  tests/test_ui.py drives it): the home page and the CLI reference page, each screenshotted and checked
  (the page's title in the DOM, a screenshot that is not blank);
- every `grandrounds …` command line shown in a fenced block of README.md or docs/*.md parses against the
  click CLI as it is now (command path, option names, option arity, positional count, choice values), without
  executing anything; every `python benchmarks/…` / `python scripts/…` line names a file that exists.
  The example *outputs* are run and compared by scripts/readme_examples.py (tests/test_readme_examples.py)
  and the benchmark figures by scripts/bench_docs.py (tests/test_readme_bench.py);
- every "DESIGN §N" the code cites is a section of docs/design.md.
"""

from __future__ import annotations

import functools
import http.server
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import click
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README] + sorted(DOCS.glob("*.md"))

_no_mkdocs = importlib.util.find_spec("mkdocs") is None
needs_mkdocs = pytest.mark.skipif(_no_mkdocs, reason='mkdocs is not installed (pip install -e ".[docs]")')


def test_readme_is_a_users_page():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines: move depth into docs/ (≤ 300)"
    text = "\n".join(lines)
    for must in ("grandrounds run examples/cases.jsonl", "python -m pytest -q", 'pip install -e ".[test,docs]"',
                 "## Your own agent", "docs/own-agent.md"):
        assert must in text, must


# the site -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    if _no_mkdocs:
        pytest.skip('mkdocs is not installed (pip install -e ".[docs]")')
    out = tmp_path_factory.mktemp("site")
    # As on a clean clone: the API source tree (scripts/api_source_tree.py) made by this build, not left
    # over from an earlier one (mkdocstrings drops a `paths` folder missing when it is configured).
    shutil.rmtree(ROOT / "build" / "docs-api-src", ignore_errors=True)
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return out


@needs_mkdocs
def test_mkdocs_build_strict(site):
    for page in ("index.html", "cli/index.html", "api/index.html", "design/index.html", "benchmarks/index.html"):
        assert (site / page).is_file(), page
    cli = (site / "cli" / "index.html").read_text(encoding="utf-8")
    # generated from the click objects: every top-level command has its section, with its --help text
    from grandrounds.cli import main

    for name in main.list_commands(click.Context(main)):
        assert f'id="grandrounds-{name}"' in cli, name
    assert "Usage: grandrounds run [OPTIONS]" in cli and "Usage: grandrounds verify [OPTIONS]" in cli
    api = (site / "api" / "index.html").read_text(encoding="utf-8")
    assert "grandrounds.store.eventstore" in api and "EventStore" in api


CHROMIUM = os.environ.get("GRANDROUNDS_CHROMIUM", "/usr/bin/chromium")


def _browser_missing() -> str | None:
    if importlib.util.find_spec("playwright") is None:
        return "playwright is not installed (pip install playwright; the browser is Debian's chromium)"
    if not Path(CHROMIUM).exists():
        return f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    return None


@pytest.fixture(scope="module")
def served(site):
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # noqa: D102 (no request log on the test's output)
        pass


def _not_blank(png: bytes) -> tuple[int, float]:
    """(distinct colours, share of pixels that differ from the most common one) of a screenshot."""
    import io

    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("RGB")
    colours = img.getcolors(maxcolors=1 << 20) or []
    top = max(c for c, _ in colours)
    total = img.width * img.height
    return len(colours), 1 - top / total


@needs_mkdocs
@pytest.mark.skipif(_browser_missing() is not None, reason=_browser_missing() or "")
@pytest.mark.parametrize("path, title, also", [
    ("/", "grandrounds", "Five minutes"),
    ("/cli/", "Command line reference", "grandrounds verify"),
])
def test_docs_render_in_chromium(served, tmp_path, path, title, also):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(served + path, wait_until="load")
            h1 = page.locator("article h1").first.inner_text().strip().rstrip("¶").strip()
            assert h1 == title
            assert page.title().endswith("grandrounds")  # "<nav title> - grandrounds"
            assert also in page.locator("article").inner_text()
            # the theme's stylesheet applied (Material's header bar is laid out, not an unstyled list)
            assert page.locator("header.md-header").bounding_box()["height"] > 20
            png = page.screenshot(full_page=False)
        finally:
            browser.close()
    shot = Path(os.environ.get("GRANDROUNDS_DOCS_SHOTS", tmp_path)) / f"docs-{path.strip('/').replace('/', '-') or 'home'}.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    shot.write_bytes(png)
    colours, inked = _not_blank(png)
    assert colours > 50 and inked > 0.03, f"{shot}: {colours} colours, {inked:.1%} of pixels off the background"


# commands shown in the docs -----------------------------------------------------------------------

_FENCE = re.compile(r"^```[ \t]*([A-Za-z0-9_-]*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)


def shown_commands(text: str) -> list[str]:
    """Command lines of the fenced blocks: `bash`/`console`/`shell`/`sh` blocks, and `$ `-prompted lines
    of any block; backslash continuations joined, comments and a trailing `&` dropped."""
    out = []
    for lang, body in _FENCE.findall(text):
        lines = body.splitlines()
        joined, buf = [], ""
        for line in lines:
            if buf:
                buf += " " + line.strip()
            else:
                buf = line
            if buf.rstrip().endswith("\\"):
                buf = buf.rstrip()[:-1]
                continue
            joined.append(buf)
            buf = ""
        for line in joined:
            s = line.strip()
            prompted = s.startswith("$ ")
            if prompted:
                s = s[2:]
            elif lang not in ("bash", "console", "shell", "sh"):
                continue
            s = re.sub(r"\s+#(?![^\[]*\]).*$", "", s)  # a trailing comment (not a `#` inside [...])
            s = s.rstrip().rstrip("&").rstrip()
            if s:
                out.append(s)
    return out


def _strip_optional(args: str) -> str:
    """`[--a X | --b Y]` optional groups out (nested too); what remains is the command as run."""
    prev = None
    while prev != args:
        prev = args
        args = re.sub(r"\[[^\[\]]*\]", " ", args)
    return args


def _resolve(tokens: list[str]):
    from grandrounds.cli import main

    ctx = click.Context(main, info_name="grandrounds")
    cmd, path = main, ["grandrounds"]
    while isinstance(cmd, click.Group) and tokens and not tokens[0].startswith("-"):
        sub = cmd.get_command(ctx, tokens[0])
        if sub is None:
            raise AssertionError(f"`{' '.join(path)}` has no command {tokens[0]!r}")
        path.append(tokens.pop(0))
        cmd, ctx = sub, click.Context(sub, info_name=path[-1], parent=ctx)
    return cmd, ctx, path


def check_parses(line: str) -> None:
    """`line` (a `grandrounds …` command) parses against the click CLI: nothing is executed."""
    tokens = shlex.split(_strip_optional(line).replace("…", ""))
    assert tokens[0] == "grandrounds", line
    cmd, ctx, path = _resolve(tokens[1:])
    rest = tokens[1 + len(path) - 1:]
    if isinstance(cmd, click.Group):
        assert not rest or rest[0].startswith("-"), f"`{' '.join(path)}` is a group: {line}"
        return
    parser = cmd.make_parser(ctx)
    try:
        opts, largs, _order = parser.parse_args(list(rest))
    except click.UsageError as exc:
        raise AssertionError(f"{line}\n  {exc}") from None
    assert not largs, f"{line}\n  unexpected arguments {largs} for `{' '.join(path)}`"
    for param in cmd.params:
        value = opts.get(param.name)
        if value is None or not isinstance(param.type, click.Choice):
            continue
        for v in (value if isinstance(value, (list, tuple)) else [value]):
            if isinstance(v, str) and "|" not in v and not v.isupper() and not v.startswith("$"):
                assert v in param.type.choices, f"{line}\n  {param.name}={v!r} not in {list(param.type.choices)}"


def _all_commands():
    """(page, command) for every simple command shown: optional groups out, then `a && b`, `a; b` and
    pipelines split, redirections dropped."""
    for page in PAGES:
        for line in shown_commands(page.read_text(encoding="utf-8")):
            for part in re.split(r"\s*(?:&&|\|\||;|\s\|\s)\s*", _strip_optional(line)):
                part = re.sub(r"\s\d?>>?\s*\S+", "", part).strip()
                if part:
                    yield page, part


def test_the_extractor_finds_the_tour():
    lines = shown_commands(README.read_text(encoding="utf-8"))
    assert "grandrounds run examples/cases.jsonl" in lines
    assert any(l.startswith("grandrounds replay --db runs.duckdb --from ex --permutations 5") and "--report" in l
               for l in lines)


def test_the_checker_refuses_what_the_cli_refuses():
    for bad in ("grandrounds runn examples/cases.jsonl",            # no such command
                "grandrounds run examples/cases.jsonl --no-such-flag",
                "grandrounds run a.jsonl b.jsonl",                   # one CASES_FILE
                "grandrounds run examples/cases.jsonl --db",         # an option without its value
                "grandrounds run examples/cases.jsonl --commit weekly"):  # not a choice
        with pytest.raises(AssertionError):
            check_parses(bad)
    check_parses("grandrounds run examples/cases.jsonl [--db F] --policy none --commit case")


def test_every_command_the_docs_show_parses():
    problems, seen = [], 0
    for page, line in _all_commands():
        rel = page.relative_to(ROOT)
        first = line.split()[0]
        if first == "grandrounds":
            seen += 1
            try:
                check_parses(line)
            except AssertionError as exc:
                problems.append(f"{rel}: {exc}")
        elif first in ("python", "python3") and len(line.split()) > 1:
            script = line.split()[1]
            if script.startswith(("benchmarks/", "scripts/")) and not (ROOT / script).is_file():
                problems.append(f"{rel}: {line}\n  no file {script}")
    assert seen > 50, f"only {seen} grandrounds command lines found in the docs"
    assert not problems, "\n".join(problems)


# the design document ------------------------------------------------------------------------------

def test_design_citations_resolve():
    design = (DOCS / "design.md").read_text(encoding="utf-8")
    sections = set(re.findall(r"^## (\d+a?)\. .*\{#s\1\}$", design, re.M))
    assert {"1", "3", "6", "8", "9"} <= sections
    cited = {}
    for folder in ("grandrounds", "store", "handlers", "streams", "replay", "sandbox", "tests", "scripts", "benchmarks"):
        for path in (ROOT / folder).rglob("*.py"):
            for n in re.findall(r"DESIGN §(\d+a?)", path.read_text(encoding="utf-8", errors="replace")):
                cited.setdefault(n, path.relative_to(ROOT))
    assert cited, "no DESIGN § citation found in the code"
    missing = {n: str(p) for n, p in cited.items() if n not in sections}
    assert not missing, f"cited sections absent from docs/design.md: {missing}"
