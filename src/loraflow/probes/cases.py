"""Single-process reproductions: checkpointing, cache, packing, adapters, precision. Each `execute` runs the tiny
model exactly as the Combination says and reports ok, an error, or silently wrong results against the reference."""

from __future__ import annotations

import torch

from loraflow.probes.base import Context, Observation, case
from loraflow.probes.tiny import (
    adapter_grads,
    compare,
    tiny_llama,
    token_batch,
    with_adapters,
)
from loraflow.rules.combination import Combination

LORA = Combination(adapter="lora", matched_modules=14)


def checkpoint_as_setup(model, setup: Combination) -> None:
    """Checkpoint the decoder layers the way the Combination says: transformers' own layer mechanism or torch's
    checkpoint_wrapper; then keep or remove the input-grad hook (transformers 5 adds one on its own)."""
    from loraflow.setup.checkpointing import (
        decoder_layers,
        enable_layer_checkpointing,
        hf_model,
        set_input_grad_hook,
    )

    if setup.checkpointing == "off":
        return
    every = 1 if setup.checkpointing == "all" else setup.checkpoint_every_n
    layers = decoder_layers(model)
    indices = [i for i in range(len(layers)) if i % every == 0]  # the plan's every_n_layers semantics
    if setup.checkpoint_impl == "transformers":
        enable_layer_checkpointing(hf_model(model), bool(setup.reentrant), indices)
    else:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            CheckpointImpl,
            apply_activation_checkpointing,
            checkpoint_wrapper,
        )

        impl = CheckpointImpl.REENTRANT if setup.reentrant else CheckpointImpl.NO_REENTRANT
        chosen = {id(layers[i]) for i in indices}
        apply_activation_checkpointing(model, check_fn=lambda m: id(m) in chosen,
                                       checkpoint_wrapper_fn=lambda m: checkpoint_wrapper(m, checkpoint_impl=impl))
    set_input_grad_hook(model, setup.input_grad_hook)


def step_grads(setup: Combination, batch=None) -> dict:
    model = with_adapters(tiny_llama(use_cache=setup.use_cache, tie=setup.tied_embeddings), setup)
    checkpoint_as_setup(model, setup)
    model.train(setup.train_mode_at_backward)
    batch = batch or token_batch()
    model(**batch, use_cache=setup.use_cache).loss.backward()
    return adapter_grads(model)


def reference_grads(setup: Combination, batch=None) -> dict:
    """The unoptimized reference: same adapters, no checkpointing, no cache."""
    return step_grads(Combination(adapter=setup.adapter, tied_embeddings=setup.tied_embeddings, use_cache=False), batch)


def checkpointed_step(setup: Combination, ctx: Context) -> Observation:
    """one LoRA step of a 2-layer Llama, adapter gradients compared with the fp32 no-checkpointing reference"""
    return compare(step_grads(setup), reference_grads(setup))


case("reentrant-frozen-inputs", LORA.replace(checkpointing="all", reentrant=True))(checkpointed_step)


@case("reentrant-partial-silent", LORA.replace(checkpointing="partial", checkpoint_every_n=2, reentrant=True))
def partial_step(setup: Combination, ctx: Context) -> Observation:
    """one LoRA step with every 2nd layer checkpointed, adapter gradients compared with the reference"""
    return checkpointed_step(setup, ctx)


@case("cache-during-recompute", LORA.replace(checkpointing="all", reentrant=True, input_grad_hook=True,
                                             checkpoint_impl="torch-wrapper", use_cache=True))
def cache_step(setup: Combination, ctx: Context) -> Observation:
    """torch checkpoint_wrapper on every layer, one unpadded row, gradients against the reference"""
    batch = token_batch(rows=1, length=20)
    return compare(step_grads(setup, batch), reference_grads(setup, batch))


