"""`loraflow check` on Python training code (frontends/python_script.py, script_code.py, script_facts.py,
script_setup.py): scripts and snippets from public threads and examples (tests/fixtures/frontends/python/MANIFEST.json)
-> Combination fields with their `file:line: call` sources -> the rule findings. The code is read, never run.
"""

from __future__ import annotations

import json
import re
import shutil
import shlex

import pytest
from conftest import ROOT

from loraflow.commands.cli import main
from loraflow.errors import LoraflowError
from loraflow.frontends import detect, from_files, parse_versions, run_check
from loraflow.frontends.script_code import read_code
from loraflow.frontends.script_setup import looks_like_script

FIX = ROOT / "tests" / "fixtures" / "frontends" / "python"
# Every package check asks about, pinned: the findings below hold for these releases, not a scenario sweep.
CURRENT = parse_versions("torch=2.13.0,transformers=5.23.0,peft=0.21.2,trl=1.16.0,bitsandbytes=0.50.2,"
                         "accelerate=1.15.0,deepspeed=0.19.8,unsloth=2026.7.1")


def doc(argv: list[str] | None = None, files: list[str] | None = None, versions=CURRENT, name=None) -> dict:
    text, code = run_check(argv, "python" if files else name, files or [], dict(versions), as_json=True)
    out = json.loads(text)
    assert out["exit_code"] == code
    return out


def found(report: dict) -> dict[str, bool]:
    """rule -> whether it holds whatever is unknown (False: only under a condition the code does not show)."""
    return {f["rule"]: f["holds_if"] is None for f in report["findings"]}


