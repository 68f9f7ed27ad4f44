"""The setup as asked: the config mapped onto the normalized Combination the rules read, with `auto` settled by
the plan's defaults, before any rule's fix. It is what a framework without loraflow's rules would run; the rules
then decide what must change (plan/__init__.py)."""

from __future__ import annotations

import torch

from loraflow.config.schema import Config
from loraflow.engines.deepspeed_config import DeepSpeedSettings
from loraflow.environment import Environment
from loraflow.families import family, fp16_overflows_type
from loraflow.plan.engine import engine_fields
from loraflow.plan.quantization import storage_matches
from loraflow.plan.rollout import rollout_fields, sharded_weights
from loraflow.rules import Combination
from loraflow.setup.model import ModelInfo
from loraflow.stagespec import stage_spec


def asked_setup(config: Config, env: Environment, info: ModelInfo, modules_to_save: list[str],
                layers: list[int], reentrant: bool | None, engine: str,
                deepspeed: DeepSpeedSettings | None, load_dtype: torch.dtype = torch.float32,
                towers: list | None = None) -> Combination:
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
        # FlashAttention casts float32 queries to autocast's dtype or the weights' (rule flash-attn-fp32-inputs).
        flash_attn_fp32=(config.model.attn_implementation == "flash_attention_2" and config.precision.mode == "fp32"
                         and load_dtype == torch.float32),
        fp16_overflows=fp16_overflows_type(info.model_type),
        world_size=env.world_size,
        quantization=None if not config.model.quantization.enabled else
        ("8bit" if config.model.quantization.bits == 8 else "4bit"),
        quant_storage_matches=storage_matches(config, load_dtype),
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
        **engine_fields(config, engine, deepspeed),
        **rollout_fields(config, stage_spec(config.stage), cpu=env.device == "cpu",
                         sharded=sharded_weights(engine, deepspeed.stage if deepspeed else 0)),
    )
