"""Every rule: a setup that triggers it, and a neighbouring setup that must leave it silent."""

from __future__ import annotations

import pytest
from conftest import ROOT
from packaging.version import Version

from loraflow.rules import Combination, all_rules, evaluate, get_rule
from loraflow.rules.registry import SYMPTOMS, Rule, rules_for_symptom

BASE = Combination(adapter="lora", matched_modules=28)
OLD_DS, NEW_DS = {"deepspeed": Version("0.15.3")}, {"deepspeed": Version("0.19.8")}
OLD_TORCH, NEW_TORCH = {"torch": Version("2.5.1")}, {"torch": Version("2.13.0")}
ZERO3 = BASE.replace(engine="deepspeed", zero_stage=3, world_size=2)
FSDP2 = BASE.replace(engine="fsdp2", world_size=2, checkpointing="all", reentrant=False)
FSDP1 = BASE.replace(engine="fsdp1", world_size=2)
DDP = BASE.replace(engine="ddp", world_size=2)
VLLM = BASE.replace(stage="grpo", generation=True, rollout_engine="vllm", rollout_sync="adapter", adapter_rank=16)

# rule id -> (setup that triggers it, neighbouring setup that must not)
CASES = {
    "reentrant-frozen-inputs": (
        BASE.replace(checkpointing="all", reentrant=True),
        BASE.replace(checkpointing="all", reentrant=False)),
    "reentrant-partial-silent": (
        BASE.replace(checkpointing="partial", checkpoint_every_n=2, reentrant=True),
        BASE.replace(checkpointing="partial", checkpoint_every_n=2, reentrant=True, embeddings_trainable=True)),
    "cache-during-recompute": (
        BASE.replace(checkpointing="all", reentrant=True, checkpoint_impl="torch-wrapper", use_cache=True,
                     input_grad_hook=True),
        BASE.replace(checkpointing="all", reentrant=True, checkpoint_impl="transformers", use_cache=True,
                     input_grad_hook=True)),
    "packing-cache-cross-attention": (
        BASE.replace(packing=True, use_cache=True),
        BASE.replace(packing=True, use_cache=False)),
    "no-adapter-matched": (
        BASE.replace(matched_modules=0),
        BASE.replace(adapter="full", matched_modules=None)),
    "lora-no-default-targets": (
        BASE.replace(no_default_targets=True),
        BASE.replace(no_default_targets=True, adapter="full")),
    "adapter-loaded-frozen": (
        BASE.replace(adapter_loaded_frozen=True),
        BASE.replace(adapter_loaded_frozen=True, adapter="full")),
    "fsdp2-generate-unsharded": (
        FSDP2.replace(stage="grpo", generation=True),
        FSDP2.replace(stage="grpo", generation=True, generation_gather=True)),
    "tied-embedding-adapter": (
        BASE.replace(tied_embeddings=True, lm_head_trainable=True),
        BASE.replace(tied_embeddings=False, lm_head_trainable=True)),
    "checkpointing-off-in-eval": (
        BASE.replace(checkpointing="all", reentrant=False, train_mode_at_backward=False),
        BASE.replace(checkpointing="off", train_mode_at_backward=False)),
    "fp16-trainable-unscale": (
        BASE.replace(precision="fp16"),
        BASE.replace(precision="fp16-mixed")),
    "zero3-frozen-recompute": (
        ZERO3.replace(checkpointing="all", reentrant=False, versions=OLD_DS),
        ZERO3.replace(checkpointing="all", reentrant=False, versions=NEW_DS)),
    "fsdp2-recompute-cast": (
        FSDP2.replace(precision="bf16-mixed", checkpoint_outside_shard=True, versions=OLD_TORCH),
        FSDP2.replace(precision="bf16-mixed", checkpoint_outside_shard=True, versions=NEW_TORCH)),
    "zero3-stale-trace": (
        ZERO3.replace(outside_forwards=True, versions={"deepspeed": Version("0.19.1")}),
        ZERO3.replace(outside_forwards=True, versions={"deepspeed": Version("0.19.2")})),
    "bf16-lost-updates": (
        BASE.replace(adapter="dora", precision="bf16"),
        BASE.replace(adapter="lora", precision="bf16")),
    "sharded-tied-adapters": (
        ZERO3.replace(tied_embeddings=True, lm_head_trainable=True, weight_tying_enforced=True),
        ZERO3.replace(tied_embeddings=True, embeddings_trainable=True, weight_tying_enforced=True)),
    "fsdp2-reentrant-cross-attention": (
        FSDP2.replace(image_text=True, image_cross_attention=True, checkpointing="all", reentrant=True),
        FSDP2.replace(image_text=True, image_cross_attention=True, checkpointing="all", reentrant=False)),
    "zero3-eval-trace": (
        ZERO3.replace(evaluates=True, versions=OLD_DS),
        ZERO3.replace(evaluates=True, versions={"deepspeed": Version("0.15.4")})),
    "zero3-eval-backward": (
        ZERO3.replace(train_mode_at_backward=False, versions=OLD_DS),
        ZERO3.replace(train_mode_at_backward=False, versions={"deepspeed": Version("0.15.4")})),
    "ddp-reentrant-unused": (
        DDP.replace(checkpointing="all", reentrant=True, input_grad_hook=True, find_unused_parameters=True),
        DDP.replace(checkpointing="all", reentrant=True, input_grad_hook=True, find_unused_parameters=True,
                    ddp_static_graph=True)),
    "fsdp1-mixed-requires-grad": (
        FSDP1.replace(fsdp_use_orig_params=False),
        FSDP1.replace(fsdp_use_orig_params=False, adapter="full")),
    "fsdp-frozen-grad-memory": (
        FSDP1.replace(fsdp_use_orig_params=True),
        FSDP1.replace(fsdp_use_orig_params=True, fsdp_frozen_units_separate=True)),
    "zero3-empty-adapter-save": (
        ZERO3,
        ZERO3.replace(zero_stage=2)),
    "zero3-generation-gather": (
        ZERO3.replace(stage="grpo", generation=True, adapter_save_gather=True),
        ZERO3.replace(stage="grpo", generation=True, generation_gather=True, adapter_save_gather=True)),
    "fsdp2-multi-forward-dtensor": (
        FSDP2.replace(stage="dpo", forwards_per_step=2, versions=OLD_TORCH),
        FSDP2.replace(stage="dpo", forwards_per_step=2, versions=NEW_TORCH)),
    "dora-sharded-weight": (
        ZERO3.replace(adapter="dora"),
        ZERO3.replace(adapter="dora", zero_stage=2)),
    "qlora-storage-dtype": (
        FSDP2.replace(quantization="4bit", quant_storage_matches=False, checkpointing="off"),
        BASE.replace(quantization="4bit", quant_storage_matches=False)),
    "kbit-cpu-repack": (
        BASE.replace(quantization="4bit", cpu=True),
        BASE.replace(quantization="4bit", cpu=False)),
    "kbit-merge": (
        BASE.replace(quantization="4bit", merge_into_quantized=True),
        BASE.replace(quantization=None, merge_into_quantized=True)),
    "zero-grad-reduced-twice": (
        BASE.replace(engine="deepspeed", zero_stage=2, world_size=2, checkpointing="all", reentrant=True,
                     forwards_per_step=2),
        BASE.replace(engine="deepspeed", zero_stage=2, world_size=2, checkpointing="all", reentrant=False,
                     forwards_per_step=2)),
    "adapter-omits-new-head": (
        BASE.replace(stage="rm", task_head_saved=False),
        BASE.replace(stage="rm")),
    "kbit-model-moved": (
        BASE.replace(quantization="8bit", quantized_moved=True),
        BASE.replace(quantization="8bit")),
    "unsloth-multi-gpu": (
        DDP.replace(unsloth=True, versions={"unsloth": Version("2025.4.1")}),
        BASE.replace(unsloth=True)),
    "vllm-vlm-weight-names": (
        BASE.replace(rollout_engine="vllm", rollout_sync="merged", vlm_renamed="qwen2-vl",
                     versions={"transformers": Version("4.52.4"), "vllm": Version("0.8.5")}),
        BASE.replace(rollout_engine="vllm", rollout_sync="merged", vlm_renamed="qwen2-vl",
                     versions={"transformers": Version("4.52.4"), "vllm": Version("0.9.1")})),
    "zero3-prefetch-bucket-float": (
        BASE.replace(engine="deepspeed", zero_stage=3, zero3_prefetch_bucket="auto", accumulation_loop="hf-trainer",
                     versions={"deepspeed": Version("0.15.0"), "transformers": Version("4.44.2")}),
        BASE.replace(engine="deepspeed", zero_stage=3, zero3_prefetch_bucket="auto", accumulation_loop="hf-trainer",
                     versions={"deepspeed": Version("0.15.0"), "transformers": Version("4.45.0")})),
    "moe-zero3-expert-hang": (
        BASE.replace(engine="deepspeed", zero_stage=3, world_size=2, moe_skips_experts=True),
        BASE.replace(engine="deepspeed", zero_stage=3, world_size=2, moe_skips_experts=True,
                     moe_leaf_registered=True)),
    "adapter-vocab-mismatch": (
        BASE.replace(adapter_vocab_differs=True),
        BASE.replace(adapter_vocab_differs=True, adapter="full")),
    "flash-attn-fp32-inputs": (
        BASE.replace(flash_attn_fp32=True),
        BASE.replace(flash_attn_fp32=False)),
    "liger-head-adapter-bypassed": (
        BASE.replace(head_adapter=True, liger_fused_ce=True),
        BASE.replace(head_adapter=True, liger_fused_ce=True, adapter="full")),
    "zero3-sync-full-gather": (
        BASE.replace(engine="deepspeed", zero_stage=3, rollout_engine="vllm", sync_gathers_whole=True),
        BASE.replace(engine="deepspeed", zero_stage=2, rollout_engine="vllm", sync_gathers_whole=True)),
    "zero-no-sync-accumulation": (
        BASE.replace(engine="deepspeed", zero_stage=2, world_size=2, grad_accum_steps=4, accumulation_loop="hf-trainer",
                     versions={"deepspeed": Version("0.16.0"), "accelerate": Version("1.2.1"),
                               "transformers": Version("4.46.1")}),
        BASE.replace(engine="deepspeed", zero_stage=2, world_size=2, grad_accum_steps=4, accumulation_loop="hf-trainer",
                     versions={"deepspeed": Version("0.16.0"), "accelerate": Version("1.2.1"),
                               "transformers": Version("4.48.0")})),  # the Trainer skips no_sync under DeepSpeed
    "device-map-split-distributed": (
        DDP.replace(model_split=True),
        BASE.replace(model_split=True)),  # one process may spread its model: naive model parallelism
    # Rules from the mined sample's clusters (catalog_precision.py, catalog_placement.py, catalog_saving.py).
    "fp16-overflow": (
        BASE.replace(fp16_overflows=True, precision="fp16-mixed"),
        BASE.replace(fp16_overflows=True, precision="bf16-mixed")),
    "lora-dtype-mismatch": (
        ZERO3.replace(quantization="8bit", precision="fp16-mixed", versions={"peft": Version("0.5.0")}),
        ZERO3.replace(quantization="8bit", precision="fp16-mixed", versions={"peft": Version("0.6.0")})),
    "zero3-init-adapter-read": (
        ZERO3.replace(adapter_reads_base="svd", versions={"peft": Version("0.11.1")}),
        ZERO3.replace(adapter_reads_base="svd", versions={"peft": Version("0.12.0")})),
    "zero3-init-quantized-load": (
        ZERO3.replace(quantization="4bit", image_text=True, versions={"transformers": Version("4.45.2")}),
        ZERO3.replace(quantization="4bit", image_text=False, versions={"transformers": Version("4.45.2")})),
    "sharded-weights-outside-forward": (
        FSDP1.replace(weights_outside_forward=True),
        DDP.replace(weights_outside_forward=True)),
    "adapter-frozen-others-train": (
        BASE.replace(adapter_loaded_frozen=True, lm_head_trainable=True),
        BASE.replace(adapter_loaded_frozen=True)),
    "unsloth-precision-mismatch": (
        BASE.replace(unsloth=True, precision_against_load=True, versions={"unsloth": Version("2025.6.1")}),
        BASE.replace(unsloth=True, precision_against_load=True, versions={"unsloth": Version("2025.2.5")})),
    "peft-config-on-peft-model": (
        BASE.replace(peft_config_on_peft_model=True, versions={"trl": Version("0.27.0")}),
        BASE.replace(peft_config_on_peft_model=True, versions={"trl": Version("0.26.0")})),
    "zero3-model-outside-engine": (
        ZERO3.replace(model_outside_engine=True),
        ZERO3.replace(zero_stage=2, model_outside_engine=True)),
    "zero3-checkpoint-frozen": (
        ZERO3.replace(frozen_from_engine_checkpoint=True, versions={"deepspeed": Version("0.9.0")}),
        ZERO3.replace(frozen_from_engine_checkpoint=True, versions={"deepspeed": Version("0.9.1")})),
    "mm-token-types-required": (
        BASE.replace(model_type="gemma3", image_text=True, mm_token_types_missing=True,
                     versions={"transformers": Version("5.2.0")}),
        BASE.replace(model_type="gemma3", image_text=True, mm_token_types_missing=True,
                     versions={"transformers": Version("5.6.0")})),
    "fsdp1-8bit-optimizer-save": (
        BASE.replace(engine="fsdp1", world_size=2, optimizer_8bit=True, saves_optimizer_state=True,
                     versions={"bitsandbytes": Version("0.48.2")}),
        BASE.replace(engine="fsdp1", world_size=2, optimizer_8bit=True, saves_optimizer_state=True,
                     versions={"bitsandbytes": Version("0.49.2")})),
    "fp8-checkpoint-not-trainable": (
        BASE.replace(fp8_checkpoint=True, accumulation_loop="hf-trainer",
                     versions={"transformers": Version("5.21.1")}),
        BASE.replace(fp8_checkpoint=True, accumulation_loop="hf-trainer",
                     versions={"transformers": Version("5.22.0")})),
    "fa2-right-padding-cache": (
        BASE.replace(model_type="qwen2", flash_attention=True, versions={"transformers": Version("4.51.0")}),
        BASE.replace(model_type="qwen2", flash_attention=True, versions={"transformers": Version("4.45.0")})),
    "remote-code-old-gc-hook": (
        BASE.replace(model_type="chatglm", checkpointing="all", versions={"transformers": Version("4.35.2")}),
        BASE.replace(model_type="chatglm", checkpointing="all", versions={"transformers": Version("4.36.0")})),
    "zero3-device-map-load": (
        ZERO3.replace(device_map_load="device_map"),
        ZERO3.replace(device_map_load="low_cpu_mem_usage", versions={"transformers": Version("4.51.0")})),
    "zero0-frozen-master-copies": (
        BASE.replace(engine="deepspeed", zero_stage=0, precision="bf16-mixed", optimizer_holds_frozen=True,
                     versions={"deepspeed": Version("0.18.0")}),
        BASE.replace(engine="deepspeed", zero_stage=0, precision="bf16-mixed", optimizer_holds_frozen=True,
                     versions={"deepspeed": Version("0.17.5")})),
    "vllm-qwen3vl-lora-start": (
        BASE.replace(stage="grpo", rollout_engine="vllm", rollout_sync="adapter", model_type="qwen3_vl",
                     versions={"vllm": Version("0.11.0")}),
        BASE.replace(stage="grpo", rollout_engine="vllm", rollout_sync="adapter", model_type="qwen2_5_vl",
                     versions={"vllm": Version("0.11.0")})),
    "adalora-reentrant-ddp": (
        BASE.replace(engine="ddp", world_size=2, adalora_orth_reg=True, checkpointing="all", reentrant=True,
                     input_grad_hook=True),
        BASE.replace(engine="ddp", world_size=2, adalora_orth_reg=True, checkpointing="all", reentrant=True,
                     input_grad_hook=True, ddp_static_graph=True)),
    "zero-checkpoint-frozen-base": (
        BASE.replace(engine="deepspeed", zero_stage=2, engine_checkpoints="all"),
        BASE.replace(engine="deepspeed", zero_stage=2, engine_checkpoints="peft-trainable")),
    "zero-peft-resume-strict": (
        BASE.replace(engine="deepspeed", zero_stage=2, engine_checkpoints="peft-trainable", resumes=True,
                     versions={"transformers": Version("4.37.2")}),
        BASE.replace(engine="deepspeed", zero_stage=2, engine_checkpoints="peft-trainable", resumes=True,
                     versions={"transformers": Version("4.38.0")})),
    "fsdp2-adapter-resume-lost": (
        BASE.replace(engine="fsdp2", world_size=2, fsdp_state_dict="full", checkpoint_adapter_only=True, resumes=True,
                     versions={"accelerate": Version("1.14.0")}),
        BASE.replace(engine="fsdp2", world_size=2, fsdp_state_dict="sharded", checkpoint_adapter_only=True,
                     resumes=True, versions={"accelerate": Version("1.14.0")})),
    "adapter-state-dict-patched": (
        BASE.replace(state_dict_patched=True, versions={"peft": Version("0.19.1")}),
        BASE.replace(state_dict_patched=True, versions={"peft": Version("0.20.0")})),
    "kbit-full-finetune": (
        BASE.replace(quantization="4bit", adapter="full"),
        BASE.replace(quantization="4bit")),
    "kbit-int8-fsdp2": (
        FSDP2.replace(quantization="8bit", checkpointing="off"),
        FSDP2.replace(quantization="4bit", checkpointing="off")),
    "kbit-int8-zero3": (
        ZERO3.replace(quantization="8bit"),
        ZERO3.replace(quantization="8bit", zero_stage=2)),
    # 8-bit codes in an FSDP1 unit; the same base under FSDP2 is its own rule (kbit-int8-fsdp2).
    "kbit-int8-fsdp1": (
        BASE.replace(quantization="8bit", engine="fsdp1", world_size=2),
        BASE.replace(quantization="8bit", engine="ddp", world_size=2)),
    # A GPTQ checkpoint sharded by ZeRO-3 or FSDP2; the same checkpoint under ZeRO-2 keeps its weights whole.
    "ptq-model-under-sharding": (
        ZERO3.replace(ptq_checkpoint="gptq"),
        ZERO3.replace(ptq_checkpoint="gptq", zero_stage=2)),
    # Image-text models (catalog_vision.py).
    "zero3-vision-skipped": (
        ZERO3.replace(image_text=True),
        ZERO3.replace(image_text=True, world_size=1)),
    "ddp-unused-vision-tower": (
        DDP.replace(image_text=True, towers_trainable=True),
        DDP.replace(image_text=True, towers_trainable=True, find_unused_parameters=True)),
    "image-tokens-truncated": (
        BASE.replace(image_text=True),
        BASE.replace(image_text=True, image_safe_truncation=True)),
    "vlm-wrong-auto-class": (
        BASE.replace(image_text=True, causal_lm_class=True),
        BASE.replace(image_text=False, causal_lm_class=True)),
    "lora-targets-vision-tower": (
        BASE.replace(image_text=True, targets_all_towers=True),
        BASE.replace(image_text=False, targets_all_towers=True)),
    "zero3-lora-merge": (
        ZERO3.replace(merge_in_sharded=True, adapter_save_gather=True),
        ZERO3.replace(merge_in_sharded=True, adapter_save_gather=True, zero_stage=2)),
    "fsdp1-mixed-dtype": (
        FSDP1.replace(mixed_param_dtypes=True, precision="bf16-mixed", fsdp_use_orig_params=False),
        FSDP1.replace(mixed_param_dtypes=True, precision="bf16-mixed", fsdp_frozen_units_separate=True)),
    "zero3-mixed-dtype-gather": (
        ZERO3.replace(mixed_param_dtypes=True, adapter_save_gather=True, versions={"deepspeed": Version("0.19.2")}),
        ZERO3.replace(mixed_param_dtypes=True, adapter_save_gather=True, versions=NEW_DS)),
    "sequence-parallel-recompute": (
        FSDP2.replace(sequence_parallel=True),
        FSDP2.replace(sequence_parallel=True, checkpointing="off")),
    "bf16-zero-master-weights": (
        ZERO3.replace(zero_stage=2, precision="bf16"),
        ZERO3.replace(zero_stage=2, precision="bf16-mixed")),
    # Rollout engines (catalog_rollout.py).
    "vllm-adapter-unservable": (
        VLLM.replace(adapter="dora"),
        VLLM.replace(adapter="dora", rollout_sync="merged")),
    "vllm-max-lora-rank": (
        VLLM.replace(adapter_rank=64),
        VLLM.replace(adapter_rank=64, rollout_sync="merged")),
    "vllm-raw-logprobs": (
        VLLM.replace(rollout_logprobs_processed=False),
        VLLM.replace(rollout_engine="hf", rollout_sync=None)),
    "vllm-stale-policy": (
        VLLM.replace(rollout_verified=False),
        VLLM.replace(rollout_engine="hf", rollout_sync=None)),
    "vllm-sync-peft-names": (
        VLLM.replace(rollout_sync="unmerged"),
        VLLM.replace(rollout_sync="unmerged", adapter="full")),
    "vllm-tokenizer-mismatch": (
        VLLM.replace(engine_tokenizer_checked=False),
        VLLM.replace(engine_tokenizer_checked=None)),
    "vllm-colocate-memory": (
        VLLM.replace(rollout_colocated=True, engine_gpu_memory_utilization=0.9),
        VLLM.replace(rollout_colocated=True, engine_gpu_memory_utilization=0.5)),
}


