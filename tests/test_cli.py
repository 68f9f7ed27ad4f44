"""The command line: exit codes, errors without tracebacks, and bad input stopped before anything is trained."""

from __future__ import annotations

import json

import pytest
from packaging.version import Version

from conftest import write_jsonl
from loraflow.commands.cli import build_parser, main


def test_check_prints_the_plan_and_exits_clean(tiny_model, capsys):
    assert main(["check", f"model.path={tiny_model}", "checkpointing.enabled=true"]) == 0
    out = capsys.readouterr().out
    assert "loraflow plan" in out and "checkpointing.reentrant" in out and "findings: none" in out


def test_check_exits_2_on_rule_errors(tiny_model, capsys):
    assert main(["check", f"model.path={tiny_model}", "adapter.target_modules=[nope]"]) == 2
    assert "no-adapter-matched" in capsys.readouterr().out


def test_check_json(tiny_model, capsys):
    import json

    assert main(["check", f"model.path={tiny_model}", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stage"] == "sft"


def test_check_stage_checks_that_stages_demo(capsys):
    import json

    # With no config, --stage picks the stage's embedded default, the one `loraflow train ppo` would run.
    assert main(["check", "--stage", "ppo", "--json"]) in (0, 1)
    plan = json.loads(capsys.readouterr().out)
    assert plan["stage"] == "ppo"
    assert main(["check", "--json"]) in (0, 1)
    assert json.loads(capsys.readouterr().out)["stage"] == "sft"


def test_config_errors_are_printed_without_traceback(capsys):
    assert main(["check", "adapter.rnak=4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: 1 configuration problem") and "adapter.rank" in err and "Traceback" not in err


def test_malformed_data_stops_before_training(tiny_model, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "completion": "b"}\n{"prompt": "a" "completion": "b"}\n')
    run = tmp_path / "run"
    code = main(["train", "sft", f"model.path={tiny_model}", f"data.train={bad}", "data.eval=",
                 f"output.dir={run}", "output.progress_bar=false"])
    assert code == 2
    assert f"{bad} line 2: not valid JSON" in capsys.readouterr().err
    assert not (run / "checkpoints").exists()


def test_zero_matched_modules_stops_before_training(tiny_model, chat_data, tmp_path, capsys):
    code = main(["train", "sft", f"model.path={tiny_model}", f"data.train={chat_data[0]}",
                 f"output.dir={tmp_path / 'run'}", "adapter.target_modules=[decoder.layers.q]"])
    assert code == 2
    err = capsys.readouterr().err
    assert "nothing was trained" in err and "no-adapter-matched" in err


def test_missing_model_path(tmp_path, capsys):
    code = main(["train", "sft", f"model.path={tmp_path / 'nowhere'}", f"output.dir={tmp_path / 'run'}"])
    assert code == 2
    assert "model.path=" in capsys.readouterr().err


def test_config_command_lists_every_key(capsys):
    assert main(["config"]) == 0
    out = capsys.readouterr().out
    assert "checkpointing.reentrant" in out and "adapter.train_modules" in out


def test_cli_surface_is_stable():
    """The commands and flags users script against; changing them is a breaking change."""
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert sorted(sub.choices) == ["chat", "check", "config", "explain", "generate", "merge", "plot", "probe",
                                   "train"]
    options = {name: {o for a in p._actions for o in a.option_strings} for name, p in sub.choices.items()}
    assert options["train"] >= {"--resume", "--verbose"}
    assert options["check"] >= {"--framework", "--versions", "--json"}
    assert options["explain"] >= {"--json", "--list"}
    assert options["probe"] >= {"--only", "--json", "--list", "--logs"}
    assert options["generate"] >= {"--prompt", "--image", "--prompts", "--no-chat-template", "--json", "--base"}
    train = sub.choices["train"]
    stage = next(a for a in train._actions if a.dest == "stage")
    assert list(stage.choices) == ["sft", "rm", "dpo", "grpo", "ppo"]
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "kto"])  # an unknown stage is refused by argparse


def test_check_reads_another_frameworks_command_line(capsys):
    argv = ["check", "--json", "--versions", "deepspeed=0.15.3", "--", "deepspeed", "--num_gpus", "2", "--module",
            "openrlhf.cli.train_sft", "--lora_rank", "16", "--gradient_checkpointing", "--zero_stage", "3"]
    assert main(argv) == 2
    data = json.loads(capsys.readouterr().out)
    assert "zero3-frozen-recompute" in [f["rule"] for f in data["findings"]]


def test_check_with_nothing_after_the_separator_is_an_error(capsys):
    assert main(["check", "--"]) == 3  # check could not read its input: no verdict on a launch
    assert "nothing after `--`" in capsys.readouterr().err


def test_check_versions_must_be_package_equals_version(capsys):
    assert main(["check", "--versions", "deepspeed"]) == 3
    assert "--versions" in capsys.readouterr().err


def test_check_versions_accept_a_package_no_rule_reads_and_name_the_one_a_typo_meant():
    from loraflow.environment import parse_versions
    from loraflow.errors import LoraflowError

    assert parse_versions("vllm=0.8.5,flash-attn=2.7.4.post1") == {"vllm": Version("0.8.5"),
                                                                    "flash-attn": Version("2.7.4.post1")}
    with pytest.raises(LoraflowError, match="did you mean transformers"):
        parse_versions("transfomers=4.40.0")


def test_check_on_another_frameworks_config_reads_it_with_that_frontend(capsys):
    from pathlib import Path

    axolotl = Path(__file__).parent / "fixtures/frontends/axolotl/llama3_lora_zero3.yml"
    code = main(["check", str(axolotl), "--json"])
    out = capsys.readouterr()
    # The guess is said (with the flag that overrides it) on stderr, and stdout is the axolotl check, as JSON.
    assert f"read as `loraflow check --framework axolotl {axolotl}`" in out.err
    report = json.loads(out.out)
    assert report["framework"] == "axolotl"
    assert main(["check", "--framework", "axolotl", str(axolotl), "--json"]) == code
    assert json.loads(capsys.readouterr().out) == report
    # An override meant for a loraflow config still refuses rather than guessing.
    assert main(["check", str(axolotl), "train.steps=2"]) == 2


def test_check_on_a_launch_script_reads_its_launch_line(tmp_path, capsys):
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/bash\n#SBATCH --nodes=1\nsrun -N 1 --gres=gpu:8 torchrun --nproc_per_node 8 train.py "
                      "--use_peft_lora True --gradient_checkpointing True --bf16\n")
    main(["check", str(script), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["framework"] == "hf" and report["setup"]["adapter"] == "lora"
    assert report["setup"]["world_size"] == 8
