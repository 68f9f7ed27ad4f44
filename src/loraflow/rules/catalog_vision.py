"""The rules of image-text models: a vision encoder and projector beside the language model. They break memory savers
and engines in ways of their own: a tower that runs on some ranks and not others (text-only samples), parameters
that get no gradient, image tokens cut by truncation, the wrong auto class, adapter targets that reach into the
vision encoder. loraflow's setup of these models is in setup/towers.py and plan/towers.py."""

from __future__ import annotations

from loraflow.families import TOKEN_TYPES_LAST
from loraflow.rules.rule import Rule, older, register
from loraflow.rules.signs import Evidence, LogSigns, Message


def _ranks_differ(s) -> bool:
    """Several ranks, and the vision side may run on some and not on others (a micro-batch without an image)."""
    return s.image_text and s.world_size > 1 and not s.image_every_rank


register(Rule(
    id="zero3-vision-skipped",
    title="A sharded vision tower runs on some ranks and not on others",
    verdict="fix",
    impact="crash",
    conditions="an image-text model under ZeRO-3 or FSDP on several ranks, with micro-batches that hold no image on "
               "some ranks (text-only samples mixed in, or image and video batches)",
    knobs=("image_every_rank",),
    when=lambda s: _ranks_differ(s) and s.sharded_params,
    cause=("Sharded parameters are gathered by a collective when their module runs. A rank whose micro-batch has no "
           "image skips the vision encoder, so it joins the next layer's all-gather while the others wait in the "
           "vision tower's: the ranks' collectives no longer match, and the run hangs until the NCCL watchdog kills "
           "it (ZeRO-3 may first print `Invalidate trace cache`). It happens with the tower frozen too: frozen "
           "weights are sharded and gathered all the same."),
    fix=("loraflow runs the vision encoder on every rank at every micro-batch: a rank whose batch has no image "
         "feeds one blank image whose tokens are masked out of attention and loss, so the towers' collectives match "
         "and the gradients are those of the real batch."),
    remedy=lambda s: {"image_every_rank": True},
    elsewhere=("add a dummy image (zero-weighted in the loss) to micro-batches without one, as LLaMA-Factory's "
               "multimodal plugin and Qwen2-VL-Finetune do; or use ZeRO-2, or keep text-only samples out of "
               "image-text runs"),
    references=("https://github.com/2U1/Qwen-VL-Series-Finetune/issues/17",
                "https://github.com/hiyouga/LlamaFactory/issues/7157",
                "https://github.com/modelscope/ms-swift/issues/3213"),
    fixed_in="design",
    log=LogSigns(
        messages=(Message(r"Invalidate trace cache @ step \d+: expected module \d+, but got module \d+", "shared",
                          "deepspeed runtime/zero/partitioned_param_coordinator.py: the modules ran in another "
                          "order than the step before"),
                  Message(r"Watchdog caught collective operation timeout|collective operation timeout", "generic",
                          "torch ProcessGroupNCCL watchdog")),
        evidence=(Evidence("vision", 3, "a vision tower is in the model"),
                  Evidence("vlm_config", 2, "an image-text model's config is named"),
                  Evidence("rank_sizes_differ", 4, "ranks waited in collectives of different sizes: they ran "
                           "different modules", decisive=True),
                  Evidence("zero3", 2, "ZeRO-3 is in use"),
                  Evidence("fsdp", 1, "FSDP is in use"),
                  Evidence("generation", -2, "the model generates, which has its own gather rule")),
        prior=1.5,
        tells_apart="an image-text model under ZeRO-3 or FSDP, a hang (NCCL watchdog, `Invalidate trace cache`) on "
                    "a step whose batch on some rank had no image; ranks time out in collectives of different sizes"),
))

