"""Bounded dynamic shapes: `torch.compile(backend="tpu", options={"num_dynamic_buckets": N, "bucket_size": B})`.

XLA compiles static shapes, so a graph with a dynamic dimension would compile a program per size. With buckets,
a real size n runs in the program compiled for the padded size S = ceil(n / B) * B: inputs are zero-padded to S,
outputs are sliced back to n, and a graph compiles at most N programs.

The invariant every value keeps: an axis of size c*s (s a dynamic size, c a constant) holds the real values in
its first c*n entries, in the unpadded computation's order; the padding after them may hold anything, even
inf/nan. Ops that treat positions independently (elementwise, views that keep each dynamic size outermost in the
axes they merge or split, reductions over other axes, contractions over other axes) keep it for free: garbage
stays in the padding. Ops that combine values along a padded axis get their padded inputs masked (`jnp.where`, as
the garbage may be nan) to the op's identity first: 0 for sums and contractions, -inf for maxima and softmax; means
divide by the real count and NLL losses ignore padded targets. A graph with any other op touching a padded axis is
not bucketable: it warns and compiles one program per exact size, as without the options.

Inside the program shapes see the padded sizes as static ints; where the graph uses a size as a value (a divisor,
a scale) or a mask needs the real size, it reads an extra traced scalar input, so one executable serves every n
of its bucket.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import operator
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import sympy
import torch
from torch._ops import OpOverload
from torch.fx.node import map_aggregate

from torch_tpu.compile.graph import user_line
from torch_tpu.ops.registry import graph_lowering

aten = torch.ops.aten

MAX_BUCKETS = 8

Axis = tuple[sympy.Symbol, int] | None  # a padded axis of size c*s, as (s, c); None: a static axis
Layout = tuple[Axis, ...]


@dataclasses.dataclass(frozen=True)
class Options:
    """How many padded programs a graph may compile, and the multiple dynamic sizes are padded to."""

    num_buckets: int = MAX_BUCKETS
    bucket_size: int = 128

    @classmethod
    def parse(cls, options: dict) -> Options | None:
        """The bucket options of `torch.compile(options=...)`; None when neither is given (a program per size)."""
        given = {"num_buckets": options.get("num_dynamic_buckets"), "bucket_size": options.get("bucket_size")}
        if all(value is None for value in given.values()):
            return None
        parsed = cls(**{field: value for field, value in given.items() if value is not None})
        for name, value, high in (
            ("num_dynamic_buckets", parsed.num_buckets, MAX_BUCKETS),
            ("bucket_size", parsed.bucket_size, None),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1 or value > (high or value):
                limit = f" up to {high}" if high else ""
                raise ValueError(f"torch_tpu: option {name} must be a positive int{limit}, got {value!r}")
        return parsed


class NotBucketable(Exception):
    """A graph that cannot run padded; says which node and why."""


# Ops that move or copy positions without combining them (pointwise-tagged ops count too).
_LOCAL = {
    aten._to_copy.default,
    aten.copy.default,
    aten.copy_.default,
    aten.detach.default,
    aten.alias.default,
    aten.lift_fresh_copy.default,
    aten.permute.default,
    aten.expand.default,
    aten.t.default,
    aten.transpose.int,
    aten.full_like.default,
    aten.zeros_like.default,
    aten.ones_like.default,
    aten.empty_like.default,
    aten.rand_like.default,
    aten.randn_like.default,
    aten.bernoulli.p,
    aten.native_dropout.default,
    aten.embedding.default,
    # size queries: shapes use padded sizes; where a size is used as a value, its consumer reads the real one
    aten.sym_size.int,
    aten.sym_numel.default,
    aten.sym_storage_offset.default,
}
# Reshapes: local when every group of axes they merge or split keeps its dynamic size outermost.
_RESHAPES = {
    aten.view.default,
    aten._unsafe_view.default,
    aten._reshape_alias.default,
    aten.reshape.default,
    aten.squeeze.dim,
    aten.squeeze.dims,
    aten.squeeze.default,
    aten.unsqueeze.default,
}
# The contracted axis of each tensor argument (by position) of the matrix products.
_CONTRACTED = {
    aten.mm.default: (1, 0),
    aten.bmm.default: (2, 1),
    aten.dot.default: (0, 0),
    aten.addmm.default: (None, 1, 0),
    aten.baddbmm.default: (None, 2, 1),
}
_INF = float("inf")
# The value padding is masked to before an op that combines values along a padded axis: its identity.
_IDENTITY = {
    **dict.fromkeys(_CONTRACTED, 0),
    **dict.fromkeys(
        [
            aten.sum.dim_IntList,
            aten.sum.default,
            aten._softmax_backward_data.default,
            aten._log_softmax_backward_data.default,
            aten.native_layer_norm_backward.default,
            aten.embedding_dense_backward.default,
            aten.convolution_backward.default,
        ],
        0,
    ),
    **dict.fromkeys(
        [
            aten.amax.default,
            aten.max.dim,
            aten.max.default,
            aten.argmax.default,
            aten._softmax.default,
            aten._log_softmax.default,
            aten.logsumexp.default,
        ],
        -_INF,
    ),
    **dict.fromkeys([aten.amin.default, aten.min.dim, aten.min.default, aten.argmin.default], _INF),
}
# Means: computed as the sum over the real values, then divided by their real count.
_MEANS = {aten.mean.dim: aten.sum.dim_IntList, aten.mean.default: aten.sum.default}
_NLL = {aten.nll_loss_forward.default, aten.nll_loss_backward.default}
_MSE = {aten.mse_loss.default, aten.mse_loss_backward.default}
_MEAN_REDUCTION, _SUM_REDUCTION = 1, 2
_VALUE_TYPES = {"Tensor", "number", "float", "Optional[Tensor]", "Optional[number]", "Optional[float]"}


@dataclasses.dataclass
class _Rewrite:
    """How one node runs padded (see `_rewrite`); the default changes nothing."""

    values: set[str] = dataclasses.field(default_factory=set)  # arguments whose sizes are read as real values
    fills: dict[torch.fx.Node, float] = dataclasses.field(default_factory=dict)  # inputs masked to this first
    replace: dict[str, Any] = dataclasses.field(default_factory=dict)  # arguments given a new value
    target: OpOverload | None = None  # the summing op replacing a mean
    divisor: sympy.Expr | None = None  # the real count a mean's sum is divided by


@dataclasses.dataclass
class Plan:
    """A graph rewritten to run padded, and how to pad its inputs and slice its outputs.

    `gm` takes the original inputs (tensors padded, int inputs at padded sizes) followed by one traced scalar
    per expression in `reals`, each evaluated at the real sizes.
    """

    gm: torch.fx.GraphModule
    symbols: tuple[sympy.Symbol, ...]
    sources: tuple[tuple[int, int | None, int], ...]  # per symbol: (input, axis or None for an int input, c)
    inputs: tuple[Layout | sympy.Expr | None, ...]  # per input: a tensor's layout, an int's expression
    outputs: tuple[Layout | sympy.Expr | None, ...]  # per output likewise
    reals: tuple[sympy.Expr, ...]

    def sizes(self, inputs: Sequence[Any]) -> tuple[int, ...]:
        """The real size of each dynamic symbol, read from the call's inputs."""
        return tuple((inputs[i] if axis is None else inputs[i].shape[axis]) // c for i, axis, c in self.sources)

    def named(self, sizes: tuple[int, ...]) -> str:
        """`s0=5, s1=7`: sizes by symbol, for messages."""
        return ", ".join(f"{s}={n}" for s, n in zip(self.symbols, sizes, strict=True))

    def bucket(self, sizes: tuple[int, ...], bucket_size: int) -> tuple[int, ...]:
        """The padded size of each symbol: the next multiple of `bucket_size`."""
        return tuple(-(-n // bucket_size) * bucket_size for n in sizes)

    def pad(self, inputs: Sequence[Any], sizes: tuple[int, ...], bucket: tuple[int, ...]) -> list[Any]:
        """The program's inputs: tensors zero-padded, int inputs at the padded sizes, then the real values."""
        padded = dict(zip(self.symbols, bucket, strict=True))
        real = dict(zip(self.symbols, sizes, strict=True))
        result = []
        for value, spec in zip(inputs, self.inputs, strict=True):
            if isinstance(spec, sympy.Expr):
                value = _evaluate(spec, padded)
            elif spec is not None and any(spec):
                value = jnp.pad(value, [(0, 0) if a is None else (0, a[1] * (padded[a[0]] - real[a[0]])) for a in spec])
            result.append(value)
        return result + list(_real_values(self.reals, self.symbols, sizes))

    def finish(self, outputs: list[Any], mutations: Sequence[tuple[int, int]], sizes: tuple[int, ...]) -> list[Any]:
        """The program's outputs at the real sizes: tensors and written-back inputs sliced, sizes evaluated."""
        real = dict(zip(self.symbols, sizes, strict=True))
        specs = {**dict(enumerate(self.outputs)), **{position: self.inputs[i] for i, position in mutations}}
        for position, spec in specs.items():
            if isinstance(spec, sympy.Expr):
                outputs[position] = _evaluate(spec, real)
            elif spec is not None and any(spec) and outputs[position] is not None:  # None: a passthrough
                outputs[position] = outputs[position][
                    tuple(slice(None) if a is None else slice(0, a[1] * real[a[0]]) for a in spec)
                ]
        return outputs


def plan(gm: torch.fx.GraphModule, name: str) -> Plan | None:
    """The padded form of `gm`, or None when it has no dynamic size or cannot run padded (then with a warning
    naming the op: the graph compiles one program per exact size)."""
    try:
        return _plan(gm)
    except NotBucketable as error:
        warnings.warn(
            f"torch_tpu: graph '{name}' cannot use dynamic-shape buckets: {error}; it compiles one "
            "program per exact size instead",
            stacklevel=3,
        )
        return None


def _plan(gm: torch.fx.GraphModule) -> Plan | None:
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    specs = []
    for node in placeholders:
        with _at(node):
            specs.append(_spec(node))
    sources = {}
    for index, spec in enumerate(specs):
        if isinstance(spec, sympy.Symbol):
            sources.setdefault(spec, (index, None, 1))
        for axis, padded in enumerate(spec if isinstance(spec, tuple) else ()):
            if padded is not None:
                sources.setdefault(padded[0], (index, axis, padded[1]))
    if not sources:
        return None
    symbols = tuple(sorted(sources, key=str))
    rewrites, reals = {}, dict.fromkeys(symbols)
    for node in nodes:
        with _at(node):
            unknown = _free_symbols(node.meta.get("val")) - set(symbols)
            if unknown:
                raise NotBucketable(f"sizes {sorted(map(str, unknown))} that no input carries")
            if node.op != "call_function":
                continue
            if not isinstance(node.target, OpOverload):
                if node.target is not operator.getitem and any(
                    isinstance(a.meta.get("val"), torch.Tensor) for a in node.all_input_nodes
                ):
                    raise NotBucketable("a call on tensors that is not an ATen op")
                continue
            rewrite = _rewrite(node)
            if rewrite != _Rewrite():
                rewrites[node] = rewrite
                reals.update(dict.fromkeys(_sym_expr(a) for a in _value_sizes(node, rewrite.values)))
                reals.update(dict.fromkeys([rewrite.divisor] if rewrite.divisor is not None else []))
    output = next(n for n in nodes if n.op == "output")
    return Plan(
        gm=_build(gm, rewrites, tuple(reals)),
        symbols=symbols,
        sources=tuple(sources[s] for s in symbols),
        inputs=tuple(specs),
        outputs=tuple(_spec(o) if isinstance(o, torch.fx.Node) else None for o in output.args[0]),
        reals=tuple(reals),
    )


@contextlib.contextmanager
def _at(node: torch.fx.Node) -> Iterator[None]:
    """Name the node (and the user's source line) in a NotBucketable raised within."""
    try:
        yield
    except NotBucketable as error:
        raise NotBucketable(f"{error} ('{node.target}', from: {user_line(node)})") from None


def _rewrite(node: torch.fx.Node) -> _Rewrite:
    """How `node` keeps the invariant, or NotBucketable. Sizes used as values are read as real values.

    Ops with no padded input, moving ops and pointwise ones need nothing; any other op's family rule
    (`_RULES`, `_combining` for the rest) decides."""
    rewrite = _Rewrite(values=_value_arguments(node))
    for value in _flat(node.meta.get("val")):
        _layout(value)  # every size must be static or c*s
    inputs = [a for a in node.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)]
    padded = [a for a in inputs if any(_layout(a.meta["val"]))]
    if not padded or node.target in _LOCAL or torch.Tag.pointwise in node.target.tags:
        return rewrite
    return _RULES.get(node.target, _combining)(node, rewrite, inputs, padded)


# A rule: (node, its rewrite so far, its tensor inputs, the padded ones) -> its rewrite, or NotBucketable.
_Rule = Callable[[torch.fx.Node, _Rewrite, list[torch.fx.Node], list[torch.fx.Node]], _Rewrite]
_RULES: dict[OpOverload, _Rule] = {}


def _rule(*ops: OpOverload) -> Callable[[_Rule], _Rule]:
    """Register the rule of an op family (next to it, as JAX's lax registers rules next to each primitive)."""

    def register(rule: _Rule) -> _Rule:
        for op in ops:
            _RULES[op] = rule
        return rule

    return register


def _filled_with_identity(node: torch.fx.Node, rewrite: _Rewrite, padded: list[torch.fx.Node]) -> _Rewrite:
    """The padded inputs masked to the op's identity first (`_IDENTITY`)."""
    return dataclasses.replace(rewrite, fills=dict.fromkeys(padded, _IDENTITY[node.target]))


@_rule(*_RESHAPES)
def _reshape(node: torch.fx.Node, rewrite: _Rewrite, inputs: list, padded: list) -> _Rewrite:
    if not _keeps_prefix(node.args[0].meta["val"].shape, node.meta["val"].shape):
        raise NotBucketable("a reshape that interleaves padding with real values")
    return rewrite


@_rule(*_CONTRACTED)
def _contraction(node: torch.fx.Node, rewrite: _Rewrite, inputs: list, padded: list) -> _Rewrite:
    tensors = [a for a in node.args if isinstance(a, torch.fx.Node)]
    if not any(
        axis is not None and _layout(a.meta["val"])[axis]
        for a, axis in zip(tensors, _CONTRACTED[node.target], strict=False)
    ):
        return rewrite
    return _filled_with_identity(node, rewrite, padded)


@_rule(aten.native_layer_norm.default, aten.native_layer_norm_backward.default)
def _layer_norm(node: torch.fx.Node, rewrite: _Rewrite, inputs: list, padded: list) -> _Rewrite:
    normalized = len(_argument(node, "normalized_shape"))
    if any(_layout(_argument(node, "input").meta["val"])[-normalized:]):
        raise NotBucketable("a layer norm over a padded axis")
    if node.target is aten.native_layer_norm.default:
        return rewrite
    return _filled_with_identity(node, rewrite, padded)  # the weight and bias gradients sum over the other axes


@_rule(aten.convolution.default, aten.convolution_backward.default)
def _convolution(node: torch.fx.Node, rewrite: _Rewrite, inputs: list, padded: list) -> _Rewrite:
    if _argument(node, "weight") in padded or any(any(_layout(a.meta["val"])[1:]) for a in padded):
        raise NotBucketable("a convolution over a padded channel or spatial axis")
    if node.target is aten.convolution.default:
        return rewrite  # per sample; the backward's weight and bias gradients sum over the batch
    return _filled_with_identity(node, rewrite, padded)


@_rule(aten.slice.Tensor)
def _slice(node: torch.fx.Node, rewrite: _Rewrite, inputs: list, padded: list) -> _Rewrite:
    if not _layout(node.args[0].meta["val"])[_argument(node, "dim") % node.args[0].meta["val"].ndim]:
        return rewrite
    if _argument(node, "start") in (None, 0) and _argument(node, "step") == 1:
        return rewrite  # a prefix of a padded axis: the real part of the result is a prefix too
    raise NotBucketable("a slice of a padded axis that does not start at 0")


@_rule(*_NLL)
def _nll(node: torch.fx.Node, rewrite: _Rewrite, inputs: list, padded: list) -> _Rewrite:
    labels = _argument(node, "target")  # padded targets become ignored ones: no loss, no weight, no gradient
    return dataclasses.replace(rewrite, fills={labels: _argument(node, "ignore_index")} if labels in padded else {})


@_rule(*_MSE)
def _mse(node: torch.fx.Node, rewrite: _Rewrite, inputs: list, padded: list) -> _Rewrite:
    if _argument(node, "reduction", _MEAN_REDUCTION) == _MEAN_REDUCTION:
        rewrite.replace["reduction"] = _SUM_REDUCTION
        rewrite.divisor = _numel(_argument(node, "self").meta["val"].shape)
    if node.target is aten.mse_loss.default:
        rewrite.fills = dict.fromkeys(padded, 0)
    return rewrite


@_rule(aten.embedding_dense_backward.default)
def _embedding_backward(node: torch.fx.Node, rewrite: _Rewrite, inputs: list, padded: list) -> _Rewrite:
    if _argument(node, "scale_grad_by_freq"):
        raise NotBucketable("scale_grad_by_freq counts padded indices")
    return _filled_with_identity(node, rewrite, padded)


def _combining(node: torch.fx.Node, rewrite: _Rewrite, inputs: list, padded: list) -> _Rewrite:
    """Every other op: free along static axes; a mean or an op with an identity (`_IDENTITY`) masks a padded
    one; anything else is NotBucketable."""
    dims = _dims(node)
    if dims is not None and not any(
        _layout(a.meta["val"])[d] for a in padded if a.meta["val"].ndim == inputs[0].meta["val"].ndim for d in dims
    ):
        return rewrite  # reduces, sorts, concatenates... along static axes only
    if node.target in _MEANS:
        shape = inputs[0].meta["val"].shape
        reduced = range(len(shape)) if dims is None else dims
        return dataclasses.replace(
            rewrite,
            fills=dict.fromkeys(padded, 0),
            target=_MEANS[node.target],
            divisor=_numel([shape[d] for d in reduced]),
        )
    if node.target not in _IDENTITY:
        raise NotBucketable("it combines values along a padded axis and has no masked form")
    return _filled_with_identity(node, rewrite, padded)


def _value_arguments(node: torch.fx.Node) -> set[str]:
    """Names of the arguments where the node uses a dynamic size as a value (read as the real size at run
    time); sizes in shape arguments stay padded. Any other use of a dynamic size is NotBucketable."""
    lowering = graph_lowering(node.target)
    static = lowering.static if lowering is not None else frozenset()
    values = set()
    for argument in node.target._schema.arguments:
        if not _value_sizes(node, {argument.name}):
            continue
        start, step = _argument(node, "start"), _argument(node, "step", 1)
        if (
            argument.name == "end"
            and node.target in (aten.slice.Tensor, aten.arange.start_step)
            and start in (None, 0)
            and step == 1
        ):
            continue  # a prefix: padded end, real values first
        if str(argument.type) in _VALUE_TYPES and argument.name not in static:
            values.add(argument.name)
        elif str(argument.type) != "List[int]" or argument.name not in ("size", "shape", "stride"):
            raise NotBucketable(f"a dynamic size as its argument '{argument.name}'")
    return values


def _build(
    gm: torch.fx.GraphModule, rewrites: dict[torch.fx.Node, _Rewrite], reals: tuple[sympy.Expr, ...]
) -> torch.fx.GraphModule:
    """`gm` with the real values as trailing inputs, masks before the nodes that need them, means as sums."""
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    nodes = list(gm.graph.nodes)
    for node in nodes:
        if node.op == "placeholder":
            env[node] = graph.node_copy(node)
    real = {expr: graph.placeholder(f"real_{i}") for i, expr in enumerate(reals)}
    for node in nodes:
        if node.op == "placeholder":
            continue
        rewrite = rewrites.get(node)
        env[node] = (
            graph.node_copy(node, env.__getitem__) if rewrite is None else _apply(graph, node, rewrite, env, real)
        )
    return torch.fx.GraphModule(gm, graph)


def _apply(
    graph: torch.fx.Graph,
    node: torch.fx.Node,
    rewrite: _Rewrite,
    env: dict[torch.fx.Node, torch.fx.Node],
    real: dict[sympy.Expr, torch.fx.Node],
) -> torch.fx.Node:
    masked = {}
    for a, fill in rewrite.fills.items():
        limits = tuple((axis, p[1], real[p[0]]) for axis, p in enumerate(_layout(a.meta["val"])) if p is not None)
        masked[a] = graph.call_function(_masked, (env[a], limits, fill))
        masked[a].meta = {"val": a.meta["val"]}

    def argument(name: str, value: Any) -> Any:
        def one(a: Any) -> Any:
            if not isinstance(a, torch.fx.Node):
                return a
            if name in rewrite.values and _sym_expr(a) is not None:
                return real[_sym_expr(a)]
            return masked.get(a, env[a])

        return rewrite.replace[name] if name in rewrite.replace else map_aggregate(value, one)

    names = [a.name for a in node.target._schema.arguments if not a.kwarg_only]
    args = tuple(argument(n, v) for n, v in zip(names, node.args, strict=False))
    kwargs = {k: argument(k, v) for k, v in node.kwargs.items()}
    kwargs.update({k: v for k, v in rewrite.replace.items() if k not in names[: len(args)] and k not in kwargs})
    result = graph.call_function(rewrite.target or node.target, args, kwargs)
    result.meta = dict(node.meta)
    if rewrite.divisor is not None:
        result = graph.call_function(aten.div.Tensor, (result, real[rewrite.divisor]))
        result.meta = dict(node.meta)
    return result


def _masked(value: jax.Array, limits: tuple[tuple[int, int, jax.Array], ...], fill: float) -> jax.Array:
    """`value` with every entry past the real size of a padded axis set to `fill` (a where, not a product:
    padding may hold inf or nan). `limits` holds (axis, c, real size) per padded axis."""
    keep = functools.reduce(
        jnp.logical_and, [jax.lax.broadcasted_iota(jnp.int32, value.shape, axis) < c * n for axis, c, n in limits]
    )
    if math.isinf(fill) and not jnp.issubdtype(value.dtype, jnp.inexact):
        fill = (
            (jnp.iinfo(value.dtype).min if fill < 0 else jnp.iinfo(value.dtype).max)
            if jnp.issubdtype(value.dtype, jnp.integer)
            else fill > 0
        )
    return jnp.where(keep, value, jnp.asarray(fill, value.dtype))


def _keeps_prefix(source: Sequence[Any], result: Sequence[Any]) -> bool:
    """Whether a reshape keeps the invariant: in each group of axes it merges or splits, only the outermost
    size on either side is dynamic, so row-major order puts the group's real values first, as unpadded."""
    source, result = ([e for e in map(_expr, shape) if e != 1] for shape in (source, result))
    generic, prime = {}, 1_000_000  # distinct large primes for the symbols: no accidental equal products
    for symbol in sorted(set().union(*(e.free_symbols for e in source + result)), key=str):
        generic[symbol] = prime = sympy.nextprime(prime)

    def value(exprs: list[sympy.Expr]) -> int:
        return math.prod(int(e.xreplace(generic)) for e in exprs)

    i = j = 0
    while i < len(source) and j < len(result):
        left, right = [source[i]], [result[j]]
        i, j = i + 1, j + 1
        while value(left) != value(right):
            if value(left) < value(right):
                left.append(source[i])
                i += 1
            else:
                right.append(result[j])
                j += 1
        if any(e.free_symbols for e in left[1:] + right[1:]):
            return False
    return True


def _layout(value: torch.Tensor) -> Layout:
    return tuple(_axis(size) for size in value.shape)


def _axis(size: Any) -> Axis:
    expr = _expr(size)
    if not expr.free_symbols:
        return None
    coefficient, rest = expr.as_coeff_Mul()
    if isinstance(rest, sympy.Symbol) and coefficient.is_Integer and coefficient > 0:
        return rest, int(coefficient)
    raise NotBucketable(f"a size {expr} that is not a multiple of one dynamic size")


def _spec(node: torch.fx.Node) -> Layout | sympy.Expr | None:
    value = node.meta.get("val")
    if isinstance(value, torch.Tensor):
        return _layout(value)
    return _sym_expr(node)


def _expr(size: Any) -> sympy.Expr:
    return size.node.expr if isinstance(size, torch.SymInt) else sympy.Integer(size)


def _sym_expr(node: torch.fx.Node) -> sympy.Expr | None:
    value = node.meta.get("val")
    return value.node.expr if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)) else None


