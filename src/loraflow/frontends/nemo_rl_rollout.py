"""NeMo-RL GRPO generation (policy.generation.*): which engine samples, how the policy's weights reach it (refit), how
much of the GPUs it claims, whether it shares them. Read by nemo_rl.py for the GRPO entry points.

Before every generation after an update, grpo.py refit_policy_generation streams every weight of the policy into vLLM
(CUDA IPC when colocated, NCCL broadcast otherwise): a LoRA policy's delta is merged into each base weight on the way
(dtensor_policy_worker_v2.py _maybe_merge_lora_weight, v0.6.0), so vLLM never holds an adapter. Colocated, the two
take turns: the policy moves its weights and optimizer to the CPU (offload_after_refit) and vLLM, started with
enable_sleep_mode=True, sleeps while the policy trains (vllm_worker.py sleep level 1). Read at the tags named.
"""

from __future__ import annotations

from loraflow.frontends.common import Draft, as_bool
from loraflow.frontends.table import fraction

G = "policy.generation."
FLAGS = {"rollout_sync": "none (NeMo-RL refits every weight, a LoRA delta merged in)",
         "engine_gpu_memory_utilization": G + "vllm_cfg.gpu_memory_utilization",
         "rollout_colocated": G + "colocated.enabled",
         "rollout_logprobs_used": "loss_fn.use_importance_sampling_correction",
         "rollout_verified": "none in NeMo-RL (it logs token_mult_prob_error without stopping)"}
# vllm_worker.py passes logprobs_mode="raw_logprobs" from v0.4.0 (vLLM 0.10); the vLLM of earlier releases had only
# the raw model's log-probs.
RAW_LOGPROBS = "NeMo-RL starts vLLM with logprobs_mode='raw_logprobs' (nemo_rl/models/generation/vllm/vllm_worker.py)"


def _backend(draft: Draft, s) -> tuple[str, str]:
    found = s.get(draft, G + "backend")
    return (str(found[0]), found[1]) if found else ("vllm", "default (policy.generation.backend vllm)")


def apply(draft: Draft, s, engine: str) -> None:
    """The generation fields of a GRPO launch (s: nemo_rl.Settings; engine: fsdp1, fsdp2 or megatron)."""
    backend, where = _backend(draft, s)
    if backend == "hf":
        # v0.1 - v0.2: the FSDP1 worker generates under summon_full_params (hf_policy.py / fsdp1_policy_worker.py
        # generate); the DTensor worker has no generate.
        draft.set("generation", True, f"{where} (the policy's own generate)")
        draft.set("generation_gather", engine == "fsdp1", "FSDP1 generate runs under summon_full_params "
                  "(fsdp1_policy_worker.py)" if engine == "fsdp1" else "the DTensor worker has no generate")
        return
    if backend != "vllm":
        draft.set("generation", backend == "megatron", f"{where} (rollouts from {backend})")
        draft.note(f"{where}: loraflow's rollout rules model vLLM engines; the {backend} engine's refit is not "
                   "checked")
        return
    draft.set("rollout_engine", "vllm", where)
    draft.set("generation", False, "rollouts come from vLLM, not from the policy worker")
    lora = draft.get("adapter") == "lora"
    draft.set("rollout_sync", "merged", "refit streams every weight into vLLM in place" + (
        ", the LoRA delta merged into each base weight (dtensor_policy_worker_v2.py _maybe_merge_lora_weight)"
        if lora else " (grpo.py refit_policy_generation)"))
    draft.set("rollout_sync_proven", True, "grpo.py refits the policy into vLLM before each generation that follows "
              "an update (refit_policy_generation, POLICY_GENERATION_STALE)")
    draft.set("rollout_verified", False, "grpo.py logs token_mult_prob_error (engine vs policy log-probs) without "
              "stopping on it")
    used = [k for k in ("loss_fn.use_importance_sampling_correction", "loss_fn.truncated_importance_sampling_ratio")
            if (found := s.get(draft, k)) is not None and found[0] not in (None, False, "null", "false", "False", "")]
    draft.set("rollout_logprobs_used", bool(used), s.get(draft, used[0])[1] if used else
              "the policy recomputes prev_logprobs before training (grpo.py policy.get_logprobs)")
    draft.set("rollout_logprobs_processed", False, RAW_LOGPROBS)
    share = s.get(draft, G + "vllm_cfg.gpu_memory_utilization")
    if share is not None:
        draft.set("engine_gpu_memory_utilization", fraction(*share), share[1])
    colocated = s.get(draft, G + "colocated.enabled")
    if colocated is None:  # v0.1 - v0.2: always colocated (grpo.py: colocated_inference = backend != "hf")
        colocated = (True, "default (nemo-rl < 0.3.0 grpo.py colocates vLLM whenever it is the backend)")
    on = as_bool(*colocated) if colocated[0] not in ("", None) and "$" not in str(colocated[0]) else True
    draft.set("rollout_colocated", False, f"{colocated[1]}: " + (
        "vLLM shares the policy's GPUs by turns: offload_after_refit moves the policy's weights and optimizer to the "
        "CPU before generating, vLLM sleeps (enable_sleep_mode) while the policy trains" if on else
        "vLLM runs on GPUs of its own (colocated.resources)"))
