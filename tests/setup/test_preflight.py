"""`check` predicts what setup would hit (issue 15): each setup failure that needs no weights (model class, attention
implementation, adapter targets, merge adapters, tokenizer against embeddings, data format) is refused by
`loraflow check` with the key and the fix, and `loraflow train` stops with the same error, not a crash reported as a
bug. Where the plan now decides instead (attention), `train` trains."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from conftest import TOKENIZER_FILES, write_jsonl

from loraflow.commands.cli import main
from loraflow.run.config import demo_config
from loraflow.locations import ASSETS

STAGES = ("sft", "rm", "dpo", "grpo", "ppo")


def _save(model_or_config, path: Path) -> Path:
    model_or_config.save_pretrained(path)
    for name in TOKENIZER_FILES:
        shutil.copy(ASSETS / "tiny-base" / name, path / name)
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """Tiny models of the architectures that used to crash setup, saved with the bundled tokenizer (88 tokens)."""
    from transformers import (BertConfig, BertModel, Gemma2Config, Gemma2ForCausalLM, LlamaConfig, LlamaForCausalLM,
                              LlavaConfig)

    root = tmp_path_factory.mktemp("preflight-models")
    torch.manual_seed(0)
    ids = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return {
        # Gemma2 refuses SDPA in transformers 5 (attention softcapping).
        "gemma2": _save(Gemma2ForCausalLM(Gemma2Config(vocab_size=96, hidden_size=32, intermediate_size=64,
                                                       num_hidden_layers=2, num_attention_heads=2,
                                                       num_key_value_heads=1, head_dim=16, **ids)), root / "gemma2"),
        "bert": _save(BertModel(BertConfig(vocab_size=96, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                           intermediate_size=64)), root / "bert"),
        # A vision-language config: only config.json is read, so no weights are needed.
        "llava": _save(LlavaConfig(), root / "llava"),
        "small-vocab": _save(LlamaForCausalLM(LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64,
                                                          num_hidden_layers=1, num_attention_heads=2, **ids)),
                             root / "small-vocab"),
    }


def _config(tmp_path: Path, model: Path, extra: str = "", train: str = "builtin:reverse/train.jsonl") -> str:
    path = tmp_path / "run.yaml"
    path.write_text(f"stage: sft\nmodel:\n  path: {model}\n{extra}data:\n  train: {train}\n  max_length: 64\n"
                    "train:\n  max_steps: 1\n  micro_batch_size: 2\noutput:\n  progress_bar: false\n"
                    "  tensorboard: false\n")
    return str(path)


def _check(capsys, *args: str) -> tuple[int, str]:
    code = main(["check", *args])
    out = capsys.readouterr()
    return code, out.out + out.err


def _train(capsys, tmp_path: Path, config: str, *args: str, stage: str = "sft") -> tuple[int, str]:
    code = main(["train", stage, config, f"output.dir={tmp_path / 'run'}", *args])
    out = capsys.readouterr()
    return code, out.out + out.err


def _refused_by_both(capsys, tmp_path, config: str, *needles: str, args: tuple[str, ...] = (),
                     stage: str = "sft") -> None:
    """check and train both exit 2 with the clear error (no traceback, no 'a bug' line)."""
    for code, text in (_check(capsys, config, f"stage={stage}", *args), _train(capsys, tmp_path, config, *args,
                                                                                stage=stage)):
        assert code == 2, text
        assert "a bug" not in text and "Traceback" not in text, text
        for needle in needles:
            assert needle in text, text


def test_attention_auto_picks_eager_for_gemma2_and_trains(models, tmp_path, capsys):
    config = _config(tmp_path, models["gemma2"])
    code, text = _check(capsys, config)
    assert code == 0, text
    assert "attention        eager" in text and "does not support SDPA" in text
    code, text = _train(capsys, tmp_path, config)
    assert code == 0, text
    assert "trained 1 steps" in text


def test_explicit_attention_the_architecture_refuses(models, tmp_path, capsys):
    config = _config(tmp_path, models["gemma2"])
    _refused_by_both(capsys, tmp_path, config, "model.attn_implementation=sdpa", "Gemma2ForCausalLM",
                     "model.attn_implementation=auto", args=("model.attn_implementation=sdpa",))


def test_attention_auto_keeps_sdpa_where_supported(tiny_model, tmp_path, capsys):
    code, text = _check(capsys, _config(tmp_path, tiny_model))
    assert code == 0 and "attention        sdpa" in text, text


def test_merge_adapter_for_another_base(tiny_model, tmp_path, capsys):
    # The demo's adapter was trained on builtin:tiny-base (128 wide); the tiny Llama here is 64 wide.
    config = _config(tmp_path, tiny_model, "  merge_adapters: [builtin:reverse-sft-weak]\n")
    _refused_by_both(capsys, tmp_path, config, "model.merge_adapters: builtin:reverse-sft-weak does not fit",
                     "in the adapter", "Remove it from model.merge_adapters")


def test_merge_adapter_that_fits_is_accepted(tmp_path, capsys):
    config = _config(tmp_path, "builtin:tiny-base", "  merge_adapters: [builtin:reverse-sft-weak]\n")
    code, text = _check(capsys, config)
    assert code == 0 and "merge_adapters   builtin:reverse-sft-weak" in text, text


def test_target_modules_matching_nothing_lists_the_linear_modules(tiny_model, tmp_path, capsys):
    config = _config(tmp_path, tiny_model)
    _refused_by_both(capsys, tmp_path, config, "adapter.target_modules=c_attn matches nothing", "q_proj, up_proj",
                     args=("adapter.target_modules=[c_attn]",))


def test_train_modules_matching_nothing_lists_the_modules(tiny_model, tmp_path, capsys):
    config = _config(tmp_path, tiny_model)
    _refused_by_both(capsys, tmp_path, config, "adapter.train_modules: `c_proj` matches no module", "q_proj",
                     args=("adapter.train_modules=[c_proj]",))


def test_tokenizer_larger_than_the_embedding(models, tmp_path, capsys):
    config = _config(tmp_path, models["small-vocab"])
    _refused_by_both(capsys, tmp_path, config, "model.tokenizer=builtin:tiny-base has 88 tokens", "embedding has 40",
                     args=("model.tokenizer=builtin:tiny-base",))


def test_encoder_only_model(models, tmp_path, capsys):
    config = _config(tmp_path, models["bert"])
    _refused_by_both(capsys, tmp_path, config, f"model.path={models['bert']}", "is an encoder", "decoder-only")


def test_image_text_model_as_a_reward_model(models, tmp_path, capsys):
    """An image-text model loads for sft and dpo; a score head on it is refused, naming the stage."""
    config = _config(tmp_path, models["llava"])
    _refused_by_both(capsys, tmp_path, config, f"model.path={models['llava']}", "is an image-text model",
                     "stage rm", stage="rm")


def test_malformed_record_is_reported_by_check_too(tiny_model, tmp_path, capsys):
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"messages": [{"role": "user", "content": "hi"},
                                                             {"role": "assistant", "content": "ih"}]},
                                               {"question": "no format here"}])
    config = _config(tmp_path, tiny_model, train=str(bad))
    _refused_by_both(capsys, tmp_path, config, "bad.jsonl line 2")


def test_check_without_the_model_says_so_and_plans(tmp_path, capsys, monkeypatch):
    import huggingface_hub.constants

    # No network and nothing cached: the hub cannot answer. check must carry on with the plan.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    code, text = _check(capsys, _config(tmp_path, "nobody-here/no-such-model"))
    assert code == 0, text
    assert "could not look at model.path=nobody-here/no-such-model" in text and "loraflow plan" in text


@pytest.mark.parametrize("stage", STAGES)
def test_demo_configs_check_clean(stage, capsys):
    code, text = _check(capsys, str(demo_config(stage)))
    assert code == 0, text
    assert "findings: none" in text and "train data:" in text


def test_a_checkpoint_that_leaves_weights_uninitialised_is_refused(tiny_model, tmp_path, capsys):
    """transformers only reports weights a checkpoint lacks and initialises them randomly (the shipped tiny-vlm under
    transformers < 5.6 lost its whole vision encoder that way); loraflow refuses, naming model.path and the keys."""
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "broken"
    shutil.copytree(tiny_model, broken)
    weights = load_file(broken / "model.safetensors")
    dropped = [k for k in weights if "layers.1.mlp" in k]
    save_file({k: v for k, v in weights.items() if k not in dropped}, broken / "model.safetensors",
              metadata={"format": "pt"})
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "ab", "completion": "ba"}] * 4)
    code = main(["train", "sft", f"model.path={broken}", f"data.train={data}", "data.eval=", "train.max_steps=1",
                 f"output.dir={tmp_path / 'run'}", "output.progress_bar=false"])
    err = capsys.readouterr().err
    assert code == 2 and f"model.path={broken}: {len(dropped)} weights of the model are not in the checkpoint" in err
    assert "layers.1.mlp.down_proj.weight" in err and "random values" in err
    assert not (tmp_path / "run" / "adapter").exists()
    # the intact checkpoint trains
    assert main(["train", "sft", f"model.path={tiny_model}", f"data.train={data}", "data.eval=", "train.max_steps=1",
                 f"output.dir={tmp_path / 'run2'}", "output.progress_bar=false"]) == 0


def test_a_processor_whose_video_part_cannot_be_built_loads_without_it(tmp_path, caplog):
    """Qwen2-VL's processor builds a video processor that needs torchvision even for image-only training
    (transformers' ImportError begins with an empty line, which used to be all loraflow kept, followed by blame for a
    preprocessor_config.json that exists). loraflow reads images only: it loads the same processor without the video
    part, says so, and saves the checkpoint's video config beside it so a stack with torchvision loads it whole. A
    processor that fails for another reason still names it."""
    import importlib.util
    import json
    import logging

    from loraflow.config import load_config
    from loraflow.errors import ConfigError
    from loraflow.setup.processor import load_processor

    for name in TOKENIZER_FILES:
        shutil.copy(ASSETS / "tiny-base" / name, tmp_path / name)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2VLProcessor", "patch_size": 14,
        "temporal_patch_size": 2, "merge_size": 2, "min_pixels": 3136, "max_pixels": 12544}))
    (tmp_path / "video_preprocessor_config.json").write_text(json.dumps({"video_processor_type":
                                                                         "Qwen2VLVideoProcessor"}))
    with caplog.at_level(logging.INFO, logger="loraflow"):
        processor = load_processor(load_config(None, []), str(tmp_path))
    assert type(processor).__name__ == "Qwen2VLProcessor" and processor.image_processor.merge_size == 2
    if importlib.util.find_spec("torchvision") is None:
        assert "loaded without its video processor (Qwen2VLVideoProcessor requires the Torchvision" in caplog.text
    saved = tmp_path / "saved"
    processor.save_pretrained(saved)
    assert (saved / "video_preprocessor_config.json").read_text() == \
        (tmp_path / "video_preprocessor_config.json").read_text()
    assert json.loads((saved / "processor_config.json").read_text())["processor_class"] == "Qwen2VLProcessor"
    (tmp_path / "preprocessor_config.json").write_text("{not json")
    with pytest.raises(ConfigError) as err:
        load_processor(load_config(None, []), str(tmp_path))
    assert f"cannot load an image-text processor from {tmp_path}" in str(err.value)


@pytest.mark.parametrize("processor_class,package", [("PixtralProcessor", "torchvision"),
                                                     ("SmolVLMProcessor", "num2words")])
def test_a_processor_that_needs_a_missing_package_for_its_image_parts_names_it(tmp_path, processor_class, package):
    """Mistral3's Pixtral processor imports torchvision for its image part; SmolVLM's, once built without its video
    part, needs num2words: refused before the model loads, naming the package (Pixtral's raised transformers' own
    ImportError past loraflow)."""
    import importlib.util
    import json

    from loraflow.config import load_config
    from loraflow.errors import ConfigError
    from loraflow.setup.processor import load_processor

    for name in TOKENIZER_FILES:
        shutil.copy(ASSETS / "tiny-base" / name, tmp_path / name)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": processor_class.replace("Processor", "ImageProcessor"),
        "processor_class": processor_class}))
    if importlib.util.find_spec(package) is not None:  # a stack that has it gets past this point
        return
    with pytest.raises(ConfigError) as err:
        load_processor(load_config(None, []), str(tmp_path))
    assert f"transformers needs {package} to build it" in str(err.value)