@case("packing-cache-cross-attention", LORA.replace(packing=True, use_cache=True))
def packed_forward(setup: Combination, ctx: Context) -> Observation:
    """two samples packed in one row with restarting position ids, logits compared with separate forwards"""
    model = with_adapters(tiny_llama(use_cache=setup.use_cache), setup)
    a, b = token_batch(seed=4, rows=1, length=10)["input_ids"], token_batch(seed=5, rows=1, length=12)["input_ids"]
    positions = torch.cat([torch.arange(10), torch.arange(12)]).unsqueeze(0)
    with torch.no_grad():
        packed = model(input_ids=torch.cat([a, b], 1), position_ids=positions, use_cache=setup.use_cache).logits
        separate = torch.cat([model(input_ids=a, use_cache=False).logits, model(input_ids=b, use_cache=False).logits], 1)
    diff = float((packed - separate).abs().max())
    if diff > 1e-4:
        return Observation("wrong", f"no error raised, but packed logits differ from per-sample logits by {diff:.3g}: "
                                    "the second sample attends to the first")
    return Observation("ok", f"packed logits equal per-sample logits (max difference {diff:.1e})")


@case("no-adapter-matched", LORA.replace(matched_modules=0))
def mismatched_targets(setup: Combination, ctx: Context) -> Observation:
    """LoRA with OPT's module names (fc1, fc2) on a Llama, then one step"""
    model = with_adapters(tiny_llama(), setup)  # PEFT raises here on current versions
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if trainable == 0:
        return Observation("wrong", "no error raised, but 0 trainable parameters")
    return Observation("ok", f"{trainable} trainable parameters")


@case("lora-no-default-targets", LORA.replace(no_default_targets=True))
def default_targets(setup: Combination, ctx: Context) -> Observation:
    """LoRA with no target_modules on a tiny Phi-3 (a model type PEFT's default-target table does not list)"""
    from peft import LoraConfig, get_peft_model
    from transformers import Phi3Config, Phi3ForCausalLM

    torch.manual_seed(0)
    cfg = Phi3Config(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0)
    model = get_peft_model(Phi3ForCausalLM(cfg) if setup.no_default_targets else tiny_llama(),
                           LoraConfig(r=4, lora_alpha=8))  # PEFT raises here for phi3
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return Observation("ok" if trainable else "wrong", f"{trainable} trainable parameters")


@case("tied-embedding-adapter", LORA.replace(tied_embeddings=True, lm_head_trainable=True))
def tied_save_reload(setup: Combination, ctx: Context) -> Observation:
    """tied-embedding Llama with a trained lm_head copy (modules_to_save), reloaded as an adapter and as a merged
    export"""
    from peft import PeftModel

    model = with_adapters(tiny_llama(tie=True), setup, modules_to_save=["lm_head"],
                          ensure_weight_tying=setup.weight_tying_enforced)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.requires_grad and "lm_head" in name:
                p.add_(torch.randn_like(p))  # stands in for training: the trained head differs from the base
    batch = token_batch()
    model.eval()
    with torch.no_grad():
        before = model(input_ids=batch["input_ids"]).logits
    model.save_pretrained(f"{ctx.workdir}/adapter")  # the adapter path
    reloaded = PeftModel.from_pretrained(tiny_llama(tie=True), f"{ctx.workdir}/adapter").eval()
    model.merge_and_unload().save_pretrained(f"{ctx.workdir}/merged")  # the export path
    merged = type(tiny_llama()).from_pretrained(f"{ctx.workdir}/merged").eval()
    with torch.no_grad():
        after = reloaded(input_ids=batch["input_ids"]).logits
        exported = merged(input_ids=batch["input_ids"]).logits
    diff = max(float((before - after).abs().max()), float((before - exported).abs().max()))
    if diff > 1e-4:
        return Observation("wrong", f"no error raised, but the reloaded model's logits differ by {diff:.3g}: the "
                                    "trained lm_head was lost on reload")
    return Observation("ok", f"reloaded logits equal the trained model's (max difference {diff:.1e})")


@case("checkpointing-off-in-eval", LORA.replace(checkpointing="all", reentrant=False,
                                                train_mode_at_backward=False))
