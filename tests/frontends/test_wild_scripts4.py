"""`loraflow check` on more shapes of users' own training scripts seen in public repositories (a fourth sweep): each
test writes a short synthetic script of the shape the named repository showed and checks the reading."""

from __future__ import annotations

import json
import textwrap

from loraflow.frontends import parse_versions, run_check

CURRENT = parse_versions("torch=2.13.0,transformers=5.23.0,peft=0.21.2,trl=1.16.0,bitsandbytes=0.50.2,"
                         "accelerate=1.15.0,deepspeed=0.19.8,unsloth=2026.7.1")


def check(tmp_path, monkeypatch, text: str, argv: list[str] | None = None) -> dict:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(textwrap.dedent(text))
    out, code = run_check(argv, None if argv else "python", [] if argv else ["train.py"], dict(CURRENT),
                          as_json=True)
    report = json.loads(out)
    assert report["exit_code"] == code
    return report


def rules(report: dict) -> set[str]:
    return {f["rule"] for f in report["findings"]}


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
