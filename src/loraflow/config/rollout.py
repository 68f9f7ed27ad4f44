"""The `rl.rollout` section: what samples an RL stage's rollouts (the trainer's own generate or vLLM servers) and how
a vLLM engine is kept in step with the trainer (plan/rollout.py decides from it; rl/engine_rollout.py runs it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass(kw_only=True)
class RolloutConfig:
    engine: Literal["auto", "hf", "vllm"] = "auto"
    """What samples the rollouts. `hf`: the policy's own generate inside the training process; `vllm`: vLLM servers,
    local (started and stopped by loraflow for the run) or remote (rl.rollout.urls), holding the trainer's policy
    through rl.rollout.sync. `auto` is vllm when rl.rollout.urls names servers, hf otherwise."""

    urls: list[str] = field(default_factory=list)
    """Running `vllm serve --enable-lora --logprobs-mode processed_logprobs` servers (http://HOST:PORT) to sample
    on, requests spread over them; empty: loraflow starts a local one when rl.rollout.engine=vllm."""

    sync: Literal["auto", "adapter", "merged"] = "auto"
    """How the engine gets the policy after an update. `adapter`: only the adapter's tensors are gathered and
    loaded by the engine as a new version; `merged`: the changed weights with the adapter merged in are loaded in
    place. `auto`: adapter where the engine can serve the adapter, merged otherwise."""

    sync_every: int = 1
    """Optimizer steps between syncs: above 1 the engine samples with a policy up to that many updates old, and
    the log-prob check runs only on the rollout right after a sync."""

    engine_memory: float = 0.3
    """The fraction of the GPU's memory a local engine on the trainer's GPU may take (vLLM
    --gpu-memory-utilization, whose own default of 0.9 leaves the trainer nothing); unused on a CPU."""

    max_logprob_diff: float | None = None
    """The largest difference allowed between the engine's and the trainer's log-prob of a sampled token on a
    rollout right after a sync; beyond it the run stops before the update (a stale or wrong policy in the engine).
    None: the precision's own bound (loraflow.rl.engine_rollout.LOGPROB_BOUNDS)."""

    importance: Literal["auto", "off", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"] = "auto"
    """Importance-sampling correction of what remains of the engine/trainer mismatch (the engine samples from
    pi_engine, the update assumes pi_trainer): each sampled token's loss is weighted by w = pi_trainer / pi_engine,
    per token or per sequence (the product over its tokens), truncated at rl.rollout.importance_cap (`*_truncate`)
    or zeroed beyond it (`*_mask`), as TRL's vllm_importance_sampling_mode and verl's rollout correction do.
    `auto`: token_truncate under bf16, where the engine's and trainer's numerics differ measurably; off under fp32,
    where they agree within 4e-5 (a weight within 1 +- 4e-5 changes nothing)."""

    importance_cap: float = 3.0
    """The largest importance weight kept (C in w = min(pi_trainer / pi_engine, C)); TRL's default."""

    def needs(self, generates: bool) -> tuple[str, ...]:
        """Optional packages the rollouts of a stage that samples (`generates`) need: a local vLLM engine is started
        from vllm (here, or its own interpreter: rl/vllm_server.py); remote servers and hf need nothing more."""
        return ("vllm",) if generates and self.engine == "vllm" and not self.urls else ()

    def problems(self) -> list[str]:
        """Settings that cannot work, each naming its key."""
        ro, out = self, []
        if not 0 < ro.engine_memory < 1:
            out.append(f"rl.rollout.engine_memory={ro.engine_memory} must be between 0 and 1 (a fraction of the GPU's "
                       "memory).")
        if ro.sync_every < 1:
            out.append(f"rl.rollout.sync_every={ro.sync_every} must be >= 1.")
        if ro.max_logprob_diff is not None and not ro.max_logprob_diff > 0:
            out.append(f"rl.rollout.max_logprob_diff={ro.max_logprob_diff} must be > 0 (or null for the "
                       "precision's bound).")
        if not ro.importance_cap > 1:
            out.append(f"rl.rollout.importance_cap={ro.importance_cap} must be > 1 (a weight of 1 is no correction).")
        for url in ro.urls:
            if not url.startswith(("http://", "https://")):
                out.append(f"rl.rollout.urls: {url!r} is not an http(s) URL; give http://HOST:PORT of a running "
                           "`vllm serve`.")
        if ro.engine == "hf" and ro.urls:
            out.append("rl.rollout.urls names servers but rl.rollout.engine=hf samples in the trainer; set "
                       "rl.rollout.engine=vllm (or auto) to use them, or drop rl.rollout.urls.")
        return out
