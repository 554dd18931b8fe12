"""The README's Layout block is the package as it is: generated from the
modules' docstrings by .ci/layout.py, every module listed."""

from __future__ import annotations

import pathlib
import runpy

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_the_readme_layout_is_the_generated_one():
    layout = runpy.run_path(str(ROOT / ".ci" / "layout.py"))["layout"]()
    readme = (ROOT / "README.md").read_text()
    assert "```\n" + layout + "\n```" in readme, "run python .ci/layout.py and paste it"


def test_the_layout_names_every_module():
    layout = runpy.run_path(str(ROOT / ".ci" / "layout.py"))["layout"]()
    words = set(layout.replace(",", " ").replace(";", " ").replace("/", " ").split())
    for path in (ROOT / "fxckpt").rglob("*.py"):
        if path.name != "__init__.py":
            name = path.name if path.parent.name == "fxckpt" else path.stem
            assert name in words, path
