"""Exit codes (DESIGN §8): 0 success, 2 bad input, 1 anything else."""

from __future__ import annotations

import json
import sys

import click

from grandrounds.handlers.backbones import BackboneUnavailable
from grandrounds.handlers.cases import CaseFileError
from grandrounds.handlers.policies.config import PolicyError
from grandrounds.handlers.runs import RunMismatch

BAD_INPUT = (CaseFileError, PolicyError, RunMismatch, BackboneUnavailable)


def fail(message: str, code: int, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"error": message, "exit_code": code}))
    click.echo(f"error: {message}", err=True)
    sys.exit(code)
