"""Launch scripts as people write them: the launcher's options in a variable (Qwen-VL's and MiniCPM-V's
finetune_lora_ds.sh build `DISTRIBUTED_ARGS="..."` over several lines), that variable left unset in a pasted line,
and `#` inside a quoted prompt or a dataset spec (`name#5000`), which is no comment to bash."""

from __future__ import annotations

import json

from loraflow.frontends import parse_versions, run_check
from loraflow.frontends.argv import split_command
from loraflow.frontends.shell import command_from_script

VERSIONS = dict(parse_versions("torch=2.13.0,transformers=5.23.0,peft=0.21.2,trl=1.16.0,accelerate=1.15.0"))
# HF Trainer flags of a LoRA run that crashes under DDP (ddp-reentrant-unused): reentrant checkpointing with
# find_unused_parameters on.
FLAGS = ("train.py --use_peft --lora_r 16 --gradient_checkpointing --gradient_checkpointing_kwargs "
         "'{\"use_reentrant\": true}' --ddp_find_unused_parameters true --output_dir o")


def _doc(script) -> tuple[dict, int]:
    text, code = run_check(["bash", str(script)], None, [], dict(VERSIONS), True)
    return json.loads(text), code


def test_launcher_options_in_a_multiline_variable_are_read(tmp_path):
    script = tmp_path / "finetune.sh"
    script.write_text('GPUS_PER_NODE=8\nNNODES=2\nDISTRIBUTED_ARGS="\n    --nproc_per_node $GPUS_PER_NODE \\\n'
                      '    --nnodes $NNODES \\\n    --master_port 6001\n"\n\ntorchrun $DISTRIBUTED_ARGS ' + FLAGS + "\n")
    cmd = split_command(command_from_script(str(script)))
    assert (cmd.launcher, cmd.program, cmd.world_size) == ("torchrun", "train.py", 16)
    doc, code = _doc(script)
    assert code == 2 and {f["rule"]: f["holds_if"] for f in doc["findings"]}["ddp-reentrant-unused"] is None


def test_an_unset_launcher_variable_makes_the_process_count_a_question(tmp_path):
    script = tmp_path / "pasted.sh"
    script.write_text("torchrun $DISTRIBUTED_ARGS " + FLAGS + "\n")
    cmd = split_command(command_from_script(str(script)))
    assert (cmd.program, cmd.world_size, cmd.hidden_launcher_options) == ("train.py", None, ["$DISTRIBUTED_ARGS"])
    doc, code = _doc(script)
    assert code == 1
    assert {f["rule"]: f["holds_if"] for f in doc["findings"]}["ddp-reentrant-unused"] == "several processes"
    assert any("$DISTRIBUTED_ARGS" in q for q in doc["depends_on"])
    # Without the variable torchrun starts one process (its --nproc_per_node default), which accelerate >= 1.10 does
    # not wrap in DDP: nothing to ask.
    script.write_text("torchrun " + FLAGS + "\n")
    doc, code = _doc(script)
    assert "ddp-reentrant-unused" not in {f["rule"] for f in doc["findings"]}


def test_a_hash_inside_quotes_or_a_word_is_no_comment(tmp_path):
    script = tmp_path / "grpo.sh"
    script.write_text('PROMPT="Solve it.\nGive the answer after ####."\n'
                      'swift rlhf --rlhf_type grpo --system "$PROMPT" --dataset AI-MO/NuminaMath-TIR#5000 '
                      "--train_type lora # the rest is a comment --deepspeed zero3\n")
    tokens = command_from_script(str(script))
    assert tokens[tokens.index("--system") + 1] == "Solve it. Give the answer after ####."
    assert "AI-MO/NuminaMath-TIR#5000" in tokens and "--deepspeed" not in tokens


def test_a_case_arm_s_assignment_does_not_run_without_arguments(tmp_path):
    """Qwen's finetune/finetune_lora_ds.sh parses `-m MODEL` in a `while ... case $1 in` loop: run without arguments,
    the arms never run, so MODEL keeps its default; a count the script computes leaves the world size open."""
    script = tmp_path / "finetune_lora_ds.sh"
    script.write_text('GPUS_PER_NODE=$(python -c "import torch; print(torch.cuda.device_count())")\n'
                      'MODEL="Qwen/Qwen-7B"\nwhile [[ "$1" != "" ]]; do\n    case $1 in\n        -m | --model )\n'
                      '            shift\n            MODEL=$1\n            ;;\n    esac\n    shift\ndone\n'
                      'torchrun --nproc_per_node $GPUS_PER_NODE finetune.py --model_name_or_path $MODEL --use_lora\n')
    argv = command_from_script(str(script))
    assert argv[argv.index("--model_name_or_path") + 1] == "Qwen/Qwen-7B"
    assert split_command(argv).hidden_launcher_options == ["--nproc_per_node $GPUS_PER_NODE"]