def eval_mode_saved_bytes(setup: Combination, ctx: Context) -> Observation:
    """bytes saved for backward by a checkpointed 2-layer Llama, in the Combination's mode vs without checkpointing"""
    def saved_bytes(s: Combination) -> int:
        model = with_adapters(tiny_llama(use_cache=False), s)
        checkpoint_as_setup(model, s)
        model.train(s.train_mode_at_backward)
        total = 0

        def pack(t):
            nonlocal total
            total += t.numel() * t.element_size()
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = model(**token_batch(rows=2, length=32), use_cache=False).loss
        loss.backward()
        return total

    plain = saved_bytes(setup.replace(checkpointing="off", train_mode_at_backward=True))
    actual = saved_bytes(setup)
    if actual >= plain:
        return Observation("wrong", f"no error raised, but checkpointing saved nothing: {actual} bytes kept for "
                                    f"backward vs {plain} without checkpointing (the layers skip it in eval mode)")
    return Observation("ok", f"{actual} bytes kept for backward vs {plain} without checkpointing")


@case("fp16-trainable-unscale", LORA.replace(precision="fp16"))
def fp16_scaler_step(setup: Combination, ctx: Context) -> Observation:
    """LoRA step with a GradScaler, adapters stored in the Combination's dtype (fp16 storage vs fp32 under fp16
    autocast)"""
    pure = setup.precision == "fp16"
    model = with_adapters(tiny_llama(dtype=torch.float16), setup, autocast_adapter_dtype=not pure)
    if pure:
        for p in model.parameters():
            p.data = p.data.half()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    with torch.autocast("cpu", dtype=torch.float16, enabled=not pure):
        loss = model(**token_batch(length=8)).loss
    scaler.scale(loss.float()).backward()
    scaler.unscale_(optimizer)  # what clip_grad_norm_ does first in every trainer
    scaler.step(optimizer)
    scaler.update()
    return Observation("ok", f"scaled step done; trainable dtype {trainable[0].dtype}")


@case("adapter-loaded-frozen", LORA.replace(adapter_loaded_frozen=True))
def resume_saved_adapter(setup: Combination, ctx: Context) -> Observation:
    """a LoRA adapter saved, then loaded with PeftModel.from_pretrained (is_trainable as the Combination says) to
    continue training: one step, adapter gradients compared with the same step on the freshly built adapter"""
    from peft import PeftModel

    trained = with_adapters(tiny_llama(), setup)
    trained.save_pretrained(f"{ctx.workdir}/adapter")
    resumed = PeftModel.from_pretrained(tiny_llama(), f"{ctx.workdir}/adapter",
                                        is_trainable=not setup.adapter_loaded_frozen)
    trainable = sum(p.numel() for p in resumed.parameters() if p.requires_grad)
    batch = token_batch()
    resumed(**batch).loss.backward()  # raises `element 0 of tensors does not require grad` with nothing trainable
    if trainable == 0:
        return Observation("wrong", "no error raised, but 0 trainable parameters after loading the adapter")
    trained(**batch).loss.backward()
    return compare(adapter_grads(resumed), adapter_grads(trained))


@case("adapter-state-dict-patched", LORA.replace(state_dict_patched=True))
def patched_state_dict_save(setup: Combination, ctx: Context) -> Observation:
    """a LoRA model saved with save_pretrained after alpaca-lora's patch of model.state_dict (state_dict_patched) or
    without it, then the saved adapter loaded into a fresh model: its tensors counted and compared with the trained
    ones"""
    from peft import PeftModel, get_peft_model_state_dict

    model = with_adapters(tiny_llama(), setup)
    trained = {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}
    if setup.state_dict_patched:  # alpaca-lora finetune.py, verbatim in substance
        old_state_dict = model.state_dict
        model.state_dict = (lambda self, *_, **__: get_peft_model_state_dict(self, old_state_dict())).__get__(
            model, type(model))
    model.save_pretrained(f"{ctx.workdir}/adapter")
    reloaded = PeftModel.from_pretrained(tiny_llama(), f"{ctx.workdir}/adapter")
    restored = get_peft_model_state_dict(reloaded)
    differ = [k for k, v in trained.items() if k not in restored or not torch.equal(v, restored[k])]
    if differ:
        return Observation("wrong", f"no error raised, but {len(differ)} of {len(trained)} adapter tensors did not "
                                    f"come back from the saved adapter (e.g. {differ[0]}): it was saved empty")
    return Observation("ok", f"all {len(trained)} adapter tensors saved and reloaded unchanged")
