"""The human side of the plan: one Decision (value + reason, + rule id when a rule set it) per choice.

Kept apart from the decision logic (plan/__init__.py) so it stays short; nothing here changes a choice, it only
explains it.
"""

from __future__ import annotations

from loraflow.config.schema import EXPERTS_TARGET
from loraflow.enginespec import engine_spec
from loraflow.plan.types import Decision, Plan
from loraflow.rules import Combination
from loraflow.stagespec import stage_spec


def _adapter(plan: Plan) -> Decision:
    a = plan.config.adapter
    if a.method == "full":
        return Decision("adapter", "none (full fine-tuning)", "adapter.method=full: every weight trains")
    targets = ",".join(a.target_modules)
    n = len(plan.model.adapter_modules)
    if not plan.model.inspected:
        return Decision("adapter", f"{a.method} r={a.rank} alpha={a.alpha:g} on {targets}",
                        "model.path could not be inspected here, so the matched modules are unknown")
    if n == 0:
        return Decision("adapter", f"{a.method} on no module: adapter.target_modules={targets} matches nothing",
                        f"this {plan.model.model_type} model's linear modules are "
                        f"{', '.join(plan.model.linear_names) or 'none'}; set adapter.target_modules to some of "
                        "them, or to all-linear")
    kinds = sorted({m.rsplit(".", 1)[-1] for m in plan.model.adapter_modules})
    value = f"{a.method} r={a.rank} alpha={a.alpha:g} dropout={a.dropout:g} on {n} modules ({', '.join(kinds)})"
    return Decision("adapter", value, f"adapter.target_modules={targets} matched {n} modules (PEFT's matching)")


def _fused_weights(plan: Plan) -> list[Decision]:
    """A mixture of experts says what happens to its fused expert weights: adapted where PEFT's matching wrapped
    them (`experts` in adapter.target_modules, or peft 0.21's all-linear on Mixtral, which maps its former expert
    Linears to parameters), frozen where it did not (it trained nothing there, silently, before)."""
    fused = plan.model.fused_weights
    if not fused or plan.config.adapter.method == "full":
        return []
    adapted = {m for m in plan.model.adapter_modules}
    reached = {n: size for n, size in fused.items() if n in adapted}
    frozen = {n: size for n, size in fused.items() if n not in adapted}

    def blocks(which: dict[str, int]) -> str:
        size = sum(which.values())
        kinds = sorted({n.rsplit(".", 1)[-1] for n in which})
        share = f", {100 * size / plan.model.parameters:.0f}% of the model" if plan.model.parameters else ""
        return f"{len(which)} fused blocks ({', '.join(kinds)}; {size:,} weights{share})"

    if not frozen:
        asked = EXPERTS_TARGET in plan.config.adapter.target_modules
        return [Decision("experts", f"adapted: {blocks(reached)}",
                         (f"adapter.target_modules names `{EXPERTS_TARGET}`, which stands for every fused expert "
                          "block" if asked else "adapter.target_modules reached these blocks (peft's all-linear maps "
                          "this family's former expert Linears to parameters)") +
                         ": peft's target_parameters wraps each fused parameter (one adapter slice per expert)")]
    return [Decision("experts", f"frozen: {blocks(frozen)}" + (f"; adapted: {blocks(reached)}" if reached else ""),
                     "these weights are parameters of three dimensions (one slice per expert), not Linear modules, "
                     "so module names in adapter.target_modules do not reach them; the Linear layers "
                     f"(attention, a shared expert) are adapted where targeted. Add `{EXPERTS_TARGET}` to "
                     "adapter.target_modules to adapt them (peft's target_parameters); adapter.method=full trains "
                     "them in full.")]


