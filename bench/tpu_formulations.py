"""Formulations of the large GPT step's memory-bound ops, timed side by side in plain JAX on this device.

Our lowerings of softmax and log-softmax compute a bfloat16 input in float32 (CPU's accumulation); on a TPU, XLA
may fuse the upcast into one reduction as a second output and write a float32 copy of the input. Each op here is
timed as written in torch_tpu's lowering (`ours`) and in alternatives with the same float32 arithmetic, on the
large step's shapes (logits (8192, 32768), attention scores (16, 12, 512, 512), bfloat16): ms per call (median
of --repeats after a compile), the bytes it must move at least as a floor, and how many elements differ from
`ours` (0: the same numbers). A formulation that wins here is a candidate for the lowering, to be measured in the
step (bench/tpu_step.py).
Usage: python bench/tpu_formulations.py [--repeats N] [--scale S]   (S < 1 shrinks the first dimension: a dry run)
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp

F32, BF16 = jnp.float32, jnp.bfloat16
HBM_GBPS = {"TPU v5 lite": 819.0}  # the v5e's HBM bandwidth, for the floor


def log_softmax_ours(x: jax.Array) -> jax.Array:
    return jax.nn.log_softmax(x.astype(F32), axis=-1).astype(BF16)


def log_softmax_max_low(x: jax.Array) -> jax.Array:
    """The row maximum in the input's dtype (exact), so no reduction reads a float32 copy."""
    shifted = x.astype(F32) - jnp.max(x, axis=-1, keepdims=True).astype(F32)
    return (shifted - jnp.log(jnp.sum(jnp.exp(shifted), axis=-1, keepdims=True))).astype(BF16)


def log_softmax_of_3d(x: jax.Array) -> jax.Array:
    """Ours on the logits as the compiled model hands them over, (batch, seq, vocab), read as the (batch * seq,
    vocab) view the loss takes (Strict eager reads a reshaped view inside the op's program): what the reshape costs
    in the program, against `log_softmax_ours` on the 2-d array."""
    return log_softmax_ours(x.reshape(-1, x.shape[-1]))


def log_softmax_then_reshape(x: jax.Array) -> jax.Array:
    """Ours over the last axis of the (batch, seq, vocab) array as it is, the result then reshaped: whether the
    cost of `log_softmax_of_3d` is the reshape of its input."""
    return log_softmax_ours(x).reshape(-1, x.shape[-1])


def log_softmax_3d_kept(x: jax.Array) -> jax.Array:
    """Ours over the last axis of the (batch, seq, vocab) array, the result in that shape (no reshape at all)."""
    return log_softmax_ours(x)


def log_softmax_backward_ours(grad: jax.Array, out: jax.Array) -> jax.Array:
    grad32, out32 = grad.astype(F32), out.astype(F32)
    return (grad32 - jnp.exp(out32) * jnp.sum(grad32, axis=-1, keepdims=True)).astype(BF16)


def softmax_ours(x: jax.Array) -> jax.Array:
    return jax.nn.softmax(x.astype(F32), axis=-1).astype(BF16)


def softmax_max_low(x: jax.Array) -> jax.Array:
    exp = jnp.exp(x.astype(F32) - jnp.max(x, axis=-1, keepdims=True).astype(F32))
    return (exp / jnp.sum(exp, axis=-1, keepdims=True)).astype(BF16)


def softmax_backward_ours(grad: jax.Array, out: jax.Array) -> jax.Array:
    grad32, out32 = grad.astype(F32), out.astype(F32)
    return (out32 * (grad32 - jnp.sum(grad32 * out32, axis=-1, keepdims=True))).astype(BF16)


def softmax_backward_dot(grad: jax.Array, out: jax.Array) -> jax.Array:
    """The row sums of grad * out as a product with float32 accumulation: bfloat16 products are exact in float32,
    so the sum is the float32 one, without a float32 copy of either input."""
    total = jnp.einsum("...k,...k->...", grad, out, preferred_element_type=F32)[..., None]
    return (out.astype(F32) * (grad.astype(F32) - total)).astype(BF16)


CASES: dict[str, tuple[tuple[int, ...], int, tuple[Callable, ...]]] = {
    # name: (shape, inputs, formulations; the first is ours)
    "log_softmax": ((8192, 32768), 1, (log_softmax_ours, log_softmax_max_low)),
    "log_softmax_3d": ((16, 512, 32768), 1, (log_softmax_of_3d, log_softmax_then_reshape, log_softmax_3d_kept)),
    "log_softmax_backward": ((8192, 32768), 2, (log_softmax_backward_ours,)),
    "softmax": ((16, 12, 512, 512), 1, (softmax_ours, softmax_max_low)),
    "softmax_backward": ((16, 12, 512, 512), 2, (softmax_backward_ours, softmax_backward_dot)),
}


def _ms(compiled: Callable, args: tuple, repeats: int) -> float:
    jax.block_until_ready(compiled(*args))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--scale", type=float, default=1.0)
    args = parser.parse_args()
    device = jax.devices()[0]
    bandwidth = HBM_GBPS.get(device.device_kind)
    print(f"device: {device.device_kind}; ms per call, median of {args.repeats}")
    print(f"{'op':<22}{'formulation':<28}{'ms':>9}{'floor ms':>10}{'differ':>10}")
    for name, (shape, inputs, formulations) in CASES.items():
        shape = (max(1, int(shape[0] * args.scale)), *shape[1:])
        keys = jax.random.split(jax.random.PRNGKey(0), inputs)
        values = tuple((jax.random.normal(key, shape, F32) * 3).astype(BF16) for key in keys)
        moved = (inputs + 1) * values[0].nbytes  # each input read once, the result written once
        floor = f"{moved / bandwidth / 1e6:10.2f}" if bandwidth else f"{'-':>10}"
        reference = None
        for formulation in formulations:
            compiled = jax.jit(formulation).lower(*values).compile()
            result = compiled(*values)
            reference = result if reference is None else reference
            differ = int(jnp.sum(result.reshape(reference.shape) != reference))
            ms = _ms(compiled, values, args.repeats)
            print(f"{name:<22}{formulation.__name__:<28}{ms:>9.3f}{floor}{differ:>10}")


if __name__ == "__main__":
    main()
