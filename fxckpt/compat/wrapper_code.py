"""The Python wrapper code Inductor generates, read as statements.

Inductor's wrapper (``def call(self, args):``) is the allocation order of
a compiled graph; fxckpt/memory/compiled_peak.py walks it for the peak.
Its format is Inductor's, and changes between releases: torch 2.14 sizes
a fallback kernel's outputs with ``assert_tensor_metadata`` (dtype
included) where 2.13 wrote ``assert_size_stride``, and groups input asserts
into ``assert_size_stride_grouped``. This module is the one place that
knows the format. Every statement is one of the forms below, or the
reading stops with UnreadableCode naming the line: a form it does not know
is never read as no memory.

- ``X = empty_strided_<device>((sizes), (strides), torch.<dtype>)``: Allocate
- ``X = Y; del Y  # reuse`` (or ``reinterpret_tensor(Y, ...)``): Reuse
- ``X = Y`` / ``X = reinterpret_tensor(Y, ...)  # alias``: Alias
- ``X = Y[i]...``: Item (one output of a call returning several)
- ``X = extern_kernels.op(...)`` / ``X = torch.ops.<ns>.<op>...(...)``:
  FallbackCall (a kernel returning new buffers)
- ``assert_size_stride(X, ...)``, ``assert_tensor_metadata(X, ..., dtype,
  ...)``, ``assert_size_stride_grouped((X, ...), ...)``: SizeAssert, one
  per name
- ``del X, Y``: Delete; ``return (...)``: Return; ``a, b = args``: the
  inputs (Inputs)
- anything else that assigns nothing (a kernel launch writing into buffers
  it is given, ``args.clear()``, ``assert_alignment``, stream and device
  guards, comments): no memory.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Iterator


class UnreadableCode(Exception):
    """The wrapper code holds a statement this reading does not know, or
    one whose memory cannot be told. ``expected``: a case the reading is
    known not to cover (symbolic sizes), not a format it does not know."""

    def __init__(self, why: str, line: str = "", *, expected: bool = False) -> None:
        super().__init__(f"{why}: {line}" if line else why)
        self.why, self.line, self.expected = why, line, expected


@dataclass(frozen=True)
class Allocate:
    name: str
    sizes: str
    strides: str
    dtype: str


@dataclass(frozen=True)
class Reuse:
    name: str
    freed: str        # the name the buffer had
    value: str        # what ``name`` is bound to (a name, or reinterpret_tensor of one)


@dataclass(frozen=True)
class Alias:
    name: str
    base: str
    value: str


@dataclass(frozen=True)
class Item:
    name: str
    base: str
    index: tuple[int, ...]


@dataclass(frozen=True)
class FallbackCall:
    name: str
    op: str                         # the op's name (``convolution``, ``mm``, ``higher_order``)
    operands: tuple[str | None, ...]   # the first three arguments, where they are names
    wrapped: str | None             # the op a higher-order wrapper runs
    text: str


@dataclass(frozen=True)
class SizeAssert:
    name: str
    sizes: str
    strides: str
    dtype: str | None               # None where the assert names no dtype


@dataclass(frozen=True)
class Delete:
    names: tuple[str, ...]


@dataclass(frozen=True)
class Return:
    names: tuple[str, ...]


@dataclass(frozen=True)
class Inputs:
    names: tuple[str, ...]


Statement = Allocate | Reuse | Alias | Item | FallbackCall | SizeAssert | Delete | Return \
    | Inputs

_ALLOC = re.compile(r"^(\w+) = empty_strided_\w+\(\(([^)]*)\), \(([^)]*)\), torch\.(\w+)\)")
_REUSE = re.compile(r"^(\w+) = ((?:reinterpret_tensor\()?\w+\b.*); del (\w+)$")
_ALIAS = re.compile(r"^(\w+) = ((?:reinterpret_tensor\()?(\w+)(?:\)|,.*\))?)$")
_ITEM = re.compile(r"^(\w+) = (\w+)((?:\[\d+\])+)$")
_CALL = re.compile(r"^(\w+) = (?:torch\.ops\.aten|torch\.ops(?=\.higher_order\.)|torch\.ops\.\w+"
                   r"|extern_kernels)\.(\w+)[.(]")
_WRAPPED = re.compile(r"torch\.ops\.aten\.(\w+)\.")
_INPUTS = re.compile(r"^(\w+(?:, \w+)*),? = args$")
# A dtype view (``aten.view.dtype``) aliases its base.
_DTYPE_VIEW = re.compile(r"^(\w+) = aten\.view\.dtype\((\w+), ")
# Symbolic sizes bound from the inputs (``s0 = arg0_1.size()[0]``, ``ps0 = 64*s0``,
# ``u0 = buf3.item()``).
_SYMBOL = re.compile(r"^[pu]?s\d+ = |^\w+ = .*\.(?:size|stride|item)\(\)")
_ASSERT = re.compile(r"^assert_size_stride\((\w+), \(([^)]*)\), \(([^)]*)\)")
_ASSERT_DTYPE = re.compile(r"^assert_tensor_metadata\((\w+), \(([^)]*)\), \(([^)]*)\), "
                           r"torch\.(\w+)")
_ASSERT_GROUPED = re.compile(r"^assert_size_stride_grouped\(\(")
# Asserts that state nothing of memory.
_OTHER_ASSERTS = ("assert_alignment(",)
# Statements that bind a name without making a tensor.
_BINDINGS = re.compile(r"^(stream\d*|\w*raw_stream\w*) = ")


def call_body(code: str) -> list[str]:
    """The statements of the wrapper's ``call``, one line each, stripped."""
    lines = code.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == "def call(self, args):"]
    if len(starts) != 1:
        raise UnreadableCode("no single def call(self, args)")
    indent = len(lines[starts[0]]) - len(lines[starts[0]].lstrip()) + 4
    body = []
    for line in lines[starts[0] + 1:]:
        if line.strip() and len(line) - len(line.lstrip()) < indent:
            break
        if line.strip():
            body.append(line.strip())
    return body


