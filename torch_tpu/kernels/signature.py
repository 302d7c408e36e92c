"""A JAX function's annotations as a `torch.library` schema: which arguments are tensors and which are static.

`jax.Array` is a Tensor, `Optional[jax.Array]` a `Tensor?`, `list[jax.Array]` a `Tensor[]`; `int`, `float`,
`bool` and `str` (optional or not, and lists of int or float) are static arguments, compiled into the kernel's
program, with their defaults. A return of `jax.Array`, a tuple of them or a list of them gives one output, several
or a `Tensor[]`. Anything else is refused here, naming the parameter, rather than failing later inside a trace.
`describe` names a call's arguments by those parameters, for errors and for the ranks' per-call check.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import inspect
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any

import jax
import torch

_STATIC = {int: "int", float: "float", bool: "bool", str: "str"}
_STATIC_LISTS = {int: "int[]", float: "float[]"}
ARRAY, OPTIONAL, LIST, STATIC = "array", "optional", "list", "static"


@dataclasses.dataclass(frozen=True)
class Param:
    """One parameter of a kernel function: its name, kind (ARRAY, OPTIONAL, LIST or STATIC), schema type and its
    schema text (type, name and default)."""

    name: str
    kind: str
    type: str
    schema: str


@dataclasses.dataclass(frozen=True)
class Signature:
    """A kernel function's parameters and outputs as a schema (`schema`, without the op's name)."""

    params: tuple[Param, ...]
    returns: str  # "single", "tuple" or "list"
    schema: str

    @property
    def arrays(self) -> tuple[Param, ...]:
        return tuple(p for p in self.params if p.kind != STATIC)

    @property
    def statics(self) -> tuple[Param, ...]:
        return tuple(p for p in self.params if p.kind == STATIC)


def _optional_of(annotation: Any) -> Any:
    """X for `Optional[X]` / `X | None`, else None."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        others = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(others) == 1 and len(typing.get_args(annotation)) == 2:
            return others[0]
    return None


def _list_of(annotation: Any) -> Any:
    """X for `list[X]` / `Sequence[X]` / `tuple[X, ...]`, else None."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (list, collections.abc.Sequence) and len(args) == 1:
        return args[0]
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return args[0]
    return None


def _param_type(annotation: Any) -> tuple[str, str] | None:
    if annotation is jax.Array:
        return ARRAY, "Tensor"
    if annotation in _STATIC:
        return STATIC, _STATIC[annotation]
    inner = _optional_of(annotation)
    if inner is jax.Array:
        return OPTIONAL, "Tensor?"
    if inner in _STATIC:
        return STATIC, _STATIC[inner] + "?"
    element = _list_of(annotation)
    if element is jax.Array:
        return LIST, "Tensor[]"
    if element in _STATIC_LISTS:
        return STATIC, _STATIC_LISTS[element]
    return None


def _default_text(value: Any) -> str:
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    if isinstance(value, str) and '"' not in value and "\\" not in value:  # schemas have no escapes
        return f'"{value}"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_default_text(v) for v in value) + "]"
    raise TypeError(repr(value))


def _returns(name: str, annotation: Any) -> tuple[str, str]:
    if annotation is jax.Array:
        return "single", "Tensor"
    if _list_of(annotation) is jax.Array and typing.get_origin(annotation) is not tuple:
        return "list", "Tensor[]"
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is tuple and args and Ellipsis not in args and all(a is jax.Array for a in args):
        return "tuple", "(" + ", ".join(["Tensor"] * len(args)) + ")"
    raise TypeError(
        f"torch_tpu: jax_op {name!r}: the return annotation {annotation!r} is not supported; annotate "
        f"`-> jax.Array`, `-> tuple[jax.Array, jax.Array]` (a fixed number of outputs) or `-> list[jax.Array]`"
    )


def of(name: str, fn: Callable) -> Signature:
    """The schema of kernel function `fn`, registered as op `name`, from its annotations; TypeError naming the
    parameter for one that has no tensor or static meaning."""
    annotated = fn
    while isinstance(annotated, functools.partial):  # its signature is the partial's, its annotations the function's
        annotated = annotated.func
    try:
        hints = typing.get_type_hints(annotated)
    except Exception as error:
        raise TypeError(f"torch_tpu: jax_op {name!r}: cannot read the annotations of {fn!r}: {error}") from error
    params = []
    texts = []
    for parameter in inspect.signature(fn).parameters.values():
        where = f"torch_tpu: jax_op {name!r}: parameter {parameter.name!r}"
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise TypeError(f"{where}: *args and **kwargs have no schema; name each argument")
        if parameter.kind == parameter.POSITIONAL_ONLY:
            raise TypeError(f"{where} is positional-only; the op passes arguments by name")
        if parameter.name not in hints:
            raise TypeError(
                f"{where} has no annotation; annotate jax.Array for a tensor, int/float/bool/str for a static"
            )
        found = _param_type(hints[parameter.name])
        if found is None:
            raise TypeError(
                f"{where}: annotation {hints[parameter.name]!r} is not supported; use jax.Array, "
                f"Optional[jax.Array], list[jax.Array], or int/float/bool/str (optional, or lists of int/float)"
            )
        kind, type_text = found
        if kind != STATIC and parameter.kind == parameter.KEYWORD_ONLY:
            raise TypeError(f"{where}: a tensor argument cannot be keyword-only (torch.library custom ops)")
        text = f"{type_text} {parameter.name}"
        if parameter.default is not parameter.empty:
            if kind in (ARRAY, LIST) or kind == OPTIONAL and parameter.default is not None:
                raise TypeError(f"{where}: a tensor argument's only default is None (annotate it Optional)")
            try:
                text += "=" + _default_text(parameter.default)
            except TypeError:
                raise TypeError(f"{where}: default {parameter.default!r} cannot be written in a schema") from None
        if parameter.kind == parameter.KEYWORD_ONLY and "*" not in texts:
            texts.append("*")
        texts.append(text)
        params.append(Param(parameter.name, kind, type_text, text))
    if not any(p.kind != STATIC for p in params):
        raise TypeError(f"torch_tpu: jax_op {name!r}: {fn!r} takes no jax.Array argument (an op needs a tensor)")
    if "return" not in hints:
        raise TypeError(f"torch_tpu: jax_op {name!r}: {fn!r} has no return annotation (e.g. `-> jax.Array`)")
    returns, return_text = _returns(name, hints["return"])
    return Signature(tuple(params), returns, f"({', '.join(texts)}) -> {return_text}")


def describe(args: tuple, kwargs: dict, names: Sequence[str]) -> str:
    """A call's arguments as its errors and the ranks' per-call check name them: tensors by dtype and shape."""

    def one(value: Any) -> str:
        if isinstance(value, torch.Tensor):
            return f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
        if isinstance(value, (list, tuple)):
            return "[" + ", ".join(one(v) for v in value) + "]"
        return repr(value)

    given = [f"{name}: {one(value)}" for name, value in zip(names, args, strict=False)]
    return ", ".join(given + [f"{name}: {one(value)}" for name, value in kwargs.items()])
