"""A fifth sweep, of users' RL launches (verl, OpenRLHF, TRL GRPO, ms-swift GRPO) from public repositories: the
readings it found wrong. Each input is a short synthetic script of the same shape; the comment names the public
repository that showed the class."""

from __future__ import annotations

from packaging.version import Version

from loraflow.frontends import detect, from_command
from loraflow.frontends.argv import split_command
from loraflow.frontends.shell import command_from_script

CURRENT = {"torch": Version("2.13.0"), "transformers": Version("5.23.0"), "peft": Version("0.21.2"),
           "deepspeed": Version("0.19.8"), "trl": Version("0.29.0")}


def _script(tmp_path, text: str) -> list[str]:
    path = tmp_path / "run.sh"
    path.write_text(text)
    return command_from_script(str(path))


# Zityuen/open-r1-coderm run.sh and MAOJIASONG/TinyZero-TRL scripts/grpo_vlm.sh start TRL's vLLM server
# (`python -m trl.scripts.vllm_serve`, `trl vllm-serve`) before `accelerate launch ... grpo.py`; guanjinquan/
# CXRTrekReasoner train_infi.sh starts `swift rollout` before `swift rlhf`. The server line was read as the run (an
# SFT with five unknown flags, or refused: "`trl vllm-serve` is not a training command"), not the trainer after it.
def test_a_rollout_server_started_first_gives_way_to_the_trainer(tmp_path):
    argv = _script(tmp_path, "CUDA_VISIBLE_DEVICES=0 python -m trl.scripts.vllm_serve --model Qwen/Qwen2.5-1.5B \\\n"
                             "  --gpu_memory_utilization 0.85 --port 8000 &\n"
                             "CUDA_VISIBLE_DEVICES=1,2 accelerate launch --num_processes 2 grpo.py --use_vllm \\\n"
                             "  --vllm_mode server --use_peft --lora_r 16 --output_dir out\n")
    assert argv[:2] == ["CUDA_VISIBLE_DEVICES=1,2", "accelerate"]
    argv = _script(tmp_path, "CUDA_VISIBLE_DEVICES=0 swift rollout --model Qwen/Qwen2.5-3B --vllm_max_model_len 8192\n"
                             "CUDA_VISIBLE_DEVICES=1 NPROC_PER_NODE=1 swift rlhf --rlhf_type grpo "
                             "--model Qwen/Qwen2.5-3B --train_type lora --use_vllm true --vllm_mode server\n")
    r = from_command(argv, CURRENT)
    assert (r.setup.stage, r.setup.adapter, r.setup.rollout_colocated) == ("grpo", "lora", False)
    argv = _script(tmp_path, "trl vllm-serve --model Qwen/Qwen2-VL-2B --tensor_parallel_size 1 &\n"
                             "accelerate launch --num_processes 3 src/pkg/grpo.py --use_vllm\n")
    assert argv[:2] == ["accelerate", "launch"]
    # A script that only starts the server still names it, so its own error says it is no training command.
    assert _script(tmp_path, "trl vllm-serve --model Qwen/Qwen2.5-7B --port 8000\n")[:2] == ["trl", "vllm-serve"]
    # An evaluation or export after training is still not the run (the first training line wins).
    assert _script(tmp_path, "swift rlhf --rlhf_type grpo --model m\nswift deploy --model out\n")[:2] == ["swift",
                                                                                                      "rlhf"]


# astOwOlfo/swe_bench_rl run_rl.sh (`uv run ray stop`, `uv run ray start --head --num-gpus 8`) and zlH518/PipeRLHF
# scripts/desperate.sh (`ray stop --force`, `ray start --head ...`, then `python3 -m openrlhf.cli.train_ppo_ray`): the
# cluster commands before the job were taken for the launch and refused ("`ray job submit` without `--`").
def test_ray_cluster_commands_before_the_job_are_not_the_launch(tmp_path):
    argv = _script(tmp_path, "ray stop --force\nray start --head --node-ip-address 127.0.0.1 --num-gpus 4\n"
                             "python3 -m openrlhf.cli.train_ppo_ray --actor_num_gpus_per_node 2 \\\n"
                             "  --vllm_num_engines 2 --colocate_all_models --pretrain Qwen/Qwen3-4B --zero_stage 3\n")
    assert argv[:3] == ["python3", "-m", "openrlhf.cli.train_ppo_ray"]
    argv = _script(tmp_path, "uv run ray stop\nuv run ray start --head --port 6380 --num-gpus 8\n"
                             "uv run ray job submit --address=http://127.0.0.1:8265 -- python -m "
                             "openrlhf.cli.train_ppo_ray --actor_num_gpus_per_node 8 --vllm_num_engines 2 "
                             "--colocate_all_models --zero_stage 3\n")
    r = from_command(argv, CURRENT)
    assert (r.setup.world_size, r.setup.rollout_colocated) == (8, True)


