"""LLaVA's training script and its lineage: `python|deepspeed llava/train/train.py` (train_mem.py, train_xformers.py)
with HfArgumentParser flags, in haotian-liu/LLaVA and the forks and VLM repos that keep its train.py (LLaVA-NeXT,
ShareGPT4V, MoE-LLaVA, ...). When the script is here, the script reader reads its code; when it is not, these facts
of LLaVA's train.py (commit c121f04, v1.2.2.post1) are applied, with the TrainingArguments going through hf.py.

- `--bits` (default 16) 4 or 8 loads the language model with bitsandbytes and runs prepare_model_for_kbit_training.
- `--gradient_checkpointing True` adds the input-grad hook (model.enable_input_require_grads()).
- `--lora_enable True`: LoRA on every Linear of the language model (find_all_linear_names skips mm_projector,
  vision_tower and vision_resampler), and with bits 16 the whole model is cast to bf16 (`--bf16`) or fp16 (`--fp16`)
  right before get_peft_model, so the projector that trains (below) is stored in half precision.
- Images: a sample without one gets a blank image (LazySupervisedDataset), and the features are spliced into the
  embeddings before the length limit cuts them (llava_arch.py), so no image placeholder can be cut apart.
- `--vision_tower`: a CLIP tower, frozen (llava/model/multimodal_encoder/clip_encoder.py requires_grad_(False)), and
  a projector whose parameters initialize_vision_modules sets trainable again after LoRA froze them (llava_arch.py,
  "In case it is frozen by LoRA"): it trains in full.
"""

from __future__ import annotations

import re

from loraflow.frontends import hf, llava_forks
from loraflow.frontends.trainer_checkpoints import trainer_checkpoints
from loraflow.frontends.argv import Command, script_command
from loraflow.frontends.base import Framework, FrontendResult
from loraflow.frontends.common import Draft, as_bool, finish_world, int_value, one_process_ddp
from loraflow.frontends.hf_options import Opt, options_from_args

NAME = "llava"
CODE = "LLaVA llava/train/train.py"
_PROGRAM = re.compile(r"(?:^|/)llava/train/train(?:_mem|_xformers|_dpo)?\.py$")
# Flags only LLaVA's train.py and the scripts derived from it take (MobileVLM's mobilevlm/train/train_mem.py, a
# user's llava/train/train_mem_hf.py, Vision-Zephyr's): with a tower flag (--vision_tower; Video-LLaVA's
# --image_tower / --video_tower) they mark its lineage under any path.
_LINEAGE = frozenset({"mm_projector_type", "mm_vision_select_layer", "mm_use_im_start_end", "mm_use_im_patch_token",
                      "pretrain_mm_mlp_adapter", "tune_mm_mlp_adapter", "freeze_mm_mlp_adapter", "mm_patch_merge_type",
                      "mm_vision_select_feature"})
# Fields of train.py's ModelArguments, DataArguments and TrainingArguments subclass that are LLaVA's own.
OWN = frozenset("""version freeze_backbone tune_mm_mlp_adapter vision_tower mm_vision_select_layer pretrain_mm_mlp_adapter
mm_projector_type mm_use_im_start_end mm_use_im_patch_token mm_patch_merge_type mm_vision_select_feature data_path
lazy_preprocess is_multimodal image_folder image_aspect_ratio freeze_mm_mlp_adapter mpt_attn_impl model_max_length
double_quant quant_type bits lora_enable lora_r lora_alpha lora_dropout lora_weight_path lora_bias mm_projector_lr
group_by_modality_length unfreeze_mm_vision_tower mm_vision_tower_lr lora_qv_proj_only""".split())
FLAGS = {"adapter": "--lora_enable", "quantization": "--bits", "precision": "--bf16 / --fp16",
         "checkpointing": "--gradient_checkpointing", "input_grad_hook": "--gradient_checkpointing (train.py hooks)",
         "towers_trainable": "--freeze_mm_mlp_adapter", "world_size": "deepspeed --num_gpus / torchrun"}


def _given(opts: dict[str, Opt], name: str, default: str) -> tuple[str, str]:
    opt = opts.get(name)
    return (str(opt.value), opt.source) if opt is not None and opt.value is not None else (default, f"default ({CODE}: "
                                                                                             f"{name} {default})")


def _on(opts: dict[str, Opt], name: str) -> bool:
    return name in opts and as_bool(opts[name].value if opts[name].value is not None else True, opts[name].source)


