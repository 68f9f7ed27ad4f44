"""verl PPO/GRPO rollouts (actor_rollout_ref.rollout.*): which engine samples, how the actor's weights reach it, how
much of the GPUs it claims. Read by verl.py for main_ppo, whose module this would overfill.

verl's hybrid engine runs vLLM on the actor's GPUs and syncs the actor into it before every rollout
(verl/workers/sharding_manager/fsdp_vllm.py, later fsdp_workers.py rollout_mode): a LoRA actor's adapter is loaded as a
vLLM LoRA (TensorLoRARequest) and every other weight in place. Read at the verl tags named beside each fact.
"""

from __future__ import annotations

from typing import Any, Callable

from loraflow.frontends.base import Mitigation
from loraflow.frontends.common import Draft, as_bool, at_least, int_value, mitigated
from loraflow.frontends.table import Default, Field, apply_table, fact, fraction, rank

R = "actor_rollout_ref.rollout."
LORA_RANK = "actor_rollout_ref.model.lora_rank"
FLAGS = {"rollout_sync": R + "name (vllm syncs the LoRA adapter as a vLLM LoRA)",
         "engine_max_lora_rank": LORA_RANK + " (verl >= 0.6.1 rounds it up to a rank vLLM takes)",
         "adapter_rank": LORA_RANK, "engine_gpu_memory_utilization": R + "gpu_memory_utilization",
         "rollout_colocated": "actor_rollout_ref.actor.fsdp_config.param_offload / optimizer_offload with "
                              + R + "free_cache_engine",
         "rollout_sync_proven": R + "mode sync (or verl >= 0.6.1)",
         "rollout_logprobs_used": "algorithm.rollout_correction.rollout_is",
         "rollout_verified": "none in verl (it logs rollout_probs_diff without stopping)"}
# vLLM was started with max_lora_rank=lora_rank itself up to v0.6.0 (v0.6.0 vllm_rollout_spmd.py#L115); v0.6.1 rounds
# it up to the next rank vLLM accepts (verl PR #3821, verl/workers/rollout/vllm_rollout/utils.py
# get_vllm_max_lora_rank), from this list.
ROUNDED_RANK_SINCE = "0.6.1"
ROUNDED_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
# rollout.mode=async (vLLM's AsyncLLM server) loaded no LoRA into the engine in v0.5.0 and only the frozen base in
# v0.6.0, so rollouts sampled the initial policy (verl PR #3639, v0.6.0; fixed by PR #3821 and #3907, v0.6.1).
ASYNC_LORA_SYNC = Mitigation(("vllm-stale-policy",), "0.6.1", "async rollouts load the trained LoRA into the engine",
                             "verl/workers/fsdp_workers.py (PR #3821, #3907)")
# The weight sync maps transformers >= 4.52's image-text module names (model.language_model, model.visual) back to
# the checkpoint layout vLLM's loaders read, from v0.4.1 (verl/utils/model.py convert_weight_keys, called in
# workers/sharding_manager/fsdp_vllm.py; absent in the v0.4.0 wheel).
VLM_KEYS_RENAMED = Mitigation(("vllm-vlm-weight-names",), "0.4.1", "the weight sync renames transformers 4.52's "
                              "image-text module names to the checkpoint's", "verl/utils/model.py convert_weight_keys")
# The engine returns log-probs after temperature (vLLM logprobs_mode processed_logprobs) from the first release
# after v0.7.0 (verl/trainer/config/rollout/rollout.yaml logprobs_mode on main, commit b178a3c).
PROCESSED_SINCE = "0.7.1"


def _name(options: dict[str, tuple[Any, str]]) -> tuple[str, str]:
    if R + "name" in options:
        value, where = options[R + "name"]
        return str(value), where
    # A mandatory key (`???`) from v0.6.0; vllm before.
    return "vllm", "default (verl 0.1 - 0.5.0 ppo_trainer.yaml: rollout.name vllm; mandatory from 0.6.0)"


def _on(options: dict, key: str, default: bool) -> bool:
    return as_bool(*options[key]) if key in options else default


