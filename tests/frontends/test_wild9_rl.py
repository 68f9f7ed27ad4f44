"""A ninth sweep, of RL fine-tuning launches with LoRA and full weights (EasyR1, verl recipes with LoRA, OpenRLHF's
newer flags, NeMo-RL, TRL and Unsloth GRPO) from public repositories: the readings it found wrong. Each input is a
short synthetic launch of the same shape; the comment names the public repository that showed the class."""

from __future__ import annotations

from packaging.version import Version

from loraflow.frontends import detect, from_command
from loraflow.frontends.argv import split_command
from loraflow.frontends.shell import command_from_script

CURRENT = {"torch": Version("2.13.0"), "transformers": Version("5.23.0"), "peft": Version("0.21.2"),
           "deepspeed": Version("0.19.8")}


def _script(tmp_path, text: str) -> list[str]:
    path = tmp_path / "run.sh"
    path.write_text(text)
    return command_from_script(str(path))


# hiyouga/EasyR1 examples/qwen3_4b_math_grpo_lora.sh: `python3 -m verl.trainer.main config=examples/config.yaml
# worker.actor.model.lora.rank=64 ...`. EasyR1's package is named verl, so the launch was taken for verl's and refused
# ("`verl.trainer.main` is not a verl training entry point"): its config (worker.actor.*) is its own.
def test_easyr1_launch_reads_its_own_config(tmp_path):
    argv = _script(tmp_path, "MODEL_PATH=Qwen/Qwen3-4B\npython3 -m verl.trainer.main \\\n"
                             "  config=examples/config.yaml \\\n  worker.actor.model.model_path=${MODEL_PATH} \\\n"
                             "  worker.actor.model.lora.rank=64 \\\n"
                             "  worker.actor.model.lora.alpha=64 worker.actor.optim.lr=1e-5 \\\n"
                             "  worker.rollout.tensor_parallel_size=1 trainer.n_gpus_per_node=1\n")
    assert detect(argv) == "verl"
    r = from_command(argv, CURRENT)
    s = r.setup
    assert (s.stage, s.adapter, s.adapter_rank, s.engine, s.world_size) == ("grpo", "lora", 64, "fsdp1", 1)
    assert (s.checkpointing, s.reentrant, s.input_grad_hook, s.packing) == ("all", False, True, True)
    assert (s.rollout_engine, s.rollout_sync_proven, s.rollout_colocated) == ("vllm", True, True)
    assert s.engine_gpu_memory_utilization == 0.6
    # The YAML `config=` names is not here: its keys are unseen, so the reading is listed (exit 1), not trusted.
    assert [u for u in r.unknown if u.startswith("config=examples/config.yaml")], r.unknown
    assert len(r.unknown) == 1, r.unknown


def test_easyr1_config_file_and_full_finetune(tmp_path):
    (tmp_path / "config.yaml").write_text(
        "algorithm:\n  adv_estimator: gae\nworker:\n  actor:\n    fsdp:\n      torch_dtype: bf16\n"
        "    offload:\n      offload_params: true\n      offload_optimizer: true\n    model:\n"
        "      enable_gradient_checkpointing: false\ntrainer:\n  nnodes: 2\n  n_gpus_per_node: 8\n")
    r = from_command(["python3", "-m", "verl.trainer.main", f"config={tmp_path / 'config.yaml'}",
                      "worker.actor.model.lora.rank=0", "worker.actor.ulysses_size=2",
                      "worker.actor.unknown_knob=1"], CURRENT)
    s = r.setup
    assert (s.stage, s.adapter, s.precision, s.offload, s.checkpointing) == ("ppo", "full", "bf16", True, "off")
    assert (s.world_size, s.sequence_parallel, s.rollout_sync, s.rollout_colocated) == (16, True, "merged", False)
    assert r.unknown == ["worker.actor.unknown_knob=1 (not a key of EasyR1's config as read)"]
    # A fork's own module given EasyR1's keys is EasyR1's launch too.
    assert detect(["python3", "-m", "vision_r1_lora.main", "config=c.yaml", "worker.actor.model.lora.rank=64"]) \
        == "verl"