def fired(setup: Combination) -> dict[str, str]:
    _, findings = evaluate(setup)
    return {f.rule.id: f.verdict for f in findings}


def test_every_registered_rule_has_cases():
    assert {r.id for r in all_rules()} == set(CASES)


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_triggers(rule_id):
    trigger, _ = CASES[rule_id]
    assert fired(trigger).get(rule_id) == get_rule(rule_id).verdict


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_silent_on_neighbour(rule_id):
    _, neighbour = CASES[rule_id]
    assert rule_id not in fired(neighbour)


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_fix_rules_resolve_their_condition(rule_id):
    """After the plan applies a fix, the rule's own condition no longer holds."""
    rule = get_rule(rule_id)
    final, _ = evaluate(CASES[rule_id][0])
    if rule.verdict == "fix":
        assert not rule.when(final)


def test_fixes_are_reported_with_what_they_changed():
    final, findings = evaluate(BASE.replace(checkpointing="all", reentrant=True, packing=True, use_cache=True))
    by_id = {f.rule.id: f for f in findings}
    assert by_id["reentrant-frozen-inputs"].changes == {"input_grad_hook": True}
    assert by_id["packing-cache-cross-attention"].changes == {"use_cache": False}
    assert final.input_grad_hook and not final.use_cache


def test_rule_metadata_is_complete():
    for rule in all_rules():
        assert rule.id and rule.title and rule.cause and rule.fix and rule.references, rule.id
        assert rule.verdict in ("error", "fix", "warning")


