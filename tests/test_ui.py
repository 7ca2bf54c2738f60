"""`grandrounds ui`: the read-only web view, driven in a real headless Chromium (Debian's
`chromium` package through Playwright's `executable_path`; no browser download).

One database per module: `teach` (the seven-case stream where a rule taught by teach-1 answers
learn-1, and rule-00001 is patched, demoted and retired), two order replays of it, `tools`
(twelve example cases with a reliable and an unreliable simulated tool) and `skills` (SkeMex, 3-case windows).
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from grandrounds.app import run_cases
from grandrounds.cli import main
from grandrounds.handlers.cases import load_cases
from grandrounds.handlers.policies.config import EvoMedAgentPolicy, load_policy
from grandrounds.handlers.runs import RunSpec
from grandrounds.replay.audit_diff import diff_points
from grandrounds.replay.metrics import rolling_accuracy
from grandrounds.store.embeddings import EmbeddingCache, shared_minilm
from grandrounds.store.eventstore import EventStore, StoreError
from grandrounds.ui import svg
from replay_fixtures import EXAMPLES, teaching_cases

CHROMIUM = os.environ.get("GRANDROUNDS_CHROMIUM", "/usr/bin/chromium")
try:
    import playwright.sync_api  # noqa: F401
    _why = None if Path(CHROMIUM).exists() else f"no Chromium at {CHROMIUM} (apt-get install chromium)"
except ImportError:
    _why = "playwright is not installed (pip install playwright; the browser is Debian's chromium)"
needs_browser = pytest.mark.skipif(_why is not None, reason=_why or "")


@pytest.fixture(scope="module")
def ui_db(tmp_path_factory) -> Path:
    from grandrounds.app import make_cache
    from grandrounds.replay.order_replay import execute_plan, plan_replay

    path = tmp_path_factory.mktemp("ui") / "ui.duckdb"
    with EventStore(path) as store:
        cache = EmbeddingCache(shared_minilm(), store.conn)
        teach = teaching_cases()
        # without the k-subjects gate (tests/test_privacy_freetext.py): the teaching stream's few patients
        run_cases(store, teach, RunSpec(policy=EvoMedAgentPolicy(memory_min_subjects=1), source="teaching"),
                  run_id="teach", cache=cache)
        run_cases(store, load_cases(EXAMPLES)[0][:12],
                  RunSpec(policy=EvoMedAgentPolicy(), source="ex-12", tools={"ddx-lookup": 0.95, "triage-score": 0.1}),
                  run_id="tools", cache=cache)
        # windows of 3 cases, so skills are distilled early enough for later cases to retrieve them
        skemex = load_policy("skemex").model_copy(update={"window": 3})
        run_cases(store, teach, RunSpec(policy=skemex, source="teaching"), run_id="skills", cache=cache)
        execute_plan(store, make_cache(store), plan_replay(store, "teach", 2, 0), workers=1)
    return path


@pytest.fixture(scope="module")
def base_url(ui_db):
    from grandrounds.ui.serve import serving

    with serving(ui_db) as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser):
    p = browser.new_page()
    yield p
    p.close()


# --- the read side the pages are built on (no browser) -----------------------------------------


def test_rolling_accuracy_is_the_accuracy_of_the_last_window_cases():
    assert rolling_accuracy([True, False, True, True, False], 2) == [1.0, 0.5, 0.5, 1.0, 0.5]
    assert rolling_accuracy([False, True, True], 10) == [0.0, 0.5, round(2 / 3, 6)]


def test_a_one_case_series_is_drawn_as_a_dot():
    out = svg.render(svg.Chart("t", "acc", series=[svg.Series("cumulative", [1.0])]))
    assert '<circle data-series="cumulative"' in out


def test_diff_between_two_points_of_a_run(ui_db):
    with EventStore(ui_db, read_only=True) as store:
        d = diff_points(store, "teach", {"as_of_case": 0}, {})
    added = {f"{i['kind']}:{i['id']}" for i in d["added"]}
    assert "rule:rule-00001" in added and "episode:ep-00006" in added  # taught after case 0
    assert d["summary"]["removed"] == 0 and d["a"]["case_index"] == 0 and d["b"]["at_head"]
    assert d["counts_a"]["episodes"] == 1 and d["counts_b"]["episodes"] == 7


def test_the_view_opens_the_file_read_only(ui_db):
    from grandrounds.ui.app import create_app

    view = create_app(ui_db).state.view
    with pytest.raises(Exception):
        view.store.conn.execute("DELETE FROM events")
    view.store.close()


def test_ui_command_refuses_a_missing_file(tmp_path):
    res = CliRunner().invoke(main, ["ui", "--db", str(tmp_path / "none.duckdb")])
    assert res.exit_code == 2 and "no database file" in res.output


def test_ui_command_serves_on_localhost(ui_db):
    import urllib.request

    proc = subprocess.Popen([sys.executable, "-m", "grandrounds", "ui", "--db", str(ui_db), "--port", "0"],
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+/", line).group(0)
        body = urllib.request.urlopen(url, timeout=30).read().decode()
        assert "teach-perm0-s0" in body and "read-only" in body
    finally:
        proc.terminate()
        proc.wait(20)


# --- in the browser ------------------------------------------------------------------------------


@needs_browser
def test_runs_page_lists_every_run_with_its_checks(page, base_url, ui_db):
    page.goto(base_url + "/")
    rows = page.locator("#runs tbody tr")
    assert sorted(rows.evaluate_all("rs => rs.map(r => r.dataset.run)")) == [
        "skills", "teach", "teach-perm0-s0", "teach-perm1-s0", "tools"]
    teach = page.locator("tr[data-run=teach]")
    with EventStore(ui_db, read_only=True) as store:
        fp = store.fingerprint("teach")
    assert teach.locator("code").get_attribute("title") == fp
    assert "evo-medagent" in teach.inner_text() and "intact" in teach.locator(".chain").inner_text()
    assert page.locator("tr[data-run=skills]").inner_text().split("\t")[1] == "skemex"
    page.click("tr[data-run=teach] >> text=teach")
    assert page.url.endswith("/runs/teach")
    assert page.locator("h1").inner_text() == "Run teach"


@needs_browser
def test_run_page_draws_cumulative_and_rolling_accuracy_replays_and_growth(page, base_url):
    page.goto(base_url + "/runs/teach?window=3")
    assert page.locator("#accuracy-chart [data-series=cumulative]").count() == 1
    assert page.locator('#accuracy-chart [data-series="rolling (3 cases)"]').count() == 1
    group = page.locator(".replay-group[data-stem=teach]")
    assert "2 order(s)" in group.locator("h3").inner_text()
    assert group.locator("[data-band]").count() == 1 and group.locator("[data-series=mean]").count() == 1
    assert page.locator("#growth-chart [data-series='active rules']").count() == 1
    cats = {r.split("\t")[0]: r.split("\t")[1] for r in page.locator("#categories tbody tr").all_inner_texts()}
    assert cats == {"cardiology": "2", "pediatrics": "5"}
    assert page.locator("#cases tbody tr").count() == 7


@needs_browser
def test_case_page_shows_what_was_retrieved_and_where_it_came_from(page, base_url, ui_db):
    page.goto(base_url + "/runs/teach/cases/learn-1")
    answer = page.locator("#answer").inner_text()
    assert "followed rule rule-00000, learned from case teach-1 (#0" in answer
    assert "rule-00000" in page.locator("#retrieved").inner_text()
    assert "CORRECT" in page.locator("#feedback").inner_text()
    with EventStore(ui_db, read_only=True) as store:
        types = [e.type for e in store.read("teach", case_id="learn-1")]
    assert page.locator("#timeline details").evaluate_all("ds => ds.map(d => d.dataset.type)") == types
    page.locator("#timeline details[data-type='answer.given'] summary").click()
    assert "rule:rule-00000" in page.locator("#timeline details[data-type='answer.given'] pre").inner_text()
    page.click("#answer >> text=teach-1")
    assert page.url.endswith("/runs/teach/cases/teach-1")
    assert "added rule-00000" in page.locator("#changes").inner_text()


@needs_browser
def test_item_page_shows_a_rules_whole_life(page, base_url):
    page.goto(base_url + "/runs/teach/items/rule-00001")
    assert "created by case kd-1" in page.locator("#provenance").inner_text()
    events = page.locator("#history tbody tr").evaluate_all("rs => rs.map(r => r.dataset.event)")
    for e in ("created", "patched", "demoted", "retired", "retrieved", "feedback"):
        assert e in events
    assert "kd-2" in page.locator("#shown-to").inner_text()
    assert page.locator("#utility-chart [data-series=utility]").count() == 1


@needs_browser
def test_time_travel_form_shows_memory_as_of_a_case(page, base_url):
    page.goto(base_url + "/runs/teach/memory")
    assert "at the end of the run" in page.locator("#as-of").inner_text()
    end_rows = page.locator("#items tbody tr").count()
    page.fill("#time-travel input[name=case]", "0")
    page.click("#time-travel button")
    assert "after case #0" in page.locator("#as-of").inner_text()
    assert page.locator("#items tbody tr").count() < end_rows
    assert page.locator("#items tr[data-kind=episode]").count() == 1


@needs_browser
def test_diff_page_between_two_points(page, base_url):
    page.goto(base_url + "/runs/teach/diff?a_case=0")
    assert "after case #0" in page.locator("#points").inner_text()
    assert "rule-00001" in page.locator("#added").inner_text()
    page.goto(base_url + "/runs/teach/diff?a_case=3&b_case=6")
    assert "rule-00001" in page.locator("#changed").inner_text()  # demoted and retired in between


@needs_browser
def test_tool_governance_page_shows_labels_and_their_changes(page, base_url):
    page.goto(base_url + "/runs/tools/tools")
    triage = page.locator(".tool[data-tool=triage-score]")
    assert "Avoid" in triage.locator("h3").inner_text()
    assert "Caution → Avoid" in triage.inner_text()
    assert "Trusted" in page.locator(".tool[data-tool=ddx-lookup] h3").inner_text()
    page.goto(base_url + "/runs/teach/tools")
    assert page.locator("#no-tools").count() == 1


@needs_browser
def test_skemex_memory_is_listed_as_skills(page, base_url, ui_db):
    page.goto(base_url + "/runs/skills/memory")
    kinds = set(page.locator("#items tbody tr").evaluate_all("rs => rs.map(r => r.dataset.kind)"))
    assert "rule" not in kinds and "episode" not in kinds
    with EventStore(ui_db, read_only=True) as store:  # a case that retrieved skills shows them, linked
        shown = next((e.case_id, e.payload["items"]) for e in store.read("skills", types=["memory.retrieved"])
                     if e.payload.get("items"))
    page.goto(base_url + f"/runs/skills/cases/{shown[0]}")
    assert page.locator("#policy-items tbody tr").count() == len(shown[1])
    assert shown[1][0]["item_id"] in page.locator("#policy-items").inner_text()


@needs_browser
def test_verify_re_executes_and_the_runs_page_remembers(page, base_url):
    page.goto(base_url + "/runs/teach/verify")
    assert "IDENTICAL" in page.locator("#verdict").inner_text()
    page.goto(base_url + "/")
    assert "identical" in page.locator("tr[data-run=teach] .verified").inner_text()


@needs_browser
def test_unknown_references_are_a_404_page_with_the_audit_message(page, base_url):
    resp = page.goto(base_url + "/runs/nope")
    assert resp.status == 404 and "no run 'nope'" in page.locator("#error").inner_text()
    resp = page.goto(base_url + "/runs/teach/memory?case=99")
    assert resp.status == 404 and "no completed case with index 99" in page.locator("#error").inner_text()
    resp = page.goto(base_url + "/runs/teach/memory?case=x")
    assert resp.status == 404 and "whole number" in page.locator("#error").inner_text()


@needs_browser
def test_browsing_every_page_leaves_the_file_unchanged(page, base_url, ui_db):
    before = hashlib.sha256(ui_db.read_bytes()).hexdigest()
    for path in ("/", "/runs/teach", "/runs/teach/cases/kd-2", "/runs/teach/items/rule-00000",
                 "/runs/teach/memory?seq=5", "/runs/teach/diff", "/runs/tools/tools", "/runs/skills"):
        assert page.goto(base_url + path).status == 200, path
    assert hashlib.sha256(ui_db.read_bytes()).hexdigest() == before


# --- `audit items` tells policies apart (what the memory page shows too) ------------------------


def test_audit_items_refuses_a_kind_the_runs_policy_does_not_keep(ui_db):
    res = CliRunner().invoke(main, ["audit", "items", "teach", "--db", str(ui_db), "--kind", "skill"])
    assert res.exit_code == 2 and "uses policy evo-medagent, whose memory holds rule, episode, tool items" in res.output
    res = CliRunner().invoke(main, ["audit", "items", "skills", "--db", str(ui_db), "--kind", "rule"])
    assert res.exit_code == 2 and "skill, tool" in res.output


def test_audit_items_header_names_the_policys_own_items(ui_db):
    res = CliRunner().invoke(main, ["audit", "items", "skills", "--db", str(ui_db)])
    assert res.exit_code == 0, res.output
    header = res.output.splitlines()[1]
    assert header.startswith("  policy skemex · skills ") and "episodes" not in header and "rules" not in header
