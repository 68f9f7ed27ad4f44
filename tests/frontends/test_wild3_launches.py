"""A third sweep of users' own launches (research repos, SLURM jobs, VLM fine-tuning forks): the spellings it found
misread. Each input is a short synthetic script or line of the same shape; the comment names the public repository
that showed the class."""

from __future__ import annotations

import json
import shlex

from loraflow.frontends import from_command
from loraflow.frontends.shell import command_from_script


def _check(line: str, versions: dict | None = None):
    return from_command(shlex.split(line), versions or {})


def _script(tmp_path, text: str, versions: dict | None = None):
    script = tmp_path / "run.sh"
    script.write_text(text)
    return from_command(["bash", str(script)], versions or {})


# shiyawei666/disc-law-sft_qwen_lora train_qlora.sh: `export OUTPUT_DIR="./out_$(date +%Y%m%d_%H%M%S)"`, then
# `--output_dir $OUTPUT_DIR`: bash runs the date when it assigns, one word; the space inside must not split it.
def test_a_command_substitution_in_a_quoted_assignment_stays_one_word(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text('OUT="./runs/x_$(date +%Y%m%d_%H%M%S)"\nGPUS=$(nvidia-smi -L | wc -l)\n'
                      "torchrun --nproc_per_node $GPUS train.py --output_dir $OUT --lora_r 8\n")
    argv = command_from_script(str(script))
    assert argv[argv.index("--output_dir") + 2] == "--lora_r"  # no stray `+%Y...)` word after the path
    assert "$GPUS" in argv  # a count computed by a command stays an unknown variable


# Wyyyb/leakage_influence llama_factory/experiments/1_sft_0628.sh: `export CUDA_VISIBLE_DEVICES=1` on a line of its
# own, then `llamafactory-cli train x.yaml`: the exported variable is the launch's environment (world size 1).
def test_an_exported_variable_reaches_the_launch_environment(tmp_path):
    result = _script(tmp_path, "export CUDA_VISIBLE_DEVICES=0,1\nexport HF_HOME=/tmp/hf\ncd ..\n"
                               "llamafactory-cli train x.yaml stage=sft finetuning_type=lora\n")
    assert result.setup.world_size == 2
    plain = _script(tmp_path, "CUDA_VISIBLE_DEVICES=0,1\n"
                              "llamafactory-cli train x.yaml stage=sft finetuning_type=lora\n")
    assert "world_size" in plain.unsure  # not exported: the command never sees it
    later = _script(tmp_path, "NPROC_PER_NODE=2\nexport NPROC_PER_NODE\n"
                              "swift sft --model Qwen/Qwen2.5-7B-Instruct --train_type lora --dataset d\n")
    assert later.setup.world_size == 2


# VikramRangarajan/cypher-finetune run_sft.sh: `uv run sft.py --lora_rank=null &` (uv runs a .py file with the
# project's python, no `python` word on the line).
def test_uv_run_of_a_python_file_is_a_launch(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text("module purge\nuv run --extra gpu sft.py --lora_r 8 &\nwait $!\n")
    assert command_from_script(str(script)) == ["python", "sft.py", "--lora_r", "8"]


# JerMa88/faster-sft run_sft.sh: `${PYTHON} scripts/prepare_data.py ...` and a profiling step before
# `${PYTHON} scripts/train_sft.py ... --lora_rank 16`: the data step is not the launch.
def test_a_data_step_before_the_training_line_gives_way(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text("PY=/env/bin/python\n$PY scripts/prepare_data.py --n 10\n$PY scripts/profile_layers.py --k 2\n"
                      "$PY scripts/train_sft.py --lora_rank 16\n$PY scripts/eval_lora.py --ckpt o\n")
    assert command_from_script(str(script))[1:] == ["scripts/train_sft.py", "--lora_rank", "16"]
    script.write_text("python main.py --lora_r 8\npython merge_lora.py --ckpt o\n")  # no later training line
    assert command_from_script(str(script))[1] == "main.py"
    # a launcher's line after the data step wins whatever its program is called
    script.write_text("python prepare_data.py --out d\ntorchrun --nproc_per_node 4 main.py --lora_r 8\n")
    assert command_from_script(str(script))[:2] == ["torchrun", "--nproc_per_node"]


# Vitasii/NLP_Hw_2 part2/2.1.b.sh: `llamafactory-cli train examples/train_full/llama3_full_sft.yaml ...
# deepspeed=null`: OmegaConf reads `null` as None, which removes the YAML's deepspeed key (no DeepSpeed).
def test_a_null_override_removes_the_llama_factory_key(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "full_sft.yaml").write_text("stage: sft\nfinetuning_type: full\ndeepspeed: ds_z3_config.json\n"
                                            "bf16: true\noutput_dir: o\n")
    result = _check("llamafactory-cli train full_sft.yaml deepspeed=null bf16=true")
    assert result.setup.engine == "single" and result.setup.zero_stage == 0
    assert _check("llamafactory-cli train full_sft.yaml bf16=true").setup.zero_stage == 3


# kev1n-zhao/Firefly train_qlora.sh: `deepspeed --num_gpus=1 train_qlora.py --train_args_file args/x.json`: the
# script hands the JSON to HfArgumentParser.parse_json_file, so its keys are the run's TrainingArguments.
def test_a_training_arguments_file_named_by_the_script_s_own_flag_is_read(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "args.json").write_text(json.dumps({"output_dir": "o", "lora_rank": 64, "gradient_checkpointing": True,
                                                    "fp16": True, "optim": "paged_adamw_32bit"}))
    result = _check("deepspeed --num_gpus=1 train_qlora.py --train_args_file args.json")
    assert result.framework == "hf" and result.setup.adapter == "lora"
    assert result.setup.checkpointing == "all" and result.setup.precision == "fp16-mixed"
    assert not any("--train_args_file" in u for u in result.unknown)


# A SLURM length probe (found by text search; the index did not name its repository): `timeout --signal=TERM
# --kill-after=60 2400 apptainer exec --nv ... img.sif /opt/venv/bin/torchrun ... /opt/venv/bin/swift sft ...`.
def test_timeout_is_a_wrapper_before_the_launcher(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text("timeout --signal=TERM 2400 apptainer exec --nv --env A=1 img.sif /venv/bin/torchrun "
                      "--nproc_per_node=4 /venv/bin/swift sft --model Qwen/Qwen2.5-7B-Instruct --train_type lora\n")
    argv = command_from_script(str(script))
    assert argv[0] == "/venv/bin/torchrun"
    assert from_command(argv, {}).framework == "ms-swift"


# The same probe's `--model .../Qwen3.5-9B --model_type qwen3_5 --freeze_vit true`: ms-swift registers qwen3_5 as an
# image-text type (MLLMModelType in swift/llm/model/constant.py), so it is no text loader forced on a VLM.
def test_qwen3_5_is_an_image_text_model_type_in_ms_swift():
    result = _check("swift sft --model Qwen/Qwen3.5-9B --model_type qwen3_5 --freeze_vit true --tuner_type lora "
                    "--torch_dtype bfloat16")
    assert not result.setup.causal_lm_class
    forced = _check("swift sft --model Qwen/Qwen2.5-VL-7B-Instruct --model_type qwen2_5 --train_type lora")
    assert forced.setup.causal_lm_class


# KLi447/CS-598-FAL-Project run_profile.sh: `nsys profile --trace=cuda,nvtx --force-overwrite true \` then
# `python train.py ...` on the next line: the profiler runs the launch.
def test_nsys_profile_wraps_the_launch(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text("nsys profile --trace=cuda,nvtx --output=prof --force-overwrite true \\\n"
                      "python train.py --lora_r 8 --output_dir o\n")
    assert command_from_script(str(script)) == ["python", "train.py", "--lora_r", "8", "--output_dir", "o"]


# A user's `litgpt finetune --config configs/tiny-llama-lora.yaml --quantize bnb.nf4` (found by text search; the
# index did not name its repository): the config is not here and may set precision, so the launch is not told that
# its default precision fails beside --quantize.
def test_litgpt_quantize_without_precision_is_not_called_failing_when_the_config_is_unseen():
    unseen = _check("litgpt finetune --config configs/absent-lora.yaml --quantize bnb.nf4")
    assert not any("Quantization and mixed precision" in n for n in unseen.notes)
    seen = _check("litgpt finetune_lora checkpoints/x --quantize bnb.nf4")
    assert any("Quantization and mixed precision" in n for n in seen.notes)


# A DeepSpeed-Chat run starting from step 1's output (found by text search; the index did not name its repository):
# `--model_name_or_path .../step1_supervised_finetuning/output --lora_module_name decoder.layers.`: a local path that
# names no family may well be OPT (step 1's default), so its layer names stay a question, not a certain crash.
def test_a_deepspeed_chat_model_path_naming_no_family_leaves_the_lora_scope_open():
    line = ("deepspeed --num_gpus 1 main.py --model_name_or_path /w/step1_supervised_finetuning/output "
            "--lora_dim 128 --lora_module_name decoder.layers. --only_optimize_lora --zero_stage 0 --output_dir o")
    result = _check(line)
    assert result.framework == "deepspeed-chat" and "matched_modules" in result.unsure
    llama = _check(line.replace("/w/step1_supervised_finetuning/output", "meta-llama/Llama-2-7b-hf"))
    assert llama.setup.matched_modules == 0


# An alignment-handbook style recipe (found by text search; the index did not name its repository): `accelerate
# launch --config_file .../deepspeed_zero3.yaml scripts/run_dpo.py --config dpo_lora.yaml`: NeMo-RL's scripts share
# the name, but NeMo-RL starts its own Ray workers and never runs under accelerate, deepspeed or torchrun.
def test_run_dpo_py_under_accelerate_is_no_nemo_rl_launch():
    line = "accelerate launch --num_processes 2 scripts/run_dpo.py --config dpo_lora.yaml"
    assert _check(line).framework == "hf"
    assert _check("uv run python examples/run_dpo.py --config examples/configs/dpo.yaml").framework == "nemo-rl"


# Found in review: only a step its name calls data preparation gives way, names are matched as words, and what
# follows a training line (an evaluation, a plot, a merge) never displaces it.
def test_only_a_named_data_step_gives_way_and_only_to_a_line_that_trains(tmp_path):
    def first_line(text: str) -> list[str]:
        script = tmp_path / "run.sh"
        script.write_text(text)
        return command_from_script(str(script))

    assert first_line("python main.py --lora_r 8\naccelerate launch -m lm_eval --model hf\n")[1] == "main.py"
    assert first_line("python main.py --lora_r 8\npython plot_training_loss.py\n")[1] == "main.py"
    assert first_line("python check_constraints.py\npython main.py\n")[1] == "check_constraints.py"
    assert first_line("python prepare_data.py\npython train_retrieval.py --x 1\n")[1] == "train_retrieval.py"
    assert first_line("python prepare_data.py\npython tokenize_data.py\ntorchrun --nproc_per_node 2 run_clm.py\n"
                      "python merge_lora.py\n")[0] == "torchrun"
    assert first_line("python prepare_data.py\npython eval.py\n")[1] == "prepare_data.py"


# Found in review: a script's own `--config_file` may name its DeepSpeed JSON, a model config or a list; only a file
# of training arguments is read as them, and none of the others is read as another framework's config.
def test_a_script_s_own_config_flag_naming_no_training_arguments_is_left_unread(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ds.json").write_text('{"bf16": {"enabled": true}, "zero_optimization": {"stage": 3}}')
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    (tmp_path / "model_cfg.json").write_text('{"use_cache": true, "hidden_size": 8}')
    for name in ("ds.json", "list.yaml", "model_cfg.json"):
        result = _check(f"python train.py --config_file {name} --lora_r 8 --output_dir o")
        assert result.framework == "hf"
        assert any(u.startswith(f"--config_file {name}") for u in result.unknown)
        assert "use_cache" not in result.sources or name not in result.sources["use_cache"]


# Found in review: OmegaConf reads an override's value as YAML, so `~`, `Null` and an empty value are null too.
def test_every_yaml_null_override_removes_the_llama_factory_key(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "full_sft.yaml").write_text("stage: sft\nfinetuning_type: full\ndeepspeed: ds_z3_config.json\n"
                                            "bf16: true\noutput_dir: o\n")
    for null in ("~", "Null", "NULL", ""):
        result = _check(f"llamafactory-cli train full_sft.yaml deepspeed={null} bf16=true")
        assert result.setup.engine == "single", null


# Found in review: `timeout` and `nsys profile` before the launcher on a pasted line, as in a script.
def test_timeout_and_nsys_on_a_pasted_line_reach_the_launcher():
    assert _check("timeout 2400 torchrun --nproc_per_node 4 train.py --lora_r 8").setup.world_size == 4
    assert _check("nsys profile -o p --trace=cuda torchrun --nproc_per_node 2 train.py --lora_r 8"
                  ).setup.world_size == 2


# Found in review: `export A=1 B=2` on one line exports both; a short family name inside a path's word is no family.
def test_export_of_several_assignments_and_family_names_as_words(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text("export NPROC=2 CUDA_VISIBLE_DEVICES=0,1\ntorchrun --nproc_per_node $NPROC train.py --lora_r 8\n")
    assert command_from_script(str(script))[:3] == ["NPROC=2", "CUDA_VISIBLE_DEVICES=0,1", "torchrun"]
    from loraflow.frontends.deepspeed_chat import _OTHER_FAMILY

    assert not _OTHER_FAMILY.search("/w/step1/ckpt5") and _OTHER_FAMILY.search("google/flan-t5-xl")


# Found in a second review: setup lines (`python -m pip`, `python -c`) and an evaluation before the run never become
# it; only the command word makes a line a Ray or server line; a comment inside or after a bash array is a comment.
def test_setup_and_evaluation_lines_before_the_run_and_comments_in_arrays(tmp_path):
    def first_line(text: str) -> list[str]:
        script = tmp_path / "run.sh"
        script.write_text(text)
        return command_from_script(str(script))

    run = "torchrun --nproc_per_node 8 train.py --bf16\n"
    for before in ("python -m pip install -r requirements.txt\n", 'python -c "import torch; print(1)"\n',
                   "python eval_baseline.py --model m\n"):
        assert first_line(before + run)[0] == "torchrun", before
    assert first_line("python prepare_data.py\npython train.py --rollout_backend ray --run_name ray\n"
                      )[1] == "train.py"
    assert first_line("ray stop\nray start --head\nray job submit -- python3 -m verl.trainer.main_ppo\n")[:2] == [
        "ray", "job"]
    array = "ARGS=(\n  --model_name_or_path m   # the model's id\n  --bf16\n)  # flags (see README)\n"
    assert first_line(array + 'torchrun --nproc_per_node 8 train.py "${ARGS[@]}"\n')[-3:] == [
        "--model_name_or_path", "m", "--bf16"]