def test_a_fix_rule_needs_a_remedy():
    with pytest.raises(ValueError, match="needs a remedy"):
        Rule(id="x", title="x", verdict="fix", impact="crash", when=lambda s: True, conditions="c", cause="c",
                 fix="f")


def test_unknown_versions_count_as_affected_and_say_so():
    rule = get_rule("zero3-frozen-recompute")
    setup = ZERO3.replace(checkpointing="all", reentrant=False, versions={})
    assert rule.applies(setup)
    _, findings = evaluate(setup)
    finding = next(f for f in findings if f.rule.id == rule.id)
    assert any("--versions deepspeed=" in n for n in finding.notes)


def test_old_deepspeed_plan_switches_to_reentrant_and_then_adds_the_hook():
    """One remedy creates another rule's condition: the fixed point covers both, each announced."""
    final, findings = evaluate(ZERO3.replace(checkpointing="all", reentrant=False, versions=OLD_DS))
    ids = [f.rule.id for f in findings]
    assert "zero3-frozen-recompute" in ids and "reentrant-frozen-inputs" in ids
    assert final.reentrant is True and final.input_grad_hook is True


def test_foreign_setups_are_reported_without_fixes():
    setup = BASE.replace(checkpointing="all", reentrant=True)
    final, findings = evaluate(setup, apply_fixes=False)
    assert final == setup and [f.verdict for f in findings] == ["fix"] and not findings[0].changes


