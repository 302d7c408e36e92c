"""Views share storage and in-place writes through any view reach the base and every other view, as on CPU."""

import re

import pytest
import torch

from torch_tpu.testing.compare import assert_close

pytestmark = pytest.mark.tpu_device  # the device part of the suite (bench/device_run.sh)


def _both(build):
    """Run `build(device)` on CPU and on tpu; each returns a list of tensors to compare."""
    expected = build("cpu")
    actual = build("tpu")
    assert_close(actual, expected)


VIEW_WRITES = {
    "view": lambda b: b.view(4, 3).mul_(2),
    "reshape": lambda b: b.reshape(12).add_(1),
    "t": lambda b: b.t().mul_(3),
    "transpose": lambda b: b.transpose(0, 1)[1].add_(5),
    "permute": lambda b: b.permute(1, 0).mul_(-1),
    "slice": lambda b: b[1:, ::2].add_(10),
    "select": lambda b: b.select(1, 2).mul_(4),
    "narrow": lambda b: b.narrow(1, 1, 2).add_(7),
    "diagonal": lambda b: b.diagonal().add_(100),
    "unsqueeze": lambda b: b.unsqueeze(0).mul_(2),
    "squeeze": lambda b: b.unsqueeze(1).squeeze(1).add_(1),
    "unfold": lambda b: b.unfold(1, 2, 2).mul_(3),
    "as_strided": lambda b: b.as_strided((2, 2), (4, 1), 1).add_(9),
    "as_strided_across_rows": lambda b: b.as_strided((2, 2), (4, 1), 3).add_(9),  # elements 3, 4, 7, 8
    "copy_into_slice": lambda b: b[0].copy_(torch.arange(4.0, device=b.device) * -1),
    "fill_column": lambda b: b[:, 3].fill_(8),
    "zero_row": lambda b: b[2].zero_(),
    "dtype_view": lambda b: b.view(torch.int32).add_(1),
}


@pytest.mark.parametrize("name", sorted(VIEW_WRITES))
def test_write_through_view_reaches_base(name):
    def build(device):
        base = torch.arange(12.0, device=device).reshape(3, 4)
        other = base.view(12)
        view = VIEW_WRITES[name](base)
        return [base, other, view]

    _both(build)


HEAD_VIEWS = {  # views of a (4, 5, 24) qkv buffer as attention takes them, and a stepped one
    "k_heads": lambda b: b[..., 8:16].view(4, 5, 2, 4).transpose(1, 2),
    "v_heads_last": lambda b: b[..., 16:].view(4, 5, 2, 4).permute(0, 2, 3, 1),
    "stepped": lambda b: b[1:3, ::2, 5:21:4],
    "int_bits": lambda b: b.view(torch.int32)[2:, :, 16:].view(2, 5, 2, 4).transpose(1, 2),
    "across_rows": lambda b: b.as_strided((3, 2), (24, 1), 23),  # wraps from one row of 24 into the next
}


@pytest.mark.parametrize("name", sorted(HEAD_VIEWS))
def test_views_inside_their_buffer_read_and_write_as_on_cpu(name):
    def build(device):
        base = torch.arange(480.0, device=device).view(4, 5, 24)
        view = HEAD_VIEWS[name](base)
        read = view * 1
        view.mul_(-1) if view.is_floating_point() else view.add_(1)
        return [read, base]

    _both(build)


def test_a_view_inside_its_buffer_is_read_and_written_without_padding():
    """The k third of a qkv buffer split in heads is read (at its offset as a program input too, as ops read it)
    and written through the whole buffer reshaped to the view's blocks: no slice of the flat buffer padded past its
    end (on a TPU XLA materialised that pad and a relayout of the whole buffer: 4.4 ms of the large GPT step's
    74.7 in Fused eager). Every offset where the view does not wrap shares that program."""
    import jax
    import jax.numpy as jnp

    from torch_tpu.runtime import strided

    shape, stride = (4, 2, 5, 4), (120, 4, 24, 1)
    assert strided.aligned(shape, stride, 8, 480) and strided.aligned(shape, stride, 16, 480)
    assert not strided.aligned(shape, stride, 20, 480)  # its heads would run past the row of 24
    assert not strided.aligned(shape, stride, 8, 0)  # a buffer resized to nothing
    view = strided.Blocked(shape, stride, 8)
    flat = jnp.arange(480, dtype=jnp.float32)
    for program in (
        jax.make_jaxpr(view.read)(flat),
        jax.make_jaxpr(lambda flat: view.write(flat, -view.read(flat)))(flat),
        jax.make_jaxpr(lambda flat, offset: strided.read_view(flat, shape, stride, offset, True))(flat, 8),
    ):
        names = [equation.primitive.name for equation in program.jaxpr.eqns]
        assert "pad" not in names, names
        flat_slices = [e for e in program.jaxpr.eqns if "slice" in e.primitive.name and e.invars[0].aval.ndim == 1]
        assert flat_slices == [], flat_slices
    base = torch.arange(480.0).view(4, 5, 24)
    read_at = jax.jit(lambda flat, offset: strided.read_view(flat, shape, stride, offset, True))
    assert_close(torch.from_dlpack(view.read(flat)), base.as_strided(shape, stride, 8))
    for offset in (8, 16):
        assert_close(torch.from_dlpack(read_at(flat, jnp.int32(offset))), base.as_strided(shape, stride, offset))


