"""resolve(config, environment) -> Plan: every concrete choice of a run, each with its reason.

This is the one decision function. It maps the config onto the normalized Combination, lets the rule registry
apply its fixes and report its errors and warnings, and turns the result into typed choices (types.py) that `train`
executes and `check` prints, each worded by reasons.py. Nothing downstream re-decides: setup code and the engines
read `plan.<choice>` (the engine's settings included) and never the raw config for anything the plan covers.
"""

from __future__ import annotations

from typing import Any

import torch

from loraflow.config.schema import Config
from loraflow.data.sources import has_eval_set
from loraflow.engines.deepspeed_config import DeepSpeedSettings, deepspeed_settings
from loraflow.enginespec import ENGINES, engine_spec
from loraflow.environment import Environment
from loraflow.errors import ConfigError
from loraflow.families import SUB_BLOCKS, family
from loraflow.logprobs import FULL, HeadMode, chunk_tokens
from loraflow.phases import stage_phases
from loraflow.plan.reasons import explain_choices
from loraflow.plan.towers import full_tower_roots, resolve_towers
from loraflow.plan.types import Decision, Plan
from loraflow.rules import Combination, evaluate
from loraflow.setup.model import ModelInfo
from loraflow.setup.quantize import Quantization
from loraflow.stagespec import reference_kind, stage_spec

__all__ = ["Decision", "Plan", "resolve"]

TRAIN_MODULE_GROUPS = ("embeddings", "lm_head", "norms")


def resolve_train_modules(config: Config, info: ModelInfo) -> list[str]:
    """adapter.train_modules -> full module names (PEFT modules_to_save), or a ConfigError naming the bad entry."""
    names: list[str] = []
    problems: list[str] = []
    from loraflow.setup.adapters import module_names_matching

    if not info.inspected:
        return []  # `check` without the model: nothing to match against

    for entry in config.adapter.train_modules:
        if entry == "embeddings":
            names.append(info.embedding_name)
        elif entry == "lm_head":
            if info.lm_head_name is None:
                problems.append(f"adapter.train_modules: this {info.model_type} model has no output head to train.")
            else:
                names.append(info.lm_head_name)
        elif entry == "norms":
            names += info.norm_names
        else:
            found = module_names_matching(info, entry)
            if not found:
                kinds = sorted({n.rsplit(".", 1)[-1] for n in info.module_names if not n.rsplit(".", 1)[-1].isdigit()})
                problems.append(f"adapter.train_modules: `{entry}` matches no module of this model. Use one of "
                                f"{', '.join(TRAIN_MODULE_GROUPS)} or a module name suffix; this {info.model_type} "
                                f"model's module names are: {', '.join(kinds)} (linear: "
                                f"{', '.join(info.linear_names) or 'none'}).")
            names += found
    if problems:
        raise ConfigError(problems)
    return list(dict.fromkeys(names))