def test_rule_knobs_and_versions_are_declared():
    for rule in all_rules():
        assert rule.knobs and rule.conditions and rule.impact in ("crash", "silent", "slow"), rule.id


def test_compatibility_doc_is_current():
    """docs/compatibility.md is generated from the registry; regenerate with scripts/gen_docs.py."""

    from loraflow.rules.docs import render_markdown

    text = (ROOT / "docs/compatibility.md").read_text()
    assert text == render_markdown()
    assert all(f"### `{r.id}`" in text for r in all_rules())


def test_dora_under_fsdp1_only_on_peft_before_the_fsdp_refactor():
    dora_fsdp1 = FSDP1.replace(adapter="dora", fsdp_use_orig_params=True)
    assert "dora-sharded-weight" in fired(dora_fsdp1.replace(versions={"peft": Version("0.11.1")}))
    assert "dora-sharded-weight" not in fired(dora_fsdp1.replace(versions={"peft": Version("0.12.0")}))


def test_vision_tower_adapters_under_reentrant_need_a_hook_on_the_tower():
    # The language model's embeddings are hooked, so nothing crashes; the tower's adapters are the silent part.
    tower = BASE.replace(checkpointing="all", reentrant=True, input_grad_hook=True, tower_adapters=True)
    rule = get_rule("reentrant-partial-silent")
    assert rule.applies(tower) and not get_rule("reentrant-frozen-inputs").applies(tower)
    assert not rule.applies(tower.replace(tower_input_hook=True))  # transformers >= 5 hooks the patch embedding
    assert not rule.applies(tower.replace(reentrant=False))
    assert not rule.applies(tower.replace(tower_adapters=False))
    assert not rule.applies(tower.replace(**rule.remedy(tower)))


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_pure_bf16_is_refused_under_every_zero_stage(stage):
    setup = BASE.replace(engine="deepspeed", zero_stage=stage, world_size=2, precision="bf16")
    assert fired(setup).get("bf16-zero-master-weights") == "error"


