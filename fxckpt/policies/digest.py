"""A policy as text two processes agree on, for the plan cache's key
(fxckpt/planning/cache.py), or ``Unkeyable`` saying why there is none.

Python's ``hash()`` will not do: it is salted per process for strings. A
policy from the vocabulary is a frozen value, written out field by field.
A selective-checkpoint function is written out as its code: bytecode,
constants, names, defaults, and the values its closure cells and the
globals it names hold. That is sound only while the function cannot
answer differently for the same code, so these make it unkeyable:

- a closure cell or global holding anything but a plain immutable value
  (None, bool, numbers, str, bytes, ops, enum members, tuples and
  frozensets of those), a module, a class of Python or torch, or another
  function keyable the same way: a list or dict can change between calls,
  or be a counter the function keeps;
- a function that rebinds a global or a variable of an enclosing scope
  (``global n; n += 1``): a graph served from cache would skip the call
  that moves it on, and later graphs would be planned differently;
- any callable that is not a plain function (a bound method, a
  ``functools.partial``, an object with ``__call__``).
"""

from __future__ import annotations

import builtins
import dataclasses
import dis
import enum
import types


from fxckpt.compat.ops import HigherOrderOperator, OpOverload, OpOverloadPacket
from fxckpt.policies.api import Policy

_PLAIN = (type(None), bool, int, float, complex, str, bytes)
_OPS = (OpOverload, OpOverloadPacket)
# Modules whose classes are named in a digest rather than written out: their
# code is fixed by the Python and torch versions and fxckpt's own source,
# which the plan cache's key holds.
_KNOWN_MODULES = ("builtins", "torch", "fxckpt", "enum", "typing", "operator", "math")
_REBINDS = {"STORE_GLOBAL", "DELETE_GLOBAL", "STORE_DEREF", "DELETE_DEREF"}


class Unkeyable(Exception):
    """A value the plan cache cannot key; the message says which and why."""


def policy_text(policy) -> str:
    """A Policy value written out (see the module docstring)."""
    if not isinstance(policy, Policy):
        raise Unkeyable(f"{policy!r} is not a policy from fxckpt.policies")
    return encode(policy)


def function_text(fn) -> str:
    """A selective-checkpoint function written out (see the module docstring)."""
    return _function(fn, set())


def encode(value, seen: set[int] | None = None) -> str:
    """``value`` as text, or Unkeyable."""
    seen = set() if seen is None else seen
    if isinstance(value, enum.Enum):
        return f"enum:{_class_name(type(value))}.{value.name}"
    if isinstance(value, _PLAIN):
        return f"{type(value).__name__}:{value!r}"
    if isinstance(value, _OPS):
        return f"op:{value}"
    if isinstance(value, HigherOrderOperator):
        return f"op:{value.name()}"
    if isinstance(value, tuple):
        return "(" + ",".join(encode(v, seen) for v in value) + ")"
    if isinstance(value, frozenset):
        return "frozenset(" + ",".join(sorted(encode(v, seen) for v in value)) + ")"
    if isinstance(value, Policy) and dataclasses.is_dataclass(value):
        return _policy(value, seen)
    if isinstance(value, types.FunctionType):
        return _function(value, seen)
    if isinstance(value, types.ModuleType):
        return f"module:{value.__name__}"
    if isinstance(value, (type, types.BuiltinFunctionType)) and _known(value):
        return f"named:{_class_name(value)}"
    raise Unkeyable(f"{_what(value)} is not a plain immutable value")


def _policy(policy: Policy, seen: set[int]) -> str:
    cls = type(policy)
    parts = [f"policy:{_class_name(cls)}"]
    if not _known(cls):
        # A user's Policy subclass: its methods are part of what it answers.
        parts += [f"{name}={_function(member, seen)}" for name, member in
                  sorted(vars(cls).items()) if isinstance(member, types.FunctionType)]
    parts += [f"{field.name}={encode(getattr(policy, field.name), seen)}"
              for field in dataclasses.fields(policy)]
    return "[" + ";".join(parts) + "]"


def _function(fn, seen: set[int]) -> str:
    if not isinstance(fn, types.FunctionType):
        raise Unkeyable(f"{_what(fn)} is not a plain function")
    if id(fn) in seen:   # recursion: the function is being written out already
        return f"function-ref:{fn.__qualname__}"
    seen.add(id(fn))
    what = f"policy function {fn.__qualname__}"
    parts = [f"function:{fn.__qualname__}", _code(fn.__code__, what)]
    for label, values in (("defaults", fn.__defaults__ or ()),
                          ("kwdefaults", tuple(sorted((fn.__kwdefaults__ or {}).items())))):
        parts.append(f"{label}={_named(values, seen, f'{what}: a default')}")
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        try:
            contents = cell.cell_contents
        except ValueError:
            parts.append(f"cell {name}=empty")
            continue
        parts.append(f"cell {name}={_named(contents, seen, f'{what}: closure variable {name}')}")
    for name in sorted(_names(fn.__code__)):
        if name in fn.__globals__:
            value = _named(fn.__globals__[name], seen, f"{what}: global {name}")
            parts.append(f"global {name}={value}")
        elif hasattr(builtins, name):
            parts.append(f"builtin {name}")
    return "{" + ";".join(parts) + "}"


def _named(value, seen: set[int], where: str) -> str:
    try:
        return encode(value, seen)
    except Unkeyable as error:
        if str(error).startswith(where):
            raise
        raise Unkeyable(f"{where} holds {error}") from None


def _code(code: types.CodeType, what: str) -> str:
    for instruction in dis.get_instructions(code):
        if instruction.opname in _REBINDS and instruction.argval not in code.co_cellvars:
            raise Unkeyable(f"{what} rebinds {instruction.argval!r}, state kept across calls")
    consts = ",".join(_code(c, what) if isinstance(c, types.CodeType) else encode(c)
                      for c in code.co_consts)
    return (f"code({code.co_code.hex()};{code.co_argcount},{code.co_kwonlyargcount},"
            f"{code.co_flags};names={code.co_names};vars={code.co_varnames};"
            f"free={code.co_freevars};cells={code.co_cellvars};consts={consts})")


def _names(code: types.CodeType) -> set[str]:
    """Global or attribute names read by ``code`` and the code nested in it."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _known(obj) -> bool:
    return (getattr(obj, "__module__", None) or "builtins").split(".")[0] in _KNOWN_MODULES


def _class_name(obj) -> str:
    return f"{getattr(obj, '__module__', None) or 'builtins'}.{obj.__qualname__}"


def _what(value) -> str:
    text = repr(value)
    return f"{text[:60]}{'...' if len(text) > 60 else ''} ({type(value).__name__})"