# A public OpenRLHF GRPO script (code index hit, repository not named) passes `--colocate_all_model` with
# --vllm_enable_sleep and --deepspeed_enable_sleep. OpenRLHF parses with a plain argparse.ArgumentParser, whose
# allow_abbrev takes the unique prefix for --colocate_all_models; it was listed as not understood and the engines were
# read as having GPUs of their own.
def test_openrlhf_unique_prefix_of_a_flag_is_that_flag():
    r = from_command(["python3", "-m", "openrlhf.cli.train_ppo_ray", "--actor_num_gpus_per_node", "2",
                      "--vllm_num_engines", "2", "--colocate_all_model", "--vllm_enable_sleep",
                      "--deepspeed_enable_sleep", "--pretrain", "meta-llama/Llama-3.1-8B-Instruct",
                      "--advantage_estimator", "group_norm", "--zero_stage", "3", "--bf16"], CURRENT)
    assert r.unknown == []
    assert r.sources["rollout_colocated"].startswith("--colocate_all_models with")
    # Without both sleeps the colocated engine holds its memory while the actor trains.
    r = from_command(["python3", "-m", "openrlhf.cli.train_ppo_ray", "--vllm_num_engines", "2",
                      "--colocate_all_model", "--pretrain", "m", "--zero_stage", "3"], CURRENT)
    assert r.setup.rollout_colocated is True
    # A prefix of several flags is argparse's error, not a guess: --colocate_a (actor_ref, all_models) stays unread.
    r = from_command(["python3", "-m", "openrlhf.cli.train_ppo_ray", "--vllm_num_engines", "2", "--colocate_a",
                      "--pretrain", "m"], CURRENT)
    assert "--colocate_a" in r.unknown


# A public verl GRPO LoRA script (code index hit, repository not named): `actor_rollout_ref.model.lora_rank=32
# ... rollout.layered_summon=True ... actor.fsdp_config.grad_offload=True`. grad_offload left verl's config after 0.2,
# lora_rank came in 0.4.0: Hydra refuses the override of a key the composed config lacks, so the launch stops at
# start-up on every release. Only a note said the keys were of different releases, and check answered exit 0.
def test_verl_overrides_no_release_has_together_are_listed():
    r = from_command(["python3", "-m", "verl.trainer.main_ppo", "algorithm.adv_estimator=grpo",
                      "actor_rollout_ref.model.path=Qwen/Qwen2.5-3B", "actor_rollout_ref.model.lora_rank=32",
                      "actor_rollout_ref.rollout.load_format=safetensors",
                      "actor_rollout_ref.rollout.layered_summon=True",
                      "actor_rollout_ref.actor.fsdp_config.grad_offload=True", "trainer.n_gpus_per_node=4"], CURRENT)
    found = [u for u in r.stops if u.startswith("actor_rollout_ref.actor.fsdp_config.grad_offload=True with")]
    assert found and "Could not override" in found[0] and "first appears in verl 0.4.0" in found[0], r.stops
    # `+key=` adds a key to any release's config: it dates nothing and stops nothing.
    r = from_command(["python3", "-m", "verl.trainer.main_ppo", "actor_rollout_ref.model.lora_rank=32",
                      "+actor_rollout_ref.actor.fsdp_config.grad_offload=True", "trainer.n_gpus_per_node=4"], CURRENT)
    assert not [u for u in r.stops if " with " in u], r.stops


# OpenRLHF/OpenRLHF examples/scripts/train_reinforce_baseline_llama_ray_agent_async.sh: `--advantage_estimator
# reinforce_baseline --colocate_all_models --async_train`. Every estimator but gae drops the critic (train_ppo_ray.py
# sets critic_pretrain None), yet only group_norm and dr_grpo were read as critic-free (the rest as PPO with a
# critic); and the engines' own GPUs under --async_train were explained as "time-shared" by sleep flags never given.
def test_openrlhf_critic_free_estimators_and_async_placement():
    r = from_command(["python3", "-m", "openrlhf.cli.train_ppo_ray", "--actor_num_gpus_per_node", "6",
                      "--vllm_num_engines", "2", "--colocate_all_models", "--pretrain", "m", "--zero_stage", "3",
                      "--advantage_estimator", "reinforce_baseline", "--async_train"], CURRENT)
    assert (r.setup.stage, r.setup.rollout_colocated) == ("grpo", False)
    assert "--async_train" in r.sources["rollout_colocated"] and "sleep" not in r.sources["rollout_colocated"]
    for algo, stage in (("rloo", "grpo"), ("reinforce", "grpo"), ("gae", "ppo")):
        r = from_command(["python3", "-m", "openrlhf.cli.train_ppo_ray", "--pretrain", "m",
                          "--advantage_estimator", algo], CURRENT)
        assert r.setup.stage == stage, algo


