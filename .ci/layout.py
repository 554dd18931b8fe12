"""Prints the README's Layout block from the package itself: each top-level
module with the first sentence of its docstring, each folder (and each
folder inside one) with its ``__init__`` docstring's first sentence and
every module in it.
``tests/test_layout.py`` holds the README to it; after moving files run
``python .ci/layout.py`` and paste its output under "## Layout"."""

from __future__ import annotations

import ast
import pathlib
import textwrap

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "fxckpt"
WIDTH = 78
INDENT = 21


def first_sentence(path: pathlib.Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    paragraph = " ".join(doc.split("\n\n")[0].split())
    sentence = paragraph.split(". ")[0].rstrip(".")
    return sentence.replace("``", "`")


def entry(name: str, text: str) -> list[str]:
    lines = textwrap.wrap(text, WIDTH - INDENT) or [""]
    head = f"  {name}".ljust(INDENT - 1)
    if len(head) >= INDENT:
        return [head.rstrip()] + [" " * INDENT + line for line in lines]
    return [head + " " + lines[0]] + [" " * INDENT + line for line in lines[1:]]


def layout() -> str:
    out = ["fxckpt/"]
    for path in sorted(PACKAGE.glob("*.py")):
        out += entry(path.name, first_sentence(path))
    for folder in _packages(PACKAGE):
        modules = sorted(p.stem for p in folder.glob("*.py") if p.name != "__init__.py")
        text = f"{first_sentence(folder / '__init__.py')}. Modules: {', '.join(modules)}"
        inner = _packages(folder)
        if inner:
            text += f"; folders: {', '.join(p.name for p in inner)}"
        out += entry(f"{folder.name}/", text)
        for sub in inner:
            modules = sorted(p.stem for p in sub.glob("*.py") if p.name != "__init__.py")
            text = f"{first_sentence(sub / '__init__.py')}. Modules: {', '.join(modules)}"
            out += entry(f"{folder.name}/{sub.name}/", text)
    return "\n".join(out)


def _packages(folder: pathlib.Path) -> list[pathlib.Path]:
    return sorted(p for p in folder.iterdir() if (p / "__init__.py").exists())


if __name__ == "__main__":
    print("```\n" + layout() + "\n```")
