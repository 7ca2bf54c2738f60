"""Rows of docs/trust.md's hostile matrix that the tests assert (issue 43's probes).

Each test module of issue 43 declares `HOSTILE`: for each probe, what it does, the result the test
asserts (as fields its assertions read: the exit code, the exception, what the message says, verify's
reason codes afterwards, the committed cases kept, whether anything was written) and what the build
before did. scripts/tamper_matrix.py writes the page's rows from these, so the result column is what the
tests hold; `was` is history (the behaviour on a66b17b), not re-run.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Hostile:
    probe: str  # what is done, as the page says it
    test: str  # the test that asserts the result
    was: str  # what the build before issue 43 did
    exit: int | None = None  # the command's exit code
    status: int | None = None  # the HTTP status
    raises: str | None = None  # the exception a Python caller gets
    says: tuple[str, ...] = ()  # what the message (or verify's completeness line) contains
    codes: tuple[str, ...] | None = None  # verify's reason codes afterwards; () is verified
    kept: int | None = None  # the file and its key file kept, with this many committed cases
    written: bool | None = None  # False: nothing written (no file created, no byte changed)

    def said(self, text: str) -> bool:
        """Whether `text` says everything this row says it does."""
        return all(part in text for part in self.says)

    def result(self) -> str:
        parts = []
        if self.exit is not None:
            parts.append(f"exit {self.exit}")
        if self.status is not None:
            parts.append(f"HTTP {self.status}")
        if self.raises:
            parts.append(f"`{self.raises}` raised")
        if self.says:
            parts.append("saying " + ", ".join(f'"{s}"' for s in self.says))
        if self.written is False:
            parts.append("nothing written")
        if self.kept is not None:
            parts.append(f"the file and its key file kept with the {self.kept} committed case(s)")
        if self.codes is not None:
            parts.append("verify: " + (", ".join(f"`{c}`" for c in self.codes) if self.codes else "verified"))
        return "; ".join(parts)