# hiyouga/EasyR1 examples/config.yaml given alone with --framework verl: its keys (worker.actor.*) were read against
# verl's SFT trainer config and all listed as unknown.
def test_easyr1_yaml_given_alone(tmp_path):
    from loraflow.frontends import verl

    path = tmp_path / "config.yaml"
    path.write_text("algorithm:\n  adv_estimator: grpo\nworker:\n  actor:\n    model:\n      lora:\n        rank: 16\n"
                    "    offload:\n      offload_params: true\n      offload_optimizer: true\n  rollout:\n"
                    "    gpu_memory_utilization: 0.6\ntrainer:\n  n_gpus_per_node: 4\n")
    r = verl.from_files([str(path)], CURRENT)
    assert (r.setup.adapter, r.setup.adapter_rank, r.setup.world_size, r.setup.rollout_colocated) == \
        ("lora", 16, 4, False)
    assert r.unknown == []


# A verl PPO script migrated to `actor_rollout_ref.model.lora.rank=8` (code index hit, repository not named; a
# migration note elsewhere tells users to write lora.rank): HFModelConfig's `lora` dict is the Megatron workers' LoRA,
# the FSDP workers build PEFT from model.lora_rank, so the run trains every weight. The key was listed bare, with no
# word of why the launch reads as full fine-tuning or which key to set.
def test_verl_megatron_lora_dict_on_fsdp_workers_names_lora_rank():
    r = from_command(["python", "-m", "verl.trainer.main_ppo", "actor_rollout_ref.model.path=Qwen/Qwen3-4B",
                      "actor_rollout_ref.model.lora.rank=8", "actor_rollout_ref.rollout.name=vllm",
                      "trainer.n_gpus_per_node=1"], CURRENT)
    assert r.setup.adapter == "full"
    assert any("set actor_rollout_ref.model.lora_rank=8" in u for u in r.unknown), r.unknown
    # Given beside lora_rank (scripts that set both), it is only the Megatron key, listed as given.
    r = from_command(["python", "-m", "verl.trainer.main_ppo", "actor_rollout_ref.model.lora_rank=8",
                      "actor_rollout_ref.model.lora.rank=8", "trainer.n_gpus_per_node=1"], CURRENT)
    assert r.setup.adapter == "lora" and "actor_rollout_ref.model.lora.rank=8" in r.unknown


# Recent verl scripts pick the Megatron workers with the Hydra group choice `model_engine=megatron` (ppo_trainer.yaml
# `defaults: - model_engine: dp`, `actor@actor_rollout_ref.actor: ${model_engine}_actor`; code index hits, e.g. a
# qwen3-8b LoRA GRPO script with `model_engine=megatron actor_rollout_ref.model.lora.rank=16`). It was listed unknown
# and the run read as the FSDP workers' full fine-tuning.
def test_verl_model_engine_group_choice_picks_the_megatron_workers():
    r = from_command(["python3", "-m", "verl.trainer.main_ppo", "model_engine=megatron", "algorithm.adv_estimator=grpo",
                      "actor_rollout_ref.model.path=Qwen/Qwen3-8B", "actor_rollout_ref.model.lora.rank=16",
                      "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2", "trainer.n_gpus_per_node=8"],
                     CURRENT)
    assert (r.setup.adapter, r.setup.adapter_rank, r.setup.not_used) == ("lora", 16, ("peft",))
    assert r.unknown == [] and any(n.startswith("model_engine=megatron: verl's Megatron") for n in r.notes)
    r = from_command(["python3", "-m", "verl.trainer.main_ppo", "model_engine=dp",
                      "actor_rollout_ref.model.lora_rank=8", "trainer.n_gpus_per_node=2"], CURRENT)
    assert (r.setup.adapter, r.setup.engine, r.unknown) == ("lora", "fsdp1", [])
    r = from_command(["python3", "-m", "verl.trainer.main_ppo", "model_engine=torchtitan",
                      "trainer.n_gpus_per_node=2"], CURRENT)
    assert any(u.startswith("model_engine=torchtitan: verl's torchtitan engine") for u in r.unknown)