def _towers(plan: Plan, changed_by: dict[str, str]) -> list[Decision]:
    """An image-text model's towers: what trains in each and where it recomputes (plan/towers.py)."""
    out = []
    for t in plan.towers:
        asked = getattr(plan.config.towers, t.name)
        why = (f"towers.{t.name}.train={asked.train}" if asked.train != "auto" else
               f"towers.{t.name}.train=auto: " + ("the language model follows adapter.method" if t.name == "language"
                                                  else "under adapters, the vision side stays frozen unless asked"
                                                  if plan.config.adapter.method != "full" else
                                                  "adapter.method=full trains every tower"))
        if t.train == "full" and plan.config.adapter.method != "full":
            copies = [m for m in plan.modules_to_save if any(m == r or m.startswith(r + ".") for r in t.roots)]
            why += f"; trained as PEFT modules_to_save ({', '.join(copies)}), copies saved in the adapter"
        if t.name == "vision" and t.layers:
            c = asked.checkpointing
            why += (f"; its layers recompute: towers.vision.checkpointing={c}" + (
                f" follows checkpointing.enabled={str(plan.config.checkpointing.enabled).lower()}" if c == "auto"
                else ""))
        if t.name == "vision" and plan.model.unreached and t.train != "frozen":
            why += (f"; {', '.join(plan.model.unreached)} are never read by the image-text forward (the features "
                    "are taken before them), so they get no gradient and stay frozen (in the tower's dtype)")
        out.append(Decision(f"tower {t.name}", t.describe().split(": ", 1)[1], why))
    if plan.towers:
        out.append(Decision("image truncation", "a sample whose image tokens data.max_length would cut is dropped",
                            "the model needs one placeholder per image feature", changed_by.get("image_safe_truncation")))
    if plan.blank_images:
        out.append(Decision("blank images", "a micro-batch without an image gets one blank image, masked out of "
                            "attention and loss", "every rank must run the vision encoder each step: sharded towers "
                            "gather by collectives and DDP waits for every trainable weight's gradient",
                            changed_by.get("image_every_rank")))
    return out


def _model_setup(plan: Plan) -> list[Decision]:
    """How the model is built: the attention kernel (setup/preflight.py chose one the architecture supports) and
    the adapters merged into the base first."""
    if not plan.model.inspected:
        return []
    out = [Decision("attention", plan.attn_implementation, plan.model.attn_reason)]
    merged = plan.config.model.merge_adapters
    if merged:
        notes = "; ".join(plan.model.merge_notes)
        out.append(Decision("merge_adapters", merged, "their tensor shapes (safetensors headers) fit model.path"
                            + (f"; but {notes}" if notes else "")))
    return out


def _quantization(plan: Plan, changed_by: dict[str, str]) -> list[Decision]:
    """QLoRA: what bitsandbytes quantizes and how, and the k-bit preparation (what peft's
    prepare_model_for_kbit_training does, each part decided here)."""
    q = plan.quantization
    if q is None:
        return []
    asked = plan.config.model.quantization
    kind = "int8 (LLM.int8)" if q.bits == 8 else f"{q.method} 4-bit" + (", double quantization" if
                                                                         q.double_quant else "")
    out = [Decision("quantization", f"{kind}; unquantized: {', '.join(q.skip_modules) or 'none'}",
                    f"model.quantization.method={q.method}: the frozen linear layers load quantized by bitsandbytes "
                    f"({q.formula()}); the head, modules trained in full"
                    f"{' and the vision encoder and projector' if plan.towers else ''} stay in "
                    f"{_dt(plan.load_dtype)}")]
    if q.bits == 4:
        out.append(Decision("quantization.compute_dtype", q.compute_dtype,
                            f"model.quantization.compute_dtype={asked.compute_dtype}" + (
                                f": precision.mode={plan.config.precision.mode} computes in {_dt(q.compute_dtype)}"
                                if asked.compute_dtype == "auto" else "")))
        rule = changed_by.get("quant_storage_matches")
        if plan.setup.sharded_params:
            why = (f"model.quantization.storage_dtype={asked.storage_dtype} would not shard beside the "
                   f"{_dt(plan.load_dtype)} weights" if rule else
                   "parameters are sharded, and sharding needs the packed weights in the dtype of the others")
        else:
            why = (f"model.quantization.storage_dtype={asked.storage_dtype}" + (": parameters are not sharded, so "
                   "the packed weights keep bitsandbytes' byte storage" if asked.storage_dtype == "auto" else ""))
        out.append(Decision("quantization.storage_dtype", q.storage_dtype, why, rule))
        if plan.setup.cpu:
            out.append(Decision("quantization.cpu_repack", q.cpu_repack, "bitsandbytes would rewrite the frozen "
                                "4-bit weights for its CPU kernel at the first evaluation", changed_by.get(
                                    "quant_cpu_repack")))
    hook = "an input-grad hook (reentrant checkpointing)" if plan.input_grad_hook else "no input-grad hook (below)"
    out.append(Decision("kbit preparation", f"base frozen; unquantized weights in {_dt(plan.load_dtype)}; {hook}",
                        "what peft's prepare_model_for_kbit_training does, decided by the plan: it freezes the base "
                        "(the adapters train), adds the hook only for reentrant checkpointing, and upcasts fp16/bf16 "
                        "norms to float32 for fp16 training, which loraflow does not run (bf16-mixed computes norms "
                        "in float32 under autocast)"))
    return out


