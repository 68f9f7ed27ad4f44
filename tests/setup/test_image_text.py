"""Image-text models in one process: the plan finds each family's towers and counts their layers apart; per-tower
training and checkpointing give the gradients of the unoptimised reference; the blank image changes nothing; the
saved adapter (with the towers trained in full) reloads with PEFT and gives the trained model's outputs; and the
first-step guard names a step without an image as such."""

from __future__ import annotations

import logging

import pytest
import torch
from conftest import make_config
from image_text import build_image_text, write_colour_data

from loraflow.environment import detect_environment
from loraflow.errors import DataError
from loraflow.plan import resolve
from loraflow.setup import build_model
from loraflow.setup.checkpointing import checkpointed_layers, vision_layers

# Families built from their configs only, for the plan- and model-level checks below (their processors and the whole
# pipeline are the composition sweep's: loraflow.verify.sweep_vision). LLaVA and Idefics3 go through it here too.
TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128)
CONFIG_ONLY = {
    "qwen2_vl": dict(vision_config=dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2,
                                        patch_size=4, spatial_merge_size=2, temporal_patch_size=2, in_chans=3),
                     text_config={**TEXT, "rope_scaling": {"type": "mrope", "mrope_section": [2, 2, 4]}},
                     image_token_id=100, video_token_id=101, vision_start_token_id=102),
    "gemma3": dict(vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=2, image_size=32, patch_size=8),
                   text_config={**TEXT, "head_dim": 16}, image_token_id=100, mm_tokens_per_image=4),
}


@pytest.fixture(scope="module")
def families(tmp_path_factory) -> dict:
    from transformers import AutoConfig, AutoModelForImageTextToText

    root = tmp_path_factory.mktemp("image-text")
    out = {f: build_image_text(root / f, f) for f in ("llava", "idefics3")}
    for name, kw in CONFIG_ONLY.items():
        torch.manual_seed(0)
        model = AutoModelForImageTextToText.from_config(AutoConfig.for_model(name, **kw))
        with torch.no_grad():  # Gemma3 initialises its projection to zeros, which would cut the vision side off
            for p in model.parameters():
                if p.dim() >= 2 and not p.any():
                    p.normal_(0, 0.02)
        model.save_pretrained(root / name)
        out[name] = root / name
    out["data"] = write_colour_data(root / "data", 12, 0, text_only_every=3)
    out["text-only"] = write_colour_data(root / "data", 4, 5, text_only_every=1)
    return out


def _plan(families, family: str, *overrides: str):
    config = make_config(families[family], f"data.train={families['data']}", *overrides)
    return resolve(config, detect_environment())


TOWERS = {  # family -> (vision root, projector root, vision layers)
    "llava": ("model.vision_tower", "model.multi_modal_projector", 3),
    "idefics3": ("model.vision_model", "model.connector", 2),
    "qwen2_vl": ("model.visual", "model.visual.merger", 2),
    "gemma3": ("model.vision_tower", "model.multi_modal_projector", 2),
}


@pytest.mark.parametrize("family", list(TOWERS))
def test_the_plan_finds_the_towers_and_checkpoints_each_as_planned(families, family):
    """Four families, each naming its towers its own way; checkpointing counts the language model's layers apart
    from the vision encoder's (it used to count them together: `checkpointing applied to layers [0, 1, 2, 3], but
    the plan says [0, 1]` on Gemma3), and the built model recomputes exactly where the plan says."""
    vision, projector, layers = TOWERS[family]
    plan = _plan(families, family, "checkpointing.enabled=true", "towers.vision.train=full",
                 "towers.projector.train=full")
    towers = {t.name: t for t in plan.towers}
    assert towers["vision"].roots == [vision] and towers["projector"].roots == [projector]
    assert towers["vision"].layers == layers and towers["language"].layers == plan.model.num_layers == 2
    assert plan.checkpoint_layers == [0, 1] and plan.vision_checkpoint_layers == list(range(layers))
    # The adapters stay in the language model: all-linear is matched inside the adapted tower only.
    assert plan.model.adapter_modules and all("language_model" in n or "text_model" in n
                                              for n in plan.model.adapter_modules)
    model = build_model(plan)
    assert checkpointed_layers(model) == [0, 1]
    recomputing = [i for i, m in enumerate(vision_layers(model)) if getattr(m, "gradient_checkpointing", False)]
    assert recomputing == plan.vision_checkpoint_layers
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert any(vision.split(".")[-1] in n for n in trainable) and any("lora_" in n for n in trainable)
    # LLaVA reads the second-to-last vision layer: the last one and the final norm never run, so stay frozen.
    if family == "llava":
        assert not any(".layers.2." in n or "post_layernorm" in n for n in trainable if "vision" in n)


