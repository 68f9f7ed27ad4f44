"""`loraflow check` on runs that load a trained adapter and train nothing: ms-swift's `swift export --merge_lora
true`, `swift merge-lora`, `swift infer`, and LLaMA-Factory's `llamafactory-cli export` (frontends/load_runs.py,
ms_swift_export.py, llama_factory_export.py).

Material, machine text copied verbatim:
- ms-swift examples/export/merge_lora.sh @ a2a5c15cb2da3e75d11581230e0c310d7c4f5e5b,
  examples/train/qlora/awq/merge_lora.sh @ f567d951ca92f90dbcca832e7934f988e94ed4c5,
  docs/source_en/GetStarted/Quick-start.md @ 07b6fcf3657fbf9332d5e7e6cbeeac23d53b7e43 (swift infer --merge_lora true);
- LLaMA-Factory examples/merge_lora/qwen3_lora_sft.yaml and qwen3vl_lora_sft.yaml @
  dc85995aba68a5d29cbe47951a843491c0795737, llama3_lora_sft.yaml @ 13e6173c475ba458e030473b4e9ddc3d2f8d4ac0;
- issue threads: https://github.com/modelscope/ms-swift/issues/3001 (swift infer, a text --model_type for Qwen2.5-VL),
  https://github.com/modelscope/ms-swift/issues/5144 (swift export of a LoRA into Qwen2.5-14B-Instruct),
  https://github.com/modelscope/ms-swift/issues/435 (swift merge-lora of an int4 model's adapter),
  https://github.com/modelscope/ms-swift/issues/1839 (swift export --ckpt_dir of a qwen2-72b-instruct-awq adapter).
Lines marked "variant" change one flag of a copied line to show the other side of a finding.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path

import pytest
from packaging.version import Version

from loraflow.errors import LoraflowError
from loraflow.frontends import from_command, from_files, run_check
from loraflow.frontends.load_runs import LOAD_FIELDS
from loraflow.rules.combination import Combination

CURRENT = {"torch": Version("2.13.0"), "transformers": Version("5.23.0"), "peft": Version("0.21.2"),
           "deepspeed": Version("0.19.8")}

MERGE_SH = "swift export \\\n    --adapters output/vx-xxx/checkpoint-xxx \\\n    --merge_lora true\n"
AWQ_MERGE_SH = ("swift export \\\n    --model Qwen/Qwen2.5-7B-Instruct \\\n"
                "    --adapters output/vx-xxx/checkpoint-xxx \\\n    --merge_lora true\n")
QUICK_START_INFER = ("CUDA_VISIBLE_DEVICES=0 \\\nswift infer \\\n    --adapters output/vx-xxx/checkpoint-xxx \\\n"
                     "    --stream true \\\n    --merge_lora true \\\n    --infer_backend vllm \\\n"
                     "    --max_model_len 8192\n")
ISSUE_3001 = ("CUDA_VISIBLE_DEVICES=0 swift infer --model Qwen/Qwen2.5-VL-7B-Instruct --model_type 'qwen2_5' "
              "--template 'qwen2_5' --system 'You are a helpful assistant.' ")
ISSUE_5144 = ("swift export \\\n    --model Qwen/Qwen2.5-14B-Instruct \\\n    --adapters ./exported_lora_adapter \\\n"
              "    --merge_lora true \\\n    --torch_dtype bfloat16 \\\n"
              "    --output_dir ./merged_banking_translation_model")
ISSUE_435 = "swift merge-lora --ckpt_dir 'xxx/vx_xxx/checkpoint-xxx'"
ISSUE_1839 = "swift export --ckpt_dir 'checkpoint-1168' --merge_lora true"

QWEN3_MERGE = """### Note: DO NOT use quantized model or quantization_bit when merging lora adapters

### model
model_name_or_path: Qwen/Qwen3-4B-Instruct-2507
adapter_name_or_path: saves/qwen3-4b/lora/sft
template: qwen3_nothink
trust_remote_code: true

### export
export_dir: saves/qwen3_sft_merged
export_size: 5
export_device: cpu  # choices: [cpu, auto]
export_legacy_format: false
"""
QWEN3VL_MERGE = """### Note: DO NOT use quantized model or quantization_bit when merging lora adapters

### model
model_name_or_path: Qwen/Qwen3-VL-4B-Instruct
adapter_name_or_path: saves/qwen3-vl-4b/lora/sft
template: qwen3_vl_nothink
trust_remote_code: true

