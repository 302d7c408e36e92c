"""The runtime's own small programs that every process needs (the zeros and fills of fresh storages, a donated
input's copy), one per shape and dtype, kept in the persistent tier (`persistent`): compiling them again cost a warm
process on a TPU host 0.7 s each."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import jax
import numpy as np

from torch_tpu.runtime import compat, persistent

_compiles: dict[tuple, Future] = {}  # (helper, call key) -> its program compiling (`Helper` with `cold`)
_pool: list[ThreadPoolExecutor] = []  # made on first use


def _forget_compiles() -> None:
    """A forked child has none of the parent's threads: its own pool, and none of the parent's compiles."""
    _compiles.clear()
    _pool.clear()


os.register_at_fork(after_in_child=_forget_compiles)


HOST_FILL_MAX_BYTES = 256 << 20


@compat.without_dynamo_frames  # a fill in a compiled region's eager stretch: JAX's frames are not the user's
def host_fill(shape: tuple[int, ...], dtype: np.dtype, value: Any = 0) -> jax.Array | None:
    """`shape` filled with `value` in `dtype` on this process's first device, made on the host and transferred
    (a `Helper`'s `cold` path for zeros and fills), or None past HOST_FILL_MAX_BYTES (the program then)."""
    if math.prod(shape) * np.dtype(dtype).itemsize > HOST_FILL_MAX_BYTES:
        return None
    return jax.device_put(np.full(shape, value, dtype), jax.local_devices()[0])


class Helper:
    """A small jitted runtime helper (zeros, a fill) whose executables come from the persistent tier: every process
    needs the same few, one per shape. Called like the function; inside a trace (a Fused cluster's) it is the plain
    `jax.jit`.

    `cold(*args)`, where given, makes the same array without a program (a transfer from the host), or None where it
    will not (too large): a call whose program is neither in memory nor in the tier returns it while the program
    compiles on a thread, for the calls after. A cold first step otherwise waited, on the main thread, for a fill's
    compile per parameter shape (torch.optim's `zeros_like` state: 10 of the small GPT step's, each 0.3-0.7 s on a
    TPU host), delaying the optimizer's program, the step's last, by seconds."""

    def __init__(self, function: Callable, static_argnums: tuple[int, ...], cold: Callable | None = None) -> None:
        self.__name__ = function.__name__
        self._jit = jax.jit(function, static_argnums=static_argnums)
        self._static = frozenset(static_argnums)
        self._calls: dict[tuple, Callable] = {}
        self._cold = cold

    def __call__(self, *args: Any) -> Any:
        static = self._static
        dynamic = [arg for i, arg in enumerate(args) if i not in static]
        if any(isinstance(arg, jax.core.Tracer) for arg in dynamic):
            return self._jit(*args)
        key = tuple(
            arg if i in static else (arg.shape, arg.dtype, getattr(arg, "sharding", None)) for i, arg in enumerate(args)
        )
        call = self._calls.get(key)
        if call is not None:
            return call(*dynamic)
        # an array elsewhere than on this process's first device (an SPMD program's over several) keeps jax.jit:
        # the tier's programs run there, and its key names no other device assignment
        home = {jax.local_devices()[0]}
        if not persistent.enabled() or any(
            isinstance(arg, jax.Array) and arg.sharding.device_set != home for arg in dynamic
        ):
            return self._jit(*args)
        if self._cold is not None:
            compiled = self._compiled_soon(key, args)
            if compiled is not None:
                return self._first_call(key, compiled, dynamic)
            made = self._cold(*args)
            if made is not None:
                return made
        return self._compile(key, args, dynamic)

    @compat.without_dynamo_frames
    def _compiled_soon(self, key: tuple, args: tuple) -> Callable | None:
        """The call's program once compiled (at once where the tier holds it), else None, its compile started (it is
        stored in the tier when done: a process exits after its pool's work)."""
        future = _compiles.get((self, key))
        if future is None:
            lowered = self._jit.lower(*args)
            options, program_key, loaded = persistent.look_up(lowered, None, eager=True)
            if loaded is not None:
                return loaded
            if not _pool:
                _pool.append(ThreadPoolExecutor(1, thread_name_prefix="torch_tpu_helper_compile"))
            future = _pool[0].submit(persistent.compile_and_store, lowered, options, program_key)
            _compiles[self, key] = future
        return _compiles.pop((self, key)).result() if future.done() else None

    @compat.without_dynamo_frames
    def _compile(self, key: tuple, args: tuple, dynamic: list) -> Any:
        future = _compiles.pop((self, key), None)
        compiled = (
            future.result() if future is not None else persistent.compile_lowered(self._jit.lower(*args), eager=True)[0]
        )
        return self._first_call(key, compiled, dynamic)

    def _first_call(self, key: tuple, compiled: Any, dynamic: list) -> Any:
        result = compiled(*dynamic)
        self._calls[key] = persistent.fast_call(compiled)  # (its C++ path exists once called)
        return result
