"""NeMo-RL frontend of `loraflow check`: launch lines from NeMo-RL's public threads and its example configs
(tests/fixtures/frontends/nemo-rl/, MANIFEST.json names each source) -> Combination, with NeMo-RL's defaults per
release from its example configs (nemo_rl_keys.json), and the rule findings `check` reports on them."""

from __future__ import annotations

import json
import shlex

import pytest
from conftest import ROOT
from packaging.version import Version

from loraflow.errors import LoraflowError
from loraflow.frontends import detect, from_command, from_files, guess_framework_for_files, run_check

FIX = ROOT / "tests" / "fixtures" / "frontends" / "nemo-rl"
MANIFEST = json.loads((FIX / "MANIFEST.json").read_text())
LAUNCH = {entry["id"]: entry["text"] for entry in MANIFEST["launches"]}
CURRENT = {"torch": Version("2.13.0"), "transformers": Version("5.23.0"), "peft": Version("0.21.2")}
# The launch of issue 1051 with its variables filled in (the line `loraflow check` is asked about in the report).
FILLED = ("uv run ./examples/run_grpo_math.py --config=examples/configs/grpo_math_8B.yaml "
          "policy.model_name=Qwen/Qwen3-32B policy.generation.vllm_cfg.tensor_parallel_size=4 "
          "policy.max_total_sequence_length=16384 cluster.num_nodes=2 cluster.gpus_per_node=8 "
          "policy.dtensor_cfg.enabled=True policy.dtensor_cfg.tensor_parallel_size=2 "
          "policy.dtensor_cfg.sequence_parallel=True")


def check(line: str, versions: dict = CURRENT) -> tuple[dict, int]:
    text, code = run_check(shlex.split(line), None, [], dict(versions), True)
    return json.loads(text), code


def holds(doc: dict) -> dict[str, str | None]:
    return {f["rule"]: f["holds_if"] for f in doc["findings"]}


def test_issue_1051_line_reads_the_dtensor_policy_and_the_named_config_as_released():
    argv = shlex.split(FILLED)
    assert detect(argv) == "nemo-rl"
    r = from_command(argv, CURRENT)
    s = r.setup
    assert (s.stage, s.adapter, s.engine, s.world_size) == ("grpo", "full", "fsdp2", 16)
    assert r.sources["world_size"] == "cluster.num_nodes=2 x cluster.gpus_per_node=8"
    assert r.sources["engine"] == "policy.dtensor_cfg.enabled=True (DTensor policy worker: fully_shard, FSDP2)"
    # grpo_math_8B.yaml is not here: read as NeMo-RL ships it, each value citing the release and file.
    assert (s.precision, s.checkpointing, s.packing) == ("bf16-mixed", "off", True)
    assert r.sources["packing"] == ("nemo-rl >= 0.3.0 examples/configs/grpo_math_8B.yaml: "
                                    "policy.sequence_packing.enabled=True (the --config file as released)")
    assert (s.reentrant, s.checkpoint_impl, s.checkpoint_outside_shard, s.use_cache) == (False, "torch-wrapper",
                                                                                         False, False)
    # vLLM, refit of every weight, colocated by turns (the policy offloads, vLLM sleeps).
    assert (s.rollout_engine, s.rollout_sync, s.rollout_sync_proven, s.generation) == ("vllm", "merged", True, False)
    assert (s.rollout_colocated, s.engine_gpu_memory_utilization) == (False, 0.6)
    assert s.not_used == ("peft",) and s.sequence_parallel is False
    assert r.eras["nemo-rl"][0] == ">=0.2.0" and r.unknown == []
    assert any("tensor-parallel sequence parallelism" in n for n in r.notes)
    doc, code = check(FILLED)
    assert (doc["findings"], code) == ([], 0)


def test_issue_1051_launch_as_posted_asks_what_its_variables_hold():
    r = from_command(shlex.split(LAUNCH["nemo-rl-1051"]), CURRENT)
    # cluster.num_nodes=${NUM_ACTOR_NODES} and activation_checkpointing= (cut off) are not in the command.
    assert set(r.unsure) >= {"world_size", "checkpointing"}
    assert r.setup.engine == "fsdp2" and r.unknown == []


