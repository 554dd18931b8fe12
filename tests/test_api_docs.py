"""Every public function's docstring gives its arguments, what it returns
and an example (the README's options table points users there)."""

from __future__ import annotations

import inspect

import pytest

import fxckpt

_FUNCTIONS = [name for name in fxckpt.__all__ if inspect.isfunction(getattr(fxckpt, name))]


def test_the_public_functions_are_found():
    assert {"backend", "transform", "checkpoint", "explain", "pareto"} <= set(_FUNCTIONS)


@pytest.mark.parametrize("name", _FUNCTIONS)
def test_a_public_function_documents_args_returns_and_an_example(name):
    doc = inspect.getdoc(getattr(fxckpt, name)) or ""
    for section in ("Args:", "Returns:", "Example"):
        assert f"\n{section}" in doc, f"fxckpt.{name}'s docstring has no {section} section"
    args = doc.split("Args:", 1)[1].split("Returns:", 1)[0]
    # "name: ..." or "a, b, c: as ..." at the start of an Args line.
    documented = {word.strip().lstrip("*") for line in args.splitlines()
                  if ":" in line and not line.startswith(" " * 8)
                  for word in line.split(":", 1)[0].split(",")}
    for parameter in inspect.signature(getattr(fxckpt, name)).parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        assert parameter.name in documented, f"fxckpt.{name}: {parameter.name} undocumented"
