"""Frontends of `loraflow check` on RL launches that sample with vLLM: TRL (--use_vllm), OpenRLHF (--vllm_num_engines)
and ms-swift GRPO (--use_vllm true), read into the rollout fields, and the rollout rules that follow.

Pure parsing, as in test_frontends.py: launch lines in the style of the frameworks' own examples
(trl/scripts/grpo.py, OpenRLHF examples/scripts/train_*_ray*.sh, ms-swift examples/train/grpo/*.sh).
"""

from __future__ import annotations

import json
import shlex

import pytest
from packaging.version import Version

from loraflow.errors import LoraflowError
from loraflow.frontends import from_command, run_check

CURRENT = {"torch": Version("2.13.0"), "transformers": Version("5.23.0"), "peft": Version("0.21.2"),
           "deepspeed": Version("0.19.8")}
TRL_GRPO = ("accelerate launch --num_processes 4 trl/scripts/grpo.py --model_name_or_path Qwen/Qwen2.5-1.5B "
            "--output_dir out --reward_funcs accuracy_reward --use_vllm --use_peft --lora_r 32")
ORL_PPO = ("python3 -m openrlhf.cli.train_ppo_ray --actor_num_nodes 1 --actor_num_gpus_per_node 4 "
           "--vllm_num_engines 4 --vllm_tensor_parallel_size 1 --pretrain Qwen/Qwen2.5-7B --zero_stage 3 --bf16 "
           "--advantage_estimator group_norm")
SWIFT_GRPO = ("NPROC_PER_NODE=4 swift rlhf --rlhf_type grpo --model Qwen/Qwen2.5-7B-Instruct --tuner_type lora "
              "--use_vllm true --vllm_mode colocate --vllm_gpu_memory_utilization 0.5 --torch_dtype bfloat16")


def findings(text: str, versions: dict = CURRENT) -> dict[str, str | None]:
    """rule id -> the condition it holds under (None: whatever is unknown)."""
    doc = json.loads(run_check(shlex.split(text), None, [], versions, as_json=True)[0])
    return {f["rule"]: f["holds_if"] for f in doc["findings"]}


def setup(text: str, versions: dict = CURRENT):
    return from_command(shlex.split(text), versions)


# ---------------------------------------------------------------- TRL


def test_trl_merges_the_adapter_and_colocates_by_default_since_1_0():
    r = setup(TRL_GRPO, {**CURRENT, "trl": Version("1.9.0")})
    s = r.setup
    assert (s.rollout_engine, s.rollout_sync, s.adapter_rank) == ("vllm", "merged", 32)
    assert s.rollout_colocated and s.engine_gpu_memory_utilization == 0.3
    assert s.rollout_logprobs_used and s.rollout_logprobs_processed and s.rollout_sync_proven
    assert "vllm_generation.py" in r.sources["rollout_sync"]
    assert not findings(TRL_GRPO + " --vllm_mode colocate", {**CURRENT, "trl": Version("1.9.0")})


def test_trl_before_0_15_sends_peft_names_to_the_engine():
    old = {**CURRENT, "transformers": Version("4.48.0"), "trl": Version("0.14.0")}
    r = setup(TRL_GRPO, old)
    assert r.setup.rollout_sync == "unmerged"
    assert "vllm-sync-peft-names" in findings(TRL_GRPO, old)
    # Without the release it holds for the releases before the merge; --dtype dates a command to TRL >= 0.23.
    assert findings(TRL_GRPO)["vllm-sync-peft-names"] == "trl<0.15.0"
    assert "vllm-sync-peft-names" not in findings(TRL_GRPO + " --dtype bfloat16")


def test_trl_colocated_engine_at_vllms_own_share_starves_the_trainer():
    found = findings(TRL_GRPO + " --vllm_mode colocate --vllm_gpu_memory_utilization 0.9")
    assert found["vllm-colocate-memory"] is None
    assert "vllm-colocate-memory" not in findings(TRL_GRPO + " --vllm_mode server --vllm_gpu_memory_utilization 0.9")