# Scripts that add flags by branch (`if [ "$USE_LORA" = True ]; then ARGS+=" --use_peft ..."; fi`, as lmms-finetune's
# and many users' example_*.sh do) and set defaults in one-line ifs (`if [ -z "$NPROC" ]; then NPROC=8; fi`).
def test_flags_added_in_branches_read_from_the_first_branch_and_said_so(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text('#!/bin/bash\nif [ -z "$NPROC" ]; then NPROC=2; fi\nARGS="--output_dir out --bf16 True"\n'
                      'if [ "$MODE" = "lora" ]; then\n  ARGS+=" --use_peft --lora_r 16"\n'
                      'elif [ "$MODE" = "qlora" ]; then\n  ARGS="$ARGS --use_peft --load_in_4bit"\nelse\n'
                      '  ARGS="${ARGS} --lr 1e-5"\nfi\nARGS="$ARGS --gradient_checkpointing True"\n'
                      'torchrun --nproc_per_node $NPROC train.py $ARGS\n')
    line = command_from_script(str(script))
    cmd = split_command(line)
    assert cmd.world_size == 2 and "--use_peft" in line and "--load_in_4bit" not in line and "--lr" not in line
    assert "--gradient_checkpointing" in line  # after the `fi`: unconditional
    notes = " ".join(line.notes)
    assert "runs only when `[ \"$MODE\" = \"lora\" ]`" in notes and "the `else` branch" in notes
    assert "elif [ \"$MODE\" = \"qlora\" ]" in notes
    # Outside any branch an addition is plain, with nothing to say.
    plain = tmp_path / "plain.sh"
    plain.write_text('ARGS="--output_dir o"\nARGS+=" --use_peft"\npython train.py $ARGS\n')
    line = command_from_script(str(plain))
    assert "--use_peft" in line and not any("branch" in n or "only when" in n for n in line.notes)


# ShareGPT4V's slurm_finetune_7b.sh and SLURM scripts at large: `--master_addr $(scontrol show hostnames ... |
# head -n1)` inside `srun bash -c '...'`; the `|` inside the substitution is no pipe of the launch line.
def test_command_substitutions_are_one_word_and_open_quotes_do_not_crash(tmp_path):
    script = tmp_path / "slurm.sh"
    script.write_text("#!/bin/bash\nsrun bash -c 'torchrun --nnodes 2 --nproc_per_node 8 --master_addr "
                      "$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1) train.py --use_peft "
                      "--output_dir o'\n")
    cmd = split_command(command_from_script(str(script)))
    assert (cmd.launcher, cmd.program, cmd.world_size) == ("torchrun", "train.py", 16)
    assert "--use_peft" in cmd.args
    pasted = tmp_path / "cut.sh"
    pasted.write_text("python train.py --use_peft --output_dir 'o\n")  # a quote left open where the paste was cut
    assert split_command(command_from_script(str(pasted))).program == "train.py"


# OpenRLHF users' scripts: `$VENV_PYTHON -m openrlhf.cli.train_ppo_ray ...` with the interpreter from the job's
# environment; LLaVA-style run scripts that pretrain then fine-tune in one file.
def test_an_interpreter_variable_runs_python_and_later_runs_are_named(tmp_path):
    script = tmp_path / "ppo.sh"
    script.write_text("#!/bin/bash\n$VENV_PYTHON -m openrlhf.cli.train_sft --pretrain m --lora_rank 16\n")
    cmd = split_command(command_from_script(str(script)))
    assert (cmd.program_kind, cmd.program) == ("module", "openrlhf.cli.train_sft")
    both = tmp_path / "stages.sh"
    both.write_text("deepspeed llava/train/train_mem.py --tune_mm_mlp_adapter True --output_dir s1\n"
                    "deepspeed llava/train/train_mem.py --lora_enable True --output_dir s2\n"
                    "python scripts/merge_lora_weights.py --model-path s2\n")
    line = command_from_script(str(both))
    assert "--tune_mm_mlp_adapter" in line
    note = next(n for n in line.notes if "trains 2 times" in n)
    assert "--lora_enable" in note and "merge_lora" not in note


# Video-LLaVA's and MoE-LLaVA's train.py declare `data_path: List[str]`: `--data_path a.json b.json` is one flag.
def test_data_path_takes_several_files():
    from loraflow.frontends import from_command

    result = from_command(["python", "train.py", "--data_path", "a.json", "b.json", "--output_dir", "o"], VERSIONS)
    assert not any(u.startswith("b.json") for u in result.unknown)  # not a stray config file of its own


# open-r1's and TRL's GRPO recipe: `trl vllm-serve --model X &` then `accelerate launch grpo.py --config recipe.yaml`
# whose recipe (not here) sets use_vllm: the server the script starts says how the run samples.
def test_a_vllm_server_started_before_the_run_means_server_mode_rollouts(tmp_path):
    from loraflow.frontends import from_command

    script = tmp_path / "grpo.sh"
    script.write_text("CUDA_VISIBLE_DEVICES=0 trl vllm-serve --model Qwen/Qwen2.5-1.5B-Instruct &\nsleep 60\n"
                      "CUDA_VISIBLE_DEVICES=1,2 accelerate launch --num_processes 2 src/open_r1/grpo.py "
                      "--config recipe.yaml --use_peft --lora_r 16\n")
    setup = from_command(["bash", str(script)], VERSIONS).setup
    assert (setup.stage, setup.generation, setup.rollout_engine, setup.rollout_colocated) == ("grpo", False, "vllm",
                                                                                            False)
    alone = tmp_path / "alone.sh"
    alone.write_text("accelerate launch --num_processes 2 src/open_r1/grpo.py --config recipe.yaml --use_peft\n")
    assert from_command(["bash", str(alone)], VERSIONS).setup.generation is True


# Found in review: a Python heredoc's `if x:` / `else:` is no shell block; `NPROC=${NPROC:-8}` gives a default, it
# adds nothing; a nested `if` inside a later branch is not read; one-line ifs with several statements or `else`.
def test_heredocs_defaults_nested_and_one_line_branches(tmp_path):
    def line_of(text: str):
        script = tmp_path / "run.sh"
        script.write_text(text)
        return command_from_script(str(script))

    heredoc = line_of('python - <<EOF\nif torch.cuda.is_available():\n    print("gpu")\nelse:\n    print("cpu")\nEOF\n'
                      'ARGS="--output_dir o"\nARGS="$ARGS --use_peft"\npython train.py $ARGS\n')
    assert "--use_peft" in heredoc
    default = line_of('if [ "$DEBUG" = 1 ]; then\n  set -x\nelse\n  NPROC=${NPROC:-8}\nfi\n'
                      'torchrun --nproc_per_node $NPROC train.py --output_dir o\n')
    assert split_command(default).world_size == 8
    nested = line_of('ARGS="--output_dir o"\nif [ "$LORA" = 1 ]; then\n  ARGS="$ARGS --use_peft"\nelse\n'
                     '  if [ "$Q" = 1 ]; then\n    ARGS="$ARGS --load_in_4bit"\n  fi\nfi\npython train.py $ARGS\n')
    assert "--use_peft" in nested and "--load_in_4bit" not in nested
    one = line_of('if [ -z "$NPROC" ]; then NPROC="4"; PEFT="--use_peft"; fi\n'
                  'if [ "$FULL" = 1 ]; then ARGS="--bf16"; else ARGS="--use_peft --load_in_4bit"; fi\n'
                  'torchrun --nproc_per_node $NPROC train.py --output_dir o $PEFT $ARGS\n')
    # A plain assignment in the `else` is bash's last one, read so, and said to hold when that branch runs.
    assert split_command(one).world_size == 4 and "--load_in_4bit" in one and "--bf16" not in one
    assert any("`ARGS=\"--use_peft --load_in_4bit\"` is in the `else` branch" in n for n in one.notes)


# Found in review: runs in the branches of one `if` are alternatives, not a script that trains twice.
def test_runs_in_branches_are_alternatives(tmp_path):
    script = tmp_path / "stage.sh"
    script.write_text('if [ "$STAGE" = pretrain ]; then\n  deepspeed train.py --tune_mm_mlp_adapter True\nelse\n'
                      '  deepspeed train.py --lora_enable True\nfi\n"$PYTHON_BIN" -m trl.scripts.sft --output_dir o\n')
    line = command_from_script(str(script))
    notes = " ".join(line.notes)
    assert "another branch runs instead: `deepspeed train.py --lora_enable True`" in notes
    assert "trains 2 times; check reads the first launch. Later: `python -m trl.scripts.sft" in notes


# dangbert/thesis_app's experiments/tuner/*.sh: `tune download` and `tune cp` before `tune run`; a LLaMA-Factory script
# that trains, then exports the merged model.
def test_framework_cli_fetch_and_export_steps_are_not_runs(tmp_path):
    script = tmp_path / "tune.sh"
    script.write_text("tune download meta-llama/Llama-2-7b-hf --output-dir /tmp/m\ntune cp llama2/7B_lora ./my.yaml\n"
                      "tune run --nproc_per_node 2 lora_finetune_distributed --config ./my.yaml\n")
    cmd = split_command(command_from_script(str(script)))
    assert (cmd.program, cmd.subcommand) == ("tune", "run")
    lf = tmp_path / "lf.sh"
    lf.write_text("llamafactory-cli train a.yaml\nllamafactory-cli export merge.yaml\n")
    line = command_from_script(str(lf))
    assert "train" in line and not any("trains 2 times" in n for n in line.notes)
