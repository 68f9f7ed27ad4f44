"""A training script's code read with its launch line (script_code.py guards and branches, script_setup.live): what
runs under `if training_args.use_lora:` depends on the flag, and a flag the line leaves out is its dataclass field's
default. The shape is that of the VLM repos' finetune.py (MiniCPM-V, Qwen-VL, Qwen): one script, LoRA or full
fine-tuning by a flag, launched by several shell scripts."""

from __future__ import annotations

import shlex
import textwrap

from loraflow.frontends import from_command, parse_versions
from loraflow.frontends.script_code import read_code

VERSIONS = parse_versions("torch=2.2.0,transformers=4.44.2,peft=0.14.0,deepspeed=0.15.4,accelerate=0.30.1")
SCRIPT = textwrap.dedent('''
    from dataclasses import dataclass, field
    import transformers
    from peft import LoraConfig, get_peft_model

    @dataclass
    class TrainingArguments(transformers.TrainingArguments):
        use_lora: bool = field(default=False)
        tune_llm: bool = True

    def train():
        parser = transformers.HfArgumentParser((TrainingArguments,))
        (training_args,) = parser.parse_args_into_dataclasses()
        model = transformers.AutoModelForCausalLM.from_pretrained("Qwen/Qwen-7B-Chat")
        if not training_args.tune_llm:
            model.requires_grad_(False)
        if training_args.use_lora:
            if "chat" in training_args.output_dir:
                modules_to_save = None
            else:
                modules_to_save = ["wte", "lm_head"]
            config = LoraConfig(r=8, target_modules=["c_attn"], modules_to_save=modules_to_save)
            model = get_peft_model(model, config)
            if training_args.gradient_checkpointing:
                model.enable_input_require_grads()
                if training_args.vision_lora:
                    training_args.gradient_checkpointing_kwargs = {"use_reentrant": False}
                else:
                    training_args.gradient_checkpointing_kwargs = {"use_reentrant": True}
        trainer = transformers.Trainer(model=model, args=training_args)
        trainer.train()

    train()
''')


def test_calls_record_the_flags_their_ifs_test_and_fields_their_defaults():
    code = read_code(SCRIPT, "finetune.py")
    guards = {c.name: c.guard for c in code.calls}
    assert guards["LoraConfig"] == (("use_lora", True),)
    assert guards["requires_grad_"] == (("tune_llm", False),)
    assert guards["enable_input_require_grads"] == (("use_lora", True), ("gradient_checkpointing", True))
    assert (code.defaults["use_lora"], code.defaults["tune_llm"]) == (False, True)


def test_a_flag_left_at_its_default_turns_off_what_its_if_guards(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "finetune.py").write_text(SCRIPT)
    full = from_command(shlex.split("torchrun --nproc_per_node 2 finetune.py --output_dir o --bf16 True"), VERSIONS)
    assert full.setup.adapter == "full"
    assert any("use_lora" in n and "defaults to False" in n for n in full.notes)
    lora = from_command(shlex.split("torchrun --nproc_per_node 2 finetune.py --output_dir o --bf16 True --use_lora "
                                    "--gradient_checkpointing True"), VERSIONS)
    assert (lora.setup.adapter, lora.setup.input_grad_hook, lora.setup.reentrant) == ("lora", True, True)
    # An attribute set under an `if` follows its flag too (Qwen2-VL-Finetune's train_sft.py after 6695161).
    vision = from_command(shlex.split("torchrun --nproc_per_node 2 finetune.py --output_dir o --use_lora "
                                      "--gradient_checkpointing True --vision_lora True"), VERSIONS)
    assert vision.setup.reentrant is False


def test_a_name_both_branches_assign_differently_is_not_the_later_one():
    """modules_to_save is None or ["wte", "lm_head"] by a test check does not evaluate: not the else branch's list."""
    code = read_code(SCRIPT, "finetune.py")
    config = next(c for c in code.calls if c.name == "LoraConfig")
    assert type(config.kwargs["modules_to_save"]).__name__ == "Unread"
