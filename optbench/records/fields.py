"""Whether a record's values have the types its fields declare, read from `Record`'s own annotations (the schema).

A results file edited by hand, or written by another tool, can hold `"peak_memory_bytes": "lots"` or
`"seed": null`. Read as it is, such a value surfaces far away: a TypeError inside a table's arithmetic, a
KeyError inside a pandas groupby. So the reader asks here first and skips that line with a warning naming the
field, as it skips a torn line. Only the outer type is checked, and the elements of lists of numbers or strings:
enough for every table to do its arithmetic.
"""

from __future__ import annotations

import functools
import types
import typing
from typing import Any

from optbench.records.text import clip


class RecordFieldError(ValueError):
    """A record whose field holds a value of another type than the schema's."""


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _fits(value: Any, hint: Any) -> bool:
    if hint is Any:
        return True
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, arg) for arg in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint in (int, float):  # JSON has one number type: 3 is a valid float; True is not a number here
        whole = isinstance(value, int) and not isinstance(value, bool)
        return whole or (hint is float and isinstance(value, float))
    if hint is str:
        return isinstance(value, str)
    if origin is list:  # a list of floats holds null where the value was not finite (Record.to_dict)
        item = float | None if args and args[0] is float else (args[0] if args else Any)
        return isinstance(value, list) and all(_fits(element, item) for element in value)
    if origin is dict:
        return isinstance(value, dict)
    return True


def _kind(hint: Any) -> str:
    """A field's type in words: 'a number', 'a number or null', 'a list'."""
    words = {int: "a whole number", float: "a number", str: "a string", bool: "true or false",
             type(None): "null", list: "a list", dict: "an object"}
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    return " or ".join(dict.fromkeys(words.get(typing.get_origin(arg) or arg, str(arg)) for arg in args))


def field_problem(cls: type, data: dict[str, Any]) -> str | None:
    """The first field of `data` whose value `cls` (a dataclass) does not declare, said in one phrase; None: all
    fit. Fields `cls` does not have are not asked about (a newer schema's fields are left out on read)."""
    hints = _hints(cls)
    for name, value in data.items():
        if name in hints and not _fits(value, hints[name]):
            return f"field {name} is {clip(repr(value), 40)}, not {_kind(hints[name])}"
    return None
