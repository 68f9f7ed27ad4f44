"""Preflight: what setup would trip over before the first step, found without reading a weight.

`inspect_model` (setup/model.py) calls the model-side checks here on the meta-device skeleton, and both `check` and
`train` get their ModelInfo from it through `plan.resolve`, so the two cannot drift:

- the model class: a decoder-only causal LM (and, for stage rm, a sequence-classification class);
- the attention implementation the architecture supports in the installed transformers;
- model.merge_adapters whose tensor shapes (read from the safetensors header) fit the base.

The tokenizer and data checks need the tokenizer: setup/inputs.py loads both as `train` does, and `check` runs the
same code; setup.load_base checks the vocabulary again (check_vocab, here), so `train` refuses a mismatched tokenizer
whichever path loaded it.
"""

from __future__ import annotations

import copy
import inspect
import json
from pathlib import Path

import torch

from loraflow.config.schema import Config
from loraflow.errors import ConfigError
from loraflow.families import AUTO_CLASSES, auto_mapping, loads_as
from loraflow.setup.paths import quiet as _quiet
from loraflow.locations import location_of


def _first_sentence(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text.split(". ")[0].rstrip(".")


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def image_text(hf_config) -> bool:
    """An image-text-to-text model, loaded with its processor (families.loads_as)."""
    return loads_as(hf_config) == "image-text"


def model_auto_class(hf_config, head: str = "lm"):
    """The transformers auto class `head` loads this model with (families.loads_as chooses it)."""
    import transformers

    return getattr(transformers, AUTO_CLASSES[loads_as(hf_config, head)].name)


def check_model_class(config: Config, hf_config, head: str) -> None:
    """Refuse a config that transformers cannot build as a trainable causal LM or image-text model (or, for stage
    rm, as a scorer), naming model.path and what is supported, before from_pretrained fails deep inside."""
    model_type = getattr(hf_config, "model_type", "unknown")
    where = f"model.path={config.model.path} (model_type={model_type})"
    if image_text(hf_config):
        if head != "lm":
            raise ConfigError([f"{where} is an image-text model; stage {config.stage} trains a "
                               f"{'scalar score head' if head == 'score' else 'value head'} on a causal LM, which "
                               "loraflow does not build on an image-text model. Train this stage on a text-only base, "
                               "or use stage sft or dpo for this model."])
        return
    causal_class, image_text_class = AUTO_CLASSES["causal-lm"].name, AUTO_CLASSES["image-text"].name
    remote = config.model.trust_remote_code and causal_class in (getattr(hf_config, "auto_map", None) or {})
    causal = auto_mapping("causal-lm").get(model_type)
    if causal is None and not remote:
        if hasattr(hf_config, "vision_config"):
            raise ConfigError([f"{where} has a vision tower, but transformers {_transformers_version()} has no "
                               f"image-text-to-text class for it ({image_text_class}). loraflow trains "
                               "image-text models transformers can build (LLaVA, Qwen2-VL, Idefics3, Gemma3, "
                               "PaliGemma, ...); upgrade transformers or point model.path at one."])
        kind = "an encoder-decoder model" if getattr(hf_config, "is_encoder_decoder", False) else \
            "not a causal language model"
        raise ConfigError([f"{where} is {kind}: transformers {_transformers_version()} has no "
                           f"{causal_class} class for it. loraflow trains decoder-only causal LMs (Llama, "
                           "Qwen, Mistral, Gemma, GPT-2, ...); point model.path at one."])
    if causal is not None and getattr(hf_config, "is_decoder", None) is False:
        import transformers

        cls = getattr(transformers, causal, None)
        try:
            source = inspect.getsource(cls.__init__) if cls is not None else ""
        except (OSError, TypeError):  # no source shipped (a frozen or compiled install): do not guess
            source = ""
        # BERT-family classes say "as a standalone, add is_decoder=True": without it they attend both ways, so
        # every position sees the token it is trained to predict and the loss means nothing.
        if "standalone" in source and "is_decoder" in source:
            raise ConfigError([f"{where} is an encoder (its config has is_decoder=false): as a causal LM every "
                               "token would see the token it predicts. loraflow trains decoder-only causal LMs "
                               "(Llama, Qwen, Mistral, Gemma, GPT-2, ...); point model.path at one."])
    if head == "score" and not remote and model_type not in auto_mapping("score"):
        raise ConfigError([f"{where}: stage rm trains a scalar score head, and transformers "
                           f"{_transformers_version()} has no sequence-classification class for this architecture. "
                           "Train the reward model from a base model of another family."])


def build_skeleton(config: Config, hf_config):
    """The causal LM (or image-text model) on the meta device with the attention implementation the run will use.
    Returns (skeleton, attn_implementation, reason); raises ConfigError for an explicit choice the architecture
    or this machine cannot run."""
    auto_class = model_auto_class(hf_config)
    asked = config.model.attn_implementation

    def build(impl: str | None):
        with torch.device("meta"), _quiet():
            return auto_class.from_config(hf_config, trust_remote_code=config.model.trust_remote_code,
                                                    attn_implementation=impl)

    if asked != "auto":
        try:
            skeleton = build(asked)
        except (ValueError, ImportError) as exc:
            raise ConfigError([f"model.attn_implementation={asked}: {_first_sentence(exc)} (transformers "
                               f"{_transformers_version()}). Set model.attn_implementation=auto, which picks what "
                               "the architecture supports, or eager."]) from None
        return skeleton, asked, f"requested (model.attn_implementation={asked})"
    # auto: transformers' own default (SDPA where the architecture supports it, else eager), asked explicitly so
    # the plan can say which and why.
    try:
        return build("sdpa"), "sdpa", "model.attn_implementation=auto: the architecture supports PyTorch SDPA"
    except (ValueError, ImportError):
        skeleton = build("eager")
        return skeleton, "eager", (f"model.attn_implementation=auto: {type(skeleton).__name__} does not support "
                                   f"SDPA in transformers {_transformers_version()}, so its eager attention")


def _adapter_file_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Tensor shapes from the safetensors header (its first 8 bytes give the JSON header's length): no weights."""
    file = path / "adapter_model.safetensors"
    if not file.is_file():
        return {}
    try:
        with open(file, "rb") as fh:
            size = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(size))
        return {k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError([f"model.merge_adapters: {file} is not a readable safetensors file ({exc}); it may be "
                           "truncated: copy it again or retrain that adapter."]) from None


def check_merge_adapters(config: Config, skeleton: torch.nn.Module) -> list[str]:
    """Refuse a merge adapter that does not fit the base (PEFT would stop with a size mismatch after loading the
    weights). Returns notes for the plan (an adapter whose recorded base differs but whose shapes fit)."""
    from peft import PeftConfig, get_peft_model
    from peft.utils import get_peft_model_state_dict

    notes: list[str] = []
    problems: list[str] = []
    for spec in config.model.merge_adapters:
        path = Path(location_of(spec, "model.merge_adapters"))
        if not (path / "adapter_config.json").is_file():
            problems.append(f"model.merge_adapters: {spec} holds no adapter_config.json; give the `adapter` "
                            "directory of an earlier run.")
            continue
        try:
            peft_config = PeftConfig.from_pretrained(str(path))
        except Exception as exc:  # PEFT raises several types for a broken adapter_config.json
            problems.append(f"model.merge_adapters: {path / 'adapter_config.json'} cannot be read by PEFT ({exc}).")
            continue
        peft_config.task_type = None  # as merge_adapters loads it: only the body's weights matter
        recorded = peft_config.base_model_name_or_path or "?"
        made_for = f"it was trained on {recorded}"
        try:
            with _quiet():
                expected = {k: tuple(v.shape) for k, v in
                            get_peft_model_state_dict(get_peft_model(copy.deepcopy(skeleton), peft_config)).items()}
        except ValueError as exc:  # its target modules match nothing in this model
            problems.append(f"model.merge_adapters: {spec} does not fit model.path={config.model.path} "
                            f"({_first_sentence(exc)}); {made_for}. Remove it from model.merge_adapters, or set "
                            "model.path to the model it was trained on.")
            continue
        found = _adapter_file_shapes(path)
        wrong = [f"{k}: {list(s)} in the adapter, {list(expected[k])} in the model" for k, s in found.items()
                 if k in expected and expected[k] != s]
        foreign = [k for k in found if k not in expected and "lora_" in k]
        if wrong or foreign:
            detail = wrong[0] if wrong else f"{foreign[0]} has no place in this model"
            count = len(wrong) + len(foreign)
            problems.append(f"model.merge_adapters: {spec} does not fit model.path={config.model.path}: {count} "
                            f"tensor(s) differ, e.g. {detail}; {made_for}. Remove it from model.merge_adapters, "
                            "or set model.path to the model it was trained on.")
        elif recorded != "?" and not _same_model(recorded, config.model.path):
            notes.append(f"{spec} records base {recorded}, not model.path={config.model.path}; its shapes fit, so it "
                         "is merged (make sure it was trained on this model)")
    if problems:
        raise ConfigError(problems)
    return notes


def _same_model(recorded: str, spec: str) -> bool:
    """Loosely the same model: the same directory, or the same final name (a hub id and its local snapshot)."""
    try:
        here = location_of(spec, "model.path")
    except ConfigError:
        return False
    if Path(here).exists() and Path(recorded).exists():
        return Path(here).resolve() == Path(recorded).resolve()
    return Path(recorded.rstrip("/")).name == Path(here.rstrip("/")).name


def check_vocab(config: Config, tokenizer, vocab_size: int) -> None:
    """A token id at or past the embedding's size fails inside the embedding lookup (an index error on CPU, a
    device-side assert on GPU)."""
    if vocab_size and len(tokenizer) > vocab_size:
        source = f"model.tokenizer={config.model.tokenizer}" if config.model.tokenizer else \
            f"the tokenizer in model.path={config.model.path}"
        raise ConfigError([f"{source} has {len(tokenizer)} tokens but the model's embedding has {vocab_size}: a "
                           f"token id >= {vocab_size} would index past it. Use the tokenizer the model was trained "
                           "with (leave model.tokenizer empty for the model's own)."])