### export
export_dir: saves/qwen3_vl_sft_merged
export_size: 5
export_device: cpu  # choices: [cpu, auto]
export_legacy_format: false
"""
LLAMA3_MERGE = """### Note: DO NOT use quantized model or quantization_bit when merging lora adapters

### model
model_name_or_path: meta-llama/Meta-Llama-3-8B-Instruct
adapter_name_or_path: saves/llama3-8b/lora/sft
template: llama3
finetuning_type: lora
trust_remote_code: true

### export
export_dir: models/llama3_lora_sft
export_size: 2
export_device: cpu
export_legacy_format: false
"""


def argv(text: str) -> list[str]:
    return shlex.split(text.replace("\\\n", " "))


def check(args: list[str] | None, versions: dict, framework: str | None = None, files: list[str] | None = None):
    """(rule id -> the condition it holds under, exit code)."""
    text, code = run_check(args, framework, files or [], versions, as_json=True)
    return {f["rule"]: f["holds_if"] for f in json.loads(text)["findings"]}, code


def with_swift(release: str) -> dict:
    return {**CURRENT, "ms-swift": Version(release)}


def trains_nothing(setup: Combination) -> None:
    """Every field a load run leaves unset keeps the default that means `no training feature`."""
    defaults = Combination()
    changed = {f.name for f in dataclasses.fields(Combination) if f.name != "versions"
               and getattr(setup, f.name) != getattr(defaults, f.name)}
    assert changed <= LOAD_FIELDS, changed - LOAD_FIELDS


def yaml_file(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# ms-swift ---------------------------------------------------------------------------------------------------------

def test_swift_export_merge_example_is_sound_from_3_7_and_asks_about_qlora_before():
    """examples/export/merge_lora.sh: the adapter's args.json (not here) may quantize the base; from ms-swift 3.7 the
    merge loads it unquantized whatever it says, before that a QLoRA adapter's merge is refused (3.0 - 3.6)."""
    r = from_command(argv(MERGE_SH), with_swift("3.12.6"))
    assert r.framework == "ms-swift" and r.setup.adapter == "lora" and not r.setup.merge_into_quantized
    assert r.sources["adapter"].startswith("--adapters output/vx-xxx/checkpoint-xxx")
    trains_nothing(r.setup)
    assert check(argv(MERGE_SH), with_swift("3.12.6")) == ({}, 0)
    found, code = check(argv(MERGE_SH), CURRENT)
    assert code == 1 and "ms-swift<3.7.0" in found["kbit-merge"] and "QLoRA" in found["kbit-merge"]
    old = from_command(argv(MERGE_SH), with_swift("3.5.0"))
    assert old.setup.merge_into_quantized and "quantized model and does not support merge-lora" in \
        old.sources["merge_into_quantized"] and "quantization" in old.unsure


def test_swift_export_reads_the_checkpoints_saved_arguments(tmp_path):
    """ms-swift fills the keys the line leaves unset from the checkpoint's args.json (load_args_from_ckpt): a QLoRA
    adapter's quant_method bnb / quant_bits 4 there quantize the base the 3.0 - 3.6 merge refuses."""
    ckpt = tmp_path / "checkpoint-100"
    ckpt.mkdir()
    (ckpt / "args.json").write_text(json.dumps({"model": "Qwen/Qwen2.5-7B-Instruct", "quant_method": "bnb",
                                                "quant_bits": 4, "deepspeed": "zero3", "gradient_checkpointing": True}))
    line = ["swift", "export", "--adapters", str(ckpt), "--merge_lora", "true"]
    r = from_command(line, with_swift("3.5.0"))
    assert r.setup.quantization == "4bit" and r.sources["quantization"].startswith(f"{ckpt}/args.json: quant_method")
    trains_nothing(r.setup)  # the saved deepspeed / gradient_checkpointing are training settings: not read
    found, code = check(line, with_swift("3.5.0"))
    assert found == {"kbit-merge": None} and code == 2
    assert check(line, with_swift("3.7.0")) == ({}, 0)
    (ckpt / "args.json").write_text(json.dumps({"model": "Qwen/Qwen2.5-7B-Instruct"}))
    assert check(line, with_swift("3.5.0")) == ({}, 0)  # trained unquantized: nothing to ask


def test_swift_export_of_an_awq_adapter_onto_the_unquantized_model_is_clean():
    """examples/train/qlora/awq/merge_lora.sh names the unquantized model to merge into."""
    r = from_command(argv(AWQ_MERGE_SH), with_swift("3.12.6"))
    assert r.setup.ptq_checkpoint is None and r.sources["adapter"].startswith("--adapters")
    assert check(argv(AWQ_MERGE_SH), with_swift("3.12.6")) == ({}, 0)


