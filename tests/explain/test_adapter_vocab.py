"""An adapter whose resized embedding rows do not fit the base it is loaded onto (adapter-vocab-mismatch):
unslothai/unsloth#978, hiyouga/LlamaFactory#3125, #3154, #8046, huggingface/peft#1700, #1173, #1457, #2415."""

from __future__ import annotations

import pytest

from loraflow.explain import diagnose_log

RULE = "adapter-vocab-mismatch"
HEAD = "RuntimeError: Error(s) in loading state_dict for PeftModelForCausalLM:\n"


@pytest.mark.parametrize("line", [
    "\tsize mismatch for base_model.model.model.embed_tokens.weight: copying a param with shape "
    "torch.Size([168662, 4096]) from checkpoint, the shape in current model is torch.Size([128256, 4096]).",
    "\tsize mismatch for base_model.model.model.embed_tokens.modules_to_save.default.weight: copying a param with "
    "shape torch.Size([50000, 4096]) from checkpoint, the shape in current model is torch.Size([32000, 4096]).",
    "\tsize mismatch for base_model.model.lm_head.weight: copying a param with shape torch.Size([151665, 3584]) from "
    "checkpoint, the shape in current model is torch.Size([151936, 3584]).",
])
def test_rows_that_differ_under_the_same_width(line):
    _, candidates, _ = diagnose_log(HEAD + line)
    assert candidates and candidates[0].rule.id == RULE and candidates[0].confidence == "confirmed"


@pytest.mark.parametrize("line", [
    # another width: another model, not a vocabulary
    "\tsize mismatch for base_model.model.lm_head.weight: copying a param with shape torch.Size([32000, 4096]) from "
    "checkpoint, the shape in current model is torch.Size([32000, 5120]).",
    # the same rows: not a vocabulary of another size
    "\tsize mismatch for base_model.model.lm_head.weight: copying a param with shape torch.Size([32000, 4096]) from "
    "checkpoint, the shape in current model is torch.Size([32000, 4096]).",
    # a LoRA rank mismatch on the head: the adapter's own shapes, not the vocabulary
    "\tsize mismatch for base_model.model.lm_head.lora_A.default.weight: copying a param with shape "
    "torch.Size([8, 4096]) from checkpoint, the shape in current model is torch.Size([16, 4096]).",
    # an empty ZeRO-3 partition saved as the adapter
    "\tsize mismatch for base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight: copying a param "
    "with shape torch.Size([0]) from checkpoint, the shape in current model is torch.Size([8, 4096]).",
])
def test_other_size_mismatches_are_not_it(line):
    _, candidates, _ = diagnose_log(HEAD + line)
    assert not candidates or candidates[0].rule.id != RULE
