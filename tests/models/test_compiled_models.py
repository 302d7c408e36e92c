"""The model tests' models trained under `torch.compile(backend="tpu")`: three AdamW steps of the compiled
forward (and its backward) on `tpu` against eager CPU PyTorch, with the eager model tests' tolerances.

Each model's configuration is the eager tests' (`test_transformers`, `test_torch_models`); what this adds is
what only the compiler meets: Hugging Face's mask construction (integer advanced indexing), T5's expanded
constants, LSTM and attention graphs through AOTAutograd and the partitioner.
"""

import pytest
import torch

from tests.models import test_torch_models as torch_models
from tests.models.conftest import assert_steps_match, train

transformers = pytest.importorskip("transformers")
from tests.models import test_transformers as hf  # noqa: E402  (needs transformers)

# tpu_device: the device part of the suite (bench/device_run.sh); each test compiles afresh
pytestmark = [pytest.mark.tpu_device, pytest.mark.usefixtures("fresh_dynamo")]

STEPS = 3


def check_compiled_training(model, batches, forward, make_optimizer):
    """Eager CPU, then the compiled forward on tpu (the optimizer step stays eager, as users write it)."""
    theirs = train(model, batches, forward, make_optimizer, "cpu")
    ours = train(model, batches, torch.compile(forward, backend="tpu"), make_optimizer, "tpu")
    assert_steps_match(ours, theirs)


HF_MODELS = {**hf.MODELS, "t5": hf.t5}
# Compile times here (2 shared cores): see the report; the slower ones run with -m slow.
FAST = {"gpt2", "llama", "t5"}


@pytest.mark.parametrize(
    "name", [name if name in FAST else pytest.param(name, marks=pytest.mark.slow) for name in sorted(HF_MODELS)]
)
def test_transformer_trains_compiled_like_cpu(name):
    model, batch = HF_MODELS[name]("eager")
    check_compiled_training(model.train(), [batch] * STEPS, hf.forward, hf.adamw)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["lstm", "transformer_encoder"])
def test_torch_model_trains_compiled_like_cpu(name):
    model, batches, forward = torch_models.MODELS[name]()
    check_compiled_training(model.train(), (batches * STEPS)[:STEPS], forward, torch_models.adamw)
