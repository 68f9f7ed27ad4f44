"""General fixes found on the mined sample's fifth batch (train part only): each test states the class of log the fix
covers, with the wording copied from public threads or the upstream source it cites."""

from __future__ import annotations

import pytest

from loraflow.explain import diagnose_log


def top(text: str) -> list[tuple[str, str]]:
    _, candidates, _ = diagnose_log(text)
    return [(c.rule.id, c.confidence) for c in candidates]


# FSDP1 names both dtypes when a float tensor comes first (torch/distributed/fsdp/_flat_param.py,
# _validate_tensors_to_flatten). Only uint8 is bitsandbytes' packed 4-bit storage; int8 is LLM.int8's codes or an int8
# post-training quantization (compressed-tensors w8a8), int32 GPTQ/AWQ's packed qweight: no storage-dtype setting fixes
# those, so neither qlora-storage-dtype nor fsdp1-mixed-dtype may be claimed (llama-cookbook issue 945: a w8a8 model).
@pytest.mark.parametrize("codes", ["int8", "int32"])
def test_flatten_refusal_naming_signed_integer_codes_is_not_4bit_storage(codes):
    text = f"ValueError: Must flatten tensors with uniform dtype but got torch.bfloat16 and torch.{codes}"
    found = dict(top(text))
    assert "qlora-storage-dtype" not in found and "fsdp1-mixed-dtype" not in found, found


def test_flatten_refusal_naming_uint8_is_still_4bit_storage():
    text = "ValueError: Must flatten tensors with uniform dtype but got torch.bfloat16 and torch.uint8"
    assert top(text)[:1] == [("qlora-storage-dtype", "confirmed")]
    # The refusal that names no dtype (an integer tensor first) keeps its reading as 4-bit storage.
    assert top("ValueError: Cannot flatten integer dtype tensors")[:1] == [("qlora-storage-dtype", "confirmed")]


# Unsloth's 2024 releases raised with another sentence (unsloth/models/llama.py, FastLlamaModel.get_peft_model and the
# patched training loop); unsloth issue 724 pasted it from a notebook.
def test_unsloth_2024_wording_of_its_multi_gpu_refusal():
    text = ("RuntimeError: Unsloth currently does not work on multi GPU setups - sadly we are a 2 brother team so "
            "enabling it will require much more work, so we have to prioritize. Please understand!")
    assert top(text)[:1] == [("unsloth-multi-gpu", "confirmed")]


# transformers' refusals before the quantizer refactor said `4-bit` or `8-bit` models (no `bitsandbytes`), and
# `.half()`/`.float()` had their own sentence (modeling_utils.py, PreTrainedModel.to/half/float with `is_quantized`).
# A DeepSpeed engine casting or moving a 4-bit module prints them (transformers issue 29303, DeepSpeed issue 3719).
@pytest.mark.parametrize("line", [
    "ValueError: .to is not supported for 4-bit or 8-bit models. Please use the model as it is, since the model has "
    "already been set to the correct devices and casted to the correct dtype",
    "ValueError: `.half()` is not supported for `4-bit` or `8-bit` models. Please use the model as it is, since the "
    "model has already been casted to the correct `dtype`.",
])
def test_older_transformers_wordings_of_moving_a_quantized_model(line):
    assert top(line)[0][0] == "kbit-model-moved"
    engine = ('  File "/usr/lib/python3.10/site-packages/deepspeed/runtime/engine.py", line 1039, in '
              "_configure_distributed_model\n    self.module.half()\n" + line)
    assert top(engine)[0][0] == "kbit-model-moved"
