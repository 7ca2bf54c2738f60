"""mkdocs hook: lay out the source as the installed `grandrounds` package, for the API reference.

`pyproject.toml` installs the top-level folders `store/`, `handlers/`, `streams/`, `replay/` and
`sandbox/` as `grandrounds.store`, `grandrounds.handlers`, ... (its `package-dir` table). mkdocstrings reads
source statically (griffe), and in the repository `grandrounds/store` does not exist. Before the build
this hook makes `build/docs-api-src/grandrounds/`: the folders of `grandrounds/` and of every mapped
folder, under the names they install as (read from `package-dir` itself, so a newly mapped folder needs
no change here), holding links to their `.py` files (griffe does not follow linked folders, so folders
are made, files linked). mkdocs.yml points mkdocstrings' `paths` at that folder. Nothing is copied.
"""

from __future__ import annotations

import os
import shutil
import tomllib
from pathlib import Path

from mkdocs.plugins import event_priority

ROOT = Path(__file__).resolve().parents[1]
TREE = ROOT / "build" / "docs-api-src"


def build_tree(root: Path = ROOT, tree: Path = TREE) -> Path:
    mapping = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    if tree.exists():
        shutil.rmtree(tree)
    for name, folder in sorted(mapping.items()):
        _mirror(root / folder, tree.joinpath(*name.split(".")))
    return tree


def _mirror(src: Path, dst: Path) -> None:
    """Folders of `src` made under `dst`, its .py files linked; __pycache__ left out."""
    for here, dirs, files in os.walk(src):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        out = dst / Path(here).relative_to(src)
        out.mkdir(parents=True, exist_ok=True)
        for f in sorted(files):
            if f.endswith(".py") and not (out / f).exists():
                os.symlink(Path(here) / f, out / f)


# First among on_config handlers: mkdocstrings sets up its python handler in its own on_config and drops a
# `paths` folder that does not exist yet, so on a clean clone the tree must be there before it runs.
@event_priority(100)
def on_config(config):
    build_tree()
    return config
