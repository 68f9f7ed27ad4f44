"""verl frontend of `loraflow check`: verl's own example launches (tests/fixtures/frontends/verl/, MANIFEST.md) and
launches posted in the mined threads -> Combination, with verl's defaults per release from its Hydra configs, and the
rule findings `check` reports on them."""

from __future__ import annotations

import json
import shlex

import pytest
import yaml
from conftest import ROOT
from packaging.version import Version

from loraflow.errors import LoraflowError
from loraflow.frontends import detect, from_command, from_files, guess_framework_for_files, run_check
from loraflow.frontends.shell import command_from_script
from loraflow.frontends.dotlist import split_overrides

FIX = ROOT / "tests" / "fixtures" / "frontends" / "verl"
CURRENT = {"torch": Version("2.13.0"), "transformers": Version("5.23.0"), "peft": Version("0.21.2")}
OLD_STACK = {"torch": Version("2.8.0"), "transformers": Version("4.56.0"), "peft": Version("0.17.0")}


def launch(name: str) -> list[str]:
    return command_from_script(str(FIX / name))


def check(argv: list[str] | None = None, files: tuple[str, ...] = (), versions: dict = CURRENT) -> dict:
    return json.loads(run_check(argv, "verl" if files else None, [str(FIX / f) for f in files], dict(versions),
                                True)[0])


def holds(doc: dict) -> dict[str, str | None]:
    return {f["rule"]: f["holds_if"] for f in doc["findings"]}


GRPO_LORA = "run_qwen2_5-3b_gsm8k_grpo_lora.sh"


def test_grpo_lora_example_reads_verls_defaults_per_release():
    argv = launch(GRPO_LORA)
    assert detect(argv) == "verl"
    r = from_command(argv, CURRENT)
    s = r.setup
    assert (s.stage, s.adapter, s.world_size, s.engine) == ("grpo", "lora", 8, "fsdp1")
    assert (s.checkpointing, s.reentrant, s.input_grad_hook, s.use_cache, s.packing) == ("all", False, True, False,
                                                                                          True)
    assert (s.precision, s.fsdp_use_orig_params, s.fsdp_frozen_units_separate) == ("bf16-mixed", False, True)
    # The defaults cite verl's config file at the release that set them.
    assert r.sources["engine"] == ("default (verl 0.1 verl/trainer/config/ppo_trainer.yaml: "
                                   "actor_rollout_ref.actor.strategy=fsdp)")
    assert r.sources["world_size"] == "trainer.nnodes=1 x trainer.n_gpus_per_node=8"
    # Rollouts on vLLM: the adapter is synced as a vLLM LoRA, the engine shares the actor's GPUs.
    assert (s.rollout_engine, s.rollout_sync, s.adapter_rank, s.engine_max_lora_rank) == ("vllm", "adapter", 64, 64)
    assert (s.engine_gpu_memory_utilization, s.rollout_colocated, s.generation) == (0.6, True, False)
    # use_shm came with v0.4.0: the launch is dated by its keys.
    assert r.eras["verl"][0] == ">=0.4.0" and "actor_rollout_ref.model.use_shm" in r.eras["verl"][1]
    assert r.unknown == [] and r.flags["adapter"] == "actor_rollout_ref.model.lora_rank"
    assert check(argv)["findings"] == []


def test_lora_rank_vllm_cannot_take_fails_before_verl_rounds_it_up():
    # verl < 0.6.1 starts vLLM with max_lora_rank=lora_rank; 0.6.1 rounds it up to a rank vLLM accepts (PR #3821).
    doc = check(launch(GRPO_LORA) + ["actor_rollout_ref.model.lora_rank=48"])
    assert holds(doc) == {"vllm-max-lora-rank": "verl<0.6.1"}
    old = from_command(launch(GRPO_LORA) + ["actor_rollout_ref.model.lora_rank=48"], {"verl": Version("0.5.0")})
    new = from_command(launch(GRPO_LORA) + ["actor_rollout_ref.model.lora_rank=48"], {"verl": Version("0.6.1")})
    assert (old.setup.engine_max_lora_rank, new.setup.engine_max_lora_rank) == (48, 64)


def test_async_rollouts_with_lora_sample_a_stale_policy_before_0_6_1():
    doc = check(launch(GRPO_LORA) + ["actor_rollout_ref.rollout.mode=async"])
    assert holds(doc) == {"vllm-stale-policy": "verl<0.6.1"}