def _freezing(plan: Plan) -> Decision:
    frozen = [r for t in plan.towers if t.train == "frozen" and t.name != "language" for r in t.roots]
    if plan.config.adapter.method == "full":
        if frozen:
            return Decision("freezing", f"{', '.join(frozen)} frozen; every other weight trains",
                            "full fine-tuning, with the frozen towers of the towers section")
        return Decision("freezing", "nothing frozen", "full fine-tuning")
    if plan.modules_to_save:
        shown = plan.modules_to_save if len(plan.modules_to_save) <= 4 else \
            plan.modules_to_save[:3] + [f"... {len(plan.modules_to_save)} modules"]
        why = ("adapter.train_modules and the towers trained in full name modules trained in full" if plan.towers
               else "adapter.train_modules names modules trained in full")
        return Decision("freezing", f"adapters + {', '.join(shown)} trainable; the rest frozen",
                        f"{why} (saved with the adapter)")
    return Decision("freezing", "adapters only; base weights frozen",
                    "adapter.train_modules is empty (DeepSpeed-Chat's only_optimize_lora)")


def _checkpointing(plan: Plan, changed_by: dict[str, str]) -> list[Decision]:
    c = plan.config.checkpointing
    if not plan.checkpoint_layers:
        return [Decision("checkpointing", "off", "checkpointing.enabled=false: activations are kept for backward"),
                *_offload(plan)]
    n, total = len(plan.checkpoint_layers), plan.model.num_layers
    chosen = f"checkpointing.layers={c.layers}, spread evenly" if c.layers is not None else \
        f"every {c.every_n_layers}"
    where = "every layer" if n == total else \
        f"layers {', '.join(map(str, plan.checkpoint_layers))} of {total} ({chosen})"
    how = "torch's checkpoint around each layer's forward, inside its FSDP2 unit" if plan.checkpoint_in_engine else \
        "transformers' own layer checkpointing"
    asked = f"checkpointing.layers={c.layers}" if c.layers is not None else \
        f"checkpointing.every_n_layers={c.every_n_layers}"
    if plan.checkpoint_block:
        kept = "MLP" if c.granularity == "attention" else "attention"
        what = f"the `{plan.checkpoint_block}` sub-block of {where}"
        why = (f"checkpointing.granularity={c.granularity} with {asked}: torch's checkpoint around each chosen "
               f"layer's {c.granularity} sub-block; the {kept} sub-block keeps its saved tensors, so only the "
               f"{c.granularity} part recomputes in backward")
    else:
        what, why = where, f"checkpointing.enabled=true with {asked}, through {how}"
    out = [Decision("checkpointing", what, why)]
    rule = changed_by.get("reentrant")
    if rule:
        out.append(Decision("checkpointing.reentrant", plan.reentrant, f"checkpointing.reentrant={c.reentrant} "
                            "would fail on the installed versions with this engine", rule))
    elif c.reentrant == "auto":
        out.append(Decision("checkpointing.reentrant", False,
                            "chosen: non-reentrant records gradients for weights that are not layer inputs "
                            "(the adapters), so it needs no input-grad hook and is exact with partial "
                            "checkpointing; it is torch's recommended mode"))
    else:
        out.append(Decision("checkpointing.reentrant", plan.reentrant,
                            f"requested (checkpointing.reentrant={c.reentrant})"))
    return out + _offload(plan)


