"""A command's options dataclass from its parsed command line: the flags named after fields fill them."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")

# What cli.py's parser records besides the flags (the subcommand's name, its function): never a field's value.
_PARSER_ENTRIES = frozenset({"command", "func"})


def options(cls: type[T], args: argparse.Namespace, **given: Any) -> T:
    """A `cls` (a dataclass) whose each field is `given[field]` if given, else the parsed flag of the same name
    (`--max-batch` for `max_batch`) if there is one; a value of None (given, or a flag not set) leaves the field's
    default. `given` holds the fields whose flag is named otherwise or needs converting (a path, a tuple)."""
    names = {field.name for field in dataclasses.fields(cls)}
    if set(given) - names:
        raise TypeError(f"{cls.__name__} has no fields {sorted(set(given) - names)}")
    values = {}
    for name in names:
        value = given[name] if name in given else None if name in _PARSER_ENTRIES else getattr(args, name, None)
        if value is not None:
            values[name] = value
    return cls(**values)