def _image_batch(family: str, tokens: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(1)
    ids = torch.cat([torch.randint(3, 90, (2, 3)), torch.full((2, tokens), 100), torch.randint(3, 90, (2, 8))], 1)
    labels = ids.clone()
    labels[:, : 3 + tokens] = -100
    batch = {"input_ids": ids, "labels": labels, "attention_mask": torch.ones_like(ids)}
    if family == "qwen2_vl":  # 8 x 8 patches of 4 px, merged 2 x 2: 16 tokens per image
        batch.update(pixel_values=torch.randn(2 * 64, 3 * 2 * 4 * 4), image_grid_thw=torch.tensor([[1, 8, 8]] * 2),
                     mm_token_type_ids=(ids == 100).long())
    else:
        batch.update(pixel_values=torch.randn(2, 3, 32, 32), token_type_ids=(ids == 100).long())
    return batch


def _grads(families, family: str, *overrides: str) -> dict[str, torch.Tensor]:
    from loraflow.losses.logprobs import learned_logps
    from loraflow.losses import sft_loss_from_logps

    plan = _plan(families, family, "towers.vision.train=adapter", "towers.vision.rank=4",
                 "towers.projector.train=full", *overrides)
    torch.manual_seed(0)
    model = build_model(plan)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():  # LoRA B starts at zero, which would hide lora_A's gradient
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    model.train()
    batch = _image_batch(family, 16 if family == "qwen2_vl" else 4)
    sft_loss_from_logps(learned_logps(model, batch, plan.logits)[0], 16).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("family", ["qwen2_vl", "gemma3"])
def test_vision_adapters_and_checkpointing_match_the_reference(families, family):
    """Adapters in the vision encoder (own rank), the projector in full, LoRA on the language model; every tower
    checkpointed, reentrant (with the input-grad hook transformers 5 puts on each sub-model) or not: one step's
    gradients equal those of the run without checkpointing, every trainable tensor reached."""
    reference = _grads(families, family)
    assert all(g.abs().sum() > 0 for g in reference.values())
    for reentrant in ("true", "false"):
        got = _grads(families, family, "checkpointing.enabled=true", f"checkpointing.reentrant={reentrant}")
        assert got.keys() == reference.keys()
        worst = max(float((got[n] - g).norm() / g.norm()) for n, g in reference.items())
        assert worst <= 1e-6, (reentrant, worst)


def test_the_blank_image_changes_no_loss_and_no_gradient(families):
    """A micro-batch without an image gets a blank one on multi-rank runs: its row has no label, so the loss and
    every gradient are those of the batch without it; the vision encoder's are exactly zero."""
    from transformers import AutoProcessor

    from loraflow.data import load_sft
    from loraflow.data.batching import collate
    from loraflow.data.blank_images import blank_image_collate
    from loraflow.data.multimodal import blank_row
    from loraflow.losses.logprobs import learned_logps
    from loraflow.losses import sft_loss_from_logps

    plan = _plan(families, "llava", "towers.vision.train=full", "towers.projector.train=full")
    processor = AutoProcessor.from_pretrained(families["llava"])
    train, _ = load_sft(plan.config, processor.tokenizer, processor)
    text_rows = [r for r in train.rows if not r.images][:2]
    pad = processor.tokenizer.pad_token_id
    plain = collate(text_rows, pad)
    padded = blank_image_collate(collate, blank_row(processor), pad)(text_rows, pad)  # as the SFT stage batches
    assert "pixel_values" in padded and padded["input_ids"].shape[0] == 3

    def step(batch):
        torch.manual_seed(0)
        model = build_model(plan)
        model.train()
        loss = sft_loss_from_logps(learned_logps(model, batch, plan.logits)[0], 10)
        loss.backward()
        return float(loss), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}

    loss, grads = step(plain)
    blank_loss, blank_grads = step(padded)
    assert blank_loss == loss
    for name, g in blank_grads.items():
        if grads[name] is None:  # the vision side did not run without an image
            assert "vision_tower" in name or "projector" in name, name
            assert not g.any(), name
        else:
            assert float((g - grads[name]).norm()) <= 1e-6 * float(grads[name].norm().clamp_min(1e-12)), name


