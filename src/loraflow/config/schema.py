"""The typed configuration of a loraflow run.

Every field carries an attribute docstring: `loraflow config` prints them and docs/configuration.md is generated
from them (a test fails when it is stale). Enumerations are `Literal` types so the loader can reject a typo and
suggest the closest valid value. Cross-field checks live in `Config.problems()` and name the key to change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from loraflow.config.quantization import QuantizationConfig
from loraflow.config.rl import DPOConfig, RLConfig
from loraflow.config.towers import TowersConfig
from loraflow.enginespec import ENGINE_NAMES, ENGINES
from loraflow.stagespec import STAGE_NAMES, STAGES, stage_spec

AdapterMethod = Literal["lora", "dora", "full"]
Precision = Literal["fp32", "bf16-mixed", "bf16"]
Reentrant = Literal["auto", "true", "false"]
DataFormat = Literal["auto", "messages", "sharegpt", "alpaca", "prompt_completion", "text", "preference",
                     "preference_implicit"]
Schedule = Literal["cosine", "linear", "constant"]
Stage = Literal[STAGE_NAMES]
EngineName = Literal[("auto", *ENGINE_NAMES)]
Switch = Literal["auto", "true", "false"]
STAGES_PACKING = tuple(s for s in STAGES.values() if s.packing)
EXPERTS_TARGET = "experts"
"""The adapter.target_modules entry for every fused expert weight block (setup/adapters.py lora_config)."""


@dataclass(kw_only=True)
class ModelConfig:
    path: str = ""
    """Local directory or Hugging Face hub id of a causal LM. `builtin:NAME` names a model shipped inside
    loraflow's package (assets/NAME). Required; only `loraflow train STAGE` with no config and no model.path
    trains the built-in demo (assets/configs/STAGE.yaml)."""

    tokenizer: str | None = None
    """Tokenizer directory or hub id; empty means the model's own."""

    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Storage dtype of the frozen base weights. `auto` follows precision.mode: float32 for fp32, bfloat16 for
    bf16-mixed and bf16 (full fine-tuning under bf16-mixed keeps fp32 master weights)."""

    attn_implementation: Literal["auto", "eager", "sdpa", "flash_attention_2"] = "auto"
    """Attention kernel passed to transformers. `auto` is SDPA where the architecture supports it in the installed
    transformers, else eager (Gemma2, for one, refuses SDPA); the plan says which and why. An explicit choice the
    architecture refuses is an error from `loraflow check`."""

    trust_remote_code: bool = False
    """Allow model code from the hub. Off by default: it runs arbitrary Python."""

    merge_adapters: list[str] = field(default_factory=list)
    """PEFT adapter directories (an earlier stage's RUN_DIR/adapter, or `builtin:NAME`) folded into the base
    weights, in order, before this run's adapter is added. The merged model is where training starts and, for
    dpo, grpo and ppo, the reference policy (so the reference of a DPO run after SFT is the SFT model)."""

    quantization: QuantizationConfig = field(default_factory=QuantizationConfig)
    """QLoRA: the frozen base loaded in 4 or 8 bits (bitsandbytes)."""


@dataclass(kw_only=True)
class AdapterConfig:
    method: AdapterMethod = "lora"
    """`lora`, `dora` (weight-decomposed LoRA), or `full` (full fine-tuning: no adapter, every weight trains)."""

    rank: int = 8
    """LoRA rank r."""

    alpha: float = 16.0
    """LoRA alpha; the adapter output is scaled by alpha / rank."""

    dropout: float = 0.0
    """Dropout on the adapter input."""

    target_modules: list[str] = field(default_factory=lambda: ["all-linear"])
    """Module names (suffixes such as q_proj) that receive adapters, or `all-linear` for every linear layer but the
    output head; add `experts` for a mixture of experts' fused expert weights (transformers 5 stores them as 3-D
    parameters that no module name reaches; peft adapts them through target_parameters, one slice per expert), as
    in [q_proj, v_proj, experts] or [all-linear, experts]."""

    train_modules: list[str] = field(default_factory=list)
    """Modules trained in full beside the adapters: `embeddings`, `lm_head`, `norms`, or module name suffixes.
    Empty means adapters only (DeepSpeed-Chat's only_optimize_lora)."""


@dataclass(kw_only=True)
class CheckpointingConfig:
    enabled: bool = False
    """Recompute layer activations in backward instead of storing them."""

    every_n_layers: int = 1
    """Checkpoint decoder layers 0, n, 2n, ...; 1 checkpoints every layer."""

    reentrant: Reentrant = "auto"
    """`auto` lets the plan choose (non-reentrant); `true`/`false` force torch's use_reentrant. The plan adds
    whatever the forced mode needs to stay correct and says so."""

    layers: int | None = None
    """How many decoder layers to checkpoint, spread evenly (layer floor(i x total / layers) for i < layers);
    empty means every_n_layers decides. Set one of the two: layers=2 of 4 is every_n_layers=2."""

    granularity: Literal["layer", "mlp", "attention"] = "layer"
    """What recomputes in each chosen layer: `layer` (the whole layer), `mlp` (only its MLP sub-block; the
    attention block's saved tensors are kept) or `attention` (only its attention sub-block)."""

    offload_activations: bool = False
    """Move the tensors the forward saves for backward to CPU memory (pinned on CUDA) and back in backward; on a
    CPU-only machine it has no effect. Works with or without checkpointing; with it, what is still saved moves
    (layers and sub-blocks not recomputed; under reentrant checkpointing also the checkpointed inputs, which
    non-reentrant checkpointing holds on the device)."""


@dataclass(kw_only=True)
class PrecisionConfig:
    mode: Precision = "fp32"
    """`fp32`; `bf16-mixed` (bf16 base weights and autocast, fp32 adapters and optimizer); `bf16` (everything
    bf16, adapters included)."""


@dataclass(kw_only=True)
class ParallelConfig:
    engine: EngineName = "auto"
    """`single` (one process), `ddp` (replicated weights), `deepspeed` (ZeRO, stage below) or `fsdp2` (PyTorch
    `fully_shard`). `auto` is `deepspeed` when a DeepSpeed key below is set, else `single` in one process and `ddp`
    under torchrun or the deepspeed launcher. `deepspeed` needs `pip install 'loraflow[deepspeed]'` (the plan
    refuses it otherwise). Several processes: `torchrun --nproc_per_node N -m loraflow train ...`
    (docs/distributed.md)."""

    zero_stage: int | None = None
    """DeepSpeed ZeRO stage (0-3): 1 shards optimizer state, 2 also gradients, 3 also the weights. Empty means
    the stage of parallel.deepspeed_config, or 2 without one."""

    offload_optimizer: Switch = "auto"
    """DeepSpeed: keep optimizer state (and ZeRO's fp32 master weights) in CPU memory. `auto` follows
    parallel.deepspeed_config, or off without one."""

    offload_params: Switch = "auto"
    """DeepSpeed ZeRO-3: keep the weight partitions in CPU memory between uses. `auto` as for offload_optimizer."""

    deepspeed_config: str | None = None
    """A DeepSpeed JSON to start from. Its settings are kept, `auto` values are filled in from this config, and any
    value that contradicts this config (batch size, accumulation, clipping, ZeRO stage, offload, precision) is an
    error naming both keys."""

    find_unused_parameters: Switch = "auto"
    """DDP's find_unused_parameters; `auto` lets the plan choose (off: every trainable weight gets a gradient every
    step, and the search breaks reentrant checkpointing, rule ddp-reentrant-unused)."""

    fsdp_reshard_after_forward: bool = True
    """FSDP2: free each unit's gathered weights after its forward (less memory, one more all-gather in backward)."""

    backend: Literal["auto", "gloo", "nccl"] = "auto"
    """torch.distributed backend; `auto` is nccl on CUDA and gloo on CPU."""


@dataclass(kw_only=True)
class DataConfig:
    train: str | list[str] = ""
    """Training data: a .jsonl, .json or .parquet file, `builtin:PATH` for shipped data, or a hub dataset name.
    Required (the built-in demo's is used only when no config and no model.path are given). A list mixes several
    sources, each with its own format; `PATH*WEIGHT` (a trailing `*` and a number) weights one: above 1 repeats
    its records, below 1 keeps a seeded sample (train.seed), e.g. `[a.jsonl, b.jsonl*0.3, c.jsonl*2]`."""

    eval: str | None = None
    """Held-out data in the same forms; empty for no evaluation."""

    train_split: str = "train"
    """Split to read when `train` is a hub dataset name."""

    eval_split: str = "test"
    """Split to read when `eval` is a hub dataset name; or a fraction in (0, 1), e.g. 0.05: with `eval` empty,
    that share of the training records (at least 1, drawn with train.seed) is held out as the eval set."""

    format: DataFormat = "auto"
    """Record format of every data file; `auto` detects it per file from the first record's keys (and logs it).
    sft: `messages` (chat turns, rendered with the tokenizer's chat template), `sharegpt` (conversations of
    {from, value}), `alpaca` (instruction, optional input, output), `prompt_completion`, `text` (continued
    pretraining: every token learned; eval gives loss only). rm/dpo: `preference` (prompt, chosen, rejected) and
    `preference_implicit` (chosen and rejected whole conversations sharing their leading turns), as in TRL."""

    columns: list[str] = field(default_factory=list)
    """Rename record keys before the format is detected: `SOURCE=TARGET` entries, e.g.
    `[question=prompt, answer=completion]`. A key a record lacks is left alone (mixed files may differ)."""

    max_length: int = 512
    """Samples longer than this many tokens are truncated (and counted)."""

    packing: bool = False
    """Pack several samples per row; position ids restart per sample so samples never attend to each other.
    sft packs the training set; rm and dpo pack each micro-batch's answers (chosen and rejected of a pair stay in
    one forward), with the same losses as unpacked rows and less padding."""


@dataclass(kw_only=True)
class TrainConfig:
    seed: int = 0
    """Seed for initialisation, data order and dropout."""

    micro_batch_size: int = 8
    """Samples (or packed rows) per forward pass."""

    gradient_accumulation_steps: int = 1
    """Micro-batches per optimizer step. The loss is normalised by the tokens of the whole step, so 1 x 4 equals
    4 x 1."""

    max_steps: int = 0
    """Optimizer steps; 0 means derive them from `epochs`. A resumed run changes it only with --extend, which
    rebuilds the learning-rate schedule for the new length (docs/reliability.md)."""

    epochs: float = 1.0
    """Passes over the training data when `max_steps` is 0."""

    learning_rate: float = 2e-4
    """Peak learning rate of AdamW."""

    weight_decay: float = 0.0
    """AdamW weight decay."""

    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas."""

    warmup_steps: int = 0
    """Linear warmup steps before the schedule."""

    schedule: Schedule = "cosine"
    """Learning-rate schedule after warmup."""

    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this value; 0 disables clipping."""

    logits: Literal["auto", "learned", "full"] = "auto"
    """Where the output head runs. `learned`: only at positions whose next token the loss uses (SFT's answers,
    DPO's responses, RL completions), in chunks (logits_chunk_mib), equal to the full computation. `full`: logits
    at every position, as a plain `model(...)` call. `auto` is `learned` unless the model transforms its logits
    after the head (Gemma2's soft-capping, Cohere's or Granite's scale), which needs the full logits."""

    logits_chunk_mib: float = 256.0
    """With learned logits: the largest block of float32 [tokens x vocabulary] logits computed at once, forward
    and backward, in MiB; 0 computes every learned position at once."""
    # 256 MiB is 523 rows at Llama 3's 128,256-token vocabulary. On an H200 the head's forward and backward over 8192
    # positions took 14.5 ms in 512-row chunks against 20.2 ms in 64 MiB (130-row) ones, whose GEMMs are too thin to
    # fill the GPU, for 280 MiB more at peak; full logits took 24.0 ms and 12 GiB (docs/measurements.md, fifth loan).


@dataclass(kw_only=True)
class EvalConfig:
    every_steps: int = 0
    """Evaluate every this many optimizer steps; 0 evaluates only before and after training."""

    generate: bool = True
    """Also measure greedy exact match: generate an answer to each held-out prompt and compare it with the
    reference completion."""

    max_new_tokens: int = 32
    """Generation budget per eval prompt."""

    max_samples: int = 0
    """Evaluate on at most this many held-out samples; 0 means all."""

    batch_size: int = 32
    """Prompts per generation batch and samples per eval-loss batch."""


@dataclass(kw_only=True)
class OutputConfig:
    dir: str = ""
    """Run directory; empty means runs/<stage>-<timestamp>. A directory that already holds a run is never
    overwritten: resume it with --resume."""

    save_every_steps: int = 0
    """Write a resumable checkpoint every this many steps; 0 saves only at the end."""

    keep_checkpoints: int = 2
    """Resumable checkpoints kept on disk (oldest removed first)."""

    log_every_steps: int = 10
    """Write training metrics every this many steps."""

    tensorboard: bool = True
    """Also write metrics for TensorBoard (run_dir/tensorboard)."""

    progress_bar: bool = True
    """Show a progress bar with loss and tokens/s."""

    wandb: str = ""
    """Also log metrics to this Weights & Biases project (a run named after the run directory); empty is off. Needs
    `pip install wandb`: without it the run stops before its first step."""


@dataclass(kw_only=True)
class Config:
    stage: Stage = "sft"
    """Training stage."""

    model: ModelConfig = field(default_factory=ModelConfig)
    adapter: AdapterConfig = field(default_factory=AdapterConfig)
    towers: TowersConfig = field(default_factory=TowersConfig)
    """Vision-language models: what trains in the vision encoder, the projector and the language model."""
    checkpointing: CheckpointingConfig = field(default_factory=CheckpointingConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    dpo: DPOConfig = field(default_factory=DPOConfig)
    """Used by stage dpo."""
    rl: RLConfig = field(default_factory=RLConfig)
    """Used by stages grpo and ppo."""

    def problems(self) -> list[str]:
        """Cross-field and range checks. Each message names the key to change; all are returned at once."""
        out: list[str] = []

        def positive(key: str, value: float, allow_zero: bool = False) -> None:
            if not math.isfinite(value):
                out.append(f"{key}={value} must be a finite number.")
            elif value < 0 or (value == 0 and not allow_zero):
                bound = ">= 0" if allow_zero else "> 0"
                out.append(f"{key}={value} must be {bound}.")

        positive("adapter.rank", self.adapter.rank)
        positive("adapter.alpha", self.adapter.alpha)
        positive("train.epochs", self.train.epochs)
        if not 0 <= self.adapter.dropout < 1:
            out.append(f"adapter.dropout={self.adapter.dropout} must be in [0, 1).")
        if self.adapter.method == "full" and self.adapter.train_modules:
            out.append("adapter.train_modules has no meaning with adapter.method=full (every weight trains); "
                       "remove adapter.train_modules or choose adapter.method=lora.")
        targets = self.adapter.target_modules
        if not targets:
            out.append("adapter.target_modules is empty; name modules such as [q_proj, v_proj] or use all-linear.")
        elif "all-linear" in targets and len(set(targets) - {EXPERTS_TARGET}) > 1:
            out.append("adapter.target_modules mixes all-linear with module names; use one or the other (`experts` "
                       "may join either).")
        positive("checkpointing.every_n_layers", self.checkpointing.every_n_layers)
        c = self.checkpointing
        if c.layers is not None:
            positive("checkpointing.layers", c.layers)
            if c.every_n_layers != 1:
                out.append(f"checkpointing.layers={c.layers} and checkpointing.every_n_layers={c.every_n_layers} "
                           "both choose which layers recompute; set only one of them.")
        changed = [k for k, v in (("layers", c.layers), ("granularity", c.granularity)) if v not in (None, "layer")]
        if changed and not c.enabled:
            out.append(f"checkpointing.{changed[0]} has no effect with checkpointing.enabled=false; set "
                       f"checkpointing.enabled=true, or remove checkpointing.{changed[0]}.")
        positive("data.max_length", self.data.max_length)
        positive("train.micro_batch_size", self.train.micro_batch_size)
        positive("train.gradient_accumulation_steps", self.train.gradient_accumulation_steps)
        positive("train.max_steps", self.train.max_steps, allow_zero=True)
        positive("train.learning_rate", self.train.learning_rate)
        positive("train.weight_decay", self.train.weight_decay, allow_zero=True)
        positive("train.warmup_steps", self.train.warmup_steps, allow_zero=True)
        positive("train.max_grad_norm", self.train.max_grad_norm, allow_zero=True)
        if len(self.train.adam_betas) != 2 or not all(0 <= b < 1 for b in self.train.adam_betas):
            out.append(f"train.adam_betas={self.train.adam_betas} must be two numbers in [0, 1).")
        positive("eval.every_steps", self.eval.every_steps, allow_zero=True)
        positive("eval.max_new_tokens", self.eval.max_new_tokens)
        positive("eval.max_samples", self.eval.max_samples, allow_zero=True)
        positive("eval.batch_size", self.eval.batch_size)
        positive("output.save_every_steps", self.output.save_every_steps, allow_zero=True)
        positive("output.keep_checkpoints", self.output.keep_checkpoints)
        positive("output.log_every_steps", self.output.log_every_steps)
        out += self._stage_problems() + self.towers.problems(self.adapter.method)
        p = self.parallel
        if p.zero_stage is not None and p.zero_stage not in (0, 1, 2, 3):
            out.append(f"parallel.zero_stage={p.zero_stage} must be 0, 1, 2 or 3.")
        default = ParallelConfig()
        for owner in ENGINES.values():
            if p.engine in ("auto", owner.name):
                continue
            for key in owner.keys:  # a value other than the default (or an explicit "false") asks for its engine
                if getattr(p, key) not in (getattr(default, key), "false"):
                    out.append(f"parallel.{key} is a {owner.name} setting, but parallel.engine={p.engine}; set "
                               f"parallel.engine={owner.name} or remove parallel.{key}.")
        return out

    def _stage_problems(self) -> list[str]:
        out: list[str] = []
        d, r = self.dpo, self.rl
        if not d.beta > 0 or not math.isfinite(d.beta):
            out.append(f"dpo.beta={d.beta} must be > 0.")
        if not 0 <= d.label_smoothing < 0.5:
            out.append(f"dpo.label_smoothing={d.label_smoothing} must be in [0, 0.5).")
        if d.loss == "ipo" and d.label_smoothing:
            out.append("dpo.label_smoothing applies to dpo.loss=sigmoid only; set it to 0 for ipo.")
        if d.reference == "adapters-disabled" and self.adapter.method == "full":
            out.append("dpo.reference=adapters-disabled needs adapters, but adapter.method=full; use "
                       "dpo.reference=copy or precomputed.")
        spec = stage_spec(self.stage)
        if r.group_size < max(1, spec.min_group_size):
            out.append(f"rl.group_size={r.group_size} must be >= {max(1, spec.min_group_size)} for stage "
                       f"{self.stage}" + (" (advantages are relative to the group)." if spec.min_group_size > 1
                                          else "."))
        if r.max_new_tokens < 1:
            out.append(f"rl.max_new_tokens={r.max_new_tokens} must be >= 1.")
        if not r.temperature > 0:
            out.append(f"rl.temperature={r.temperature} must be > 0 (rollouts sample).")
        for key in ("clip_eps", "kl_coef", "value_coef", "value_clip"):
            if getattr(r, key) < 0:
                out.append(f"rl.{key}={getattr(r, key)} must be >= 0.")
        if r.updates_per_rollout < 1:
            out.append(f"rl.updates_per_rollout={r.updates_per_rollout} must be >= 1.")
        elif r.updates_per_rollout > 1 and spec.generates:
            # A checkpoint must fall between rollouts: resuming cannot recreate a rollout half consumed.
            for key, steps in (("train.max_steps", self.train.max_steps),
                               ("output.save_every_steps", self.output.save_every_steps)):
                if steps % r.updates_per_rollout:
                    out.append(f"{key}={steps} must be a multiple of rl.updates_per_rollout="
                               f"{r.updates_per_rollout}, so that checkpoints fall between rollouts.")
        out += r.rollout.problems()
        for key in ("gamma", "lam"):
            if not 0 <= getattr(r, key) <= 1:
                out.append(f"rl.{key}={getattr(r, key)} must be in [0, 1].")
        if spec.generates and not r.rewards and not r.reward_model:
            out.append(f"stage {self.stage} needs a reward: set rl.rewards (e.g. [builtin:reverse_partial]) or "
                       "rl.reward_model (the adapter directory of a `loraflow train rm` run).")
        if self.data.packing and not spec.packing:
            packs = ", ".join(s.name for s in STAGES_PACKING)
            out.append(f"data.packing is for {packs} only (stage {self.stage} scores whole pairs or generated "
                       "completions); remove it.")
        return out