def _offload(plan: Plan) -> list[Decision]:
    """Printed only when asked for (checkpointing.offload_activations=true)."""
    if not plan.config.checkpointing.offload_activations:
        return []
    if not plan.offload_activations:
        return [Decision("activation offload", "no effect on cpu", "checkpointing.offload_activations=true, but "
                         "the device is the CPU, where saved tensors already live")]
    return [Decision("activation offload", "tensors saved for backward to pinned CPU memory during the forward",
                     "checkpointing.offload_activations=true; weights (and views of them) stay on the device, as "
                     "they are kept there anyway")]


def _input_grad_hook(plan: Plan, naive: Combination, changed_by: dict[str, str]) -> Decision:
    if plan.input_grad_hook:
        return Decision("input_grad_hook", True, "reentrant checkpointing only records a graph when a layer "
                        "input requires grad and the embeddings are frozen", changed_by.get("input_grad_hook"))
    if not plan.checkpoint_layers:
        why = "no checkpointing, so autograd records every layer"
    elif naive.embedding_output_requires_grad:
        why = "the embedding output already requires grad (embeddings train)"
    else:
        why = "non-reentrant checkpointing tracks the adapter weights directly"
    return Decision("input_grad_hook", False, why)


def _use_cache(plan: Plan, naive: Combination, changed_by: dict[str, str]) -> Decision:
    rule = changed_by.get("use_cache")
    if rule:
        return Decision("use_cache", False, f"the model's default is {naive.use_cache}; training must not write a "
                        "KV cache here", rule)
    return Decision("use_cache", False, f"the model's default is {naive.use_cache}, but training never reads the "
                    "KV cache; turning it off saves its memory and keeps the forward free of cache state")


def _engine(plan: Plan, naive: Combination, changed_by: dict[str, str]) -> list[Decision]:
    s, cfg = plan.setup, plan.config
    t, n = cfg.train, s.world_size
    asked = f"parallel.engine={cfg.parallel.engine}" + (f" with {n} processes" if n > 1 else "")
    if plan.deepspeed is not None:
        offload = [k for k in ("offload_optimizer", "offload_params") if getattr(plan.deepspeed, k)]
        value = f"DeepSpeed ZeRO-{s.zero_stage}" + (f", {' + '.join(offload)} to cpu" if offload else "")
        why = f"{asked}; stage and offload from {plan.deepspeed.source}"
    else:
        value = engine_spec(s.engine).description
        why = asked if s.engine != "single" or cfg.parallel.engine != "auto" else "one process was launched"
    out = [Decision("engine", value, why)]
    if n > 1 or s.engine != "single":
        out.append(Decision("global batch", f"{t.micro_batch_size} x {t.gradient_accumulation_steps} x {n} = "
                            f"{t.micro_batch_size * t.gradient_accumulation_steps * n} samples per optimizer step",
                            "train.micro_batch_size per process x train.gradient_accumulation_steps x processes; "
                            "the loss is normalised by the learned tokens of all processes, so the averaged "
                            "gradient equals one process's on the same global batch"))
    if s.engine == "ddp":
        rule = changed_by.get("find_unused_parameters")
        out.append(Decision("find_unused_parameters", s.find_unused_parameters,
                            "every trainable weight gets a gradient every step, so the search only costs time"
                            if not rule else "the search marks parameters ready twice under reentrant recompute",
                            rule))
    if s.engine == "fsdp2":
        out += _fsdp2(plan, changed_by)
    if s.zero3:
        out.append(Decision("adapter save", "gathers the trainable partitions only", "under ZeRO-3 the module holds "
                            "empty placeholders between uses", changed_by.get("adapter_save_gather")))
        if s.generation:
            out.append(Decision("generation", "weights gathered once per rollout", "generate() would all-gather "
                                "every weight at every token", changed_by.get("generation_gather")))
    if s.dora_weight_gather:
        out.append(Decision("dora weight norm", "reads the gathered base weight", "DoRA reads the base weight after "
                            "ZeRO-3 released it", changed_by.get("dora_weight_gather")))
    return out