register(Rule(
    id="ddp-unused-vision-tower",
    title="Trainable vision weights get no gradient on some ranks under DDP",
    verdict="fix",
    impact="crash",
    conditions="an image-text model under DDP on several ranks without find_unused_parameters, with a vision "
               "encoder or projector that trains (in full or with adapters) and micro-batches without an image",
    knobs=("image_every_rank", "find_unused_parameters"),
    when=lambda s: _ranks_differ(s) and s.gradient_reducer and s.towers_trainable and not s.find_unused_parameters,
    cause=("DDP's reducer waits for a gradient of every trainable parameter each step. On a rank whose micro-batch "
           "has no image the vision encoder and projector do not run, their parameters get no gradient, and the "
           "next step fails with `Expected to have finished reduction in the prior iteration`, listing the vision "
           "parameters as the ones that did not receive grad. Layers the model never runs (LLaVA reads the "
           "second-to-last vision layer, so the last one is unused) do the same on every step."),
    fix=("loraflow runs the vision encoder on every rank at every micro-batch (a blank, masked image where a batch "
         "has none), and keeps the vision layers the forward never reaches frozen."),
    remedy=lambda s: {"image_every_rank": True},
    elsewhere=("pass find_unused_parameters=True (ddp_find_unused_parameters), add a dummy image to text-only "
               "batches, or freeze the vision layers the model does not use"),
    references=("https://github.com/modelscope/ms-swift/issues/1144",
                "https://github.com/QwenLM/Qwen-VL/issues/121",
                "https://github.com/hiyouga/LlamaFactory/issues/5680"),
    fixed_in="design",
    log=LogSigns(
        messages=(Message(r"Expected to have finished reduction in the prior iteration before starting a new one",
                          "shared",
                          "torch/csrc/distributed/c10d/reducer.cpp: Reducer::ensure_prior_reduction_finished"),
                  Message(r"Parameter indices which did not receive grad for rank", "shared",
                          "torch reducer.cpp (TORCH_DISTRIBUTED_DEBUG unset)")),
        evidence=(Evidence("vision", 4, "a vision tower is in the model: its weights miss the loss on text-only "
                           "batches", decisive=True),
                  Evidence("vlm_config", 2, "an image-text model's config is named"),
                  Evidence("checkpointing", -1, "checkpointing is in use (reentrant recompute is another cause)"),
                  Evidence("moe", -2, "a mixture-of-experts model: experts the router sends no token to get no "
                           "gradient under DDP (another cause)"),
                  Evidence("ddp:unused-not-vision", -8, "the reducer names the parameters without gradient, and none "
                           "is in a vision encoder or projector", excludes=True)),
        prior=1.0,
        tells_apart="the unused parameters belong to the vision encoder or projector (names with visual, "
                    "vision_tower, merger), in an image-text run with text-only samples"),
))

register(Rule(
    id="image-tokens-truncated",
    title="Truncation cuts a sample inside its image tokens",
    verdict="fix",
    impact="crash",
    conditions="an image-text model whose samples are truncated to a maximum length that falls inside an image's "
               "run of placeholder tokens",
    knobs=("image_safe_truncation",),
    when=lambda s: s.image_text and not s.image_safe_truncation,
    cause=("The processor expands each image into one placeholder token per image feature. A length limit "
           "(max_length, cutoff_len, max_seq_length) that cuts the sequence inside that run leaves fewer "
           "placeholders than the vision encoder produces features, and the model refuses: `Image features and "
           "image tokens do not match: tokens: 4096, features 36864`."),
    fix=("loraflow never cuts image tokens: a sample whose image tokens would be cut by data.max_length is dropped, "
         "counted and named in the data summary (raise data.max_length to keep it)."),
    remedy=lambda s: {"image_safe_truncation": True},
    elsewhere="raise the length limit (cutoff_len / max_length / max_seq_length) above the longest image sample, "
              "or lower the image resolution (max_pixels) so fewer tokens represent each image",
    references=("https://github.com/TIGER-AI-Lab/VLM2Vec/issues/79",
                "https://github.com/hiyouga/LlamaFactory/issues/8226"),
    fixed_in="design",
    log=LogSigns(
        messages=(Message(r"Image features and image tokens do not match", "shared",
                          "transformers modeling_<vlm>.py get_placeholder_mask (4.5x-5.x)"),
                  Message(r"Number of images does not match number of special image tokens in the input text", "shared",
                          "transformers Gemma3 / unsloth")),
        evidence=(Evidence("image-tokens:cut", 8, "fewer image placeholders than image features: a cut",
                           decisive=True),
                  Evidence("image-tokens:other", -10, "more placeholders than features: not a cut")),
        prior=1.0,
        tells_apart="the text holds fewer image tokens than there are image features (tokens < features), often a "
                    "round number equal to the length limit"),
))