def from_command(cmd: Command, versions: dict) -> FrontendResult:
    draft = Draft(NAME, versions)
    bases: list = []
    opts, _ = options_from_args(cmd, draft, bases)
    fork = llava_forks.fork_of(cmd.program, set(opts))
    mine = OWN | (fork.own if fork is not None else frozenset())
    own = {n: opts.pop(n) for n in list(opts) if n in mine}
    bits_text, bits_src = _given(own, "bits", "16")
    bits = int_value(bits_text, bits_src, "a number of bits", (4, 8, 16))
    lora = _on(own, "lora_enable")
    # train.py: `if model_args.freeze_backbone: model.model.requires_grad_(False)`; `if tune_mm_mlp_adapter:
    # model.requires_grad_(False)` and only the projector trains again.
    frozen = [own[n].source for n in ("freeze_backbone", "tune_mm_mlp_adapter") if _on(own, n)]
    code = {"use_peft": Opt(lora, f"{own['lora_enable'].source} ({CODE}: LoraConfig on find_all_linear_names + "
                                  "get_peft_model)" if lora else f"{CODE}: no --lora_enable, every weight trains" if
                            not frozen else f"{CODE}: no --lora_enable; {frozen[0]} freezes the language model, "
                                            "the rest trains in full")}
    adapter = llava_forks.adapter_option(fork, own)  # a fork whose own flags choose the adapter (TinyLLaVA)
    if adapter is not None:
        code["use_peft"], lora = adapter, bool(adapter.value)
    if bits in (4, 8):
        code[f"load_in_{bits}bit"] = Opt(True, f"{bits_src} ({CODE}: BitsAndBytesConfig, prepare_model_for_kbit_"
                                               "training)")
    code.update(llava_forks.checkpointing_default(fork, opts))
    stage = fork.stage if fork is not None and fork.stage else ("sft", f"{CODE}: LLaVATrainer")
    hf.apply(draft, {**opts, **code}, False, (stage[0], f"{cmd.program} ({stage[1]})"), cmd, bases, stage[0])
    if draft.get("checkpointing") != "off":
        draft.set("input_grad_hook", True, f"{CODE}: --gradient_checkpointing calls model.enable_input_require_grads()")
    trainer_checkpoints(draft, {n: (o.value, o.source) for n, o in opts.items()}, False)  # get_peft_model(model)
    if "resumes" in draft.unsure:  # train.py: trainer.train(resume_from_checkpoint=True) if output_dir has one
        draft.maybe("resumes", {True: "output_dir already holds a checkpoint-* folder (train.py then resumes from "
                                      "it by itself)", False: "output_dir holds no checkpoint yet"},
                    f"{CODE}: train() resumes whenever output_dir holds a checkpoint-* folder")
    _towers(draft, own)
    if frozen:
        draft.set("frozen_modules", True, f"{frozen[0]} ({CODE}: the language model's weights stay frozen)")
    _half_cast(draft, opts, lora, bits)
    draft.note(f"{cmd.program} is not here: read as {CODE} (commit c121f04), whose model setup is code, not flags"
               + (f", with what {fork.code} changes" if fork is not None else ""))
    if not _PROGRAM.search(cmd.program) and fork is None:
        draft.note(f"{cmd.program} takes LLaVA's train.py flags (--vision_tower, --mm_*): read as a script derived "
                   "from it, with its facts; what the copy changed is not seen")
    one_process_ddp(draft, cmd)
    finish_world(draft, cmd)
    draft.flag(**FLAGS)
    llava_forks.apply(draft, fork, own, lora)
    return draft.result()


def _towers(draft: Draft, own: dict[str, Opt]) -> None:
    tower = next((n for n in llava_forks.TOWER_FLAGS if n in own), None)
    if tower is None:
        return
    src = own[tower].source
    draft.set("image_text", True, f"{src} (LLaVA's CLIP tower and projector)")
    draft.set("frozen_modules", True, f"{src}: the vision tower is loaded frozen (clip_encoder.py requires_grad_(False))")
    draft.set("tower_adapters", False, f"{CODE}: find_all_linear_names skips mm_projector, vision_tower and "
              "vision_resampler")
    draft.settle("image_every_rank", True, f"{CODE}: a sample without an image gets a blank one "
                 "(LazySupervisedDataset: torch.zeros(3, H, W)), so the tower runs on every rank")
    draft.settle("image_safe_truncation", True, "llava_arch.py prepare_inputs_labels_for_multimodal splices the "
                 "image features in, then cuts the embeddings at tokenizer_model_max_length: no placeholder to "
                 "mismatch")
    if _on(own, "freeze_mm_mlp_adapter"):
        draft.set("towers_trainable", False, f"{own['freeze_mm_mlp_adapter'].source}: the projector stays frozen")
        return
    projector = "llava_arch.py initialize_vision_modules sets the projector trainable again after LoRA froze it"
    draft.set("towers_trainable", True, projector)
    draft.set("towers_full", True, f"{projector}: it trains in full")


def _half_cast(draft: Draft, opts: dict[str, Opt], lora: bool, bits: int) -> None:
    """With LoRA at 16 bits train.py casts the whole model to the run's half dtype before get_peft_model: the
    projector that trains is stored in half precision, with no float32 master copy unless DeepSpeed keeps one."""
    if not lora or bits != 16 or draft.get("engine") == "deepspeed":
        return
    for flag, dtype in (("fp16", "float16"), ("bf16", "bfloat16")):
        if _on(opts, flag):
            draft.set("precision", flag, f"{opts[flag].source} ({CODE}: model.to(torch.{dtype}) before get_peft_model; "
                      "the projector trains in that dtype)")
            return


def from_files(paths: list[str], versions: dict) -> FrontendResult:
    return from_command(script_command(paths, NAME, "deepspeed llava/train/train_mem.py ..."), versions)


def _recognise(view) -> bool:
    from loraflow.frontends import script_setup

    # The script read as code where it is here (the script reader knows what a copy changed).
    towers = view.flags & set(llava_forks.TOWER_FLAGS)
    ours = bool(_PROGRAM.search(view.program)) or (view.program.endswith(".py") and bool(towers)
                                                     and bool(view.flags & _LINEAGE))
    fork = llava_forks.fork_of(view.program, view.flags)
    ours = ours or (fork is not None and bool(fork.program) and view.program.endswith(".py"))
    return ours and script_setup.script_of(view.program) is None


FRAMEWORK = Framework(name=NAME, title="LLaVA train.py", module="llava", recognise=_recognise, flags=FLAGS,
                      log_paths=r"llava[/\\]train[/\\]|llava[/\\]model[/\\]llava_arch")
