"""Reproductions of the image-text rules: a tiny LLaVA (CLIP vision encoder, projector, Llama) built from its config,
run as the Combination says, on one process or two (DDP on gloo). Batches are made by hand (image placeholder
tokens and pixels), so no processor is needed."""

from __future__ import annotations

import torch

from loraflow.probes.base import Context, Observation, case
from loraflow.probes.tiny import quiet
from loraflow.rules.combination import Combination

VLM = Combination(adapter="lora", matched_modules=14, image_text=True, image_safe_truncation=True,
                  targets_all_towers=False)
IMAGE_TOKEN, TOKENS_PER_IMAGE = 90, 4  # 16 px images, 8 px patches: 4 features (CLS dropped)


def tiny_llava_config():
    from transformers import LlavaConfig

    return LlavaConfig(
        text_config=dict(model_type="llama", vocab_size=96, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2),
        vision_config=dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=2, image_size=16, patch_size=8, projection_dim=32),
        image_token_index=IMAGE_TOKEN, vision_feature_layer=-1)


def tiny_llava(seed: int = 0):
    from transformers import AutoModelForImageTextToText

    torch.manual_seed(seed)
    with quiet():
        return AutoModelForImageTextToText.from_config(tiny_llava_config())


def image_row(seed: int = 0, text: int = 8) -> tuple[list[int], dict[str, torch.Tensor]]:
    """3 prompt tokens, one image's placeholders, `text` answer tokens; and the image's pixels."""
    g = torch.Generator().manual_seed(seed)
    ids = [*torch.randint(3, 80, (3,), generator=g).tolist(), *[IMAGE_TOKEN] * TOKENS_PER_IMAGE,
           *torch.randint(3, 80, (text,), generator=g).tolist()]
    return ids, {"pixel_values": torch.randn(1, 3, 16, 16, generator=g)}


@case("vlm-wrong-auto-class", VLM.replace(causal_lm_class=True))
def auto_class(setup: Combination, ctx: Context) -> Observation:
    """a tiny LLaVA config built through AutoModelForCausalLM (the causal-LM auto class) or through the class
    loraflow's preflight picks for it"""
    import transformers

    from loraflow.setup.preflight import model_auto_class

    config = tiny_llava_config()
    auto = transformers.AutoModelForCausalLM if setup.causal_lm_class else model_auto_class(config)
    with quiet():
        model = auto.from_config(config)
    return Observation("ok", f"built {type(model).__name__} through {auto.__name__}")


@case("image-tokens-truncated", VLM.replace(image_safe_truncation=False))
def truncation(setup: Combination, ctx: Context) -> Observation:
    """a sample whose image placeholders a length limit of 5 tokens would cut, truncated by slicing (as a collator
    does) or by loraflow's data truncation; then a forward of what is left"""
    from loraflow.data.batching import Row
    from loraflow.data.multimodal import truncate_rows

    ids, images = image_row()
    limit = 5
    row = Row(ids, [-100] * 7 + ids[7:], images=images, images_end=7)
    if setup.image_safe_truncation:
        kept, stats = truncate_rows([(row, "probe line 1")], limit)
        if kept:
            return Observation("wrong", f"a row cut to {len(kept[0].input_ids)} tokens kept its image")
        return Observation("ok", f"the sample was dropped ({stats.image_cut} counted), not cut through its image")
    model = tiny_llava().eval()
    with torch.no_grad():
        model(input_ids=torch.tensor([ids[:limit]]), pixel_values=images["pixel_values"])
    return Observation("ok", "the cut sample ran")


@case("lora-targets-vision-tower", VLM.replace(targets_all_towers=True))
def targets(setup: Combination, ctx: Context) -> Observation:
    """all-linear adapter targets on a tiny LLaVA whose vision encoder is to stay frozen: PEFT's own matching over
    the whole model, or loraflow's per-tower matching (setup/adapters.py match_tower_modules)"""
    import copy

    from loraflow.config import load_config
    from loraflow.setup.adapters import match_adapter_modules, match_tower_modules
    from loraflow.setup.towers import find_towers

    model = tiny_llava()
    towers = find_towers(model)
    config = load_config(None, ["model.path=unused"])
    if setup.targets_all_towers:
        matched = match_adapter_modules(copy.deepcopy(model), config)
    else:
        matched = [n for names in match_tower_modules(model, config, towers).values() for n in names]
    inside = [n for n in matched if n.startswith(towers["vision"].roots[0] + ".")]
    if inside:
        return Observation("wrong", f"no error raised, but {len(inside)} of {len(matched)} adapters went into the "
                                    f"frozen vision encoder (e.g. {inside[0]})")
    return Observation("ok", f"{len(matched)} adapters, all in the language model")


@case("ddp-unused-vision-tower", VLM.replace(engine="ddp", world_size=2, towers_trainable=True), ranks=2)
def ddp_without_image(setup: Combination, ctx: Context) -> Observation:
    """two DDP steps of a tiny LLaVA whose vision encoder trains in full, rank 1's micro-batches text-only: as they
    come, or as loraflow runs them (a blank image in a row of its own where a batch has none, the vision modules
    the forward never runs frozen)"""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from loraflow.setup.towers import find_towers, unreached_modules

    model = tiny_llava().train()
    if setup.image_every_rank:  # loraflow's setup: what the forward never runs (CLIP's post_layernorm) stays frozen
        unreached = unreached_modules(model, model.config, find_towers(model))
        for name, p in model.named_parameters():
            if any(name.startswith(u + ".") for u in unreached):
                p.requires_grad_(False)
    model = DDP(model)
    for step in range(2):
        ids, images = image_row(seed=step)
        if ctx.rank == 1:
            ids, images = list(range(3, 3 + len(ids))), None
        rows = [ids]
        if images is None and setup.image_every_rank:
            blank, images = image_row(seed=99)
            rows.append(blank + [0] * (len(ids) - len(blank)))
        batch = torch.tensor(rows)
        labels = torch.full_like(batch, -100)
        labels[0, -8:] = batch[0, -8:]  # only the real row's answer is learned
        kwargs = {"pixel_values": images["pixel_values"]} if images else {}
        model(input_ids=batch, labels=labels, **kwargs).loss.backward()
    return Observation("ok", "two steps ran; every rank's vision encoder reduced its gradients")
