"""ms-swift GRPO's rollouts on vLLM (`swift rlhf --rlhf_type grpo --use_vllm true --vllm_mode colocate|server`):
which engine samples, how the policy reaches it, how much of the trainer's GPUs it claims. Read by ms_swift.py, whose
module this would overfill."""

from __future__ import annotations

from loraflow.frontends.base import Mitigation
from loraflow.frontends.common import Draft, at_least, int_value, mitigated
from loraflow.frontends.trl import whole_model_sync
from loraflow.frontends.table import Default, Field, apply_table, fact, fraction, rank

# SWIFT = https://github.com/modelscope/ms-swift/blob/3602360a562313afbf2ef6065fdf61f271a2c5b9 (4.x, 2026-08-22)
# GRPO's vLLM engine (SWIFT/swift/rlhf_trainers/args_mixin.py#L37 share 0.9, #L174 vllm_enable_lora, #L188
# sleep_level). Adapter sync came with v3.10 (https://github.com/modelscope/ms-swift/pull/5773): LoRA +
# --vllm_enable_lora loads the adapter into the engine (SWIFT/swift/rlhf_trainers/rollout_mixin.py#L643-L729), whose
# max_lora_rank is then --lora_rank itself in colocate mode (rollout_mixin.py#L478) or the `swift rollout` server's
# --vllm_max_lora_rank (16 unless given, swift/arguments/deploy_args.py). Every other setup merges the adapter and
# loads the merged weights (_move_full_model_to_vllm). Processed log-probs are asked for from v3.11 with vLLM >= 0.10.2
# (rollout_mixin.py#L499), when the off-policy correction (https://github.com/modelscope/ms-swift/pull/6678) uses them.
ADAPTER_SYNC_SINCE = "3.10.0"
# --sleep_level 2 discards the engine's weights; on the adapter path only the adapter was re-sent after waking, so
# the base was garbage until v3.12 (https://github.com/modelscope/ms-swift/pull/7017). With --offload_model the model
# leaves the GPU while the engine starts and runs (https://github.com/modelscope/ms-swift/pull/4770), so with a
# sleeping engine the two take turns.
SLEEP2_BASE_SYNC = Mitigation(("vllm-stale-policy",), "3.12.0", "with --sleep_level 2 the adapter path re-sends the "
                              "base weights the engine dropped, not only the adapter",
                              "swift/rlhf_trainers/rollout_mixin.py (PR #7017)")
VLLM_FLAGS = {"engine_gpu_memory_utilization": "--vllm_gpu_memory_utilization",
              "rollout_colocated": "--sleep_level 1 with --offload_model true (or --vllm_mode server)",
              "engine_max_lora_rank": "--lora_rank (colocate) / `swift rollout --vllm_max_lora_rank` (server)",
              "rollout_sync": "--vllm_enable_lora", "adapter_rank": "--lora_rank",
              "rollout_sync_proven": "--sleep_level 1"}


def _vllm_table(get, on, mode: str) -> tuple[Field, ...]:
    """What GRPO's vLLM flags set (--use_vllm true); `mode` is colocate or server."""
    lora = lambda d: d.get("adapter") in ("lora", "dora")  # noqa: E731
    adapter_sync = lambda d: d.get("rollout_sync") == "adapter"  # noqa: E731
    sleep = int_value(get("sleep_level", 0), "--sleep_level", "a sleep level", (0, 1, 2))
    time_shared = sleep > 0 and on("offload_model")
    uses_logprobs = bool(get("rollout_importance_sampling_mode") or get("off_policy_sequence_mask_delta")
                         or on("log_rollout_offpolicy_metrics"))

    def sync(draft: Draft) -> tuple[str, str] | None:
        if lora(draft) and on("vllm_enable_lora") and at_least(draft, "ms-swift", ADAPTER_SYNC_SINCE):
            if mode == "colocate":
                return "adapter", "--vllm_enable_lora: the adapter is loaded into the engine (rollout_mixin.py " \
                                  "_move_adapter_to_vllm, ms-swift >= 3.10)"
        return "merged", "ms-swift merges the adapter and loads the merged weights (rollout_mixin.py " \
                         "_move_full_model_to_vllm)"

    def proven(draft: Draft) -> tuple[bool, str]:
        if sleep == 2 and adapter_sync(draft) and not mitigated(draft, "vllm-stale-policy"):
            return False, "ms-swift < 3.12 with --sleep_level 2 re-sends only the adapter after the engine dropped " \
                          "its base weights (PR #7017)"
        return True, "ms-swift syncs the weights before every rollout (rollout_mixin.py _move_model_to_vllm)"

    return (
        fact("rollout_engine", "vllm", "--use_vllm true (rollouts from vLLM)"),
        Field("adapter_rank", ("lora_rank",), rank,
              Default(8, "default (ms-swift swift/arguments/tuner_args.py: lora_rank 8)"), when=lora),
        Field("rollout_sync", default=sync),
        Field("engine_max_lora_rank", ("lora_rank",), rank, Default(8, "default (ms-swift lora_rank 8)"),
              when=lambda d: adapter_sync(d) and mode == "colocate", suffix=" (the engine's max_lora_rank too, "
              "rollout_mixin.py _prepare_vllm)"),
        fact("rollout_colocated", mode == "colocate" and not time_shared, (PLACED if mode == "device" else
             f"--vllm_mode {mode}") + (" with --sleep_level and --offload_model (time-shared)"
                                       if mode == "colocate" and time_shared else "")),
        Field("engine_gpu_memory_utilization", ("vllm_gpu_memory_utilization",), fraction,
              Default(0.9, "default (ms-swift swift/rlhf_trainers/args_mixin.py: vllm_gpu_memory_utilization 0.9)"),
              when=lambda d: mode == "colocate"),
        fact("rollout_logprobs_used", uses_logprobs, "--rollout_importance_sampling_mode / "
             "--log_rollout_offpolicy_metrics" + ("" if uses_logprobs else " not given: the trainer recomputes "
                                                  "every log-prob")),
        fact("rollout_logprobs_processed", uses_logprobs, "ms-swift >= 3.11 asks vLLM >= 0.10.2 for "
             "processed_logprobs (rollout_mixin.py)"),
        Field("rollout_sync_proven", default=proven),
        fact("rollout_verified", False, "ms-swift logs the off-policy metrics but never stops on them"),
    )