def _checkpoint_layers(config: Config, num_layers: int) -> list[int]:
    c = config.checkpointing
    if not c.enabled:
        return []
    if c.layers is not None:  # spread evenly: layers=2 of 4 is 0, 2 (= every_n_layers=2)
        if c.layers > num_layers:
            raise ConfigError([f"checkpointing.layers={c.layers}, but the model has {num_layers} decoder layers; "
                               f"set checkpointing.layers to at most {num_layers}."])
        return sorted({i * num_layers // c.layers for i in range(c.layers)})
    n = c.every_n_layers
    return [i for i in range(num_layers) if i % n == 0]  # transformers' every_n_layers semantics


def _checkpoint_block(config: Config, info: ModelInfo) -> str | None:
    """The decoder-layer child checkpointing.granularity recomputes (None: the whole layer), found by name in the
    inspected model's module names; a ConfigError naming the key when the architecture has none."""
    from loraflow.setup.checkpointing import sub_block_name

    granularity = config.checkpointing.granularity
    if granularity == "layer" or not config.checkpointing.enabled:
        return None
    # Children of the first decoder layer: `<...>.0.<child>` (layers are the only numbered list with them all); an
    # image-text model's vision layers are numbered too, and granularity is the language model's.
    from loraflow.setup.towers import tower_of

    children = {n.rsplit(".", 1)[1] for n in info.module_names if n.count(".") and n.rsplit(".", 2)[-2] == "0"
                and (info.towers is None or tower_of(n, info.towers) == "language")}
    found = sub_block_name(children, granularity)
    if found is None and info.inspected:
        raise ConfigError([f"checkpointing.granularity={granularity}: this {info.model_type} model's decoder layers "
                           f"have no {granularity} child (looked for {', '.join(SUB_BLOCKS[granularity])}; its "
                           f"layers hold {', '.join(sorted(children)) or 'nothing named'}). Set "
                           "checkpointing.granularity=layer."])
    return found or SUB_BLOCKS[granularity][0]


def _logits(config: Config, info: ModelInfo, head: str, setup: Combination) -> HeadMode:
    """Head at learned positions only (logprobs.py) unless asked otherwise or the model needs its full logits.
    One block instead of chunks for a trainable head under ZeRO-3 (`head_chunks_gather`)."""
    asked = config.train.logits
    if asked == "learned" and info.logit_transform:
        raise ConfigError([f"train.logits=learned: this {info.model_type} model applies {info.logit_transform} to "
                           "its logits after the head, which log-probs taken inside the head would skip; set "
                           "train.logits=auto (or full)."])
    if head == "score" or asked == "full" or (asked == "auto" and info.logit_transform):
        return FULL
    if head_chunks_gather(setup):
        return HeadMode(selected=True, chunk_tokens=0)
    return HeadMode(selected=True, chunk_tokens=chunk_tokens(info.vocab_size, config.train.logits_chunk_mib))


def head_chunks_gather(setup: Combination) -> bool:
    """A trainable head (an adapter on it, or trained in full) is PEFT's wrapper around sub-modules, and ZeRO-3
    gathers a sub-module's weights at each call: one call per chunk, and the chunks per rank follow its own learned
    tokens, so ranks would gather different numbers of times and the collectives would no longer match."""
    return setup.zero_stage == 3 and setup.lm_head_trainable

def _precision(config: Config) -> tuple[list[str], torch.dtype, torch.dtype, torch.dtype | None, str]:
    """(problems, load dtype, trainable dtype, autocast dtype, reason)."""
    mode, asked, full = config.precision.mode, config.model.dtype, config.adapter.method == "full"
    problems: list[str] = []
    if mode == "fp32":
        if asked not in ("auto", "float32"):
            problems.append(f"model.dtype={asked} contradicts precision.mode=fp32; use model.dtype=auto or "
                            "precision.mode=bf16-mixed.")
        return problems, torch.float32, torch.float32, None, "precision.mode=fp32: every tensor in float32"
    if mode == "bf16":
        if asked not in ("auto", "bfloat16"):
            problems.append(f"model.dtype={asked} contradicts precision.mode=bf16 (pure bf16); use model.dtype=auto.")
        return problems, torch.bfloat16, torch.bfloat16, None, \
            "precision.mode=bf16: weights, adapters and optimizer state all in bfloat16"
    # bf16-mixed: frozen weights may be stored in bf16; anything the optimizer updates stays float32.
    if full and asked == "bfloat16":
        problems.append("model.dtype=bfloat16 contradicts full fine-tuning under precision.mode=bf16-mixed, which "
                        "keeps float32 master weights; use model.dtype=auto, or precision.mode=bf16 for pure bf16.")
    load = torch.float32 if (full or asked == "float32") else torch.bfloat16
    why = ("full fine-tuning keeps float32 master weights" if full else
           "frozen base weights are only read, so bfloat16 storage halves their memory")
    return problems, load, torch.float32, torch.bfloat16, \
        f"precision.mode=bf16-mixed: {why}; trainable parameters float32; matmuls under bfloat16 autocast"


def _quantization(config: Config, info: ModelInfo, head: str, final: Combination, load_dtype: torch.dtype,
                  modules_to_save: list[str]) -> Quantization | None:
    """bitsandbytes settings (setup/quantize.py). Compute dtype: the precision's matmul dtype unless asked. Storage:
    uint8 unless parameters are sharded, where it must be the dtype of the other weights (rule qlora-storage-dtype,
    which fixes an explicit storage_dtype that differs). Heads and modules trained in full stay unquantized. The
    schema's dtype choices are torch's own names."""
    q = config.model.quantization
    _check_prequantized(config, info)
    if not q.enabled:
        return None
    compute = getattr(torch, q.compute_dtype) if q.compute_dtype != "auto" else \
        (torch.float32 if config.precision.mode == "fp32" else torch.bfloat16)
    if final.sharded_params and final.quant_storage_matches:
        storage = load_dtype
    else:
        storage = torch.uint8 if q.storage_dtype == "auto" else getattr(torch, q.storage_dtype)
    head_name = "score" if head == "score" else info.lm_head_name
    # An image-text model quantizes its language model only. Its vision encoder and projector are a few percent of
    # the weights, so quantizing them saves little while degrading the image features a frozen tower feeds the
    # adapters (llm-compressor's vision-language recipes leave them unquantized for that reason), and
    # bitsandbytes' CPU 8-bit matmul reshapes only 3-D inputs: Mllama's projector takes 5-D ones and crashed.
    vision = [r for t in (info.towers or {}).values() if t.name != "language" for r in t.roots] + list(info.unreached)
    skip = tuple(dict.fromkeys([n for n in (head_name,) if n] + list(modules_to_save) + vision))
    return Quantization(method=q.method, double_quant=q.double_quant, compute_dtype=compute, storage_dtype=storage,
                        skip_modules=skip, cpu_repack=final.quant_cpu_repack)


def _check_prequantized(config: Config, info: ModelInfo) -> None:
    """A checkpoint saved quantized loads quantized whatever the config says: the plan must know, and agree."""
    saved, asked = info.prequantized, config.model.quantization.method
    if saved is None or saved == asked:
        return
    if saved not in ("nf4", "fp4", "int8"):
        raise ConfigError([f"model.path={config.model.path} holds weights quantized by {saved} (config.json "
                           "quantization_config); loraflow trains float bases or bitsandbytes quantization: point "
                           "model.path at the unquantized model and set model.quantization.method=nf4."])
    raise ConfigError([f"model.path={config.model.path} holds weights already quantized by bitsandbytes as {saved} "
                       f"(config.json quantization_config), but model.quantization.method={asked}; set "
                       f"model.quantization.method={saved}."])


def _storage_matches(config: Config, load_dtype: torch.dtype) -> bool:
    """Whether the asked 4-bit storage dtype is the dtype sharding would see beside it (auto: loraflow picks it)."""
    asked = config.model.quantization.storage_dtype
    return asked == "auto" or getattr(torch, asked) == load_dtype


def resolve_engine(config: Config, env: Environment) -> tuple[str, DeepSpeedSettings | None]:
    """The engine from parallel.* and the launch, and, for DeepSpeed, its settings (stage, offload, the user's
    JSON read and checked: once per run, here). A ConfigError for a contradiction."""
    p = config.parallel
    engine = p.engine
    if engine == "auto":
        deepspeed_asked = p.zero_stage is not None or p.deepspeed_config or "true" in (p.offload_optimizer,
                                                                                       p.offload_params)
        engine = "deepspeed" if deepspeed_asked else ("ddp" if env.world_size > 1 else "single")
    if not engine_spec(engine).distributed and env.world_size > 1:
        raise ConfigError([f"parallel.engine={engine}, but {env.world_size} processes were launched (WORLD_SIZE="
                           f"{env.world_size}); set parallel.engine to "
                           f"{', '.join(e.name for e in ENGINES.values() if e.distributed)}, or launch one "
                           "process."])
    if engine != "deepspeed":
        return engine, None
    return engine, deepspeed_settings(config.parallel)  # pure bf16 under ZeRO: rule bf16-zero-master-weights


def normalized_setup(config: Config, env: Environment, info: ModelInfo, modules_to_save: list[str],
                     layers: list[int], reentrant: bool | None, engine: str,
                     deepspeed: DeepSpeedSettings | None, load_dtype: torch.dtype = torch.float32,
                     towers: list | None = None) -> Combination:
    """The setup as asked (with `auto` settled by the plan's defaults), before any rule fix: what a framework
    without loraflow's rules would run. The rules then decide what must change."""
    placement = "off" if not layers else ("all" if len(layers) == info.num_layers else "partial")
    train = {t.name: t.train for t in towers or []}
    if placement == "off" and any(t.checkpoint_layers for t in towers or []):
        placement = "partial"  # only the vision encoder recomputes
    lm_head = info.lm_head_name
    full = config.adapter.method == "full"
    return Combination(
        stage=config.stage,
        adapter=config.adapter.method,
        matched_modules=None if full or not info.inspected else len(info.adapter_modules),
        embeddings_trainable=full or info.embedding_name in modules_to_save,
        lm_head_trainable=full or (lm_head is not None and (
            lm_head in modules_to_save or lm_head in info.adapter_modules)),
        tied_embeddings=info.tied_embeddings,
        checkpointing=placement,
        checkpoint_every_n=config.checkpointing.every_n_layers,
        reentrant=reentrant,
        # Sub-blocks recompute through torch's checkpoint, which does not turn the KV cache off as transformers'
        # layer checkpointing does (rule cache-during-recompute).
        checkpoint_impl="transformers" if config.checkpointing.granularity == "layer" else "torch-wrapper",
        input_grad_hook=False,
        use_cache=info.use_cache_default,
        packing=config.data.packing,
        precision=config.precision.mode,
        world_size=env.world_size,
        quantization=None if not config.model.quantization.enabled else
        ("8bit" if config.model.quantization.bits == 8 else "4bit"),
        quant_storage_matches=_storage_matches(config, load_dtype),
        cpu=env.device == "cpu",
        image_text=info.image_text,
        frozen_modules=full and "frozen" in train.values(),
        tower_adapters=train.get("vision") == "adapter",
        # transformers >= 5 enable_input_require_grads hooks every sub-model's input embeddings (rule
        # reentrant-partial-silent); loraflow requires transformers 5.
        tower_input_hook=info.image_text,
        towers_trainable=any(train.get(t) in ("full", "adapter") for t in ("vision", "projector")),
        towers_full="full" in (train.get("vision"), train.get("projector")),
        image_cross_attention=info.image_text and family(info.model_type).image_cross_attention,
        # What PEFT alone would do with an image-text model: match adapter targets across every tower.
        targets_all_towers=info.image_text and config.adapter.method != "full",
        versions=dict(env.versions),
        **_engine_fields(config, engine, deepspeed),
    )


def _engine_fields(config: Config, engine: str, ds: DeepSpeedSettings | None) -> dict[str, Any]:
    spec = stage_spec(config.stage)
    # Rollouts, and exact-match evaluation, generate with the trained model.
    generates = spec.generates or (spec.eval_generates and has_eval_set(config.data) and config.eval.generate)
    return dict(
        engine=engine, zero_stage=ds.stage if ds else 0, offload=bool(ds and (ds.offload_optimizer or
                                                                          ds.offload_params)),
        find_unused_parameters=engine == "ddp" and config.parallel.find_unused_parameters == "true",
        # What HF/accelerate do under FSDP2: transformers' layer checkpointing, which encloses the sharded unit.
        checkpoint_outside_shard=engine == "fsdp2",
        # loraflow's FSDP2 layout for LoRA (DoRA reads its base weight after the base forward, so it stays in the
        # layer's unit): see engines/fsdp2.py.
        fsdp_frozen_units_separate=engine == "fsdp2" and config.adapter.method == "lora",
        generation=generates,
        # Generation and a reference scored through the trained model (zero3-stale-trace); a loss-only evaluation
        # keeps ZeRO-3's trace intact.
        outside_forwards=generates or spec.reference == "always",
        evaluates=has_eval_set(config.data),
        # Chosen and rejected (rm, dpo) go through one concatenated forward; the reference forward runs without
        # autograd, so it leaves nothing for the backward to meet (fsdp2-multi-forward-dtensor).
        forwards_per_step=1,
    )


def resolve(config: Config, env: Environment, info: ModelInfo | None = None) -> Plan:
    """Decide every choice of the run. Raises ConfigError for config problems; rule errors are findings
    (`check` prints them, `train` calls plan.raise_for_errors())."""
    if info is None:
        from loraflow.setup.model import inspect_model

        info = inspect_model(config)
    spec = stage_spec(config.stage)
    modules_to_save = resolve_train_modules(config, info) if config.adapter.method != "full" else []
    problems, load_dtype, trainable_dtype, autocast_dtype, precision_reason = _precision(config)
    if problems:
        raise ConfigError(problems)
    layers = _checkpoint_layers(config, info.num_layers)
    towers = resolve_towers(config, info, layers)
    if towers and config.data.packing:
        raise ConfigError(["data.packing=true: image-text rows are not packed (each row keeps its own images, and "
                           "Qwen2-VL's 3-D positions cannot restart inside a row); set data.packing=false."])
    modules_to_save += [r for r in full_tower_roots(towers, info, config.adapter.method) if r not in modules_to_save]
    block = _checkpoint_block(config, info)
    vision_layers = next((t.checkpoint_layers for t in towers if t.name == "vision"), [])
    asked = config.checkpointing.reentrant
    reentrant = None if not (layers or vision_layers) else (asked == "true")
    engine, deepspeed = resolve_engine(config, env)
    naive = normalized_setup(config, env, info, modules_to_save, layers, reentrant, engine, deepspeed, load_dtype,
                             towers)
    final, findings = evaluate(naive)
    changed_by = {key: f.rule.id for f in findings for key in f.changes}

    plan = Plan(config=config, env=env, model=info, setup=final, findings=findings, device=env.device, asked=naive,
                load_dtype=load_dtype, trainable_dtype=trainable_dtype, autocast_dtype=autocast_dtype,
                modules_to_save=modules_to_save, ensure_weight_tying=final.weight_tying_enforced,
                checkpoint_layers=layers, reentrant=final.reentrant, input_grad_hook=final.input_grad_hook,
                checkpoint_in_engine=bool(layers) and final.engine == "fsdp2" and not final.checkpoint_outside_shard
                and block is None, checkpoint_block=block if layers else None,
                offload_activations=config.checkpointing.offload_activations and env.device != "cpu",
                deepspeed=deepspeed, saves="model" if config.adapter.method == "full" else "adapter",
                towers=towers, vision_checkpoint_layers=list(vision_layers),
                # Beyond the rules' cases (ZeRO-1/2): ranks that run the same modules keep every engine's
                # collectives and gradient buckets alike, at the cost of one blank image.
                blank_images=final.image_every_rank or (info.image_text and env.world_size > 1))
    plan.attn_implementation = info.attn_implementation
    if info.attn_implementation == "flash_attention_2" and env.device == "cpu":
        raise ConfigError(["model.attn_implementation=flash_attention_2 needs a CUDA GPU, and this run is on the "
                           "CPU. Set model.attn_implementation=auto (or sdpa, or eager)."])
    plan.head = spec.head
    plan.logits = _logits(config, info, spec.head, final)
    plan.quantization = _quantization(config, info, spec.head, final, load_dtype, modules_to_save)
    plan.reference = reference_kind(spec, config)
    plan.phases = stage_phases(spec, plan.reference, bool(config.rl.reward_model) and spec.generates,
                               config.rl.updates_per_rollout)
    plan.decisions = explain_choices(plan, naive, changed_by, precision_reason)
    return plan
