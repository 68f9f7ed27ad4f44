"""QLoRA: adapters on a base quantized by bitsandbytes (4-bit NF4/FP4, 8-bit), on the CPU.

The reference of a quantized run is the same run on the dequantized base: the weights the quantized layers compute
with, as plain float32 `nn.Linear`s. With compute in float32 the two see the same numbers, so their gradients agree
to float rounding, for every checkpointing mode. LLM.int8 also quantizes the activations of each matmul, so 8-bit is
compared with a tolerance that says so.
"""

from __future__ import annotations

import pytest
import torch
from conftest import first_batch, make_config, plan_and_model, randomize_adapters

from loraflow.data.batching import learned_tokens
from loraflow.environment import detect_environment
from loraflow.plan import resolve
from loraflow.setup.quantize import (
    constants,
    dequantize_model,
    quantized_linears,
    weight_count,
)
from loraflow.stages.sft import loss_fn

CHECKPOINTING = {
    "off": [],
    "reentrant": ["checkpointing.enabled=true", "checkpointing.reentrant=true"],
    "non-reentrant": ["checkpointing.enabled=true", "checkpointing.reentrant=false"],
    "every2-reentrant": ["checkpointing.enabled=true", "checkpointing.reentrant=true",
                         "checkpointing.every_n_layers=2"],
    "mlp": ["checkpointing.enabled=true", "checkpointing.granularity=mlp"],
}


def gradients(tiny_model, chat_data, overrides, dequantize=False):
    plan, model, tokenizer = plan_and_model(tiny_model, *overrides, data=chat_data)
    if dequantize:
        dequantize_model(model)
        assert not quantized_linears(model)
    randomize_adapters(model)
    batch = first_batch(tokenizer, chat_data[0])
    loss = loss_fn(plan)(model, batch, learned_tokens(batch))
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad and p.grad is not None}
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    return plan, model, loss.item(), grads, trainable


def worst_error(grads, ref):
    assert grads.keys() == ref.keys()
    return max(float((grads[n] - ref[n]).norm() / ref[n].norm().clamp_min(1e-30)) for n in ref)


@pytest.fixture(scope="module")
def nf4_reference(tiny_model, chat_data):
    return gradients(tiny_model, chat_data, ["model.quantization.method=nf4"], dequantize=True)


@pytest.mark.parametrize("checkpointing", sorted(CHECKPOINTING))
def test_qlora_gradients_equal_lora_on_the_dequantized_base(tiny_model, chat_data, nf4_reference, checkpointing):
    _, _, ref_loss, ref, _ = nf4_reference
    plan, model, loss, grads, trainable = gradients(tiny_model, chat_data, ["model.quantization.method=nf4"]
                                                    + CHECKPOINTING[checkpointing])
    assert len(quantized_linears(model)) == 28  # every frozen linear of the 4 layers; the head stays float
    assert len(grads) == len(trainable) == 56, "every adapter weight gets a gradient"
    assert loss == pytest.approx(ref_loss, rel=1e-6)
    assert worst_error(grads, ref) <= 1e-5
    if checkpointing.endswith("reentrant") and "non" not in checkpointing:
        assert plan.input_grad_hook  # reentrant recompute with a frozen (quantized) base needs it


@pytest.mark.parametrize("overrides", [["model.quantization.method=fp4", "model.quantization.double_quant=false"],
                                       ["model.quantization.method=nf4", "adapter.method=dora",
                                        "checkpointing.enabled=true"]],
                         ids=["fp4-single-quant", "qdora-checkpointed"])
def test_other_4bit_setups_equal_their_dequantized_reference(tiny_model, chat_data, overrides):
    _, _, ref_loss, ref, _ = gradients(tiny_model, chat_data, [o for o in overrides if "checkpointing" not in o],
                                       dequantize=True)
    _, _, loss, grads, trainable = gradients(tiny_model, chat_data, overrides)
    assert len(grads) == len(trainable)
    assert loss == pytest.approx(ref_loss, rel=1e-6)
    assert worst_error(grads, ref) <= 1e-5


def test_int8_gradients_are_close_to_the_dequantized_reference(tiny_model, chat_data):
    """LLM.int8 rounds each matmul's input to int8 as well as the weight, so it agrees only to that rounding."""
    _, _, ref_loss, ref, _ = gradients(tiny_model, chat_data, ["model.quantization.method=int8"], dequantize=True)
    _, model, loss, grads, trainable = gradients(tiny_model, chat_data, ["model.quantization.method=int8"])
    assert {type(m).__name__ for m in quantized_linears(model).values()} == {"Linear8bitLt"}
    assert len(grads) == len(trainable)
    assert loss == pytest.approx(ref_loss, rel=2e-2)
    assert worst_error(grads, ref) <= 0.1