def test_views_share_storage_and_data_ptr():
    base = torch.arange(12.0, device="tpu").reshape(3, 4)
    views = [base.view(12), base.t(), base[1:], base.select(0, 1), base.expand(2, 3, 4), base.unsqueeze(0)]
    for v in views:
        assert v.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    assert base.clone().untyped_storage().data_ptr() != base.untyped_storage().data_ptr()


def test_expand_reads():
    def build(device):
        x = torch.arange(3.0, device=device).reshape(3, 1)
        return [x.expand(3, 4) + 0, x.expand(2, 3, 5).contiguous()]

    _both(build)


def test_view_as_real_shares_complex_storage():
    def build(device):
        z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64, device=device)
        r = torch.view_as_real(z)
        r[:, 1].mul_(10)
        return [torch.view_as_real(z) + 0, r + 0]

    _both(build)


def test_data_detach_parameter_share_storage():
    x = torch.arange(4.0, device="tpu")
    d = x.detach()
    d.add_(1)
    x.data.mul_(2)
    p = torch.nn.Parameter(x)
    assert p.device.type == "tpu" and p.requires_grad
    p.data.add_(1)
    assert x.cpu().tolist() == [3.0, 5.0, 7.0, 9.0]


def test_clone_and_contiguous_copy():
    x = torch.arange(6.0, device="tpu").reshape(2, 3)
    c = x.clone()
    t = x.t().contiguous()
    x.add_(1)
    assert c.cpu().tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert t.is_contiguous() and t.cpu().tolist() == [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]


def test_requires_grad_and_backward_through_views():
    def build(device):
        x = torch.arange(6.0, device=device).reshape(2, 3).requires_grad_()
        y = (x.t()[1:] * 2).sum()
        y.backward()
        return [x.grad]

    _both(build)


def test_memory_returns_to_baseline_when_last_view_dies():
    torch.tpu.synchronize()
    base = torch.tpu.memory_allocated()
    x = torch.ones(256, 256, device="tpu")
    x.add_(1)
    view = x[1:, 2:]
    assert torch.tpu.memory_allocated() == base + 256 * 256 * 4
    del x
    assert torch.tpu.memory_allocated() == base + 256 * 256 * 4
    del view
    assert torch.tpu.memory_allocated() == base


def test_contiguous_full_tensor_reads_without_dispatch():
    from torch_tpu.runtime import storage

    x = torch.ones(4, 4, device="tpu").add_(1)
    assert storage.read(x) is storage.buffer_of(x).array


def test_ops_read_views_of_their_inputs_themselves(monkeypatch):
    """Slices, selects, transposes and expands are read inside the op's own executable, with no separate gather
    run first; the values are CPU's."""
    from torch_tpu.runtime import storage

    torch.manual_seed(0)
    qkv, w = torch.randn(8, 24), torch.randn(6, 8)
    ours_qkv, ours_w = qkv.to("tpu"), w.to("tpu")

    def compute(qkv, w):
        q, k, v = qkv.split(8, dim=1)
        return [q * k + v, w.t() @ qkv[:, 3:9].t().t().T, qkv[2] - w[1:, 0:1].expand(5, 24)[3], w[:, ::2] * 2]

    separate = []
    original = storage._call
    monkeypatch.setattr(storage, "_call", lambda helper, *args: separate.append(helper) or original(helper, *args))
    got = compute(ours_qkv, ours_w)
    assert separate == []
    for ours, theirs in zip(got, compute(qkv, w), strict=True):
        assert_close(ours.cpu(), theirs, rtol=1e-6, atol=1e-6)


def test_slices_at_any_offset_share_one_program():
    """A view's storage offset is a run-time input of the op that reads it: a loop over `data[i:i + batch]`
    compiles one program for all its offsets, not one per offset."""
    torch.manual_seed(0)
    data, w = torch.randn(200, 8), torch.randn(8, 3)
    ours, our_w = data.to("tpu"), w.to("tpu")
    before = torch.tpu._get_cache_stats()["num_inserts"]
    got = [ours[i : i + 10] @ our_w for i in range(10, 200, 10)]
    assert torch.tpu._get_cache_stats()["num_inserts"] - before == 1
    for i, value in zip(range(10, 200, 10), got, strict=True):
        assert_close(value.cpu(), data[i : i + 10] @ w, rtol=1e-5, atol=1e-5)