# file -> (Combination fields, findings: rule -> unconditional?)
CASES = {
    # GRPO on an adapter loaded for inference: PeftModel.from_pretrained without is_trainable=True.
    "trl_3031_grpo_loaded_adapter.py": (
        {"stage": "grpo", "adapter": "lora", "adapter_loaded_frozen": True, "quantization": None},
        {"adapter-loaded-frozen": True}),
    # A reward model with a saved adapter: whether the adapter holds the new score head is in its files.
    "trl_368_reward_adapter_load.py": (
        {"stage": "rm", "adapter": "lora"},
        {"adapter-omits-new-head": False, "adapter-loaded-frozen": False}),
    # A 4-bit model and no adapter in the snippet: full fine-tuning of a quantized base, if the rest adds none.
    "transformers_27702_seqcls_4bit.py": (
        {"stage": "rm", "quantization": "4bit", "adapter": "full"},
        {"kbit-full-finetune": False}),
    "peft_2501_bnb_storage.py": (
        {"quantization": "4bit", "adapter": "full"},
        {"kbit-full-finetune": False}),
    # A merge whose base is not shown: into quantized weights only if the checkpoint is pre-quantized.
    "qwen_vl_483_autopeft_merge.py": (
        {"adapter": "lora", "merge_into_quantized": True, "adapter_loaded_frozen": False},
        {"kbit-merge": False}),
    "peft_1138_merge_fragment.py": (
        {"adapter": "lora", "merge_into_quantized": True},
        {"kbit-merge": False}),
    # LoRA cast to bf16 after get_peft_model: pure bf16 storage, which LoRA's small A and B survive.
    "peft_2421_cast_after_peft.py": (
        {"adapter": "lora", "precision": "bf16"},
        {}),
    "accelerate_3508_lora_fragment.py": ({"adapter": "lora", "engine": "single"}, {}),
    # A float16 base with modules_to_save under fp16 loss scaling: the copies train in float16.
    "peft_341_fp16_modules_to_save.py": (
        {"adapter": "lora", "precision": "fp16"},
        {"fp16-trainable-unscale": True}),
    # Unsloth in 4 bits with its own checkpointing (reentrant, inputs made to require grad), one process.
    "unsloth_readme_dpo.py": (
        {"stage": "dpo", "unsloth": True, "quantization": "4bit", "checkpointing": "all", "reentrant": True,
         "input_grad_hook": True},
        {}),
    # An adapter loaded frozen inside accelerate's load hook: only a resumed run trains it.
    "peft_whisper_adalora_int8_excerpt.py": (
        {"adapter": "lora", "quantization": "8bit", "checkpointing": "all", "input_grad_hook": True,
         "adapter_loaded_frozen": False},
        {"adapter-loaded-frozen": False}),
    # The script stops when gradient_checkpointing is on; the bf16 AutoPeftModel reload after training is not the
    # trained model (no merge into the 4-bit base).
    "trl_sft_llama2.py": (
        {"stage": "sft", "adapter": "lora", "quantization": "4bit", "checkpointing": "off",
         "merge_into_quantized": False, "quantized_moved": False},
        {}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_fixture_reads_as_expected(name):
    fields, expected = CASES[name]
    report = doc(files=[str(FIX / name)])
    assert report["framework"] == "python-script"
    assert {k: report["setup"][k] for k in fields} == fields
    assert found(report) == expected
    for field in fields:  # a value read from the code says where: `file:LINE: call(...)`, or `file: ...` for all of it
        source = report["sources"].get(field, "")
        assert not source.startswith(name) or re.match(rf"{re.escape(name)}:(\d+: \S| )", source), source


def test_sources_name_the_line_and_the_call():
    r = from_files("python", [str(FIX / "trl_3031_grpo_loaded_adapter.py")], CURRENT)
    assert r.sources["stage"] == "trl_3031_grpo_loaded_adapter.py:7: GRPOTrainer(...)"
    assert r.sources["adapter_loaded_frozen"].startswith(
        "trl_3031_grpo_loaded_adapter.py:3: PeftModel.from_pretrained(...) (without is_trainable=True")
    assert r.flags["adapter_loaded_frozen"] == "PeftModel.from_pretrained(..., is_trainable=True)"
    u = from_files("python", [str(FIX / "unsloth_readme_dpo.py")], CURRENT)
    assert u.sources["quantization"] == "unsloth_readme_dpo.py:9: FastLanguageModel.from_pretrained(load_in_4bit=True)"
    assert u.sources["reentrant"].startswith("unsloth_readme_dpo.py:16: FastLanguageModel.get_peft_model("
                                             "use_gradient_checkpointing='unsloth') (Unsloth's prepare_model")
    assert u.sources["stage"] == "unsloth_readme_dpo.py:30: DPOTrainer(...)"


def test_a_call_in_a_hook_the_script_hands_on_is_a_condition():
    report = doc(files=[str(FIX / "peft_whisper_adalora_int8_excerpt.py")])
    why = next(u["why"] for u in report["unknowns"] if u["name"] == "adapter_loaded_frozen")
    assert why.startswith("peft_whisper_adalora_int8_excerpt.py:25: PeftModel.from_pretrained(...) is in "
                          "load_model_hook(), which the script only hands on (a hook)")


def test_the_fix_of_a_trained_frozen_adapter_is_in_the_code(tmp_path):
    # The same code with is_trainable=True: the adapter trains and nothing is found.
    fixed = (FIX / "trl_3031_grpo_loaded_adapter.py").read_text().replace(
        "PeftModel.from_pretrained(pre_trained_model, adapter_path)",
        "PeftModel.from_pretrained(pre_trained_model, adapter_path, is_trainable=True)")
    assert fixed != (FIX / "trl_3031_grpo_loaded_adapter.py").read_text()
    report = doc(files=[_write(tmp_path, fixed, "trl_3031_fixed.py")])
    assert report["setup"]["adapter_loaded_frozen"] is False and found(report) == {}


def test_a_broken_snippet_reads_what_parses_and_names_the_skipped_lines(tmp_path):
    # A snippet pasted with the poster's own words between its lines and a notebook command in front.
    lines = (FIX / "trl_3031_grpo_loaded_adapter.py").read_text().splitlines()
    broken = ["!pip install -U trl peft", *lines[:4], "then I train it with:", *lines[4:],
              "trainer.train(  # copied up to here"]
    report = doc(files=[_write(tmp_path, "\n".join(broken) + "\n", "broken.py")])
    assert report["setup"]["stage"] == "grpo" and report["setup"]["adapter_loaded_frozen"] is True
    assert "broken.py:1: skipped (a notebook command): !pip install -U trl peft" in report["notes"]
    assert any(n.startswith("broken.py:6: skipped (") and n.endswith("then I train it with:")
               for n in report["notes"])
    # The paste cut inside `trainer.train(` is closed and read as that call, not skipped.
    assert not any(n.startswith(f"broken.py:{len(broken)}: skipped (") for n in report["notes"])


def test_unread_calls_and_values_are_listed(tmp_path):
    text = (FIX / "trl_3031_grpo_loaded_adapter.py").read_text().replace(
        'GRPOConfig(output_dir="Qwen2-0.5B-GRPO", logging_steps=10)',
        'GRPOConfig(output_dir="Qwen2-0.5B-GRPO", logging_steps=10, bf16=use_bf16)')
    text += "model.resize_token_embeddings(len(tokenizer))\n"
    report = doc(files=[_write(tmp_path, text, "unread.py")])
    assert "unread.py:6: GRPOConfig(bf16=use_bf16) (not a literal: its value is not visible here)" in report["unknown"]
    assert "unread.py:14: model.resize_token_embeddings(...) (a call check does not read)" in report["unknown"]
    assert report["exit_code"] == 2  # the frozen adapter still crashes, whatever bf16 is


def test_a_launch_line_reads_the_script_with_its_flags(tmp_path, monkeypatch):
    """`check -- python train.py --fp16`: the code (Unsloth, 4 bits, DPO) and the flag together; the flag wins over
    TRL's bf16 default and the note says the script parses no arguments."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(FIX / "unsloth_readme_dpo.py", tmp_path / "train.py")
    assert detect(["python", "train.py"]) == "hf"
    report = doc(shlex.split("python train.py --fp16"))
    assert report["framework"] == "hf"
    assert (report["setup"]["precision"], report["sources"]["precision"]) == ("fp16-mixed", "--fp16")
    assert report["setup"]["unsloth"] and report["setup"]["stage"] == "dpo"
    assert any("shows no argument parser" in n for n in report["notes"])
    assert doc(shlex.split("python train.py --fp16"), name="python")["setup"] == report["setup"]
    with pytest.raises(LoraflowError, match="not a Python training script in this directory"):
        doc(shlex.split("python missing.py --fp16"), name="python")
    # Two processes: Unsloth before its multi-GPU support; and under DDP, Unsloth's reentrant checkpointing beside
    # the find_unused_parameters=True the HF Trainer sets for a PeftModel.
    multi = doc(shlex.split("torchrun --nproc_per_node 2 train.py"), versions={**CURRENT,
                                                                              **parse_versions("unsloth=2025.3.1")})
    assert found(multi) == {"unsloth-multi-gpu": True, "ddp-reentrant-unused": True}
    assert multi["sources"]["reentrant"].startswith("train.py:16: FastLanguageModel.get_peft_model(")


def test_peft_sft_example_with_its_launch_script(tmp_path, monkeypatch):
    """PEFT's examples/sft: train.py takes peft_config from a helper in utils.py (not read); its own flag
    --use_peft_lora says whether that is an adapter. The corpus's run_peft_multigpu.sh launches it."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(FIX / "peft_sft_train_excerpt.py", tmp_path / "train.py")
    launch = (ROOT / "tests/fixtures/corpus/check/scripts/002-peft-sft-qlora-ddp-torchrun.sh").read_text()
    (tmp_path / "run.sh").write_text(launch)
    report = doc(["bash", "run.sh"])
    assert report["sources"]["adapter"] == ("--use_peft_lora True (the script's own flag; train.py:38: "
                                            "SFTTrainer(peft_config=peft_config) takes its adapter)")
    assert (report["setup"]["world_size"], report["setup"]["quantization"], report["setup"]["reentrant"]) == (
        8, "4bit", False)
    assert found(report) == {} and report["unknowns"] == []
    # The script alone: whether peft_config is None is not shown, so the adapter is a choice check evaluates both
    # ways (the quantization is a flag of the launch line, absent here, so no finding depends on it).
    alone = from_files("python", [str(tmp_path / "train.py")], CURRENT)
    assert set(alone.unsure) == {"adapter"} and alone.setup.quantization is None
    # Without the LoRA flags: peft_config is None, and the 4-bit base trains in full.
    (tmp_path / "run.sh").write_text(launch.replace("--use_peft_lora True", "--use_peft_lora False")
                                     .replace("--lora_r 8 \\\n", ""))
    assert found(doc(["bash", "run.sh"])) == {"kbit-full-finetune": True}


def test_unsloth_vision_loader_checkpoints_non_reentrant_under_ddp(tmp_path, monkeypatch):
    """Unsloth's README SFT loads with FastModel (its vision loader), which checkpoints non-reentrantly in a
    multi-process launch since 2025.12.8 (PR #3751); before, reentrant beside DDP's find_unused_parameters."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(FIX / "unsloth_readme_sft.py", tmp_path / "train.py")
    launch = shlex.split("torchrun --nproc_per_node 2 train.py")
    new = doc(launch, versions={**CURRENT, **parse_versions("unsloth=2026.7.1")})
    assert new["setup"]["reentrant"] is False and "PR #3751" in new["sources"]["reentrant"]
    assert not {"unsloth-multi-gpu", "ddp-reentrant-unused"} & set(found(new))
    old = doc(launch, versions={**CURRENT, **parse_versions("unsloth=2025.12.7")})
    assert old["setup"]["reentrant"] is True and old["sources"]["reentrant"].startswith("train.py:41: ")
    assert {"unsloth-multi-gpu": True, "ddp-reentrant-unused": True}.items() <= found(old).items()
    single = doc(files=[str(tmp_path / "train.py")])  # one process: Unsloth's own reentrant checkpointing
    assert single["setup"]["reentrant"] is True and single["setup"]["quantization"] == "4bit"


def test_trl_722_a_4bit_model_on_gpu_0_in_a_two_process_launch(tmp_path, monkeypatch):
    """TRL's sft_llama2.py as trl#722 ran it (device_map={'': 0}) under `accelerate launch` with 2 processes: every
    rank loads the 4-bit model on GPU 0. The script as fixed (Accelerator().local_process_index) is clean."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(FIX / "trl_722_accelerate_multi_gpu.yaml", tmp_path / "multi_gpu.yaml")
    fixed = (FIX / "trl_sft_llama2.py").read_text()
    (tmp_path / "sft_llama2.py").write_text(fixed.replace('device_map={"": Accelerator().local_process_index}',
                                                          'device_map={"": 0}'))
    launch = shlex.split("accelerate launch --config_file multi_gpu.yaml sft_llama2.py --output_dir=sft")
    old = parse_versions("transformers=4.33.0,peft=0.6.0,trl=0.7.1,accelerate=0.23.0,bitsandbytes=0.41.1,torch=2.0.1")
    report = doc(launch, versions=old)
    assert (report["setup"]["world_size"], report["setup"]["engine"]) == (2, "ddp")
    assert report["sources"]["quantized_moved"].startswith("sft_llama2.py:64: AutoModelForCausalLM.from_pretrained("
                                                           "device_map={'': 0}) in a 2-process launch")
    assert found(report) == {"kbit-model-moved": True}
    (tmp_path / "sft_llama2.py").write_text(fixed)
    assert found(doc(launch, versions=old)) == {}


def test_check_reads_a_script_through_the_cli(capsys, tmp_path):
    path = tmp_path / "train.py"
    shutil.copy(FIX / "peft_341_fp16_modules_to_save.py", path)
    code = main(["check", "--versions", "peft=0.13.0", str(path)])
    out = capsys.readouterr().out
    assert code == 2 and "Python training script setup" in out
    assert "[crash] fp16-trainable-unscale" in out
    assert "train.py:1: AutoModelForCausalLM.from_pretrained(torch_dtype=torch.float16)" in out
    # `--framework python` is the same reader; a .py file with no training code in it is refused.
    assert main(["check", "--framework", "python", "--json", str(path)]) == 2
    capsys.readouterr()
    (tmp_path / "plain.py").write_text("import os\nprint(os.getcwd())\n")
    assert main(["check", str(tmp_path / "plain.py")]) != 0
    assert "plain.py imports or calls nothing check reads" in capsys.readouterr().err
    with pytest.raises(LoraflowError, match="one Python training script"):
        from_files("python", [str(path), str(tmp_path / "plain.py")], CURRENT)


def test_pasted_code_is_told_from_configs_and_commands():
    assert looks_like_script((FIX / "peft_2501_bnb_storage.py").read_text())
    assert not looks_like_script("load_in_8bit: true\nadapter: lora\nlora_r: 32\n")  # YAML parses as Python too
    assert not looks_like_script('{"zero_optimization": {"stage": 3}}')
    assert not looks_like_script("model.save_pretrained(script_args.output_dir)")


def _write(folder, text: str, name: str) -> str:
    (folder / name).write_text(text)
    return str(folder / name)


def test_a_snippet_that_leaves_code_out_is_read_as_an_excerpt(tmp_path):
    """`trainer = ...` and a `...` line stand for code the poster left out (trl#1379 posted its reward script so):
    that no adapter shows is then a question, not full fine-tuning in bf16 as a finding that holds whatever."""
    text = ("model = AutoModelForSequenceClassification.from_pretrained(\n"
            "    script_args.model_name, num_labels=1, torch_dtype=torch.bfloat16)\n"
            "...\ntrainer = ...\ntrainer.train()\n")
    (tmp_path / "rm.py").write_text(text)
    report = doc(files=[str(tmp_path / "rm.py")])
    assert found(report) == {"bf16-lost-updates": False}, report["findings"]
    assert report["exit_code"] == 1
    # The whole script, with nothing left out, trains every weight in bfloat16: the finding holds.
    (tmp_path / "rm.py").write_text(text.replace("...\ntrainer = ...\n", "trainer = Trainer(model=model)\n"))
    assert found(doc(files=[str(tmp_path / "rm.py")])).get("bf16-lost-updates") is True


def test_a_snippet_cut_inside_a_call_still_reads_that_call(tmp_path):
    """A paste that stops inside `get_peft_model(` (unsloth#2467 posted its script so) still attaches adapters: the
    open bracket is closed after the last line instead of the call being dropped, so the 4-bit model is not read
    as trained without adapters."""
    text = ("from unsloth import FastLanguageModel\n"
            "model, tokenizer = FastLanguageModel.from_pretrained(model_name='m', load_in_4bit=True)\n"
            "model = FastLanguageModel.get_peft_model(\n    model,\n    r=16,\n"
            "    lora_dropout=0,  # Supports any, but = 0 is optimized\n")
    code = read_code(text, "cut.py")
    peft = [c for c in code.calls if c.func.endswith("get_peft_model")]
    assert peft and peft[0].kwargs.get("r") == 16 and not code.skipped
    assert "kbit-full-finetune" not in found(doc(files=[_write(tmp_path, text, "cut.py")]))


def test_a_comma_left_out_between_two_arguments_is_put_back(tmp_path):
    """`gradient_accumulation_steps=1` / `num_generations=8` without the comma (trl#3089's GRPOConfig): the call is
    read with the comma added and a note, not dropped line by line until nothing of the script is left."""
    text = ("from trl import GRPOConfig\n"
            "training_args = GRPOConfig(\n    gradient_accumulation_steps=1\n    num_generations=8,\n"
            "    gradient_checkpointing=True,\n)\n")
    code = read_code(text, "grpo.py")
    config = next(c for c in code.calls if c.func == "GRPOConfig")
    assert config.kwargs == {"gradient_accumulation_steps": 1, "num_generations": 8, "gradient_checkpointing": True}
    assert code.skipped == ["grpo.py:3: read with a comma added (invalid syntax. Perhaps you forgot a comma?)"]
    assert looks_like_script(text)