register(Rule(
    id="vlm-wrong-auto-class",
    title="An image-text model loaded through the causal-LM auto class",
    verdict="fix",
    impact="crash",
    conditions="an image-text model (a vision config beside the text config) loaded with AutoModelForCausalLM",
    knobs=("causal_lm_class",),
    when=lambda s: s.image_text and s.causal_lm_class,
    cause=("transformers registers image-text models under AutoModelForImageTextToText (Vision2Seq before it), not "
           "under AutoModelForCausalLM, so loading one as a causal LM fails: `Unrecognized configuration class "
           "<...Qwen2VLConfig> for this kind of AutoModel: AutoModelForCausalLM`. Frameworks that fall back to the "
           "causal-LM class when their own mapping misses the model (an older or newer transformers than they "
           "know) hit it on export and merge as well as in training."),
    fix="loraflow loads image-text models with AutoModelForImageTextToText and their processor (setup/preflight.py).",
    remedy=lambda s: {"causal_lm_class": False},
    elsewhere="load the model with AutoModelForImageTextToText (or its own class, e.g. "
              "Qwen2VLForConditionalGeneration), and use a framework release that knows the model type for the "
              "installed transformers",
    references=("https://github.com/hiyouga/LlamaFactory/issues/5316",
                "https://github.com/huggingface/trl/issues/3868"),
    fixed_in="design",
    log=LogSigns(
        messages=(Message(r"Unrecognized configuration class .{0,300}for this kind of AutoModel: AutoModelForCausalLM",
                          "shared", "transformers models/auto/auto_factory.py: _BaseAutoModelClass.from_pretrained"),),
        # A log cut at the raise in from_pretrained, under a causal-LM load.
        frames=(Message(r"auto_factory\.py:from_pretrained$", "shared", stops=True),),
        evidence=(Evidence("vlm_config", 8, "the config class is an image-text model's", decisive=True),
                  Evidence("vision", 2, "a vision tower is in the model"),
                  Evidence("causal_lm_load", 1, "the model is loaded through AutoModelForCausalLM")),
        prior=1.0,
        tells_apart="the unrecognized config class is an image-text model's (Qwen2VLConfig, LlavaConfig, ...)"),
))

register(Rule(
    id="lora-targets-vision-tower",
    title="Adapter target names reach into the vision encoder",
    verdict="fix",
    impact="crash",
    conditions="an image-text model whose adapter targets (all-linear, or short names such as proj, qkv, fc1) are "
               "matched against the whole model rather than the tower meant to be adapted",
    knobs=("targets_all_towers",),
    when=lambda s: s.image_text and s.targets_all_towers,
    cause=("Adapter target names match by suffix anywhere in the model. On an image-text model, all-linear and "
           "short names also match the vision encoder (its attention `qkv`/`proj`, its MLP `fc1`/`fc2`) and "
           "even its patch embedding: PEFT then refuses Qwen2.5-VL's `Conv3d` patch embedding (`Target module "
           "Conv3d(3, 1280, ...) is not supported`), or puts adapters in a frozen, checkpointed tower where they get "
           "no gradient, or that text-only batches never reach."),
    fix=("loraflow matches adapter targets inside each tower on its own (towers.<name>.target_modules, else "
         "adapter.target_modules): the vision encoder gets adapters only with towers.vision.train=adapter."),
    remedy=lambda s: {"targets_all_towers": False},
    elsewhere="give the language model's module names with their path (a regex such as "
              "`.*language_model.*\\.(q_proj|v_proj)`), or the framework's option that keeps the vision tower "
              "frozen and unadapted",
    references=("https://github.com/hiyouga/LlamaFactory/issues/6938",
                "https://github.com/hiyouga/LlamaFactory/issues/5324"),
    fixed_in="design",
    log=LogSigns(
        messages=(Message(r"Target module Conv3d\(.{0,300}is not supported", "own",
                          "peft tuners/lora/model.py: _create_new_module (a Conv3d patch embedding matched)"),),
        evidence=(Evidence("vision", 2, "a vision tower is in the model"),),
        prior=1.0,
        tells_apart="PEFT refuses a Conv3d or another vision-encoder module that an adapter target name matched"),
))



