"""transformers 4.35 calls a remote-code model's checkpointing hook with a keyword it does not take
(remote-code-old-gc-hook): huggingface/transformers#27596 (fixed by PR #27610 in 4.36), QwenLM/Qwen#661,
axolotl-ai-cloud/axolotl#895, modelscope/ms-swift#142, hiyouga/LlamaFactory#1391, datawhalechina/self-llm#34."""

from __future__ import annotations

import pytest
from script_check import launch_findings

from loraflow.explain import diagnose_log

RULE = "remote-code-old-gc-hook"
LINE = ("torchrun --nproc_per_node 2 finetune.py --model_name_or_path {model} --trust_remote_code --use_lora "
        "--bf16 --output_dir o {more}")


@pytest.mark.parametrize("model, transformers, more, holds", [
    ("Qwen/Qwen-7B-Chat", "4.35.2", "--gradient_checkpointing", True),
    ("THUDM/chatglm3-6b", "4.35.0", "--gradient_checkpointing", True),
    ("baichuan-inc/Baichuan2-7B-Base", "4.35.2", "--gradient_checkpointing", True),
    ("Qwen/Qwen-7B-Chat", "4.36.0", "--gradient_checkpointing", False),  # PR #27610's fallback
    ("Qwen/Qwen-7B-Chat", "4.34.1", "--gradient_checkpointing", False),
    ("Qwen/Qwen-7B-Chat", "4.35.2", "", False),  # no checkpointing, no hook call
    ("Qwen/Qwen2-7B", "4.35.2", "--gradient_checkpointing", False),  # transformers' own Qwen2 (no remote code)
])
def test_the_model_the_release_and_checkpointing_decide(tmp_path, monkeypatch, model, transformers, more, holds):
    found = launch_findings(tmp_path, monkeypatch, LINE.format(model=model, more=more), f"transformers={transformers}")
    assert (RULE in found) == holds, found


def test_explain_names_it_but_not_for_diffusers_models():
    line = "TypeError: QWenPreTrainedModel._set_gradient_checkpointing() got an unexpected keyword argument 'enable'"
    _, candidates, _ = diagnose_log(line)
    assert (candidates[0].rule.id, candidates[0].confidence) == (RULE, "confirmed")
    wan = ('  File "/env/site-packages/diffusers/models/modeling_utils.py", line 1, in enable_gradient_checkpointing\n'
           "TypeError: WanModel._set_gradient_checkpointing() got an unexpected keyword argument 'enable'")
    assert RULE not in [c.rule.id for c in diagnose_log(wan)[1]]


def test_the_installed_transformers_calls_an_old_style_hook_the_old_way():
    """The bound's upper side on the installed release: a model whose code overrides the hook as the remote-code
    models do gets checkpointing enabled (PR #27610's fallback), not the TypeError."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaModel

    class OldHook(LlamaForCausalLM):
        def _set_gradient_checkpointing(self, module, value=False):  # Qwen-1's / ChatGLM's signature
            if isinstance(module, LlamaModel):
                module.gradient_checkpointing = value

    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2)
    model = OldHook(config)
    model.gradient_checkpointing_enable()  # transformers 4.35 raised TypeError here
    assert model.model.gradient_checkpointing is True