def test_trained_towers_and_adapters_reload_with_peft(families, tmp_path):
    """MiniCPM-V's setup (LoRA on the language model, vision encoder and projector trained in full), through the
    run `loraflow train` builds: the exported adapter holds the towers, PeftModel.from_pretrained on the untouched
    base gives the trained model's outputs, and the processor is saved beside it."""
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from loraflow.data.batching import collate
    from loraflow.run.pipeline import build_run

    config = make_config(families["llava"], f"data.train={families['data']}", f"output.dir={tmp_path / 'run'}",
                         "towers.vision.train=full", "towers.projector.train=full", "checkpointing.enabled=true",
                         "train.max_steps=3", "train.micro_batch_size=4", "train.learning_rate=1e-2")
    (tmp_path / "run").mkdir()
    run = build_run(config, detect_environment(), tmp_path / "run")
    run.fit()
    adapter = tmp_path / "run" / "adapter"
    saved = load_file(adapter / "adapter_model.safetensors")
    assert any("vision_tower" in k for k in saved) and any("multi_modal_projector" in k for k in saved)
    assert (adapter / "processor_config.json").is_file()
    batch = collate([r for r in run.train.rows if r.images][:3], run.tokenizer.pad_token_id)
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    trained = run.trainer.model.eval()
    with torch.no_grad():
        want = trained(**inputs).logits
        base = AutoModelForImageTextToText.from_pretrained(families["llava"])
        untouched = base(**inputs).logits
        reloaded = PeftModel.from_pretrained(base, adapter).eval()
        got = reloaded(**inputs).logits
    assert float((want - untouched).abs().max()) > 1e-3  # training changed the outputs
    assert float((got - want).abs().max()) <= 1e-5
    assert AutoProcessor.from_pretrained(adapter).image_processor is not None


def test_a_first_step_without_an_image_is_named_not_blamed(families, caplog):
    """Adapters in the vision encoder and a first step of text-only samples: the vision side gets no gradient by
    design. Told the step held no image, the guard says so and lets the run go on; without that knowledge it
    stops, and names no rule whose conditions do not hold (it used to blame cache-during-recompute with
    checkpointing off)."""
    from transformers import AutoProcessor

    from loraflow.data import load_sft
    from loraflow.data.batching import collate
    from loraflow.errors import GuardError
    from loraflow.loop.guards import check_first_gradients
    from loraflow.losses.logprobs import learned_logps
    from loraflow.losses import sft_loss_from_logps

    plan = _plan(families, "llava", "towers.vision.train=adapter")
    processor = AutoProcessor.from_pretrained(families["llava"])
    train, _ = load_sft(plan.config, processor.tokenizer, processor)
    batch = collate([r for r in train.rows if not r.images][:2], processor.tokenizer.pad_token_id)
    model = build_model(plan)
    model.train()
    sft_loss_from_logps(learned_logps(model, batch, plan.logits)[0], 4).backward()
    with caplog.at_level(logging.INFO, logger="loraflow"):
        check_first_gradients(model, plan, images=0)
    assert "held no image" in caplog.text
    with pytest.raises(GuardError) as stopped:
        check_first_gradients(model, plan)
    assert "cache-during-recompute" not in str(stopped.value) and "vision_tower" in str(stopped.value)


def test_towers_that_train_on_data_without_images_are_refused(families):
    config = make_config(families["llava"], f"data.train={families['text-only']}", "towers.vision.train=full")
    plan = resolve(config, detect_environment())
    from loraflow.setup.inputs import tokenizer_and_data

    with pytest.raises(DataError, match="towers.vision.train=full"):
        tokenizer_and_data(plan)


def test_dpo_pairs_with_images_train_as_the_reference(families, tmp_path):
    """Preference pairs whose prompt holds an image: the first DPO step starts at -log sigmoid(0) (the policy is
    its reference) and, with every tower checkpointed, has the gradients of the run without checkpointing."""
    import json

    from loraflow.run.pipeline import build_run

    pairs = families["data"].parent / "pairs.jsonl"  # beside the images its paths name
    with pairs.open("w") as fh:
        for line in families["data"].read_text().splitlines():
            user, answer = json.loads(line)["messages"]
            if isinstance(user["content"], str):
                continue
            right = answer["content"][0]["text"]
            fh.write(json.dumps({"prompt": [user], "chosen": [{"role": "assistant", "content": right}],
                                 "rejected": [{"role": "assistant", "content": "purple" + right}]}) + "\n")

    def first_step(*extra: str):
        out = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        out.mkdir()
        config = make_config(families["llava"], "stage=dpo", f"data.train={pairs}", f"output.dir={out}",
                             "towers.vision.train=adapter", "towers.projector.train=full", "train.max_steps=1",
                             "train.micro_batch_size=4", *extra)
        trainer = build_run(config, detect_environment(), out).trainer
        stats = trainer.accumulate()
        return stats["loss"], {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.requires_grad}

    loss, grads = first_step()
    assert abs(loss - 0.693147) < 1e-4
    ckpt_loss, ckpt_grads = first_step("checkpointing.enabled=true")
    assert ckpt_loss == pytest.approx(loss, abs=1e-6)
    assert any("vision_tower" in n for n in grads)
    for name, g in grads.items():
        assert float((ckpt_grads[name] - g).norm()) <= 1e-5 * float(g.norm().clamp_min(1e-12)), name