def test_issue_1178_line_reads_the_config_that_is_here(monkeypatch):
    monkeypatch.chdir(FIX)
    r = from_command(shlex.split(LAUNCH["nemo-rl-1178"]), CURRENT)
    s = r.setup
    assert (s.engine, s.world_size, s.packing, s.precision) == ("fsdp2", 8, True, "bf16-mixed")
    assert r.sources["packing"] == "grpo_math_1B.yaml: policy.sequence_packing.enabled"
    assert r.sources["world_size"] == "grpo_math_1B.yaml: cluster.num_nodes x cluster.gpus_per_node=8"
    assert check(LAUNCH["nemo-rl-1178"])[1] == 0


def test_pr_352_line_without_config_reads_grpo_math_1b_and_its_added_key():
    r = from_command(shlex.split(LAUNCH["nemo-rl-352"]), CURRENT)
    assert r.setup.world_size == 8 and r.unknown == []
    assert r.sources["precision"].startswith("default (nemo-rl 0.1.0 examples/configs/grpo_math_1B.yaml")


def test_pr_1026_reward_model_environment_config_dates_the_launch():
    r = from_command(shlex.split(LAUNCH["nemo-rl-1026"]), CURRENT)
    assert (r.setup.stage, r.setup.world_size) == ("grpo", 2)
    assert r.eras["nemo-rl"][0] == ">=0.4.0" and "grpo_rm_1B.yaml first appears" in r.eras["nemo-rl"][1]


def test_fsdp1_worker_dates_the_launch_before_0_3_0():
    line = LAUNCH["nemo-rl-352"] + " policy.dtensor_cfg.enabled=False policy.activation_checkpointing_enabled=True"
    r = from_command(shlex.split(line), CURRENT)
    assert r.eras["nemo-rl"][0] == ">=0.2.0,<0.3.0"
    s = r.setup
    assert (s.engine, s.checkpointing, s.reentrant, s.fsdp_use_orig_params) == ("fsdp1", "all", False, False)


def test_lora_policy_is_merged_into_vllm_and_dates_the_launch():
    line = LAUNCH["nemo-rl-352"] + " policy.dtensor_cfg.lora_cfg.enabled=True policy.dtensor_cfg.lora_cfg.dim=48"
    r = from_command(shlex.split(line), CURRENT)
    assert r.eras["nemo-rl"][0] == ">=0.6.0"
    s = r.setup
    assert (s.adapter, s.adapter_rank, s.rollout_sync) == ("lora", 48, "merged")
    assert "_maybe_merge_lora_weight" in r.sources["rollout_sync"]
    # Merged weights: no vLLM LoRA, so no max_lora_rank to outgrow.
    assert "vllm-max-lora-rank" not in holds(check(line)[0])


def test_importance_sampling_correction_uses_vllms_raw_logprobs():
    line = LAUNCH["nemo-rl-352"] + " loss_fn.use_importance_sampling_correction=True"
    assert holds(check(line)[0]) == {"vllm-raw-logprobs": None}
    assert "vllm-raw-logprobs" not in holds(check(LAUNCH["nemo-rl-352"])[0])


def test_megatron_policy_is_read_for_what_maps():
    line = LAUNCH["nemo-rl-352"] + " policy.megatron_cfg.enabled=True policy.dtensor_cfg.enabled=False"
    r = from_command(shlex.split(line), CURRENT)
    assert (r.setup.engine, r.setup.world_size, r.setup.rollout_engine) == ("single", 8, "vllm")
    assert any("Megatron-Core policy" in n for n in r.notes)


def test_sft_and_dpo_entry_points():
    sft = from_command(shlex.split("uv run python examples/run_sft.py --config examples/configs/sft.yaml "
                                   "policy.model_name=meta-llama/Llama-3.2-1B"), CURRENT)
    assert (sft.setup.stage, sft.setup.rollout_engine, sft.setup.world_size) == ("sft", "hf", 1)
    dpo = from_command(shlex.split("uv run examples/run_dpo.py policy.dtensor_cfg.activation_checkpointing=true"),
                       CURRENT)
    assert (dpo.setup.stage, dpo.setup.checkpointing, dpo.setup.forwards_per_step) == ("dpo", "all", 1)


