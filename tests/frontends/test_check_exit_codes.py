"""`loraflow check` on another framework's launch: its exit code says what the launch is (issue 31), and what stays
open is one "depends on" question instead of a list of conditional [crash] findings.

2: the launch fails or trains wrongly as given; 1: it depends on something check could not see, named in the
report (a version, a choice in the user's code, the data, a flag it could not read); 0: nothing found that fails or
trains wrongly (a slow-only finding is advice)."""

from __future__ import annotations

import json
import shlex

from loraflow.frontends import run_check
from loraflow.frontends.base import FrontendResult
from loraflow.frontends.report import _exit_code
from loraflow.frontends.verdict import Checked
from loraflow.rules import all_rules
from loraflow.rules.combination import Combination

# OpenRLHF with its dotted flags (releases >= 0.10.2), ZeRO-3, non-reentrant checkpointing, LoRA: crashes on
# DeepSpeed < 0.19.3 only (zero3-frozen-recompute), and its releases pin DeepSpeed on both sides of the fix.
DOTTED = ("deepspeed --module openrlhf.cli.train_sft --model.model_name_or_path m --ds.zero_stage 3 "
          "--model.gradient_checkpointing_enable --ds.lora.rank 16")


def _check(line: str, versions: str = "") -> tuple[dict, str, int]:
    from loraflow.frontends import parse_versions

    given = parse_versions(versions) if versions else {}
    doc = json.loads(run_check(shlex.split(line), None, [], dict(given), as_json=True)[0])
    text, code = run_check(shlex.split(line), None, [], dict(given), as_json=False)
    assert doc["exit_code"] == code
    return doc, text, code


def test_a_finding_the_versions_decide_is_exit_2_and_not_a_question():
    doc, text, code = _check(DOTTED, "deepspeed=0.15.3")
    assert code == 2 and doc["depends_on"] == []
    assert "[crash] zero3-frozen-recompute" in text and "depends on:" not in text
    assert "exit code 2: this launch fails or trains wrongly as given" in text


def test_an_unknown_version_is_one_depends_on_question_and_exit_1():
    doc, text, code = _check(DOTTED)
    assert code == 1
    assert len(doc["depends_on"]) == 1 and doc["depends_on"][0].startswith("which deepspeed release")
    # The conditional crash sits under the question with its condition, not as a [crash] finding of its own.
    assert "\n[crash]" not in text and "no known conflict holds whatever is unknown." in text
    assert "depends on: which deepspeed release" in text
    assert "  if deepspeed<0.19.3: [crash] zero3-frozen-recompute" in text


def test_a_version_outside_the_range_is_clean_exit_0():
    _, text, code = _check(DOTTED, "deepspeed=0.19.8")
    assert code == 0 and "zero3-frozen-recompute" not in text and "depends on:" not in text


def test_an_unread_flag_alone_is_exit_1():
    _, text, code = _check(DOTTED + " --a_flag_no_release_has 3", "deepspeed=0.19.8")
    assert code == 1 and "--a_flag_no_release_has" in text and "what it could not read" in text


def test_a_slow_only_finding_is_advice_and_exit_0():
    rules = {r.id: r for r in all_rules()}
    result = FrontendResult("hf", Combination())
    slow = Checked(rules["fsdp-frozen-grad-memory"], None)
    assert slow.rule.impact == "slow"
    assert _exit_code(result, [slow]) == 0
    assert _exit_code(result, [slow, Checked(rules["zero3-frozen-recompute"], "deepspeed<0.19.3")]) == 1
    assert _exit_code(result, [slow, Checked(rules["zero3-frozen-recompute"], None)]) == 2
    result.unknown.append("--made_up_flag")
    assert _exit_code(result, [slow]) == 1


# A launch pasted from another machine names config files that are not here. It is still checked from its flags; what
# the missing file decides is the open question (exit 1), never a refusal that exit 2 would read as "fails".
LF_OLD = ("accelerate launch --config_file config.yaml src/train_bash.py --stage sft --do_train --model_name_or_path "
          "Yi-34B-Chat --finetuning_type lora --lora_target q_proj,v_proj")