def test_frozen_4bit_weights_stay_bit_identical_through_steps_and_evaluation(tiny_model, chat_data):
    from loraflow.run.pipeline import build_run

    config = make_config(tiny_model, "model.quantization.method=nf4", "train.max_steps=3", "train.micro_batch_size=4",
                         "train.learning_rate=1e-2", f"output.dir={chat_data[0].parent / 'bits'}", data=chat_data)
    run = build_run(config, detect_environment(), chat_data[0].parent / "bits")
    layers = quantized_linears(run.trainer.model)
    before = {n: (m.weight.data.clone(), [t.clone() for t in constants(m.weight)]) for n, m in layers.items()}
    adapters = {n: p.detach().clone() for n, p in run.trainer.model.named_parameters() if p.requires_grad}
    for _ in range(3):
        run.trainer.accumulate()
        run.trainer.apply_update()
    model = run.trainer.model
    model.eval()  # bitsandbytes' CPU repack happens on an eval-mode forward without autograd (kbit-cpu-repack)
    with torch.no_grad():
        model(input_ids=torch.arange(1, 40).reshape(3, 13))
    for name, module in quantized_linears(model).items():
        weight, consts = before[name]
        assert torch.equal(module.weight.data, weight), name
        assert all(torch.equal(a, b) for a, b in zip(constants(module.weight), consts)), name
        assert not getattr(module.weight.quant_state, "packing_format_for_cpu", False)
    changed = [n for n, p in model.named_parameters() if p.requires_grad and not torch.equal(p, adapters[n])]
    assert len(changed) == len(adapters)


def test_memory_counts_4bit_weights_as_stored(tiny_model, chat_data):
    plan, model, *_ = plan_and_model(tiny_model, "model.quantization.method=nf4", data=chat_data)
    q = plan.quantization
    assert q.bytes_per_weight() == pytest.approx(0.5 + 1 / 64 + 4 / (64 * 256))
    weights = [m.weight for m in quantized_linears(model).values()]
    count = sum(weight_count(w) for w in weights)
    assert count == sum(m.in_features * m.out_features for m in quantized_linears(model).values())
    stored = sum(w.untyped_storage().nbytes() for w in weights)
    assert stored == count // 2  # two 4-bit weights per byte
    scales = sum(t.numel() * t.element_size() for w in weights for t in constants(w))
    # Per layer: 8-bit absmax (1 B per 64 weights), fp32 second-level absmax (4 B per 256 of those, rounded up) and
    # the constant tables (bytes_per_layer): exactly what the memory report's formula counts, plus the round-up.
    rounded = sum(4 * -(-weight_count(w) // (64 * 256)) for w in weights)
    assert scales == count // 64 + rounded + len(weights) * q.bytes_per_layer()
    asymptotic = count * q.bytes_per_weight() + len(weights) * q.bytes_per_layer()
    assert stored + scales == pytest.approx(asymptotic, rel=0.05)  # the report's formula, on this small model


def test_plan_decides_storage_and_compute_dtypes(tiny_model):
    single = resolve(make_config(tiny_model, "model.quantization.method=nf4"), detect_environment())
    assert single.quantization.storage_dtype == torch.uint8 and single.quantization.compute_dtype == torch.float32
    assert single.quantization.skip_modules == ("lm_head",)
    mixed = resolve(make_config(tiny_model, "model.quantization.method=nf4", "precision.mode=bf16-mixed"),
                    detect_environment())
    assert mixed.quantization.compute_dtype == torch.bfloat16
    trained = resolve(make_config(tiny_model, "model.quantization.method=nf4", "adapter.train_modules=[embeddings]"),
                      detect_environment())
    assert trained.quantization.skip_modules == ("lm_head", "model.embed_tokens")
    text = single.render()
    assert "quantization.storage_dtype" in text and "kbit preparation" in text


def test_a_checkpoint_saved_in_4bit_must_be_declared_and_then_trains(tiny_model, chat_data, tmp_path):
    from loraflow.errors import ConfigError

    _, model, *_ = plan_and_model(tiny_model, "model.quantization.method=nf4", "adapter.method=lora", data=chat_data)
    model.unload().save_pretrained(tmp_path / "nf4")  # a base saved quantized, as hub *-bnb-4bit repos are
    with pytest.raises(ConfigError, match=r"already quantized by bitsandbytes as nf4 .* set "
                                          r"model.quantization.method=nf4"):
        resolve(make_config(tmp_path / "nf4", f"model.tokenizer={tiny_model}"), detect_environment())
    plan, model, _ = plan_and_model(tmp_path / "nf4", "model.quantization.method=nf4", f"model.tokenizer={tiny_model}",
                                    data=chat_data)
    assert plan.model.prequantized == "nf4" and len(quantized_linears(model)) == 28