def _fsdp2(plan: Plan, changed_by: dict[str, str]) -> list[Decision]:
    s = plan.setup
    out = [Decision("fsdp units", "each decoder layer, then the root" + (
        "; the frozen base Linear of every LoRA module in a unit of its own" if s.fsdp_frozen_units_separate else ""),
        "frozen weights never share a gather or gradient buffer with the adapters, so gradient memory is the "
        "adapters' (fsdp-frozen-grad-memory)" if s.fsdp_frozen_units_separate else
        "full fine-tuning trains every weight" if s.adapter == "full" else
        "DoRA reads its base weight after the base forward, so the base stays gathered with its layer")]
    if plan.checkpoint_block:
        out.append(Decision("checkpoint placement", f"inside each layer's sharded unit (torch checkpoint around its "
                            f"`{plan.checkpoint_block}` sub-block)", "a sub-block is inside its layer, so FSDP2's "
                            "gather and casts in the layer's unit stay outside the recompute",
                            changed_by.get("checkpoint_outside_shard")))
    elif plan.checkpoint_layers:
        rule = changed_by.get("checkpoint_outside_shard")
        where = "outside each sharded unit (transformers' layer checkpointing)" if s.checkpoint_outside_shard \
            else "inside each sharded unit (torch checkpoint around the layer's forward, under FSDP2's hooks)"
        out.append(Decision("checkpoint placement", where, "recompute outside the unit skips FSDP2's mixed-precision "
                            "cast on this torch" if rule else "this torch recomputes correctly either way; "
                            "transformers' own mechanism is the default", rule))
    if plan.autocast_dtype is not None:
        out.append(Decision("fsdp mixed precision", "param_dtype bfloat16, reduce_dtype float32",
                            "precision.mode=bf16-mixed: bf16 compute, fp32 gradient reduction and sharded fp32 "
                            "trainable weights"))
    return out


def explain_choices(plan: Plan, naive: Combination, changed_by: dict[str, str],
                    precision_reason: str) -> list[Decision]:
    n = plan.setup.world_size
    out = [
        Decision("device", plan.device if n == 1 else f"{plan.device}, {n} processes",
                 "the only device available" if plan.device == "cpu" else "one accelerator per process"),
        *_engine(plan, naive, changed_by),
        Decision("precision", f"load {_dt(plan.load_dtype)}, trainable {_dt(plan.trainable_dtype)}, autocast "
                 f"{_dt(plan.autocast_dtype) if plan.autocast_dtype else 'off'}", precision_reason),
        *_model_setup(plan),
        *_quantization(plan, changed_by),
        _adapter(plan),
        *_fused_weights(plan),
        *_towers(plan, changed_by),
        _freezing(plan),
        Decision("saves", "every weight (the model)" if plan.saves == "model" else "the trainable weights (a PEFT "
                 "adapter)", "full fine-tuning changes every weight" if plan.saves == "model" else "only the "
                 "adapters and adapter.train_modules train; the base weights are model.path's"),
    ]
    if plan.ensure_weight_tying:
        out.append(Decision("ensure_weight_tying", True, "tied embeddings are trained",
                            changed_by.get("weight_tying_enforced")))
    out += _checkpointing(plan, changed_by)
    out.append(_logits(plan))
    out.append(_input_grad_hook(plan, naive, changed_by))
    out.append(_use_cache(plan, naive, changed_by))
    out += _stage(plan, changed_by)
    return out