def statements(body: list[str]) -> Iterator[Statement]:
    """The memory statements of ``body`` (``call_body``), in order."""
    for line in body:
        if line.startswith("#"):
            continue
        if line.endswith("# reuse"):
            yield _reuse(line)
            continue
        code = line.split("  #")[0]
        for statement in (s.strip() for s in code.split(";")):
            if statement:
                yield from _read(statement, line)


def _reuse(line: str) -> Reuse:
    code = line[:-len("# reuse")].strip()
    match = _REUSE.match(code)
    if not match:
        raise UnreadableCode("a buffer reuse of an unknown form", line)
    return Reuse(match[1], match[3], match[2])


def _read(statement: str, line: str) -> Iterator[Statement]:
    if "alloc_from_pool" in statement:
        raise UnreadableCode("a memory pool", line)
    if statement.startswith("return "):
        yield Return(tuple(returned_names(statement)))
        return
    if statement.startswith("del "):
        yield Delete(tuple(name.strip() for name in statement[4:].split(",")))
        return
    if statement.startswith("assert"):
        yield from _asserts(statement, line)
        return
    if match := _INPUTS.match(statement):
        yield Inputs(tuple(match[1].split(", ")))
        return
    if not _assigns(statement):
        return      # a kernel launch, a guard, args.clear(): no new buffer
    if _SYMBOL.match(statement):
        raise UnreadableCode("symbolic sizes", line, expected=True)
    if match := _ALLOC.match(statement):
        yield Allocate(match[1], match[2], match[3], match[4])
    elif "empty_strided" in statement:
        if ints(statement.split("((", 1)[-1].split(")", 1)[0]) is None:
            raise UnreadableCode("symbolic sizes", line, expected=True)
        raise UnreadableCode("an allocation of a form not known", line)
    elif match := _CALL.match(statement):
        wrapped = _WRAPPED.search(statement) if match[2] == "higher_order" else None
        yield FallbackCall(match[1], match[2], _operands(statement),
                           wrapped[1] if wrapped else None, statement)
    elif match := _DTYPE_VIEW.match(statement):
        yield Alias(match[1], match[2], match[2])
    elif match := _ITEM.match(statement):
        yield Item(match[1], match[2], tuple(int(k) for k in re.findall(r"\d+", match[3])))
    elif match := _ALIAS.match(statement):
        yield Alias(match[1], match[3], match[2])
    elif not _BINDINGS.match(statement):
        raise UnreadableCode("a statement of a form not known", line)


def _assigns(statement: str) -> bool:
    """Whether the statement binds a name (``X = ...``), rather than calling
    or guarding."""
    head = statement.split("(", 1)[0]
    return " = " in head and not head.startswith(("with ", "if ", "assert "))