def _token_types_required(s) -> bool:
    if s.model_type not in TOKEN_TYPES_LAST or not s.mm_token_types_missing:
        return False
    last = TOKEN_TYPES_LAST[s.model_type]
    return last is None or older(s, "transformers", last)


register(Rule(
    id="mm-token-types-required",
    title="An image-text model trained on batches without its token type ids",
    verdict="fix",
    impact="crash",
    conditions="transformers >= 5.0 and the image-text class of Gemma 3 (< 5.6), Gemma 4 (5.5.x), PaliGemma (< 5.9) "
               "or Molmo2 in train mode, fed batches without the token_type_ids (mm_token_type_ids) its processor "
               "makes: text-only data collated by the tokenizer (TRL's SFT/GRPO/DPO text paths, a plain collator)",
    knobs=("mm_token_types_missing",),
    affected={"transformers": ">=5.0.0"},
    boundaries={"transformers": tuple(sorted({v for v in TOKEN_TYPES_LAST.values() if v}))},
    when=_token_types_required,
    cause=("These models build the attention mask over each image's tokens from token_type_ids (1 on image "
           "tokens). From transformers 5.0 their mask builder (Molmo2: its forward) checks for them whenever the "
           "module is in train mode, not when images are given, and raises `token_type_ids is required as a model "
           "input when training` at the first step, even for a batch without any image. A text-only run of the "
           "multimodal checkpoint (gemma-3-4b and larger load as Gemma3ForConditionalGeneration) whose collator "
           "is the tokenizer's never has them; 4.x used them only when given."),
    fix="loraflow's image-text batches carry every input the family declares (families.py image_inputs), text-only "
        "rows included.",
    remedy=lambda s: {"mm_token_types_missing": False},
    elsewhere="add token_type_ids (all zeros for text-only rows) to the batches, or collate with the model's "
              "processor; for text-only training load the text class (Gemma3ForCausalLM); or transformers >= 5.6 "
              "(Gemma 3/4) or >= 5.9 (PaliGemma)",
    references=("https://github.com/NVIDIA-NeMo/Automodel/issues/1203",
                "https://github.com/huggingface/trl/issues/5032",
                "https://github.com/huggingface/trl/issues/5807", "https://github.com/unslothai/unsloth/pull/4017",
                "https://github.com/huggingface/trl/pull/5643", "https://github.com/huggingface/trl/issues/4142",
                "https://github.com/huggingface/transformers/blob/v5.0.0/src/transformers/models/gemma3/"
                "modeling_gemma3.py (create_causal_mask_mapping)"),
    fixed_in="transformers 5.6.0 (Gemma 3, Gemma 4), 5.9.0 (PaliGemma); Molmo2 not yet",
    log=LogSigns(
        messages=(Message(r"`?(mm_)?token_type_ids`? is required as a model input when training", "own",
                          "transformers models/gemma3 create_causal_mask_mapping, paligemma, gemma4, molmo2 forward"),),
        prior=1.0,
        tells_apart="the model refuses a training forward whose batch lacks the token type ids"),
))