def _logits(plan: Plan) -> Decision:
    t, mode = plan.config.train, plan.logits
    if plan.head == "score":
        return Decision("logits", "none (a score head)", "the reward model's head gives one score per row; the "
                        "vocabulary head is not used")
    if not mode.selected:
        why = (f"this model applies {plan.model.logit_transform} after its head" if t.logits == "auto"
               else "train.logits=full")
        return Decision("logits", "every position (full [tokens x vocabulary] logits)", why)
    if mode.chunk_tokens:
        chunks = (f"in chunks of {mode.chunk_tokens} positions ({t.logits_chunk_mib:g} MiB of float32 logits, "
                  "train.logits_chunk_mib)")
    elif t.logits_chunk_mib:
        chunks = ("all at once: the head trains under ZeRO-3, which gathers its sub-modules at every call, and "
                  "each rank's chunks follow its own tokens, so chunked calls would unbalance the collectives")
    else:
        chunks = "all at once (train.logits_chunk_mib=0)"
    return Decision("logits", f"learned positions only, {chunks}",
                    "only positions whose next token is learned carry loss: the head skips the others, and "
                    "[tokens x vocabulary] logits are never held whole")


def _stage(plan: Plan, changed_by: dict[str, str]) -> list[Decision]:
    cfg = plan.config
    spec, r = stage_spec(cfg.stage), cfg.rl
    # The loss and why its normalisation keeps gradient accumulation exact, from the stage's declaration.
    value, why = spec.loss
    values = {**vars(cfg.dpo), **vars(r)}
    out = [Decision("loss", value.format(**values), why.format(**values))]
    if spec.packing:
        out.append(Decision("packing", cfg.data.packing, "data.packing; position ids restart per sample so packed "
                            "samples never attend to each other" if cfg.data.packing else "data.packing=false: one "
                            "sample per row, right-padded"))
        return out
    if spec.head == "score":
        out.append(Decision("head", "scalar score head (trained in full, saved with the adapter)",
                            "a reward model scores a whole answer; the body carries the adapters"))
    if spec.data == "pairs":
        out.append(Decision("pairs", "chosen and rejected concatenated into one forward",
                            "one forward per micro-batch: under FSDP2 with checkpointing, two forwards before one "
                            "backward fail", "fsdp2-multi-forward-dtensor" if plan.setup.engine == "fsdp2" else None))
    if plan.reference:
        reasons = {
            "adapters-disabled": "the base with the adapters switched off is the starting policy: no second copy "
                                 "of the weights",
            "copy": "full fine-tuning changes every weight, so the reference is a separately loaded frozen copy",
            "precomputed": "reference log-probs of every pair are computed once before training; no reference "
                           "model runs during it"}
        key = spec.reference_key or "the adapter method"
        out.append(Decision("reference", plan.reference, f"{reasons[plan.reference]} ({key})"))
    if spec.generates:
        k = r.updates_per_rollout
        out.append(Decision("updates", f"{k} optimizer step{'s' if k > 1 else ''} per rollout",
                            "rl.updates_per_rollout: later updates take the ratio to the rollout's policy and are "
                            "clipped" if k > 1 else "rl.updates_per_rollout=1: the ratio is 1 at the update, so the "
                            "clip never acts (TRL's num_iterations=1)"))
        gather = plan.setup.generation_gather or not plan.setup.sharded_params
        out.append(Decision("rollout", f"{r.group_size} completions per prompt, up to {r.max_new_tokens} tokens at "
                            f"temperature {r.temperature:g}; " + ("weights gathered once per rollout" if
                                                                 plan.setup.sharded_params else "local weights"),
                            "sampling noise is keyed by (seed, step, prompt, completion, position), so the tokens "
                            "do not depend on how prompts are split over processes"
                            + ("" if gather else "; weights gathered at every token"),
                            changed_by.get("generation_gather")))
    out.append(Decision("phases", "; ".join(p.describe() for p in plan.phases),
                        "the policy is in train mode before every backward (asserted), and reference, reward and "
                        "rollout forwards run without autograd", changed_by.get("train_mode_at_backward")))
    return out


def _dt(dtype) -> str:
    return str(dtype).replace("torch.", "")