def test_trl_sleep_mode_keeps_the_engine_stale_on_the_affected_releases():
    text = TRL_GRPO + " --vllm_mode colocate --vllm_enable_sleep_mode"
    assert findings(text)["vllm-stale-policy"] == "0.26.0<=trl<1.16.0"
    assert "vllm-stale-policy" not in findings(text, {**CURRENT, "trl": Version("0.25.0")})
    assert "vllm-stale-policy" not in findings(text.replace(" --vllm_enable_sleep_mode", ""))


def test_trl_raw_logprobs_only_between_the_is_correction_and_processed_mode():
    text = TRL_GRPO + " --vllm_mode colocate"
    assert findings(text)["vllm-raw-logprobs"] == "0.23.0<=trl<0.24.0"
    assert "vllm-raw-logprobs" not in findings(text + " --vllm_importance_sampling_correction false")


def test_trl_0_14_engine_on_a_training_device_is_colocated():
    old = {**CURRENT, "transformers": Version("4.48.0"), "trl": Version("0.14.0")}
    r = setup(TRL_GRPO.replace("--use_peft --lora_r 32", "--vllm_device cuda:0"), old)
    assert r.setup.rollout_colocated and r.setup.engine_gpu_memory_utilization == 0.9


# ---------------------------------------------------------------- OpenRLHF


def test_openrlhf_lora_with_vllm_engines_broadcasts_peft_names():
    r = setup(ORL_PPO + " --lora_rank 32")
    assert (r.setup.rollout_sync, r.setup.adapter_rank) == ("unmerged", 32)
    assert "ppo_actor.py" in r.sources["rollout_sync"]
    assert findings(ORL_PPO + " --lora_rank 32")["vllm-sync-peft-names"] is None
    # Without engines the actor samples itself: no sync, no finding.
    assert "vllm-sync-peft-names" not in findings(ORL_PPO.replace("--vllm_num_engines 4", "--vllm_num_engines 0")
                                                  + " --lora_rank 32")


def test_openrlhf_full_finetune_syncs_in_place_and_is_clean():
    r = setup(ORL_PPO)
    assert (r.setup.rollout_sync, r.setup.rollout_sync_proven, r.setup.rollout_colocated) == ("merged", True, False)
    assert not findings(ORL_PPO)


@pytest.mark.parametrize("extra, colocated", [
    ("--colocate_all_models", True),
    ("--colocate_all_models --vllm_enable_sleep", True),
    ("--colocate_all_models --vllm_enable_sleep --deepspeed_enable_sleep", False),
])
def test_openrlhf_hybrid_engine_holds_memory_unless_both_sides_sleep(extra, colocated):
    r = setup(f"{ORL_PPO} {extra}")
    assert r.setup.rollout_colocated is colocated and r.setup.engine_gpu_memory_utilization == 0.95
    assert ("vllm-colocate-memory" in findings(f"{ORL_PPO} {extra}")) is colocated
    assert "vllm-colocate-memory" not in findings(f"{ORL_PPO} {extra} --vllm_gpu_memory_utilization 0.5")


def test_openrlhf_dotted_flags_and_the_is_correction():
    text = ("python3 -m openrlhf.cli.train_ppo_ray --actor.num_nodes 1 --actor.num_gpus_per_node 8 "
            "--vllm.num_engines 4 --train.colocate_all --vllm.gpu_memory_utilization 0.5 --vllm.enable_sleep "
            "--ds.enable_sleep --actor.model_name_or_path Qwen/Qwen2.5-7B --ds.zero_stage 3 "
            "--algo.advantage.is_correction_enable --ds.lora.rank 16")
    s = setup(text).setup
    assert (s.rollout_sync, s.rollout_colocated, s.engine_gpu_memory_utilization) == ("unmerged", False, 0.5)
    assert s.rollout_logprobs_used and s.rollout_logprobs_processed