def _table(options: dict, lora: bool, default_of: Callable[[str], Default]) -> tuple[Field, ...]:
    def mode(draft: Draft) -> str:
        return str(options[R + "mode"][0]) if R + "mode" in options else default_of(R + "mode")(draft)[0]

    def max_rank(draft: Draft) -> tuple[int, str] | None:
        if LORA_RANK not in options:
            return None
        value, where = options[LORA_RANK]
        wanted = int_value(value, where, "a LoRA rank")
        if at_least(draft, "verl", ROUNDED_RANK_SINCE):
            up = next((r for r in ROUNDED_RANKS if r >= wanted), wanted)
            return up, f"{where} (verl >= 0.6.1 rounds max_lora_rank up to {up}, vllm_rollout/utils.py)"
        return wanted, f"{where} (verl < 0.6.1 starts vLLM with max_lora_rank=lora_rank, vllm_rollout_spmd.py)"

    def proven(draft: Draft) -> tuple[bool, str]:
        if lora and mode(draft) == "async" and not mitigated(draft, "vllm-stale-policy"):
            return False, "verl < 0.6.1 async rollouts leave the LoRA out of the engine (PR #3821)"
        return True, "verl syncs the actor into the engine before every rollout (fsdp_workers.py)"

    def renamed(draft: Draft) -> tuple[bool, str] | None:
        if lora or draft.get("vlm_renamed") is None:
            return None
        done = mitigated(draft, "vllm-vlm-weight-names")
        return done, (f"verl >= {VLM_KEYS_RENAMED.since} renames the weights to the checkpoint's layout before the "
                      "sync (verl/utils/model.py convert_weight_keys)" if done else
                      f"verl < {VLM_KEYS_RENAMED.since} pushes the weights under the trained model's own names")

    def used(draft: Draft) -> tuple[bool, str]:
        keys = ("algorithm.rollout_correction.rollout_is", "algorithm.rollout_is",
                "algorithm.rollout_correction.bypass_mode")
        given = [k for k in keys if k in options and options[k][0] not in (None, False, "null", "false", "False")]
        return (True, options[given[0]][1]) if given else (False, "no rollout correction: the actor recomputes "
                                                                  "old_log_prob (verl/trainer/ppo/ray_trainer.py)")

    def processed(draft: Draft) -> tuple[bool, str]:
        new = at_least(draft, "verl", PROCESSED_SINCE)
        return new, ("verl after 0.7.0 starts vLLM with logprobs_mode processed_logprobs (rollout.yaml)" if new else
                     "verl <= 0.7.0 leaves vLLM's logprobs_mode at raw_logprobs")

    # A dummy load_format starts the engine with random weights, so the first sync sends the base too; a real one
    # (safetensors) loads the base from disk (fsdp_workers.py base_sync_done).
    load_format = str(options[R + "load_format"][0]) if R + "load_format" in options else "dummy"
    base_first = f" ({R}load_format {load_format})" if "dummy" in load_format else \
        f" from disk ({R}load_format {load_format})"
    time_shared = (_on(options, R + "free_cache_engine", True)
                   and _on(options, "actor_rollout_ref.actor.fsdp_config.param_offload", False)
                   and _on(options, "actor_rollout_ref.actor.fsdp_config.optimizer_offload", False))
    hybrid = _on(options, "actor_rollout_ref.hybrid_engine", True)
    return (
        fact("rollout_engine", "vllm", "actor_rollout_ref.rollout.name vllm"),
        fact("generation", False, "rollouts come from vLLM, not from the FSDP actor"),
        fact("rollout_sync", "adapter" if lora else "merged", "verl loads the LoRA into vLLM as an adapter "
             f"(TensorLoRARequest, fsdp_workers.py), after the base weights once{base_first}" if lora else
             "verl loads every weight into vLLM in place"),
        Field("adapter_rank", (LORA_RANK,), rank, when=lambda d: lora),
        Field("engine_max_lora_rank", default=max_rank, when=lambda d: lora),
        Field("rollout_sync_proven", default=proven),
        Field("rollout_sync_renamed", default=renamed),
        fact("rollout_verified", False, "verl logs the rollout/actor log-prob gap (rollout_probs_diff) but never "
             "stops on it"),
        Field("rollout_logprobs_used", default=used),
        Field("rollout_logprobs_processed", default=processed),
        fact("rollout_colocated", hybrid and not time_shared, _placement(options, hybrid, time_shared)),
        Field("engine_gpu_memory_utilization", (R + "gpu_memory_utilization",), fraction,
              default_of(R + "gpu_memory_utilization")),
    )


def _placement(options: dict, hybrid: bool, time_shared: bool) -> str:
    """Where the engine runs, as the reason for rollout_colocated. hybrid_engine=False is the split placement of
    verl's one-step-off-policy and fully-async recipes: the engine on `rollout.n_gpus_per_node` GPUs of its own."""
    if not hybrid:
        gpus = options.get("rollout.n_gpus_per_node", (None, ""))[1]
        return "actor_rollout_ref.hybrid_engine=False: the engine runs on GPUs of its own" + (f" ({gpus})" if gpus
                                                                                             else "")
    return "hybrid engine: vLLM shares the actor's GPUs" + (
        " and the two take turns (offload, free_cache_engine)" if time_shared else
        " while the actor's weights stay there (no param and optimizer offload)")


def apply(draft: Draft, options: dict[str, tuple[Any, str]], lora: bool, default_of: Callable[[str], Default]
          ) -> None:
    """The rollout fields of a main_ppo launch (options: dotted key -> (value, where); default_of: a key's default
    at each verl release, verl.default)."""
    name, where = _name(options)
    if name == "hf":
        # HFRollout generates with the FSDP actor; FSDP1 summons the root's full parameters around generate
        # (verl/workers/rollout/hf_rollout.py), FSDP2 does not.
        draft.set("generation", True, f"{where} (the actor's own generate)")
        fsdp1 = draft.get("engine") == "fsdp1"
        draft.set("generation_gather", fsdp1, "HFRollout summons FSDP1's full parameters around generate" if fsdp1
                  else "HFRollout calls generate on the FSDP2 module without gathering (hf_rollout.py)")
        return
    if name != "vllm":
        draft.set("generation", False, f"{where} (rollouts from {name})")
        draft.note(f"{where}: loraflow's rollout rules model vLLM engines; the {name} engine's weight sync is not "
                   "checked")
        return
    apply_table(draft, options, _table(options, lora, default_of))
    draft.flag(**FLAGS)