def test_swift_export_into_an_awq_checkpoint_is_refused_naming_model():
    """Variant of examples/train/qlora/awq/merge_lora.sh with the AWQ checkpoint as --model: ms-swift refuses (and
    PEFT's AWQ LoRA layer has no merge); issue 780 and 1839 are this merge."""
    line = argv(AWQ_MERGE_SH.replace("Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-7B-Instruct-AWQ"))
    with pytest.raises(LoraflowError, match=r"--model Qwen/Qwen2.5-7B-Instruct-AWQ.*awq-quantized.*Pass --model"):
        from_command(line, with_swift("3.12.6"))
    infer = ["swift", "infer", "--model", "Qwen/Qwen2.5-7B-Instruct-AWQ", "--adapters", "out/ck"]
    assert from_command(infer, CURRENT).setup.ptq_checkpoint == "awq"  # unmerged: served as it is


def test_swift_export_with_bnb_load_quantization_per_release():
    """Variant of examples/export/merge_lora.sh with --quant_method bnb --quant_bits 4 (the keys a QLoRA args.json
    holds): < 3.0 merges into the 4-bit base, 3.0 - 3.6 refuses, from 3.7 the base loads unquantized."""
    line = argv(MERGE_SH) + ["--quant_method", "bnb", "--quant_bits", "4"]
    for release, expected in (("3.5.0", ({"kbit-merge": None}, 2)), ("3.7.0", ({}, 0))):
        assert check(line, with_swift(release)) == expected, release
    new = from_command(line, with_swift("3.7.0")).setup
    assert new.quantization is None and not new.merge_into_quantized
    v2 = ["swift", "export", "--ckpt_dir", "ck", "--merge_lora", "true", "--quantization_bit", "4"]
    r = from_command(v2, with_swift("2.6.1"))
    assert r.setup.quantization == "4bit" and "It is not recommended" in r.sources["merge_into_quantized"]
    assert check(v2, with_swift("2.6.1")) == ({"kbit-merge": None}, 2)


def test_swift_infer_with_merge_from_the_quick_start():
    """Quick-start.md: merge-lora, then vLLM; the inference flags are ms-swift's and change nothing about the load."""
    r = from_command(argv(QUICK_START_INFER), with_swift("3.12.6"))
    assert not r.unknown and r.setup.world_size == 1 and r.setup.adapter == "lora"
    assert "swift infer --merge_lora true" in r.notes[-1]
    assert check(argv(QUICK_START_INFER), with_swift("3.12.6")) == ({}, 0)


def test_issue_3001_swift_infer_text_model_type_on_qwen2_5_vl():
    """ms-swift issue 3001: `swift infer` with --model_type qwen2_5 loads Qwen2.5-VL through AutoModelForCausalLM."""
    r = from_command(argv(ISSUE_3001), CURRENT)
    assert r.setup.image_text and r.setup.causal_lm_class and r.setup.image_safe_truncation
    assert r.sources["causal_lm_class"].startswith("--model_type qwen2_5")
    trains_nothing(r.setup)
    found, code = check(argv(ISSUE_3001), CURRENT)
    assert found == {"vlm-wrong-auto-class": None} and code == 2
    assert r.flags["causal_lm_class"].startswith("--model_type")
    fixed = argv(ISSUE_3001.replace("--model_type 'qwen2_5'", "--model_type qwen2_5_vl"))  # variant
    assert check(fixed, CURRENT) == ({}, 0)


def test_issue_5144_swift_export_onto_an_unquantized_base():
    r = from_command(argv(ISSUE_5144), with_swift("3.6.0"))
    assert r.setup.ptq_checkpoint is None and not r.unknown
    assert check(argv(ISSUE_5144), with_swift("3.12.6")) == ({}, 0)
    found, code = check(argv(ISSUE_5144), with_swift("3.6.0"))
    assert code == 1 and "QLoRA" in found["kbit-merge"]  # the adapter's args.json is not here


def test_issue_435_merge_lora_and_issue_1839_ckpt_dir():
    """`swift merge-lora --ckpt_dir` and 2.x's `swift export --ckpt_dir`: the adapter's sft_args.json (an int4 / AWQ
    base there) is not here, so what it quantizes the base with is a question, for ms-swift < 3.7."""
    for line in (ISSUE_435, ISSUE_1839):
        r = from_command(shlex.split(line), with_swift("2.6.1"))
        assert r.setup.adapter == "lora" and r.sources["adapter"].startswith("--ckpt_dir")
        trains_nothing(r.setup)
        found, code = check(shlex.split(line), with_swift("2.6.1"))
        assert code == 1 and "QLoRA" in found["kbit-merge"]