def _numel(shape: Sequence[Any]) -> sympy.Expr:
    return sympy.Mul(*(_expr(s) for s in shape))


def _flat(value: Any) -> list[torch.Tensor]:
    return [v for v in (value if isinstance(value, (list, tuple)) else [value]) if isinstance(v, torch.Tensor)]


def _free_symbols(value: Any) -> set[sympy.Symbol]:
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return set(value.node.expr.free_symbols)
    return set().union(*(_expr(s).free_symbols for t in _flat(value) for s in t.shape))


def _argument(node: torch.fx.Node, name: str, default: Any = None) -> Any:
    """Argument `name` of an ATen node, positional or keyword, else its schema default."""
    for index, argument in enumerate(node.target._schema.arguments):
        if argument.name == name:
            if name in node.kwargs:
                return node.kwargs[name]
            if index < len(node.args) and not argument.kwarg_only:
                return node.args[index]
            return argument.default_value if argument.has_default_value() else default
    return default


def _value_sizes(node: torch.fx.Node, names: set[str]) -> list[torch.fx.Node]:
    """The dynamic-size nodes within the named arguments of `node`."""
    found: list[torch.fx.Node] = []
    for name in names:
        map_aggregate(
            _argument(node, name),
            lambda a: found.append(a) if isinstance(a, torch.fx.Node) and _sym_expr(a) is not None else a,
        )
    return found