def test_a_missing_accelerate_config_makes_the_engine_the_question(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    doc, text, code = _check(LF_OLD, "deepspeed=0.15.3,transformers=4.40.0,peft=0.10.0,accelerate=0.30.0")
    assert code == 1, text
    assert any("config.yaml selects DeepSpeed ZeRO-3" in q for q in doc["depends_on"]), doc["depends_on"]
    # A ZeRO-3 finding holds only where the file selects DeepSpeed at stage 3: conditional, under the question.
    save = next(f for f in doc["findings"] if f["rule"] == "zero3-empty-adapter-save")
    assert save["holds_if"] == "config.yaml selects DeepSpeed ZeRO-3"
    assert "engine is now" not in text and "(engine: depends on what is not visible here)" in text
    assert "  engine                  ?             --config_file config.yaml: the file is not here" in text
    assert "engine" in doc["setup_depends_on_unseen"]


def test_each_engine_an_unseen_config_may_select_is_read_as_the_framework_reads_it(tmp_path, monkeypatch):
    """The engine is a fork, not an override: what the framework derives from it is read per engine. LLaMA-Factory
    before 0.6.0 passes no 4-bit storage dtype, which only the sharding engines refuse (LlamaFactory#3470)."""
    monkeypatch.chdir(tmp_path)
    doc, text, code = _check(LF_OLD + " --quantization_bit 4 --fp16",
                             "transformers=4.40.0,bitsandbytes=0.43.1,llama-factory=0.5.3")
    storage = next(f for f in doc["findings"] if f["rule"] == "qlora-storage-dtype")
    assert storage["holds_if"] == ("config.yaml selects DeepSpeed ZeRO-3 or config.yaml selects FSDP (fsdp_version 1) "
                                   "or config.yaml selects FSDP2 (fsdp_version 2)"), storage["holds_if"]
    assert code == 1


def test_the_missing_file_s_process_count_is_evaluated_both_ways(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _, text, _ = _check(LF_OLD)
    assert "world size not visible (the process count is not in the command: --config_file config.yaml" in text


def test_a_missing_axolotl_config_is_read_from_its_name_and_listed_unread(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    doc, text, code = _check("accelerate launch -m axolotl.cli.train examples/llama-3/qlora-fsdp-70b.yaml")
    assert code == 1, text
    assert doc["setup"]["adapter"] == "lora" and doc["setup"]["quantization"] == "4bit"
    assert doc["setup"]["engine"] == "fsdp1"
    assert any("qlora-fsdp-70b.yaml: not here" in u for u in doc["unknown"])
    # The 4-bit storage dtype follows bf16, which only the file says: a question, not a crash.
    storage = next(f for f in doc["findings"] if f["rule"] == "qlora-storage-dtype")
    assert "does not train in bf16" in storage["holds_if"]


def test_a_missing_trl_recipe_leaves_the_flags_read(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    doc, text, code = _check("accelerate launch --config_file examples/accelerate_configs/deepspeed_zero3.yaml "
                             "trl/scripts/sft.py --config recipe.yaml --use_peft --lora_r 16")
    assert code in (1, 2), text
    assert doc["setup"]["adapter"] == "lora" and doc["setup"]["zero_stage"] == 3
    assert any(u.startswith("--config recipe.yaml: not here") for u in doc["unknown"])


def test_accelerate_without_a_config_file_reads_this_machine_s_default_config(tmp_path, monkeypatch):
    """`accelerate launch train.py` takes its engine from the default config `accelerate config` wrote, read here as
    check reads the installed packages (LLaMA-Factory#274 ran ZeRO-3 from it); with none, accelerate runs one process
    per GPU under DDP, and how many GPUs is the question. A launcher flag that chooses the engine decides alone."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    plain = LF_OLD.replace("--config_file config.yaml ", "")
    doc, text, code = _check(plain, "transformers=4.40.0,llama-factory=0.6.3")
    assert doc["setup"]["engine"] == "single" and "one process and several evaluated" in text
    assert "no default config on this machine" in text and doc["setup_depends_on_unseen"] == []
    (tmp_path / "hf" / "accelerate").mkdir(parents=True)
    (tmp_path / "hf" / "accelerate" / "default_config.yaml").write_text(
        "distributed_type: DEEPSPEED\nnum_processes: 4\ndeepspeed_config:\n  zero_stage: 3\n")
    doc, text, code = _check(plain, "transformers=4.40.0,llama-factory=0.6.3")
    assert (doc["setup"]["engine"], doc["setup"]["zero_stage"], doc["setup"]["world_size"]) == ("deepspeed", 3, 4)
    assert "this machine's default config: read here" in text
    chosen = plain.replace("accelerate launch", "accelerate launch --use_deepspeed --zero_stage 2 --num_processes 2")
    doc, text, code = _check(chosen, "transformers=4.40.0,llama-factory=0.6.3")
    assert doc["setup"]["engine"] == "deepspeed" and doc["setup"]["zero_stage"] == 2


def test_a_script_that_is_not_here_is_read_as_trl_s_only_on_flags_only_trl_has(tmp_path, monkeypatch):
    """`--lora_r` is TRL's flag and FastChat's, alpaca-lora's and many scripts' own: alone it leaves open which
    trainer the script builds (TRL turns checkpointing on by default since 0.22, transformers' Trainer does not).
    `--use_peft` is TRL's ModelConfig."""
    monkeypatch.chdir(tmp_path)
    versions = "trl=0.24.0,transformers=4.57.0,peft=0.17.0,accelerate=1.10.0,torch=2.8.0"
    doc, text, _ = _check("torchrun --nproc_per_node 2 train.py --model_name_or_path m --lora_r 8 "
                          "--load_in_4bit", versions)
    # Read as TRL's, --lora_r without --use_peft is ignored: a 4-bit base trained in full; as the script's own: LoRA.
    full = next(f for f in doc["findings"] if f["rule"] == "kbit-full-finetune")
    assert full["holds_if"] == "train.py trains with TRL's trainer (its LoRA flags are TRL's)"
    assert "  checkpointing           ?" in text
    doc, text, _ = _check("torchrun --nproc_per_node 2 train.py --model_name_or_path m --use_peft --lora_r 8",
                          versions)
    assert not any("TRL's trainer" in q for q in doc["depends_on"]) and doc["setup"]["checkpointing"] == "all"


def test_a_fork_that_changes_nothing_is_not_evaluated(tmp_path, monkeypatch):
    """`accelerate launch` without a config, but the script's own --deepspeed chooses the engine: the default
    config's five engines would read alike, so they are not multiplied into the scenarios or asked about."""
    monkeypatch.chdir(tmp_path)
    line = ("accelerate launch src/train_bash.py --stage sft --do_train --model_name_or_path m --finetuning_type lora "
            "--deepspeed ds_z3_config.json")
    doc, text, _ = _check(line, "transformers=4.40.0,peft=0.10.0,deepspeed=0.14.0,llama-factory=0.6.3")
    assert not any("default accelerate config" in q for q in doc["depends_on"])
    assert doc["setup"]["engine"] == "deepspeed" and "  engine                  ?" not in text


def test_axolotl_train_runs_under_accelerate_launch_and_its_default_config(tmp_path, monkeypatch):
    """`axolotl train cfg.yml` runs `accelerate launch -m axolotl.cli.train` (cli/main.py, --accelerate default True
    from 0.6.0; --launcher accelerate from 0.12.0): with no default accelerate config, one process per GPU; with one,
    its engine where the YAML leaves it open; `--launcher python` runs one process in place."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    (tmp_path / "lora.yml").write_text("base_model: meta-llama/Llama-3.1-8B\nadapter: lora\nlora_target_linear: true\n"
                                       "gradient_checkpointing: true\nbf16: auto\n")
    _, text, _ = _check("axolotl train lora.yml")
    assert "one process and several evaluated" in text
    doc, text, _ = _check("axolotl train lora.yml --launcher python")
    assert doc["setup"]["world_size"] == 1 and "several evaluated" not in text
    doc, _, _ = _check("axolotl train lora.yml -- --num_processes 4 --use_deepspeed --zero_stage 2")
    assert (doc["setup"]["engine"], doc["setup"]["world_size"]) == ("deepspeed", 4)
    (tmp_path / "hf" / "accelerate").mkdir(parents=True)
    (tmp_path / "hf" / "accelerate" / "default_config.yaml").write_text("distributed_type: FSDP\nnum_processes: 2\n"
                                                                         "fsdp_config:\n  fsdp_version: 2\n")
    doc, _, _ = _check("axolotl train lora.yml")
    assert (doc["setup"]["engine"], doc["setup"]["world_size"]) == ("fsdp2", 2)


def test_input_check_cannot_read_is_exit_3_not_the_launch_fails_code(tmp_path, capsys):
    from loraflow.commands.cli import main

    missing = tmp_path / "run.sh"
    assert main(["check", "--", "bash", str(missing)]) == 3
    assert f"cannot read the launch script {missing}" in capsys.readouterr().err
    assert main(["check", "--framework", "verl", str(tmp_path / "config.yaml")]) == 3
    assert "config.yaml" in capsys.readouterr().err
    assert main(["check", "--no-such-flag-of-check"]) == 3
    assert main(["check", str(tmp_path / "missing.yaml")]) == 3  # a loraflow config that is not there
    assert "error: config file" in capsys.readouterr().err
    assert main(["check", "--nproc", "0"]) == 3
    assert capsys.readouterr().err.startswith("error: --nproc 0")
    assert main(["check", "--"]) == 3
    script = tmp_path / "notes.sh"
    script.write_text("echo nothing to launch here\n")
    assert main(["check", str(script)]) == 3
    assert "found no launch line" in capsys.readouterr().err


def test_a_file_that_is_no_loraflow_config_and_no_known_framework_s_is_exit_3(tmp_path, capsys):
    from loraflow.commands.cli import main

    (tmp_path / "jinja.yaml").write_text("model_dir: {{model_dir}}\nbatch: 2\n")  # a template, not YAML
    (tmp_path / "nested.yaml").write_text("env:\n  A: 1\nargs:\n  lr: 2\n")  # a user's own wrapper config
    for name in ("jinja.yaml", "nested.yaml"):
        assert main(["check", str(tmp_path / name)]) == 3
        assert "--framework NAME" in capsys.readouterr().err
    (tmp_path / "mine.yaml").write_text("model:\n  pathh: x\n")  # loraflow's, with a typo: train refuses it
    assert main(["check", str(tmp_path / "mine.yaml")]) == 2
    assert "model.path" in capsys.readouterr().err


def test_a_broken_loraflow_config_is_2_and_a_foreign_one_sharing_a_section_name_is_3(tmp_path):
    from loraflow.commands.cli import main

    (tmp_path / "bad.yaml").write_text("model:\n  path: m\nadapter:\n  rank: 8\n   alpha: 16\ntrain:\n  lr: 1\n")
    assert main(["check", str(tmp_path / "bad.yaml")]) == 2  # loraflow's sections, a YAML error: train refuses it
    (tmp_path / "other.yaml").write_text("model:\n  name: gpt2\noptimizer:\n  lr: 1\ntrainer:\n  devices: 8\n")
    assert main(["check", str(tmp_path / "other.yaml")]) == 3  # one section name in common is not loraflow's


def test_a_launch_the_framework_refuses_at_start_up_is_exit_2_with_its_own_section(tmp_path):
    """A DeepSpeed JSON whose batch sizes no process count satisfies: DeepSpeed's batch assertion stops every launch.
    It is no rule's failure, and was listed as "not understood" (exit 1); the launch fails as given."""
    ds = tmp_path / "ds.json"
    ds.write_text('{"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,'
                  ' "zero_optimization": {"stage": 2}}')
    doc = json.loads(run_check(None, "deepspeed", [str(ds)], {}, as_json=True)[0])
    text, code = run_check(None, "deepspeed", [str(ds)], {}, as_json=False)
    assert code == doc["exit_code"] == 2
    assert len(doc["stops"]) == 1 and "_batch_assertion" in doc["stops"][0]
    assert not [u for u in doc["unknown"] if "_batch_assertion" in u]
    assert "stops at start-up: the framework refuses this launch before its first step (1):" in text
    assert "exit code 2: this launch fails or trains wrongly as given (it stops at start-up)" in text
    ds.write_text('{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,'
                  ' "zero_optimization": {"stage": 2}}')
    doc = json.loads(run_check(None, "deepspeed", [str(ds)], {}, as_json=True)[0])
    assert doc["stops"] == [] and doc["exit_code"] != 2


def test_exit_code_2_for_a_stop_alone():
    assert _exit_code(FrontendResult("hf", Combination(), stops=["the framework refuses it"]), []) == 2
    assert _exit_code(FrontendResult("hf", Combination(), unknown=["--x"]), []) == 1
