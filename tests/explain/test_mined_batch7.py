"""General fixes found on the mined sample's seventh batch (train part only): each test states the class of log the fix
covers, with the wording copied from public threads or the upstream source it cites."""

from __future__ import annotations

from loraflow.explain import diagnose_log


def top(text: str) -> list[tuple[str, str]]:
    _, candidates, _ = diagnose_log(text)
    return [(c.rule.id, c.confidence) for c in candidates]


# `only Tensors of floating point dtype can require gradients` is torch's refusal of requires_grad_ on an integer
# tensor. On a quantized weight it is a 4-bit base trained in full (kbit-full-finetune); but an input-requires-grad hook
# (unsloth_zoo peft_utils.py requires_grad_pre_hook, transformers' make_inputs_require_grads) placed on a module that
# takes token ids asks an integer activation, and no quantization setting is the cause (unsloth issue 1485, Qwen2-VL).
UNSLOTH_HOOK = (
    "[/usr/local/lib/python3.11/dist-packages/unsloth_zoo/peft_utils.py](https://localhost:8080/#) in "
    "requires_grad_pre_hook(module, input)\n"
    "    199             if len(input) == 0:\n"
    "    200                 raise RuntimeError(\"Unsloth: Failed to make input require gradients!\")\n"
    "--> 201             input[0].requires_grad_(True)\n"
    "    202         else:\n"
    "    203             raise RuntimeError(\"Unsloth: Failed to make input require gradients!\")\n\n"
    "RuntimeError: only Tensors of floating point dtype can require gradients")


def test_integer_input_made_to_require_grad_by_a_hook_is_not_a_quantized_weight():
    found = dict(top(UNSLOTH_HOOK))
    assert "kbit-full-finetune" not in found and "qlora-storage-dtype" not in found, found


def test_quantized_weight_made_to_require_grad_keeps_its_reading():
    # MiniCPM-V's finetune.py training a 4-bit vision tower in full (vision corpus 018): the weight, not an input.
    text = ('  File "/home/st/mllm/MiniCPM-V/finetune/finetune.py", line 276, in train\n'
            "    model.base_model.vpm.requires_grad_(True)\n"
            "RuntimeError: only Tensors of floating point dtype can require gradients")
    assert top(text)[:1] == [("kbit-full-finetune", "possible")]


# FSDP2's fully_shard re-creates each local shard as an nn.Parameter, which requires grad until the original flag is
# restored (torch/distributed/fsdp/_fully_shard/_fsdp_param.py, FSDPParam._init_sharded_param): a bitsandbytes 4-bit
# weight in its default uint8 storage is refused there (accelerate issue 3983, torch 2.8, bitsandbytes 0.48.2).
FSDP2_INIT = (
    '  File "/usr/lib/python3.11/site-packages/accelerate/utils/fsdp_utils.py", line 700, in fsdp2_prepare_model\n'
    "    fully_shard(module, **fsdp2_kwargs)\n"
    '  File "/usr/lib/python3.11/site-packages/torch/distributed/fsdp/_fully_shard/_fully_shard.py", line 213, in '
    "fully_shard\n    state._fsdp_param_group = FSDPParamGroup(\n"
    '  File "/usr/lib/python3.11/site-packages/torch/distributed/fsdp/_fully_shard/_fsdp_param.py", line 251, in '
    "__init__\n    self._init_sharded_param(param, device, shard_placement_fn)\n"
    '  File "/usr/lib/python3.11/site-packages/torch/distributed/fsdp/_fully_shard/_fsdp_param.py", line 392, in '
    "_init_sharded_param\n    self.sharded_param = nn.Parameter(self.to_sharded_dtensor(sharded_param))\n"
    "RuntimeError: only Tensors of floating point dtype can require gradients")


def test_fsdp2_sharding_packed_4bit_storage_is_the_storage_dtype():
    assert top(FSDP2_INIT)[0][0] == "qlora-storage-dtype"
    assert top(FSDP2_INIT)[0][1] in ("likely", "confirmed")