@pytest.mark.parametrize("change", [{"precision": "bf16-mixed"}, {"zero_stage": 0},
                                    {"engine": "fsdp2", "zero_stage": 0}])
def test_pure_bf16_refusal_is_silent_where_it_trains_as_asked(change):
    setup = BASE.replace(engine="deepspeed", zero_stage=2, world_size=2, precision="bf16").replace(**change)
    assert "bf16-zero-master-weights" not in fired(setup)


def test_every_guard_symptom_names_rules_and_unknown_ones_are_refused():
    for symptom in SYMPTOMS:
        assert rules_for_symptom(symptom), symptom  # a guard that sees it always has a likely cause to name
    assert [r.id for r in rules_for_symptom("eval-mode-at-backward")] == ["checkpointing-off-in-eval",
                                                                          "zero3-eval-backward"]
    with pytest.raises(KeyError, match="unknown symptom"):
        rules_for_symptom("no-such-symptom")
    with pytest.raises(ValueError, match="not in registry.SYMPTOMS"):
        Rule(id="x", title="x", verdict="error", impact="crash", when=lambda s: True, conditions="c", cause="c",
             fix="f", symptoms=("no-such-symptom",))


def test_vllm_rank_outside_the_engines_list_is_refused_and_rounded_up():
    """ms-swift passes --lora_rank as the engine's max_lora_rank; vLLM takes only the ranks of its own list."""
    rule = get_rule("vllm-max-lora-rank")
    odd = VLLM.replace(adapter_rank=12, engine_max_lora_rank=12)
    assert rule.applies(odd) and rule.remedy(odd) == {"engine_max_lora_rank": 16}
    assert not rule.applies(odd.replace(adapter_rank=8, engine_max_lora_rank=8))