@pytest.mark.parametrize("keys", [
    "policy.dtensor_cfg.lora_cfg.match_all_linear=false policy.dtensor_cfg.lora_cfg.exclude_modules=['*out_proj*']",
    "policy.dtensor_cfg.lora_cfg.match_all_linear=false policy.dtensor_cfg.lora_cfg.target_modules=[]",
])
def test_lora_without_match_all_linear_still_adapts(keys):
    # NeMo-Automodel's ModuleMatcher adapts every Linear outside exclude_modules (or `*_proj` when both lists are
    # empty): NeMo-RL's own sft-nanov3-30BA3B-2n8g-fsdp2-lora.yaml (v0.7.0) sets match_all_linear false with only
    # exclude_modules, and check called it an adapter that matches nothing (no-adapter-matched, exit 2).
    doc, code = check("uv run examples/run_sft.py policy.dtensor_cfg.lora_cfg.enabled=true " + keys,
                      {**CURRENT, "nemo-rl": Version("0.7.0")})
    assert doc["setup"]["adapter"] == "lora" and "no-adapter-matched" not in holds(doc) and code == 0


def test_a_config_file_alone():
    r = from_files("nemo-rl", [str(FIX / "examples" / "configs" / "grpo_math_8B.yaml")], CURRENT)
    s = r.setup
    assert (s.stage, s.engine, s.world_size) == ("grpo", "fsdp2", 8)
    assert r.sources["world_size"] == "grpo_math_8B.yaml: cluster.num_nodes x grpo_math_8B.yaml: cluster.gpus_per_node"
    assert guess_framework_for_files([FIX / "examples" / "configs" / "grpo_math_1B.yaml"]) == "nemo-rl"


@pytest.mark.parametrize("override, key", [("policy.precision=fp8", "policy.precision"),
                                           ("policy.generation.vllm_cfg.gpu_memory_utilization=1.5",
                                            "policy.generation.vllm_cfg.gpu_memory_utilization"),
                                           ("cluster.gpus_per_node=eight", "cluster.gpus_per_node")])
def test_bad_values_name_the_key(override, key):
    with pytest.raises(LoraflowError, match=key.replace(".", r"\.")):
        from_command(shlex.split(f"uv run examples/run_grpo_math.py {override}"), CURRENT)


def test_unread_entry_points_and_other_frameworks_lines():
    with pytest.raises(LoraflowError, match="not a NeMo-RL training entry point"):
        from_command(shlex.split("uv run examples/run_eval.py --config examples/configs/evals/eval.yaml"), CURRENT)
    # A script of the same name with HF-style flags is not NeMo-RL's.
    assert detect(shlex.split("python run_sft.py --model_name_or_path gpt2 --output_dir out")) != "nemo-rl"
    r = from_command(shlex.split(LAUNCH["nemo-rl-352"] + " policy.not_a_key=1 --lr 3"), CURRENT)
    assert "policy.not_a_key=1" in r.unknown and any(u.startswith("--lr") for u in r.unknown)


def test_a_recipe_whose_parent_is_not_here_reads_the_parent_as_released(tmp_path, monkeypatch):
    # NeMo-RL's recipes (examples/configs/recipes/llm/*.yaml) start `defaults: ../../sft.yaml`; copied alone, the
    # parent was refused. It is one of NeMo-RL's example configs, so it is read as each release ships it, under the
    # recipe's own keys (nemo_rl/utils/config.py load_config_with_inheritance merges the child over the parent).
    recipes = tmp_path / "examples" / "configs" / "recipes" / "llm"
    recipes.mkdir(parents=True)
    (recipes / "sft-lora.yaml").write_text("defaults: ../../sft.yaml\npolicy:\n  dtensor_cfg:\n    lora_cfg:\n"
                                           "      enabled: true\ncluster:\n  gpus_per_node: 8\n")
    (recipes / "own.yaml").write_text("defaults: ../../mine.yaml\npolicy:\n  precision: bfloat16\n")
    monkeypatch.chdir(tmp_path)
    r = from_command(shlex.split("uv run examples/run_sft.py --config examples/configs/recipes/llm/sft-lora.yaml"),
                     {**CURRENT, "nemo-rl": Version("0.6.0")})
    assert (r.setup.adapter, r.setup.engine, r.setup.world_size) == ("lora", "fsdp2", 8)
    assert "examples/configs/sft.yaml" in r.sources["engine"]
    assert any("defaults examples/configs/sft.yaml is not here" in n for n in r.notes)
    with pytest.raises(LoraflowError, match="mine.yaml"):
        from_command(shlex.split("uv run examples/run_sft.py --config examples/configs/recipes/llm/own.yaml"), CURRENT)
