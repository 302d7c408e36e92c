"""`F.scaled_dot_product_attention` on tpu tensors: a kernel where one applies for the platform, else the math path.

PyTorch picks SDPA's backend through a C++ DispatchStub that Python cannot reach, so this registers an
`AutogradPrivateUse1` kernel (eager and AOTAutograd's tracing reach it; the same as the `PrivateUse1` kernel, which
`torch.inference_mode` reaches) for `aten::scaled_dot_product_attention`: `choose` names the path for the call,
the first kernel in `_PRIORITY` that runs on the platform and serves the call, else "xla". "xla" runs PyTorch's own
composite (the math decomposition our lowerings compile, as before), "splash" runs `torch.tpu.ops.splash_sdpa`
(differentiable itself). Splash applies on TPU for masks it expresses (none, or
causal), no dropout, bfloat16 (and float32 where the precision in force is `Precision.DEFAULT`: splash's float32
products run as one bf16 pass on the chip, measured ~5e-3 from a float64 reference, which HIGH and HIGHEST -- PyTorch's
default "highest" among them -- do not allow), GQA with `enable_gqa` and sequence lengths in multiples of 128. On GPU,
"cudnn" runs cuDNN's fused attention (`kernels.prebuilt.cudnn`: `jax.nn.dot_product_attention(implementation=
"cudnn")`) where it serves the call: bfloat16/float16, head dim a multiple of 8 up to 128, no mask but causal (equal
lengths), no dropout. `force("splash")` routes every call splash can serve to it on any platform (interpreted off
TPU: how the CPU tests check the kernel path against the math path); `force("cudnn")` likewise (it runs only where
jaxlib has CUDA and cuDNN). Where tokamax is installed (`torch_tpu[kernels]`), "tokamax" takes the TPU and GPU calls
those kernels do not (`kernels.prebuilt.tokamax_attention`: boolean masks, float32 on GPU, other lengths); without it
they take the XLA path. `force("tokamax")` runs tokamax's XLA implementation on CPU. On GPU, what neither cuDNN nor
tokamax takes goes to "pallas_gpu", JAX's Pallas (Triton) flash attention (`kernels.prebuilt.pallas_gpu`: float32
too, equal heads, tile-divisible lengths); `force("pallas_gpu")` runs it interpreted on CPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import Counter
from collections.abc import Callable, Iterator

import torch

from torch_tpu import precision
from torch_tpu.kernels.prebuilt import cudnn, library, pallas_gpu, tokamax_attention
from torch_tpu.runtime import platform

SPLASH_DTYPES = (torch.float32, torch.bfloat16)
# How often each path was chosen (a compiled graph counts once, when it is traced).
choices: Counter[str] = Counter()
_forced: list[str | None] = [None]


def _splash_serves(query, key, value, attn_mask, dropout_p, enable_gqa, is_causal) -> bool:
    """(Causal at any lengths: splash's mask is its own.)"""
    if attn_mask is not None or dropout_p != 0.0:
        return False
    if not library.attention_layout(query, key, value, SPLASH_DTYPES, enable_gqa):
        return False
    return query.shape[2] % 128 == 0 and key.shape[2] % 128 == 0


@dataclasses.dataclass(frozen=True)
class _Kernel:
    """An SDPA kernel: where `choose` takes it unforced, whether it serves a call, and the op that runs it."""

    name: str
    platforms: tuple[str, ...]
    serves: Callable[..., bool]  # (query, key, value, attn_mask, dropout_p, enable_gqa, is_causal)
    op: str  # torch.ops.torch_tpu.<op>(query, key, value, [attn_mask,] is_causal=, scale=)
    takes_mask: bool = False


# In priority order: a call takes the first kernel that runs on its platform and serves it, else the XLA path.
_PRIORITY = (
    _Kernel("splash", ("tpu",), _splash_serves, "splash_sdpa"),
    _Kernel("cudnn", ("gpu",), cudnn.serves, "_cudnn_sdpa"),
    _Kernel("tokamax", ("tpu", "gpu"), tokamax_attention.serves, "_tokamax_sdpa", takes_mask=True),
    _Kernel("pallas_gpu", ("gpu",), pallas_gpu.serves, "_pallas_gpu_sdpa"),
)
_BY_NAME = {kernel.name: kernel for kernel in _PRIORITY}
KERNELS = (*_BY_NAME, "xla")


@contextlib.contextmanager
def force(kernel: str | None) -> Iterator[None]:
    """Route SDPA calls to `kernel` wherever it can serve them, whatever the platform (None: by platform)."""
    if kernel is not None and kernel not in KERNELS:
        raise ValueError(f"torch_tpu: SDPA kernel must be one of {KERNELS} or None, got {kernel!r}")
    previous, _forced[0] = _forced[0], kernel
    try:
        yield
    finally:
        _forced[0] = previous


def _within_precision(dtype: torch.dtype) -> bool:
    """Whether the TPU's attention kernels (splash, tokamax's Mosaic kernels) compute `dtype` as precisely as the
    precision in force asks: their float32 products are one bf16 pass on the chip, which only `Precision.DEFAULT`
    allows (`force(...)` overrides this)."""
    return dtype != torch.float32 or precision.current() is precision.Precision.DEFAULT


def choose(
    device_platform: str,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    enable_gqa: bool = False,
    is_causal: bool = False,
) -> str:
    """The path one SDPA call takes on `device_platform` ("tpu", "gpu", "cpu"): a kernel name or "xla" (a pure
    function of the platform and the call's shapes, dtypes, mask and dropout, of `force`, and, for float32, of the
    precision in force, which every cache key holds)."""
    forced = _forced[0]
    call = (query, key, value, attn_mask, dropout_p, enable_gqa, is_causal)
    if forced is not None:
        kernel = _BY_NAME.get(forced)
        return forced if kernel is not None and kernel.serves(*call) else "xla"
    if device_platform == "tpu" and not _within_precision(query.dtype):
        return "xla"
    return next((k.name for k in _PRIORITY if device_platform in k.platforms and k.serves(*call)), "xla")


_SDPA = torch.ops.aten.scaled_dot_product_attention.default


def _kernel(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    path = choose(platform.platform(), query, key, value, attn_mask, dropout_p, enable_gqa, is_causal)
    choices[path] += 1
    kernel = _BY_NAME.get(path)
    if kernel is None:
        return _SDPA.decompose(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    mask = (attn_mask,) if kernel.takes_mask else ()
    return getattr(torch.ops.torch_tpu, kernel.op)(query, key, value, *mask, is_causal=is_causal, scale=scale)


_library: list[torch.library.Library] = []


def install() -> None:
    """Register the routing kernel for tpu tensors (once)."""
    if _library:
        return
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("scaled_dot_product_attention", _kernel, "AutogradPrivateUse1")
    lib.impl("scaled_dot_product_attention", _kernel, "PrivateUse1")  # reached when autograd is off (inference mode)
    _library.append(lib)