# XHMY/rllm examples/math_reasoning/train_multi_agent_math.sh: `python3 -m examples.math_reasoning.
# train_multi_agent_math actor_rollout_ref.model.lora_rank=256 ...`, a project's own trainer composing verl's
# ppo_trainer.yaml, was refused ("cannot tell which framework"). Two actor_rollout_ref overrides name verl's PPO
# config whatever module runs it; the trainer's own code is unseen, so it is listed (exit 1), not assumed verl's.
def test_a_projects_own_trainer_with_verls_overrides_is_read_as_verl(tmp_path):
    argv = ["python3", "-m", "pkg.train_agents", "actor_rollout_ref.model.path=Qwen/Qwen2.5-1.5B",
            "actor_rollout_ref.model.lora_rank=64", "actor_rollout_ref.rollout.name=vllm", "trainer.n_gpus_per_node=2"]
    assert detect(argv) == "verl"
    r = from_command(argv, CURRENT)
    assert (r.setup.adapter, r.setup.world_size, r.setup.rollout_engine) == ("lora", 2, "vllm")
    assert any(u.startswith("pkg.train_agents: a verl-based project's own trainer") for u in r.unknown), r.unknown
    # `python main.py` with verl's keys too; one stray dotted key is not enough to call a script verl's.
    assert detect(["python", "main.py", "actor_rollout_ref.model.path=m", "actor_rollout_ref.actor.optim.lr=1e-6"]) \
        == "verl"
    assert detect(["python", "train.py", "actor_rollout_ref.model.path=m", "--output_dir", "o"]) != "verl"


# zhshgmail/verl scripts/test_mxfp4_*_dapo*.sh: `python3 -m recipe.dapo.main_dapo ... data.gen_batch_size=256
# algorithm.filter_groups.enable=True reward_model.overlong_buffer.len=256`: the keys DAPO's recipe config
# (recipe/dapo/config/dapo_trainer.yaml, defaults: [ppo_trainer, _self_]) adds were listed as keys verl lacks.
def test_dapo_recipe_keys_are_the_recipes_not_unknown():
    argv = ["python3", "-m", "recipe.dapo.main_dapo", "actor_rollout_ref.model.path=m",
            "actor_rollout_ref.model.lora_rank=32", "data.gen_batch_size=256", "algorithm.filter_groups.enable=True",
            "algorithm.filter_groups.metric=acc", "reward_model.overlong_buffer.len=256", "trainer.my_key=1"]
    r = from_command(argv, CURRENT)
    assert r.unknown == ["trainer.my_key=1"], r.unknown
    # main_ppo itself has no such keys: there they stay unknown.
    r = from_command(["python3", "-m", "verl.trainer.main_ppo", "actor_rollout_ref.model.path=m",
                      "data.gen_batch_size=256"], CURRENT)
    assert r.unknown == ["data.gen_batch_size=256"]


# A coevo buyer GRPO script (public, found by the code index without its repository's name) builds its trainer flags
# in a bash array (`TRAINER_ARGS=(` newline `--rlhf_type grpo` ... `)`, `TRAINER_ARGS+=(--deepspeed zero3)`) and runs
# `python -m swift.cli.rlhf "${TRAINER_ARGS[@]}"`; the array expanded to nothing and the launch was read as ms-swift's
# defaults (a DPO). Other RL scripts do the same with `CMD=(swift rlhf ...)` then `"${CMD[@]}"`.
def test_bash_arrays_expand_where_they_are_used(tmp_path):
    argv = _script(tmp_path, 'MODEL=Qwen/Qwen3-8B\nARGS=(\n  --rlhf_type grpo  # the algorithm\n'
                             '  --model "$MODEL"\n  --tuner_type lora\n)\nARGS+=(--deepspeed zero3)\n'
                             'CMD=(swift rlhf "${ARGS[@]}")\n'
                             'NPROC_PER_NODE=2 "${CMD[@]}" --use_vllm true --vllm_mode colocate\n')
    assert argv[:5] == ["NPROC_PER_NODE=2", "swift", "rlhf", "--rlhf_type", "grpo"]  # nested arrays, in order
    assert split_command(argv).program == "swift"
    r = from_command(argv, CURRENT)
    assert (r.setup.stage, r.setup.adapter, r.setup.zero_stage, r.setup.world_size) == ("grpo", "lora", 3, 2)
    assert r.sources["stage"] == "--rlhf_type grpo"
    # `${#ARR[@]}` is the array's length.
    argv = _script(tmp_path, "GPUS=(0 1 2 3)\ntorchrun --nproc_per_node ${#GPUS[@]} train.py --output_dir o\n")
    assert argv[:3] == ["torchrun", "--nproc_per_node", "4"]


# A verl one-step-off-policy launch (`-m recipe.one_step_off_policy.main_ppo actor_rollout_ref.hybrid_engine=False
# trainer.n_gpus_per_node=4 rollout.n_gpus_per_node=4`; code index hit, repository not named): the engine on GPUs of
# its own was explained as "vLLM shares the actor's GPUs", and the recipe's rollout.* pool keys were listed unknown.
def test_verl_split_placement_names_the_rollout_pool():
    argv = ["python3", "-m", "recipe.one_step_off_policy.main_ppo", "actor_rollout_ref.model.path=m",
            "actor_rollout_ref.hybrid_engine=False", "actor_rollout_ref.rollout.name=vllm",
            "trainer.n_gpus_per_node=4", "rollout.nnodes=1", "rollout.n_gpus_per_node=4"]
    r = from_command(argv, CURRENT)
    assert (r.setup.world_size, r.setup.rollout_colocated) == (4, False)
    assert r.sources["rollout_colocated"].startswith("actor_rollout_ref.hybrid_engine=False: the engine runs on GPUs")
    assert "rollout.n_gpus_per_node=4" in r.sources["rollout_colocated"] and r.unknown == []
    # The hybrid engine keeps its own wording.
    r = from_command(["python3", "-m", "verl.trainer.main_ppo", "actor_rollout_ref.model.path=m",
                      "actor_rollout_ref.rollout.name=vllm"], CURRENT)
    assert r.sources["rollout_colocated"].startswith("hybrid engine: vLLM shares the actor's GPUs")
