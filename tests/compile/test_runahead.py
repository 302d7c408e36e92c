"""A compiled training forward waits for the backward run before it (compile/runahead.py), so that two steps'
saved activations never hold device memory at once; the steps compute what CPU computes either way."""

import copy

import pytest
import torch

from torch_tpu.compile import runahead
from torch_tpu.runtime import storage
from torch_tpu.testing.compare import assert_close

pytestmark = [pytest.mark.tpu_device, pytest.mark.usefixtures("fresh_dynamo")]


def _steps(model, batches, observe):
    compiled = torch.compile(model, backend="tpu")
    losses = []
    for x in batches:
        model.zero_grad(set_to_none=True)
        loss = compiled(x).square().mean()
        loss.backward()
        observe(model)
        losses.append(loss.detach())
    return torch.stack(losses).cpu()


@pytest.mark.parametrize("waits", [True, False])
def test_a_forward_waits_for_the_backward_before_it_and_the_steps_match_cpu(waits, monkeypatch):
    monkeypatch.setattr(runahead, "WAIT", waits)
    monkeypatch.setattr(runahead, "_last_backward", None)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    batches = [torch.randn(8, 6) for _ in range(3)]
    expected = torch.stack([model(x).square().mean() for x in batches]).detach()
    tpu_model = copy.deepcopy(model).to("tpu")
    pending_after_backward = []

    def observe(stepped):
        pending = runahead.pending()
        grads = {id(storage.buffer_of(p.grad)._array): p.grad.numel() for p in stepped.parameters()}
        pending_after_backward.append(None if pending is None else grads.get(id(pending)))

    losses = _steps(tpu_model, [x.to("tpu") for x in batches], observe)
    assert_close(losses, expected)
    if waits:  # each backward leaves its smallest gradient (the last layer's bias) for the next forward to wait on
        assert pending_after_backward == [3, 3, 3]
        tpu_model(batches[0].to("tpu"))  # an eager forward: not a compiled training graph
        assert runahead.pending() is not None
        torch.compile(tpu_model, backend="tpu")(batches[0].to("tpu"))
        assert runahead.pending() is None  # the compiled forward took it and waited
    else:
        assert pending_after_backward == [None, None, None]