def test_raw_logprobs_matter_only_where_the_trainer_uses_the_engines():
    rule = get_rule("vllm-raw-logprobs")
    assert rule.applies(VLLM) and not rule.applies(VLLM.replace(rollout_logprobs_used=False))


def test_a_sync_path_known_to_keep_the_engine_current_needs_no_check():
    rule = get_rule("vllm-stale-policy")
    assert not rule.applies(VLLM.replace(rollout_sync_proven=True))
    # A sync under PEFT's names crashes first: that is vllm-sync-peft-names, not a stale engine.
    assert not rule.applies(VLLM.replace(rollout_sync="unmerged"))


def test_peft_names_are_fixed_by_a_merged_sync_and_then_checked():
    final, findings = evaluate(VLLM.replace(rollout_sync="unmerged"))
    assert final.rollout_sync == "merged" and final.rollout_verified
    assert {"vllm-sync-peft-names", "vllm-stale-policy"} <= {f.rule.id for f in findings}


def test_sequence_parallel_recompute_spares_fsdp1():
    """verl#4664: Ulysses with FSDP1 and checkpointing trains; only FSDP2's recompute sees the other split."""
    rule = next(r for r in all_rules() if r.id == "sequence-parallel-recompute")
    fsdp1 = FSDP1.replace(sequence_parallel=True, checkpointing="all", reentrant=False)
    assert fsdp1.flat_params and not rule.when(fsdp1)
    assert rule.when(fsdp1.replace(engine="fsdp2"))


def test_fsdp2_recompute_cast_needs_an_input_the_policy_casts():
    """The cast the recompute skipped (torch < 2.13) changes nothing where a text model's root is sharded under the
    layers' policy (verl's apply_fsdp2, accelerate's fsdp2_prepare_model): its layers get bf16 inputs already."""
    rule = get_rule("fsdp2-recompute-cast")
    cast = FSDP2.replace(precision="bf16-mixed", checkpoint_outside_shard=True, versions=OLD_TORCH)
    assert rule.applies(cast) and not rule.applies(cast.replace(fsdp2_root_in_policy=True))
    assert rule.applies(cast.replace(fsdp2_root_in_policy=True, image_text=True))


def test_tied_embeddings_trained_in_full_stay_tied():
    """Only an adapter's trained copy (modules_to_save) unties them; full fine-tuning trains the shared matrix."""
    rule = get_rule("tied-embedding-adapter")
    assert rule.applies(BASE.replace(tied_embeddings=True, embeddings_trainable=True))
    assert not rule.applies(BASE.replace(adapter="full", frozen_modules=True, tied_embeddings=True,
                                         embeddings_trainable=True))