def test_a_view_at_a_run_time_offset_computes_its_coordinates_in_32_bits():
    """The offset input is 64-bit (the device runs with JAX's x64); a TPU emulates 64-bit division, and the
    divisions that turn it into the view's coordinates cost each program that read a view 5 s more to compile
    on the chip (the small GPT step's Fused cluster 19.5 -> 77.4 s). They run in 32 bits where the buffer fits."""
    import jax
    import jax.numpy as jnp

    from torch_tpu.runtime import strided

    shape, stride = (4, 2, 5, 4), (120, 4, 24, 1)
    flat = jnp.arange(480, dtype=jnp.float32)
    read_at = jax.jit(lambda flat, offset: strided.read_view(flat, shape, stride, offset, True))
    with jax.enable_x64(True):
        offset = jnp.asarray(16, dtype=jnp.int64)
        text = read_at.lower(flat, offset).as_text()
        read = read_at(flat, offset)
    divisions = re.findall(r"stablehlo\.(?:divide|remainder) .*", text)
    assert divisions and all(line.endswith("tensor<i32>") for line in divisions), divisions
    assert_close(torch.from_dlpack(read), torch.arange(480.0).as_strided(shape, stride, 16))


def test_heads_at_any_offset_inside_their_buffer_share_one_program():
    """The k and v heads of a qkv buffer (aligned views at two offsets) share one program, which reads them
    through the buffer reshaped; the same layout at an offset where it wraps across rows takes a program of
    its own (a slice of its span), and every value is CPU's."""
    torch.manual_seed(0)
    qkv = torch.randn(4, 5, 24)
    ours = qkv.to("tpu")
    heads = lambda base, offset: base.as_strided((3, 2, 5, 4), (120, 4, 24, 1), offset)  # 3 of the 4 batches
    before = torch.tpu._get_cache_stats()["num_inserts"]
    got = [heads(ours, offset) * 2 for offset in (8, 16)]
    assert torch.tpu._get_cache_stats()["num_inserts"] - before == 1
    got.append(heads(ours, 20) * 2)  # its 2 heads of 4 start at column 20 of 24
    assert torch.tpu._get_cache_stats()["num_inserts"] - before == 2
    for value, offset in zip(got, (8, 16, 20), strict=True):
        assert_close(value.cpu(), heads(qkv, offset) * 2)


OUT_VIEWS = {  # an `out=` view of a (3, 4) base
    "column": lambda b: b[:, 1],
    "narrow": lambda b: b.narrow(1, 1, 2),
    "transposed": lambda b: b.t(),
    "step": lambda b: b[::2, ::2],
    "row": lambda b: b[1],
}
OUT_CALLS = {  # factories (their own `out=` paths) and derived `out=` variants, all writing `out` as it is
    "ones": lambda o: torch.ones(o.shape, out=o),
    "full": lambda o: torch.full(o.shape, 2.5, out=o),
    "arange": lambda o: torch.arange(0, o.shape[-1], out=o if o.dim() == 1 else o[0]),
    "linspace": lambda o: torch.linspace(0, 1, o.shape[0], out=o[:, 0] if o.dim() == 2 else o),
    "eye": lambda o: torch.eye(*o.shape, out=o) if o.dim() == 2 else torch.eye(1, o.shape[0], out=o[None]),
    "add": lambda o: torch.add(torch.arange(o.numel(), device=o.device).view(o.shape), 2, out=o),
    "sum": lambda o: torch.sum(torch.arange(3 * o.numel(), device=o.device).view(3, *o.shape).float(), 0, out=o),
    "normal": lambda o: torch.normal(2.0, 0.0, o.shape, out=o),
    "mm": lambda o: (
        torch.mm(torch.ones(o.shape[0], 2, device=o.device), torch.ones(2, o.shape[1], device=o.device), out=o)
        if o.dim() == 2
        else torch.mv(torch.ones(o.shape[0], 2, device=o.device), torch.ones(2, device=o.device), out=o)
    ),
}


@pytest.mark.parametrize("view", sorted(OUT_VIEWS))
@pytest.mark.parametrize("call", sorted(OUT_CALLS))
def test_out_into_a_view_writes_through_its_strides(call, view):
    def build(device):
        base = torch.zeros(3, 4, device=device)
        out = OUT_VIEWS[view](base)
        OUT_CALLS[call](out)
        return [base, torch.tensor(out.stride())]

    _both(build)


@pytest.mark.parametrize("view", sorted(OUT_VIEWS))
def test_resize_of_a_view_to_its_own_size_keeps_its_strides(view):
    def build(device):
        out = OUT_VIEWS[view](torch.zeros(3, 4, device=device))
        out.resize_(out.shape)
        return [torch.tensor(out.stride()), torch.tensor(out.storage_offset())]

    _both(build)


def test_out_into_an_expanded_tensor_raises_as_on_cpu():
    for device in ("cpu", "tpu"):
        out = torch.zeros(1, device=device).expand(3)
        with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
            torch.add(torch.ones(3, device=device), 1, out=out)
