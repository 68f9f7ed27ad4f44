"""`loraflow check` on more shapes of users' own training scripts seen in public repositories (a fourth sweep): each
test writes a short synthetic script of the shape the named repository showed and checks the reading."""

from __future__ import annotations

import json

from script_check import check


# A QLoRA script whose LoRA config comes from its own helper module (`peft_config=build_lora_config(cfg)` handed to
# SFTTrainer; a Qwen3-8B bioinstruct QLoRA script in a public repository, train_common.py helpers) was read as full
# fine-tuning of a 4-bit base, an unconditional crash: a helper's result is an adapter config built elsewhere.
HELPER_PEFT = '''
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig
    from trl import SFTTrainer, SFTConfig
    from my_helpers import make_lora
    bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen3-8B", quantization_config=bnb)
    trainer = SFTTrainer(model=model, args=SFTConfig(output_dir="o"), train_dataset=ds,
                         peft_config={peft})
    trainer.train()
'''


def test_a_helper_built_peft_config_is_an_adapter_not_full_fine_tuning(tmp_path, monkeypatch):
    report = check(tmp_path, monkeypatch, HELPER_PEFT.format(peft="make_lora(cfg)"))
    assert report["setup"]["adapter"] == "lora"
    assert report["exit_code"] == 1  # full fine-tuning is only the case the helper returns None
    assert all(f.get("holds_if") for f in report["findings"] if f["rule"] == "kbit-full-finetune")


def test_trl_s_own_get_peft_config_still_follows_use_peft(tmp_path, monkeypatch):
    text = HELPER_PEFT.format(peft="get_peft_config(model_args)").replace(
        "from my_helpers import make_lora", "from trl import get_peft_config")
    report = check(tmp_path, monkeypatch, text)
    assert report["setup"]["adapter"] == "full"


# Keyword arguments gathered in a dict and spread into the call: `SFTConfig(**sft_config_kwargs)` after
# `sft_config_kwargs = dict(...)` (a Qwen3.5 Unsloth VLM script), `from_pretrained(name, **model_kwargs)` after
# `if args.load_in_8bit: model_kwargs.update({...})` (an accelerate + PEFT custom-loop example). The dict's keys are
# the call's keywords; one an `if` changes depends on the test, and a dict built elsewhere is listed, not ignored.
SPREAD = '''
    import torch
    from transformers import AutoModelForCausalLM
    from peft import LoraConfig
    from trl import SFTTrainer, SFTConfig
    model_kwargs = {{"trust_remote_code": True}}
    {update}
    model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-7B", **model_kwargs)
    cfg = dict(output_dir="o", bf16=False, fp16=True, gradient_checkpointing=False)
    cfg["max_steps"] = 10
    trainer = SFTTrainer(model=model, args=SFTConfig(**cfg), train_dataset=ds, peft_config=LoraConfig(r=8))
    trainer.train()
'''


def test_a_dict_spread_into_the_config_is_read_key_by_key(tmp_path, monkeypatch):
    report = check(tmp_path, monkeypatch, SPREAD.format(update="model_kwargs.update(load_in_4bit=True)"))
    setup = report["setup"]
    assert (setup["precision"], setup["checkpointing"], setup["quantization"]) == ("fp16-mixed", "off", "4bit")


def test_a_key_set_under_an_if_is_listed_as_not_visible(tmp_path, monkeypatch):
    text = SPREAD.format(update='if args.q8:\n        model_kwargs.update({"load_in_8bit": True})')
    report = check(tmp_path, monkeypatch, text)
    assert report["setup"].get("quantization") in (None, "none")
    assert any("load_in_8bit" in u for u in report["unknown"])


def test_a_dict_from_elsewhere_spread_into_the_load_is_listed(tmp_path, monkeypatch):
    text = SPREAD.format(update="").replace("model_kwargs = {\"trust_remote_code\": True}", "").replace(
        "**model_kwargs", "**load_kwargs(args)")
    report = check(tmp_path, monkeypatch, text)
    assert any("**load_kwargs(args)" in u for u in report["unknown"])


# Unsloth's own helpers around a run (is_bf16_supported, UnslothVisionDataCollator, save_pretrained_merged) were
# listed as calls check does not read, so a clean Unsloth vision script exited 1 (an Unsloth Llama-3.2-Vision
# distillation script that saves merged_16bit after training).
def test_unsloth_helpers_are_not_listed_as_unread(tmp_path, monkeypatch):
    report = check(tmp_path, monkeypatch, '''
        from unsloth import FastVisionModel, is_bf16_supported
        from unsloth.trainer import UnslothVisionDataCollator
        from trl import SFTTrainer, SFTConfig
        model, tok = FastVisionModel.from_pretrained("unsloth/Qwen2-VL-2B-Instruct", load_in_4bit=True)
        model = FastVisionModel.get_peft_model(model, r=16)
        trainer = SFTTrainer(model=model, data_collator=UnslothVisionDataCollator(model, tok), train_dataset=ds,
                             args=SFTConfig(output_dir="o", bf16=True, max_length=None))
        trainer.train()
        model.save_pretrained_merged("out", tok, save_method="merged_16bit")
    ''')
    assert not [u for u in report["unknown"] if "does not read" in u]


# A script's own argparse flags (`parser.add_argument("--use_lora", action="store_true")`): their defaults decide an
# `if args.use_lora:` guard for a launch that leaves the flag out, as an argument dataclass's field default does.
ARGPARSE = '''
    import argparse
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments
    from peft import LoraConfig, get_peft_model
    parser = argparse.ArgumentParser()
    parser.add_argument("--use-lora", action="store_true")
    parser.add_argument("--model", default="m")
    args = parser.parse_args()
    model = AutoModelForCausalLM.from_pretrained(args.model)
    if args.use_lora:
        model = get_peft_model(model, LoraConfig(r=8))
    Trainer(model=model, args=TrainingArguments(output_dir="o")).train()
'''


def test_argparse_defaults_decide_the_script_s_own_guards(tmp_path, monkeypatch):
    import ast

    from loraflow.frontends.script_args import argparse_default, field_default

    report = check(tmp_path, monkeypatch, ARGPARSE)
    assert report["setup"]["adapter"] == "full" and "use_lora defaults to False" in json.dumps(report)
    report = check(tmp_path, monkeypatch, ARGPARSE, argv=["python", "train.py", "--use-lora"])
    assert report["setup"]["adapter"] == "lora"
    call = ast.parse('p.add_argument("-q", "--load-4bit", dest="four", type=bool, default=True)').body[0].value
    assert argparse_default(call) == ("four", True, ["load_4bit"])
    assert field_default(ast.parse("dataclasses.field(default=False)").body[0].value) is False


# Found in review: an option whose dest differs (`--with-adapter` -> use_lora) and set_defaults reach the guards.
def test_argparse_dest_and_set_defaults_reach_the_guards(tmp_path, monkeypatch):
    text = ARGPARSE.replace('"--use-lora", action="store_true"',
                            '"--with-adapter", dest="use_lora", action="store_true"')
    given = check(tmp_path, monkeypatch, text, argv=["python", "train.py", "--with-adapter"])
    assert given["setup"]["adapter"] == "lora"
    report = check(tmp_path, monkeypatch, text)
    assert report["setup"]["adapter"] == "full" and "runs here" in report["sources"]["adapter"]
    text = text.replace("args = parser.parse_args()",
                        "parser.set_defaults(use_lora=True)\n    args = parser.parse_args()")
    assert check(tmp_path, monkeypatch, text)["setup"]["adapter"] == "lora"