def _dims(node: torch.fx.Node) -> list[int] | None:
    """The axes the node's `dim` argument names (all when None or empty), or None when it has none."""
    if not any(a.name == "dim" for a in node.target._schema.arguments):
        return None
    rank = next(a.meta["val"].ndim for a in node.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor))
    dim = _argument(node, "dim")
    if dim is None or (isinstance(dim, (list, tuple)) and not dim):
        return list(range(rank))
    return [d % max(rank, 1) for d in (dim if isinstance(dim, (list, tuple)) else [dim])]


@functools.lru_cache(maxsize=1024)
def _real_values(
    exprs: tuple[sympy.Expr, ...], symbols: tuple[sympy.Symbol, ...], sizes: tuple[int, ...]
) -> tuple[jax.Array, ...]:
    """The traced scalar inputs at these real sizes (weakly typed, as the Python numbers they stand for)."""
    real = dict(zip(symbols, sizes, strict=True))
    return tuple(jnp.asarray(_evaluate(e, real)) for e in exprs)


def _evaluate(expr: sympy.Expr, sizes: dict[sympy.Symbol, int]) -> int | float | bool:
    value = expr.xreplace({s: sympy.Integer(n) for s, n in sizes.items()})
    if value.is_Boolean:
        return bool(value)
    return int(value) if value.is_Integer else float(value)