@pytest.mark.parametrize("family", ["llava", "idefics3"])
def test_bf16_mixed_with_a_vision_tower_trained_in_full_trains_on_the_cpu(families, tmp_path, family):
    """The encoder's unread modules (LLaVA's last layer and post_layernorm) stay frozen but still run on the trained
    tower's fp32 activations: kept in bf16 they crashed CPU LayerNorm ("mixed dtype (CPU)") at the first step."""
    from loraflow.run.pipeline import build_run

    config = make_config(families[family], f"data.train={families['data']}", "data.eval=", "precision.mode=bf16-mixed",
                         "towers.vision.train=full", "towers.projector.train=full", "train.max_steps=1",
                         "train.micro_batch_size=4", f"output.dir={tmp_path}")
    run = build_run(config, detect_environment(), tmp_path)
    unreached = run.plan.model.unreached
    assert bool(unreached) == (family == "llava")  # Idefics3 reads its encoder's last output
    for name, p in run.model.named_parameters():
        if any(f".{u}." in f".{name}" for u in unreached):
            assert p.dtype == torch.float32 and not p.requires_grad, name
    stats = run.trainer.optimizer_step(None)
    assert stats["loss"] == stats["loss"] and stats["loss"] > 0  # a finite loss: the step ran


def test_mllama_batches_rows_with_and_without_images_and_generates_as_one_prompt_at_a_time(tmp_path):
    """Mllama reads its images through cross-attention, with one entry per row of the micro-batch: pixel_values,
    aspect ratios and the per-token cross_attention_mask of rows of different lengths, text-only rows among them,
    are padded to the micro-batch (they crashed collate as "a bug"), and left-padded batched generation gives
    each prompt's own completion."""
    from loraflow.loop.evaluate import exact_match
    from loraflow.run.pipeline import build_run

    model = build_image_text(tmp_path / "mllama", "mllama")
    data = write_colour_data(tmp_path / "data", n=12, seed=1, text_only_every=3)
    config = make_config(model, "train.micro_batch_size=3", "train.max_steps=1", f"output.dir={tmp_path / 'run'}",
                         data=(data, data))
    run = build_run(config, detect_environment(), tmp_path / "run")
    stats = run.trainer.accumulate()
    assert torch.isfinite(torch.tensor(stats["loss"]))
    run.trainer.apply_update()
    prompts = run.eval.prompts[:6]
    assert sum(bool(getattr(p, "images", None)) for p in prompts) not in (0, len(prompts))  # both kinds
    alone, batched = (exact_match(run.trainer.engine.module, run.tokenizer, prompts, 5, n, "cpu").examples
                      for n in (1, 6))
    assert alone == batched


def test_paligemma_learns_the_answer_of_a_chat_whose_processor_appends_a_newline(tmp_path):
    """PaliGemma's processor puts BOS after the image tokens and appends a newline to every text it encodes, so
    the first turns' encoding is no prefix of the whole conversation's (refused before as a chat template that
    "rewrites earlier turns"). The answer is found, its tokens are the only learned ones, the eval prompt ends where
    the answer begins, and a step trains."""
    import json

    from transformers import AutoProcessor

    from loraflow.data.multimodal import eval_prompt, tokenize_chat
    from loraflow.data.readers import Record
    from loraflow.run.pipeline import build_run

    model = build_image_text(tmp_path / "paligemma", "paligemma")
    data = write_colour_data(tmp_path / "data", n=6, seed=0)
    processor = AutoProcessor.from_pretrained(model)
    record = json.loads(data.read_text().splitlines()[0])
    answer = record["messages"][-1]["content"][0]["text"]
    row = tokenize_chat(record["messages"], processor, Record(record, "line 1", str(data.parent)))
    learned = processor.tokenizer.decode([t for t, label in zip(row.input_ids, row.labels) if label != -100])
    assert learned == f"{answer}<|end|>\n"
    prompt = eval_prompt(Record(record, "line 1", str(data.parent)), "auto", processor)
    assert processor.tokenizer.decode(prompt.prompt_ids).endswith("<|assistant|>")
    run = build_run(make_config(model, "train.micro_batch_size=3", "train.max_steps=1",
                                f"output.dir={tmp_path / 'run'}", data=(data, data)),
                    detect_environment(), tmp_path / "run")
    assert torch.isfinite(torch.tensor(run.trainer.accumulate()["loss"]))
