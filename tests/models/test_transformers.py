"""Hugging Face GPT-2, BERT, Llama and ViT from small random configs: forward, backward and an AdamW step on
`tpu` against CPU PyTorch (logits, loss, every gradient, every updated parameter)."""

import copy

import pytest
import torch

import torch_tpu.amp
from torch_tpu.testing.compare import TOLERANCES

pytestmark = pytest.mark.tpu_device  # the device part of the suite (bench/device_run.sh)

transformers = pytest.importorskip("transformers")
torch_tpu.amp.install()  # idempotent: a no-op once importing torch_tpu has installed it

VOCAB, SEQ, BATCH = 100, 12, 2
# Dropout draws from its own stream on tpu, so it is off; every model otherwise runs in training mode.
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def adamw(params):
    # Adam's first step is -lr * g / (|g| + eps): for |g| near eps it magnifies the gradient's rounding error
    # (~1e-7 where terms of size ~1 cancel, ~1e-10 for the exactly-zero gradient of key biases, which softmax
    # ignores) by lr / eps. eps=1e-4 keeps that under 1e-6 while the step stays Adam's for every real gradient.
    return torch.optim.AdamW(params, lr=1e-3, eps=1e-4, weight_decay=0.01)


def token_batch(padded: bool):
    torch.manual_seed(1)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    if padded:
        mask[1, SEQ - 3 :] = 0
    labels = ids.masked_fill(mask == 0, -100)
    return dict(input_ids=ids, attention_mask=mask, labels=labels)


def gpt2(attn_implementation):
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4, n_inner=64,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
        attn_implementation=attn_implementation,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config), token_batch(padded=True)


def bert(attn_implementation):
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=32, num_labels=3, attn_implementation=attn_implementation, **NO_DROPOUT,
    )  # fmt: skip
    batch = token_batch(padded=True)
    batch["labels"] = torch.tensor([0, 2])
    batch["token_type_ids"] = (torch.arange(SEQ) >= SEQ // 2).long().expand(BATCH, SEQ)
    return transformers.BertForSequenceClassification(config), batch


def llama(attn_implementation):
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32, attn_implementation=attn_implementation,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config), token_batch(padded=False)


def vit(attn_implementation):
    config = transformers.ViTConfig(
        image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, num_labels=3, attn_implementation=attn_implementation, **NO_DROPOUT,
    )  # fmt: skip
    torch.manual_seed(1)
    return transformers.ViTForImageClassification(config), dict(
        pixel_values=torch.randn(BATCH, 3, 16, 16), labels=torch.tensor([0, 2])
    )


def t5(attn_implementation="eager"):
    config = transformers.T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=16, dropout_rate=0.0,
        decoder_start_token_id=0, pad_token_id=0, attn_implementation=attn_implementation,
    )  # fmt: skip
    batch = token_batch(padded=True)
    batch["labels"] = batch["labels"][:, : SEQ // 2].clamp(min=1)  # a shorter target; 0 is the decoder's start
    return transformers.T5ForConditionalGeneration(config), batch


MODELS = {"gpt2": gpt2, "bert": bert, "llama": llama, "vit": vit}


def forward(model, batch):
    output = model(**batch)
    return output.logits, output.loss


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_trains_like_cpu(name, attn_implementation, check_training):
    model, batch = MODELS[name](attn_implementation)
    model.train()
    check_training(model, [batch], forward, adamw)


def test_llama_autocast_forward_backward():
    """Under torch.autocast(bfloat16) the logits are bfloat16 and logits, loss and the float32 gradients match
    CPU autocast within bfloat16 tolerance (tpu follows the accelerator policy: softmax, norms in float32)."""
    model, batch = llama("sdpa")
    results = {}
    for device in ("cpu", "tpu"):
        moved = copy.deepcopy(model).to(device)
        moved.tie_weights()
        with torch.autocast(device, dtype=torch.bfloat16):
            output = moved(**{k: v.to(device) for k, v in batch.items()})
        output.loss.backward()
        assert output.logits.dtype == torch.bfloat16
        grads = {n: p.grad.cpu() for n, p in moved.named_parameters()}
        results[device] = output.logits.detach().cpu(), output.loss.detach().cpu(), grads
    rtol, atol = TOLERANCES[torch.bfloat16]
    torch.testing.assert_close(results["tpu"], results["cpu"], rtol=rtol, atol=atol)
