"""The Combination: the normalized description of a training run's features (stage, adapter, checkpointing,
engine, precision, versions) that every rule reads. (It is not the `loraflow.setup` package, which builds models.)

loraflow's own config maps onto it (plan/__init__.py), and so do other frameworks' command lines and configs (the
frontends of `loraflow check`). A rule never looks at a framework's config directly. Every field has a default
that describes what a framework does when nobody asked for anything special; frontends set what they know.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from packaging.version import Version

from loraflow.enginespec import EngineSpec, engine_spec

CheckpointPlacement = Literal["off", "all", "partial"]


@dataclass(frozen=True)
class Combination:
    stage: str = "sft"
    """sft, rm, dpo, grpo or ppo."""
    adapter: Literal["lora", "dora", "full"] = "lora"
    adapter_loaded_frozen: bool = False
    """A saved adapter was loaded for inference (PeftModel.from_pretrained without is_trainable=True) and is then
    trained: none of its weights require grad."""
    precision_against_load: bool = False
    """The trainer asks for the other half precision than the model's weights were loaded in: fp16 mixed precision
    on a model loaded in bfloat16, or bf16 on one loaded in float16."""
    peft_config_on_peft_model: bool = False
    """TRL's trainer is given a model the code already wrapped with PEFT and a peft_config as well."""
    matched_modules: int | None = None
    """Modules the adapter targets matched in this model (None: not known, e.g. the model could not be read)."""
    no_default_targets: bool = False
    """The LoRA config names no target modules, and PEFT's table of default targets (by config.model_type) has no
    entry for this model's type in the release that runs."""
    embeddings_trainable: bool = False
    lm_head_trainable: bool = False
    tied_embeddings: bool = False
    weight_tying_enforced: bool = False
    """PEFT's ensure_weight_tying: trained copies of tied embeddings stay tied on save and reload."""
    checkpointing: CheckpointPlacement = "off"
    checkpoint_every_n: int = 1
    reentrant: bool | None = None
    """torch use_reentrant; None until the plan chooses."""
    checkpoint_impl: Literal["transformers", "torch-wrapper"] = "transformers"
    input_grad_hook: bool = False
    """A forward hook that marks the embedding output as requiring grad."""
    use_cache: bool = True
    packing: bool = False
    precision: Literal["fp32", "fp16-mixed", "bf16-mixed", "bf16", "fp16"] = "fp32"
    """`*-mixed`: trainable weights fp32 under autocast; `bf16`/`fp16`: everything stored in half precision."""
    grad_scaler: bool = True
    """fp16 training scales the loss and unscales gradients with a GradScaler (the HF Trainer, accelerate, DeepSpeed's
    loss scaler, loraflow); Lightning Fabric's `16-true` precision stores everything in fp16 and scales nothing."""
    quantization: Literal["4bit", "8bit"] | None = None
    quant_storage_matches: bool = True
    """bitsandbytes 4-bit storage dtype equals the dtype the other weights are sharded in."""
    quant_cpu_repack: bool = True
    """bitsandbytes (0.50) may repack a 4-bit weight in place for its CPU kernel when the layer runs in eval mode
    without autograd (evaluation, generation), as it does unless told not to."""
    cpu: bool = False
    """The run computes on the CPU (bitsandbytes, SDPA and autocast take CPU-only paths there)."""
    engine: str = "single"
    """A name of the engine table (enginespec.ENGINES); rules read its capabilities (the properties below), not
    its name."""
    zero_stage: int = 0
    offload: bool = False
    """Optimizer state or parameters offloaded to CPU (ZeRO-Offload, FSDP CPUOffload)."""
    world_size: int = 1
    find_unused_parameters: bool = False
    """DDP find_unused_parameters."""
    ddp_static_graph: bool = False
    fsdp_use_orig_params: bool = True
    """FSDP1 use_orig_params (irrelevant to FSDP2, which shards every parameter on its own)."""
    fsdp_frozen_units_separate: bool = False
    """FSDP1 wrap policy puts frozen weights and trainable adapters in separate units."""
    checkpoint_outside_shard: bool = False
    """FSDP2: the checkpoint wrapper encloses the sharded unit (applied after fully_shard) rather than sitting
    inside it, so recompute runs outside FSDP's mixed-precision casts."""
    fsdp2_root_in_policy: bool = False
    """FSDP2: the root module (embeddings, rotary embedding) is sharded under the layers' MixedPrecisionPolicy
    without autocast around it (verl's apply_fsdp2), so a text decoder layer's floating inputs arrive in the
    policy's param_dtype already and the cast at its input changes nothing. False where the root stays in float32
    (loraflow's own FSDP2 engine), where autocast wraps the forward (accelerate with bf16/fp16: the recompute loses
    it, pytorch#148831), or nobody knows."""
    forwards_per_step: int = 1
    """Forward passes through the trained model before one backward (DPO without concatenation: 2)."""
    train_mode_at_backward: bool = True
    """The trained model is in train mode when backward runs (RLHF code often leaves it in eval after generate)."""
    generation: bool = False
    """The stage samples from the trained model with generate() (GRPO, PPO rollouts)."""
    outside_forwards: bool = False
    """The trained model also runs forwards that are no part of a training step and change ZeRO-3's recorded module
    order: generation (an evaluation's exact match, rollouts), reference or value scoring through the trained
    weights (DPO's adapter-disabled or precomputed reference). A loss-only evaluation does not count."""
    evaluates: bool = False
    """The trained model runs eval-mode forwards without autograd besides its steps: an evaluation on a held-out
    set (before training, between steps, after training), loss-only or generating."""
    generation_gather: bool = False
    """Sharded parameters are gathered once per rollout before generate(), rather than at every decoding step."""
    adapter_save_gather: bool = False
    """Saving gathers sharded (ZeRO-3) adapter partitions before writing them."""
    dora_weight_gather: bool = False
    """DoRA's weight-norm computation gathers the sharded base weight first."""
    frozen_modules: bool = False
    """Base weights stay frozen beyond those an adapter wraps: a frozen vision tower or language model in a
    vision-language run (frozen weights count for the ZeRO-3 and FSDP rules even in full fine-tuning)."""
    tower_adapters: bool = False
    """Adapters sit inside a vision (or audio) tower, whose blocks take its patch embeddings rather than the token
    embeddings: a hook on the token embeddings does not reach them."""
    tower_input_hook: bool = False
    """The input-grad hook, where one is added, marks the tower's patch-embedding output too: transformers >= 5
    enable_input_require_grads hooks every sub-model's input embeddings (PR #41993, `_input_embed_layer`); before 5
    only the token embeddings."""
    image_text: bool = False
    """The model is an image-text model (vision encoder + projector + language model)."""
    towers_trainable: bool = False
    """The vision encoder or projector has trainable weights (trained in full, or adapted)."""
    towers_full: bool = False
    """The vision encoder or projector is trained in full (every weight, as PEFT's modules_to_save)."""
    image_cross_attention: bool = False
    """Images reach the language model through cross-attention layers fed a tensor computed outside them (Mllama)."""
    image_every_rank: bool = False
    """Every rank runs the vision encoder on every micro-batch (a blank image where its batch has none), so the
    towers' collectives and gradients are the same on every rank."""
    image_safe_truncation: bool = False
    """Truncation never cuts inside an image's placeholder tokens (a sample it would cut is dropped)."""
    mm_token_types_missing: bool = False
    """Training batches reach the image-text class without the token type ids its processor makes (token_type_ids,
    mm_token_type_ids): text-only data collated by the tokenizer."""
    causal_lm_class: bool = False
    """An image-text model is loaded through AutoModelForCausalLM."""
    targets_all_towers: bool = False
    """Adapter target names are matched against every tower of an image-text model at once (PEFT's own matching)."""
    merge_in_sharded: bool = False
    """Adapter weights are merged into sharded (ZeRO-3-partitioned) base weights without gathering them first: a
    hybrid engine fusing LoRA for generation, merge_and_unload before saving or for inference."""
    sequence_parallel: bool = False
    """The sequence is split across ranks (context parallelism, ring attention, Ulysses)."""
    mixed_param_dtypes: bool = False
    """Trainable adapters are stored in float32 beside a base stored in bf16/fp16 (PEFT's autocast_adapter_dtype
    upcasts adapters of a half-precision base since peft 0.12)."""
    merge_into_quantized: bool = False
    """The adapter is merged into 4-/8-bit base weights (bitsandbytes): PEFT dequantizes, adds the delta and
    quantizes again. merge_and_unload on a quantized model, a merge-then-unmerge sync of a QLoRA policy into an
    inference engine (TRL's use_vllm), a merge command that loads the base quantized."""
    task_head_saved: bool = True
    """A head created for the task (a reward model's score or value head) is trained in full beside the adapters and
    saved with them (PEFT modules_to_save); False where the adapter holds only the LoRA weights and the head stays at
    its random initialization or is left out of the saved adapter."""
    quantized_moved: bool = False
    """A bitsandbytes-quantized model (policy, reference, reward) is moved to another device or cast after loading:
    a DeepSpeed engine's module.to(device), accelerate preparing a model loaded on another rank's device."""
    grad_accum_steps: int = 1
    """Micro-batches per optimizer step on each process (gradient accumulation)."""
    accumulation_loop: Literal["own", "hf-trainer", "accelerate"] = "own"
    """What runs the micro-steps of an accumulation window: the HF Trainer's loop (with accelerate's accumulate or
    no_sync), a custom loop's accelerator.accumulate(model), or a loop of the framework's own that enters neither
    (DeepSpeed's engine counting them, loraflow, OpenRLHF, verl)."""
    moe_skips_experts: bool = False
    """A sparse mixture-of-experts block that calls only the experts its tokens reach (one module per expert): which
    experts run differs between ranks (frontends/moe_blocks.py MOE_SKIPS)."""
    moe_leaf_registered: bool = False
    """The framework registers that block as a ZeRO-3 leaf module (deepspeed.utils.set_z3_leaf_modules), gathered
    whole whatever the routing."""
    zero3_prefetch_bucket: Literal["auto", "fraction"] | None = None
    """ZeRO-3's stage3_prefetch_bucket_size in the DeepSpeed config: "auto" (the loop fills 0.9 x hidden_size**2) or
    a literal number with a fractional part."""
    model_split: bool = False
    """Each process spreads its model over several GPUs (naive model parallelism): from_pretrained with device_map
    'auto', 'balanced' or 'balanced_low_0' where the process sees several GPUs, or a map naming several devices."""
    device_map_load: Literal["device_map", "low_cpu_mem_usage"] | None = None
    """from_pretrained is given a device_map (any value: 'auto', {'': local_rank}, a device), or low_cpu_mem_usage=True
    without one: accelerate's big-model placement, which transformers refuses while ZeRO-3 is configured."""
    unsloth: bool = False
    """The model is loaded and patched by Unsloth (FastLanguageModel / FastVisionModel; LLaMA-Factory use_unsloth,
    ms-swift --tuner_backend unsloth)."""
    ptq_checkpoint: str | None = None
    """The base checkpoint was saved quantized by a post-training method (gptq, awq, aqlm, compressed-tensors), whose
    integer weights load as they are (bitsandbytes quantization is `quantization`, fine-grained FP8 checkpoints
    `fp8_checkpoint`; mxfp4 ones, dequantized where no kernel runs them, are neither)."""
    fp8_checkpoint: bool = False
    """The base checkpoint ships FP8 weights (config.json quantization_config quant_method fp8: DeepSeek-V3/R1,
    Kimi-K2, MiniMax-M2, `-FP8` uploads), which transformers loads into FP8Linear modules whatever torch_dtype asks."""
    fp16_overflows: bool = False
    """The model's activations or gradients exceed float16's range (65504) in training: a family known to overflow
    in float16 (families.FP16_OVERFLOW: T5, Gemma 3/3n/4, gpt-oss, Qwen3.5, Qwen3-MoE, GLM-4 MoE)."""
    adapter_reads_base: Literal["svd", "parameters", "prompt"] | None = None
    """What of the base weights PEFT reads while it creates the adapter, beyond their names: their values for an SVD
    or QR initialization (PiSSA, OLoRA, CorDA, LoftQ: `svd`), the shape of nn.Parameter targets (LoRA on fused MoE
    expert tensors, PEFT target_parameters: `parameters`), the vocabulary embeddings prompt tuning starts from
    (`prompt`). None: only the module names (LoRA's default random initialization)."""
    weights_outside_forward: bool = False
    """Code uses the trained model's weights outside the forward of the module its engine wraps: a submodule called
    directly (an embedding looked up, a vision tower run while the inputs are built), or weights a framework moved to
    the CPU itself and did not bring back before a log-prob, save or sync pass."""
    model_outside_engine: bool = False
    """A second model the run calls (a DPO reference, a distillation teacher, a reward model, a diffusion pipeline's
    frozen text encoder) is built while ZeRO-3's zero.Init is on but never given to deepspeed.initialize (an engine of
    its own, or accelerate's prepare), so no hook ever gathers its partitioned weights."""
    frozen_from_engine_checkpoint: bool = False
    """Frozen weights are restored from the engine's own checkpoint (DeepSpeed save_checkpoint, then load_checkpoint
    to resume or zero_to_fp32 to consolidate) rather than from the pretrained model they were frozen from."""
    head_adapter: bool = False
    """An adapter layer on the output head: lm_head named in the target modules (all-linear leaves it out)."""
    liger_fused_ce: bool = False
    """Liger's fused linear cross entropy computes the training loss from lm_head.weight, without calling lm_head."""
    flash_attention: bool = False
    """The model's attention runs transformers' FlashAttention-2 branch (attn_implementation flash_attention_2)."""
    padded_rows: bool = True
    """A training micro-batch can hold rows padded to a common length (more than one row per micro-batch)."""
    flash_attn_fp32: bool = False
    """FlashAttention asked for (attn_implementation flash_attention_2) with float32 weights and no bf16/fp16 mixed
    precision: transformers finds no half dtype to cast the queries to (frontends/hf_attention.py)."""
    adapter_vocab_differs: bool = False
    """A saved adapter carries embedding and output-head rows for another vocabulary size than the base it is loaded
    onto: tokens added and the embeddings resized before training (saved through modules_to_save or
    save_embedding_layers), the base reloaded at its original size, or PEFT 0.8 - 0.14's AutoPeftModel shrinking a
    padded embedding to the tokenizer's length. No launch shows it (the adapter file does): explain names it from
    load_state_dict's message."""
    adalora_orth_reg: bool = False
    """AdaLoRA with a task type: its orthogonal regularization (orth_reg_weight) multiplies every lora_A and lora_B
    again inside the forward, after the layers that used them (peft AdaLoraModel.forward)."""
    optimizer_holds_frozen: bool = False
    """A script's own DeepSpeed optimizer is built over every parameter, frozen ones included (model.parameters()
    handed to deepspeed.initialize or to the optimizer); the HF Trainer, TRL and the RL frameworks pass only the
    trainable ones."""
    optimizer_8bit: bool = False
    """The optimizer keeps bitsandbytes 8-bit state: per parameter, uint8 codes beside float32 block statistics and a
    quantization map (adamw_bnb_8bit, paged_adamw_8bit, lion_8bit, ...; bnb.optim.AdamW8bit)."""
    saves_optimizer_state: bool = False
    """Checkpoints hold the optimizer's state (the HF Trainer's save_steps checkpoints unless save_only_model,
    accelerate's save_state)."""
    fsdp_state_dict: Literal["full", "sharded"] | None = None
    """The state dict type accelerate's FSDP plugin saves and loads the Trainer's resumable checkpoints with
    (FULL_STATE_DICT or SHARDED_STATE_DICT); None without FSDP, or where no Trainer saves through accelerate."""
    checkpoint_adapter_only: bool = False
    """The run's resumable FSDP checkpoints hold only the adapter: the HF Trainer (and TRL, LLaMA-Factory, axolotl,
    ms-swift on it) passes adapter_only=True to accelerate's save_fsdp_model / load_fsdp_model since transformers
    4.38 (trainer.py _get_fsdp_ckpt_kwargs)."""
    engine_checkpoints: Literal["all", "peft-trainable", "trainable"] | None = None
    """What the run's resumable DeepSpeed engine checkpoints (save_checkpoint) keep: every weight, frozen ones
    included ("all"); only the trainable ones when the model is a PeftModel, the HF Trainer's rule from transformers
    4.37 ("peft-trainable"); only the trainable ones ("trainable", exclude_frozen_parameters); None where the run
    writes none or check cannot see how it saves."""
    resumes: bool = False
    """The run reloads one of its own resumable checkpoints: resume_from_checkpoint, or load_best_model_at_end."""
    state_dict_patched: bool = False
    """The training script replaces the model's state_dict method with PEFT's adapter state dict (alpaca-lora's
    finetune.py and the scripts copied from it), so PEFT's save_pretrained filters an already filtered dict."""
    rollout_engine: Literal["hf", "vllm"] = "hf"
    """What samples an RL stage's rollouts: the trained model's own generate (hf) or a vLLM server (vllm)."""
    rollout_sync: Literal["adapter", "merged", "unmerged"] | None = None
    """How a vLLM engine gets the policy after an update: the adapter's tensors only, loaded by the engine as a
    LoRA adapter; the weights with the adapter merged in, reloaded in place; or `unmerged`, every parameter of the
    adapter-wrapped model under PEFT's own names (`base_model.model.`, `.base_layer`, `lora_A`), which the engine's
    model has no parameter for (None without an engine)."""
    sync_gathers_whole: bool = False
    """Under ZeRO-3 the sync to the rollout engine gathers every weight at once (one GatheredParameters over the
    whole model, to merge the adapter), so each rank holds a full 16-bit copy, and that copy does not fit beside
    what the rank already holds."""
    rollout_sync_renamed: bool = False
    """The weight sync renames transformers' in-memory module names back to the checkpoint layout the engine loads
    (verl >= 0.4.1 convert_weight_keys, EasyR1 _rename_weight_keys)."""
    model_type: str | None = None
    """The trained model's config.model_type where its hub id or path makes it certain (frontends/model_types.py);
    None where the name does not say."""
    vlm_renamed: Literal["qwen2-vl", "vlm"] | None = None
    """An image-text model whose modules transformers 4.52 moved (model.language_model, model.visual): Qwen2-VL and
    Qwen2.5-VL ("qwen2-vl"), LLaVA, Gemma 3, Mllama ("vlm") (frontends/model_types.py VLM_RENAMED)."""
    rollout_sync_proven: bool = False
    """The framework's sync path is known to leave the engine holding the updated policy in this release: the stale
    cases found on that path are fixed or not taken. False where nobody knows: a server loraflow did not start, a
    release with a known stale path."""
    rollout_verified: bool = False
    """The engine's log-probabilities of the sampled tokens are compared with the trainer's after every sync."""
    rollout_logprobs_used: bool = True
    """The trainer uses the engine's log-probabilities (an importance-sampling correction, the engine/trainer check);
    loraflow's own runs always do, other frameworks where a flag asks for it."""
    rollout_logprobs_processed: bool = False
    """The engine returns log-probabilities after temperature scaling (vLLM --logprobs-mode processed_logprobs),
    the distribution the tokens were sampled from, rather than the raw model's."""
    engine_tokenizer_checked: bool | None = None
    """The engine's tokenization is checked against the trainer's before the first rollout (prompts go as the
    trainer's token ids, samples come back as ids); False where nothing checks it; None where unknown (launches
    of other frameworks: not read)."""
    rollout_colocated: bool = False
    """The engine shares the trainer's GPUs while the trainer's weights stay on them: a colocated engine not
    time-shared by sleep and offload on both sides."""
    engine_gpu_memory_utilization: float = 0.9
    """The fraction of each GPU's whole memory the engine claims when it starts (vLLM --gpu-memory-utilization,
    0.9 by default)."""
    adapter_rank: int = 0
    """The LoRA rank (the largest one, where towers have their own)."""
    engine_max_lora_rank: int = 16
    """The largest adapter rank the rollout engine accepts (vLLM --max-lora-rank, 16 by default); vLLM refuses a
    value outside its own list of ranks at start."""
    versions: dict[str, Version | None] = field(default_factory=dict, hash=False, compare=False)
    not_used: tuple[str, ...] = ()
    """Tracked packages the run does not import (LitGPT's own LoRA needs no PEFT): a bug of their releases cannot
    reach it, whatever version is installed."""

    @property
    def frozen_params(self) -> bool:
        """Whether any base weight is frozen (every adapter setup; not full fine-tuning)."""
        return self.adapter != "full" or self.frozen_modules

    @property
    def checkpointed(self) -> bool:
        return self.checkpointing != "off"

    @property
    def embedding_output_requires_grad(self) -> bool:
        return (self.embeddings_trainable or self.input_grad_hook
                or (self.adapter == "full" and not self.frozen_modules))

    @property
    def engine_spec(self) -> EngineSpec:
        return engine_spec(self.engine)

    @property
    def score_head(self) -> bool:
        """The stage trains a scalar score head it creates (a reward model; stagespec's head "score")."""
        from loraflow.stagespec import STAGES

        spec = STAGES.get(self.stage)
        return spec is not None and spec.head == "score"

    @property
    def zero3(self) -> bool:
        return self.engine_spec.zero and self.zero_stage == 3

    @property
    def sharded_params(self) -> bool:
        """Parameters live as shards between uses (ZeRO-3, FSDP)."""
        return self.engine_spec.shards_params(self.zero_stage)

    @property
    def sharded_optimizer(self) -> bool:
        """Optimizer state is partitioned over ranks (ZeRO stage 1 and up, FSDP)."""
        return self.engine_spec.shards_optimizer(self.zero_stage)

    @property
    def flat_params(self) -> bool:
        """Sharded units hold one flat parameter each (FSDP1)."""
        return self.engine_spec.flat_params

    @property
    def dtensor_params(self) -> bool:
        """Every parameter is its own sharded DTensor (FSDP2)."""
        return self.engine_spec.dtensor_params

    @property
    def gradient_reducer(self) -> bool:
        """A reducer all-reduces gradient buckets and expects a gradient of every trainable weight (DDP)."""
        return self.engine_spec.gradient_reducer

    @property
    def half_precision(self) -> bool:
        return self.precision != "fp32"

    def version(self, package: str) -> Version | None:
        return self.versions.get(package)

    def replace(self, **changes) -> "Combination":
        return dataclasses.replace(self, **changes)


COMBINATION_FIELDS = tuple(f.name for f in dataclasses.fields(Combination) if f.name != "versions")