def test_fsdp2_engine_hf_rollouts_and_a_full_share_find_their_rules():
    fsdp2 = launch(GRPO_LORA) + ["actor_rollout_ref.actor.strategy=fsdp2"]
    assert from_command(fsdp2, CURRENT).setup.engine == "fsdp2"
    # transformers < 5.23 checkpoints the layer's __call__ around FSDP2's hooks (hf_checkpointing.py), but verl's
    # apply_fsdp2 shards the root under the layers' policy: a text model's layers get bf16 inputs, and the cast the
    # recompute skips (torch < 2.13) changes nothing. An image-text model's towers still count.
    assert holds(check(fsdp2, versions=OLD_STACK)) == {}
    vl_fsdp2 = launch("run_qwen2_5_vl-7b_lora.sh") + ["actor_rollout_ref.actor.strategy=fsdp2"]
    assert holds(check(vl_fsdp2, versions=OLD_STACK))["fsdp2-recompute-cast"] is None
    assert holds(check(fsdp2)) == {}
    # HFRollout calls generate on the FSDP2 module without gathering (verl/workers/rollout/hf_rollout.py).
    assert holds(check(fsdp2 + ["actor_rollout_ref.rollout.name=hf"])) == {"fsdp2-generate-unsharded": None}
    assert "vllm-colocate-memory" in holds(check(launch(GRPO_LORA) + [
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.9"]))


def test_full_finetune_in_bf16_weights_and_code_read_keys():
    argv = launch(GRPO_LORA) + ["actor_rollout_ref.model.lora_rank=0",
                                "+actor_rollout_ref.actor.fsdp_config.model_dtype=bf16"]
    doc = check(argv)
    assert (doc["setup"]["adapter"], doc["setup"]["precision"]) == ("full", "bf16")
    assert holds(doc) == {"bf16-lost-updates": None} and doc["unknown"] == []
    # FSDP's compute dtype is read by verl's code without a YAML key (fsdp_config.get("mixed_precision")).
    fp16 = from_command(launch(GRPO_LORA) + ["+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp16"],
                        CURRENT)
    assert fp16.setup.precision == "fp16-mixed" and fp16.unknown == []


def test_vision_language_example_keeps_the_tower_out_only_with_exclude_modules():
    argv = launch("run_qwen2_5_vl-7b_lora.sh")
    r = from_command(argv, CURRENT)
    assert r.setup.image_text and not r.setup.targets_all_towers
    assert r.eras["verl"][0] == ">=0.5.0,<0.6.0"  # exclude_modules came in v0.5.0, a vLLM engine_kwargs key left
    assert "lora-targets-vision-tower" not in holds(check(argv))
    without = [t for t in argv if "exclude_modules" not in t]
    found = holds(check(without))
    assert found["lora-targets-vision-tower"] is None and found["vllm-adapter-unservable"] is None


def test_offloaded_14b_example_time_shares_the_gpus_with_ulysses():
    r = from_command(launch("qwen2-14b_grpo-lora_2_h100_fsdp_vllm.sh"), CURRENT)
    s = r.setup
    assert (s.world_size, s.offload, s.rollout_colocated, s.engine_gpu_memory_utilization) == (2, True, False, 0.25)
    assert s.sequence_parallel and r.sources["sequence_parallel"].endswith("ulysses_sequence_parallel_size=2")


def test_sft_trainer_example_reads_the_sft_config():
    r = from_files("verl", [str(FIX / "run_qwen2_5_05b_sft_peft_sp2_npu.sh")], CURRENT)
    s = r.setup
    assert (s.stage, s.adapter, s.engine, s.packing, s.sequence_parallel) == ("sft", "lora", "fsdp1", True, True)
    # enable_gradient_checkpointing became true by default in sft_trainer.yaml at v0.4.1.
    assert s.checkpointing == "all" and "verl >= 0.4.1 verl/trainer/config/sft_trainer.yaml" in r.sources[
        "checkpointing"]
    assert r.flags["sequence_parallel"] == "ulysses_sequence_parallel_size"
    old = from_files("verl", [str(FIX / "run_qwen2_5_05b_sft_peft_sp2_npu.sh")], {"verl": Version("0.4.0")})
    assert old.setup.checkpointing == "off"


def test_mined_launches_posted_in_threads():
    # PR #205's overrides, pasted without the launch line: read as main_ppo's.
    doc = check(files=("grpo_overrides_verl-205.txt",))
    assert (doc["setup"]["adapter"], doc["setup"]["stage"]) == ("lora", "ppo") and doc["unknown"] == []
    assert doc["inferred_eras"]["verl"]["range"] == ">=0.4.0"
    # Issue #1804's launch as posted (cut after the data keys): every other setting is verl's default.
    r = from_files("verl", [str(FIX / "main_ppo_grpo_verl-1804.sh")], CURRENT)
    assert (r.setup.stage, r.setup.adapter, r.setup.world_size) == ("grpo", "full", 8)
    assert "lora_rank" in r.sources["adapter"] and r.sources["adapter"].startswith("default (verl 0.4.0")


def test_unread_overrides_are_listed():
    r = from_command(launch(GRPO_LORA) + ["actor_rollout_ref.model.lora_rnak=8", "+trainer.my_flag=1", "stray"],
                     CURRENT)
    assert set(r.unknown) == {"actor_rollout_ref.model.lora_rnak=8", "+trainer.my_flag=1",
                              "stray (not a Hydra override key=value)"}
    # Keys inside an open section (override_config) are verl's model config's, not unknown.
    r = from_command(launch(GRPO_LORA) + ["+actor_rollout_ref.model.override_config.attention_dropout=0.0"], CURRENT)
    assert r.unknown == []


@pytest.mark.parametrize("override, key", [
    ("actor_rollout_ref.actor.strategy=deepspeed", "actor_rollout_ref.actor.strategy"),
    ("actor_rollout_ref.model.lora_rank=sixteen", "actor_rollout_ref.model.lora_rank"),
    ("algorithm.adv_estimator=ppo_plus", "algorithm.adv_estimator"),
    ("actor_rollout_ref.rollout.gpu_memory_utilization=1.5", "actor_rollout_ref.rollout.gpu_memory_utilization"),
])
def test_bad_values_name_the_key(override, key):
    with pytest.raises(LoraflowError, match=key.replace(".", r"\.")):
        from_command(launch(GRPO_LORA) + [override], CURRENT)


MEGATRON_LORA = ("python3 -m verl.trainer.main_ppo --config-path=config --config-name='ppo_megatron_trainer.yaml' "
                 "algorithm.adv_estimator=grpo actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct "
                 "actor_rollout_ref.model.lora.rank=16 actor_rollout_ref.model.lora.alpha=32 "
                 "actor_rollout_ref.actor.megatron.use_mbridge=True "
                 "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4 trainer.n_gpus_per_node=8")


def test_megatron_trainer_config_is_read_as_the_megatron_workers_not_fsdp(tmp_path, monkeypatch):
    # verl's examples/grpo_trainer/*_megatron*.sh name ppo_megatron_trainer.yaml (actor.strategy: megatron): before,
    # check read them with the FSDP config's defaults (engine fsdp1, no adapter) and listed the Megatron keys unread.
    monkeypatch.chdir(tmp_path)
    r = from_command(shlex.split(MEGATRON_LORA), CURRENT)
    assert (r.setup.stage, r.setup.adapter, r.setup.world_size) == ("grpo", "lora", 8)
    assert r.setup.engine != "fsdp1" and "peft" in r.setup.not_used and r.unknown == []
    assert any("Megatron workers" in n for n in r.notes)
    full = from_command(shlex.split(MEGATRON_LORA.replace("lora.rank=16", "lora.rank=0")), CURRENT)
    assert full.setup.adapter == "full"
    # strategy=megatron over the FSDP config reads the same way; a Megatron key without it is still unread.
    fsdp = shlex.split(MEGATRON_LORA.replace("--config-path=config --config-name='ppo_megatron_trainer.yaml' ", ""))
    assert from_command(fsdp + ["actor_rollout_ref.actor.strategy=megatron"], CURRENT).unknown == []
    assert "actor_rollout_ref.actor.megatron.use_mbridge=True" in from_command(fsdp, CURRENT).unknown
    assert run_check(shlex.split(MEGATRON_LORA), None, [], dict(CURRENT), True)[1] == 0


def test_not_a_training_entry_point():
    with pytest.raises(LoraflowError, match="not a verl training entry point"):
        from_command(shlex.split("python3 -m verl.trainer.main_generation data.path=x"), CURRENT)


def test_hydra_config_name_and_a_verl_yaml_alone(tmp_path):
    # The GRPO example's overrides as the nested YAML a --config-name file (or a config given alone) holds.
    overrides, _ = split_overrides(launch(GRPO_LORA)[3:])
    config: dict = {}
    for o in overrides:
        *parents, leaf = o.key.split(".")
        node = config
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = o.value
    (tmp_path / "grpo_lora.yaml").write_text(yaml.safe_dump(config))
    r = from_command(["python3", "-m", "verl.trainer.main_ppo", "--config-path", str(tmp_path), "--config-name",
                      "grpo_lora", "actor_rollout_ref.model.lora_rank=16"], CURRENT)
    assert (r.setup.adapter_rank, r.setup.world_size, r.setup.stage) == (16, 8, "grpo")
    assert r.sources["stage"] == "grpo_lora.yaml: algorithm.adv_estimator" and r.unknown == []
    assert guess_framework_for_files([str(tmp_path / "grpo_lora.yaml")]) == "verl"  # `loraflow check FILE`
    alone = from_files("verl", [str(tmp_path / "grpo_lora.yaml")], CURRENT)
    assert (alone.setup.adapter_rank, alone.setup.rollout_engine) == (64, "vllm") and alone.unknown == []