# Before --vllm_mode (v3.5.0) the engine sat on --vllm_device, default ['auto']: the last num_infer_workers of the
# visible GPUs, the trainer's own GPU only when a single one is visible (swift/trainers/rlhf_trainer/grpo_trainer.py
# __init__ and swift/llm/argument/rlhf_args.py of v3.3.0); ms-swift's error for a clash asks for fewer processes.
PLACED = "ms-swift < 3.5 puts vLLM on --vllm_device (auto: the last visible GPU, apart from the trainer's; " \
         "grpo_trainer.py)"


def _device_mode(draft: Draft, get, visible: tuple[int | None, str | None]) -> str:
    """colocate or device (its own GPU) for ms-swift < 3.5, from --vllm_device and the visible GPU count."""
    device = get("vllm_device", "auto")
    if str(device) != "auto":
        draft.note(f"--vllm_device {device}: vLLM on the device named (ms-swift < 3.5), read as apart from the "
                   "trainer's")
        return "device"
    count, _ = visible
    if count is None:
        draft.note("--vllm_device auto (ms-swift < 3.5): vLLM takes the last visible GPU, shared with the trainer "
                   "only when one GPU is visible; the visible devices are not in the command, read as several")
        return "device"
    return "colocate" if count == 1 else "device"


def apply(draft: Draft, get, src, on, options: dict, visible: tuple[int | None, str | None] = (None, None)) -> None:
    """The vLLM rollout fields of `swift rlhf --rlhf_type grpo --use_vllm true` (get/src/on: ms_swift's accessors
    over its options; options: name -> (value, source), each value unwrapped; visible: the visible GPU count and
    the variable that set it)."""
    if draft.get("stage") != "grpo" or not on("use_vllm"):
        return
    modern = at_least(draft, "ms-swift", "3.5.0")
    mode = str(get("vllm_mode", "colocate")) if modern else _device_mode(draft, get, visible)
    if get("vllm_mode") is None and modern:
        draft.note("--vllm_mode not given: read as colocate, ms-swift 3.5 - 3.x's default (swift/trainers/"
                   "arguments.py); ms-swift 4 asks for it")
    if mode == "server" and draft.get("adapter") != "full" and on("vllm_enable_lora"):
        draft.maybe("rollout_sync", {"merged": "the `swift rollout` server runs without --vllm_enable_lora",
                                     "adapter": "the `swift rollout` server runs with --vllm_enable_lora"},
                    "server mode syncs an adapter only where the server was started with --vllm_enable_lora")
    apply_table(draft, options, _vllm_table(get, on, mode))
    draft.flag(**VLLM_FLAGS)
    # rollout_mixin.py gathers the parameters in the groups --move_model_batches makes (one group when unset);
    # 3.12.0 - 3.12.5 wrap the whole loop in one gather whatever the flag (fixed in 3.12.6).
    whole = get("move_model_batches") is None or (at_least(draft, "ms-swift", "3.12.0")
                                                  and not at_least(draft, "ms-swift", "3.12.6"))
    if draft.get("engine") == "deepspeed" and draft.get("zero_stage") == 3 and whole and \
            draft.get("rollout_sync") != "adapter":
        whole_model_sync(draft, "ms-swift gathers every parameter in one group before the sync (swift/trainers/"
                         "rlhf_trainer/rollout_mixin.py" + (": --move_model_batches not given)" if get(
                             "move_model_batches") is None else "; 3.12.0 - 3.12.5 whatever --move_model_batches)"))
