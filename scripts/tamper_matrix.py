"""Render docs/trust.md's tamper matrix rows from the codes the tamper tests assert.

    python scripts/tamper_matrix.py           # rewrite the block in docs/trust.md
    python scripts/tamper_matrix.py --check   # exit 1 (and show a diff) if the page differs

tests/test_tamper.py runs every probe of its `ATTACKS` and asserts, for each, the exact reason codes
`verify` reports without a key and with it (`CODES`) and the anchors' codes (`ANCHORS`);
tests/test_verify_reasons.py does the same for the sealed-row probes (`SEALED_PROBES`). This script writes
those rows of the matrix from the same dictionaries, between `<!-- tamper:probes -->` and
`<!-- /tamper -->`, so the page says what the tests hold and nothing else; tests/test_tamper.py runs
`--check`. Issue 43's probes (errors, erasure of one patient, closed runs, key custody) are written the
same way, between `<!-- tamper:hostile -->` and `<!-- /tamper -->`, from the `HOSTILE` rows of the tests
that assert them (tests/hostile_rows.py). The matrix's other rows (key custody, input files) are prose,
each citing the test that asserts it.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "trust.md"
BEGIN, END = "<!-- tamper:probes -->", "<!-- /tamper -->"
HOSTILE_BEGIN = "<!-- tamper:hostile -->"
HOSTILE_MODULES = ["test_error_boundary", "test_erase_one_patient", "test_closed_runs", "test_signing_key_apart"]

PROBES = {  # probe -> what it does, as the page says it
    "delete_last_event": "delete the last event",
    "delete_last_three_events": "delete the last three events",
    "delete_last_case": "delete the last case",
    "delete_last_case_and_rechain": "delete the last case and re-chain",
    "delete_middle_event": "delete a middle event",
    "delete_middle_event_and_renumber": "**delete a middle event, renumber the rest, re-chain**",
    "flip_ciphertext_byte": "**flip a ciphertext byte**",
    "flip_ciphertext_byte_and_rechain": "**flip a ciphertext byte and re-chain**",
    "swap_two_events": "**swap two sealed rows**",
    "rewrite_run_id": "rename the run (verify asked for the new name)",
    "edit_meta": "edit meta (outside the fingerprint)",
    "edit_meta_and_rechain": "edit meta and re-chain",
    "edit_meta_and_rechain_as_v1": "edit meta and re-chain as a v1 chain",
    "edit_payload": "edit a payload",
    "edit_payload_and_rechain": "edit a payload and re-chain",
    "edit_type": "edit an event's type",
    "edit_schema_version": "edit a schema version",
    "edit_case_id": "edit a case id",
    "edit_causation": "edit a causation seq",
    "edit_chain_value": "edit a chain value",
    "append_forged_event": "append a forged event (chained)",
    "delete_signed_head": "delete the signed head",
    "resign_with_another_key": "truncate, re-chain and re-sign with another key",
}


def _load(name: str):
    sys.path.insert(0, str(ROOT / "tests"))
    import importlib

    return importlib.import_module(name)


def _codes(codes: tuple[str, ...], none: str) -> str:
    return ", ".join(f"`{c}`" for c in codes) if codes else none


def rows() -> list[str]:
    tamper, reasons = _load("test_tamper"), _load("test_verify_reasons")
    out = []
    for name, (plain, keyed) in tamper.CODES.items():
        out.append(f"| {PROBES[name]} | {_codes(plain, 'verified')} | {_codes(keyed, 'verified')} | "
                   f"{_codes(tamper.ANCHORS[name], 'pass')} | `tests/test_tamper.py::test_tamper_matrix[{name}]` |")
    for name, (plain, keyed, anchors) in reasons.SEALED_PROBES.items():
        out.append(f"| {PROBES[name]} | {_codes(plain, 'verified')} | {_codes(keyed, 'verified')} | "
                   f"{_codes(anchors, 'pass')} | `tests/test_verify_reasons.py::"
                   f"test_a_sealed_row_edited_or_moved_is_tampering_not_an_erasure[{name}]` |")
    return out


HEADER = ["| probe | no key | with signing key | anchors | test |", "|---|---|---|---|---|"]
HOSTILE_HEADER = ["| probe | result | before (a66b17b) | test |", "|---|---|---|---|"]


def hostile_rows() -> list[str]:
    return [f"| {row.probe} | {row.result()} | {row.was} | `{row.test}` |"
            for module in HOSTILE_MODULES for row in _load(module).HOSTILE.values()]


def _block(text: str, begin: str, lines: list[str]) -> str:
    start = text.index(begin)
    stop = text.index(END, start)
    return text[:start] + begin + "\n" + "\n".join(lines) + "\n" + text[stop:]


def updated(text: str) -> str:
    text = _block(text, BEGIN, [*HEADER, *rows()])
    return _block(text, HOSTILE_BEGIN, [*HOSTILE_HEADER, *hostile_rows()])


def main(argv: list[str] | None = None, page: Path = PAGE) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    old = page.read_text(encoding="utf-8")
    new = updated(old)
    if args.check:
        if new != old:
            sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True), page.name,
                                                       f"{page.name} (from the tests' codes)"))
            return 1
        print(f"{page.name}: the tamper matrix's probe rows are the tests' codes")
        return 0
    if new != old:
        tmp = page.with_suffix(".md.tmp")
        tmp.write_text(new, encoding="utf-8")
        os.replace(tmp, page)
    print(f"{page.name}: probe rows {'rendered' if new != old else 'already current'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