def test_openrlhf_share_must_be_a_fraction():
    with pytest.raises(LoraflowError, match="--vllm_gpu_memory_utilization 95: `95` is not a share"):
        setup(ORL_PPO + " --vllm_gpu_memory_utilization 95")


# ---------------------------------------------------------------- ms-swift


def test_swift_merges_unless_the_engine_loads_the_adapter():
    s = setup(SWIFT_GRPO).setup
    assert (s.rollout_engine, s.rollout_sync, s.rollout_colocated, s.adapter_rank) == ("vllm", "merged", True, 8)
    assert not findings(SWIFT_GRPO)


def test_swift_adapter_sync_takes_lora_rank_as_the_engines_max_rank():
    text = SWIFT_GRPO + " --vllm_enable_lora true --lora_rank 12"
    s = setup(text).setup
    assert (s.rollout_sync, s.engine_max_lora_rank) == ("adapter", 12)
    assert findings(text)["vllm-max-lora-rank"] is None  # --tuner_type dates it to ms-swift >= 4.0
    # --train_type is the spelling of 3.0 - 4.0: adapter sync came with 3.10.
    assert findings(text.replace("--tuner_type", "--train_type"))["vllm-max-lora-rank"] == "ms-swift>=3.10.0"
    assert "vllm-max-lora-rank" not in findings(text.replace("--lora_rank 12", "--lora_rank 64"))


def test_swift_dora_cannot_be_loaded_as_an_adapter():
    assert findings(SWIFT_GRPO + " --vllm_enable_lora true --use_dora true")["vllm-adapter-unservable"] is None
    assert "vllm-adapter-unservable" not in findings(SWIFT_GRPO + " --use_dora true")


def test_swift_colocated_default_share_and_time_sharing():
    text = SWIFT_GRPO.replace("--vllm_gpu_memory_utilization 0.5 ", "")
    assert findings(text)["vllm-colocate-memory"] is None
    assert "vllm-colocate-memory" not in findings(text + " --sleep_level 1 --offload_model true")
    assert "vllm-colocate-memory" not in findings(text.replace("colocate", "server"))


def test_swift_sleep_level_2_on_the_adapter_path_before_3_12():
    text = SWIFT_GRPO.replace("--tuner_type", "--train_type") + " --vllm_enable_lora true --sleep_level 2"
    assert findings(text)["vllm-stale-policy"] == "3.10.0<=ms-swift<3.12.0"
    assert "vllm-stale-policy" not in findings(text.replace("--sleep_level 2", "--sleep_level 1"))


def test_swift_server_adapter_sync_depends_on_how_the_server_was_started():
    text = SWIFT_GRPO.replace("colocate", "server") + " --vllm_enable_lora true --lora_rank 64"
    holds = findings(text)["vllm-max-lora-rank"]
    assert holds is not None and "--vllm_enable_lora" in holds


def test_swift_before_3_5_puts_the_engine_on_vllm_device():
    # ms-swift 3.3's examples/train/grpo/lora_vllm.sh: CUDA_VISIBLE_DEVICES=0,1, one trainer process, --vllm_device
    # auto (the last visible GPU). check read it as colocated (the --vllm_mode default of 3.5 on) with
    # --vllm_device unread (exit 1).
    text = ("CUDA_VISIBLE_DEVICES=0,1 swift rlhf --rlhf_type grpo --model Qwen/Qwen2.5-7B --train_type lora "
            "--use_vllm true --vllm_device auto --vllm_gpu_memory_utilization 0.5 --torch_dtype bfloat16")
    old = {**CURRENT, "ms-swift": Version("3.3.0")}
    s = from_command(shlex.split(text), old)
    assert s.unknown == [] and s.setup.rollout_colocated is False
    # One visible GPU: the trainer's own GPU is shared.
    one = from_command(shlex.split(text.replace("=0,1", "=0")), old)
    assert one.setup.rollout_colocated is True
    # From 3.5 the same line reads --vllm_mode's default (colocate).
    assert from_command(shlex.split(text), {**CURRENT, "ms-swift": Version("3.5.0")}).setup.rollout_colocated is True