def test_swift_usage_errors():
    with pytest.raises(LoraflowError, match=r"none is given: add --adapters CKPT"):
        from_command(["swift", "export", "--model", "Qwen/Qwen2.5-7B-Instruct", "--merge_lora", "true"], CURRENT)
    with pytest.raises(LoraflowError, match=r"reads `swift sft`.*`swift export`, `swift merge-lora`"):
        from_command(["swift", "eval", "--model", "Qwen/Qwen2.5-7B-Instruct"], CURRENT)
    r = from_command(["swift", "infer", "--adapters", "ck", "--no_such_flag", "1"], CURRENT)
    assert r.unknown == ["--no_such_flag 1"]


# LLaMA-Factory ----------------------------------------------------------------------------------------------------

def test_llamafactory_merge_examples_are_clean(tmp_path):
    for name, text in (("qwen3_lora_sft.yaml", QWEN3_MERGE), ("llama3_lora_sft.yaml", LLAMA3_MERGE),
                       ("qwen3vl_lora_sft.yaml", QWEN3VL_MERGE)):
        path = yaml_file(tmp_path, name, text)
        r = from_command(["llamafactory-cli", "export", path], CURRENT)
        assert r.framework == "llama-factory" and r.setup.adapter == "lora" and not r.unknown
        assert r.sources["adapter"].startswith(f"{name}: adapter_name_or_path")
        trains_nothing(r.setup)
        assert check(["llamafactory-cli", "export", path], CURRENT) == ({}, 0), name
        assert check(None, CURRENT, "llama-factory", [path]) == ({}, 0), name  # the YAML alone
    vl = from_files("llama-factory", [str(tmp_path / "qwen3vl_lora_sft.yaml")], CURRENT).setup
    assert vl.image_text and not vl.causal_lm_class


def test_llamafactory_export_with_quantization_bit_is_kbit_merge(tmp_path):
    """Variant of examples/merge_lora/qwen3_lora_sft.yaml with the override its note forbids: LLaMA-Factory leaves the
    adapter unmerged on the 4-bit base and refuses the export (tuner.py, from v0.4.0)."""
    path = yaml_file(tmp_path, "qwen3_lora_sft.yaml", QWEN3_MERGE)
    line = ["llamafactory-cli", "export", path, "quantization_bit=4"]
    r = from_command(line, CURRENT)
    assert r.setup.quantization == "4bit" and r.setup.merge_into_quantized
    assert "Cannot merge adapters to a quantized model" in r.sources["merge_into_quantized"]
    assert r.flags["merge_into_quantized"].startswith("quantization_bit")
    trains_nothing(r.setup)
    assert check(line, CURRENT) == ({"kbit-merge": None}, 2)


def test_llamafactory_export_refusals(tmp_path):
    path = yaml_file(tmp_path, "qwen3_lora_sft.yaml", QWEN3_MERGE)
    with pytest.raises(LoraflowError, match=r"export_quantization_bit=4 .*Please merge adapters before quantizing"):
        from_command(["llamafactory-cli", "export", path, "export_quantization_bit=4"], CURRENT)
    with pytest.raises(LoraflowError, match=r"GPTQ-Int4 is a gptq-quantized checkpoint.*Set model_name_or_path"):
        from_command(["llamafactory-cli", "export", path, "model_name_or_path=Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4"],
                     CURRENT)
    no_dir = yaml_file(tmp_path, "no_dir.yaml", QWEN3_MERGE.replace("export_dir: saves/qwen3_sft_merged\n", ""))
    with pytest.raises(LoraflowError, match=r"needs export_dir"):
        from_command(["llamafactory-cli", "export", no_dir], CURRENT)
    with pytest.raises(LoraflowError, match=r"Set finetuning_type: lora"):
        from_command(["llamafactory-cli", "export", path, "finetuning_type=full"], CURRENT)
    with pytest.raises(LoraflowError, match=r"and merges \(llamafactory-cli export"):
        from_command(["llamafactory-cli", "chat", path], CURRENT)


def test_llamafactory_export_config_not_here_is_named_not_guessed():
    r = from_command(["llamafactory-cli", "export", "examples/merge_lora/x_qlora_sft.yaml"], CURRENT)
    assert r.setup.quantization is None and r.unknown == [
        "examples/merge_lora/x_qlora_sft.yaml (not on this machine: the export's keys in it are not read)"]