def _asserts(statement: str, line: str) -> Iterator[SizeAssert]:
    if match := _ASSERT.match(statement):
        yield SizeAssert(match[1], match[2], match[3], None)
    elif match := _ASSERT_DTYPE.match(statement):
        yield SizeAssert(match[1], match[2], match[3], match[4])
    elif _ASSERT_GROUPED.match(statement):
        yield from _grouped(statement, line)
    elif not statement.startswith(_OTHER_ASSERTS) and not statement.startswith("assert "):
        raise UnreadableCode("an assert of a form not known", line)


def _grouped(statement: str, line: str) -> Iterator[SizeAssert]:
    """``assert_size_stride_grouped((a, b), ((sizes a), (sizes b)), ((strides a),
    (strides b)), op)``: one SizeAssert per name."""
    parts = top_level(inside(statement, statement.index("(")) or "")
    if len(parts) < 3:
        raise UnreadableCode("a grouped assert of a form not known", line)
    names = [n.strip() for n in top_level(inside(parts[0].strip(), 0) or "")]
    sizes = [inside(s.strip(), 0) for s in top_level(inside(parts[1].strip(), 0) or "")]
    strides = [inside(s.strip(), 0) for s in top_level(inside(parts[2].strip(), 0) or "")]
    if not (len(names) == len(sizes) == len(strides)) or None in sizes or None in strides:
        raise UnreadableCode("a grouped assert of a form not known", line)
    for name, size, stride in zip(names, sizes, strides):
        yield SizeAssert(name, size, stride, None)


def _operands(statement: str) -> tuple[str | None, ...]:
    """The first three arguments of a call, where they are plain names."""
    start = statement.find("(", statement.index(" = "))
    args = top_level(inside(statement, start) or "")
    names = [a.strip() if a.strip().isidentifier() else None for a in args[:3]]
    return tuple(names + [None] * (3 - len(names)))


def call_arguments(statement: str, op: str) -> tuple[list[str], dict[str, str]] | None:
    """The positional and keyword arguments of the call of ``op`` in
    ``statement``, as text; None where its brackets do not close."""
    inner = inside(statement, statement.find("(", statement.index(op)))
    if inner is None:
        return None
    args, keywords = [], {}
    for item in top_level(inner):
        name, eq, value = item.partition("=")
        if eq and name.strip().isidentifier() and not value.startswith("="):
            keywords[name.strip()] = value.strip()
        else:
            args.append(item.strip())
    return args, keywords


def reinterpreted(text: str) -> tuple[str, str, str] | None:
    """``reinterpret_tensor(X, sizes, strides, ...)``: (X, sizes, strides)."""
    if not text.startswith("reinterpret_tensor("):
        return None
    inner = top_level(inside(text, text.index("(")) or "")
    if len(inner) < 3:
        return None
    return inner[0].strip(), inner[1], inner[2]


def literal(text: str) -> tuple | None:
    """("list", values) or ("const", value) for a Python literal; None else."""
    try:
        value = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError):
        return None
    if isinstance(value, (list, tuple)):
        return ("list", tuple(value))
    if value is None or isinstance(value, (bool, int, float)):
        return ("const", value)
    return None


def inside(text: str, start: int) -> str | None:
    """What the bracket at ``start`` encloses (None where it is not closed)."""
    if start < 0 or start >= len(text):
        return None
    depth = 0
    for k in range(start, len(text)):
        depth += (text[k] in "([") - (text[k] in ")]")
        if depth == 0:
            return text[start + 1:k]
    return None


def top_level(text: str) -> list[str]:
    """``text`` split at its commas outside brackets."""
    items, depth, item = [], 0, ""
    for char in text:
        if char == "," and depth == 0:
            items.append(item)
            item = ""
            continue
        depth += (char in "([") - (char in ")]")
        item += char
    if item.strip():
        items.append(item)
    return items


def ints(text: str) -> tuple[int, ...] | None:
    """The integers of ``sizes`` or ``strides`` text; None where one is symbolic."""
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        return None


def returned_names(statement: str) -> list[str]:
    inner = statement[len("return "):].strip()
    inner = inner[1:-1] if inner.startswith("(") else inner
    names = []
    for item in top_level(inner):
        match = re.match(r"\s*(?:reinterpret_tensor\()?(\w+)", item)
        if item.strip():
            names.append(match[1] if match else "")
    return names
