"""llama-recipes (llama-cookbook) frontend of `loraflow check`: launch lines from meta-llama/llama-recipes /
llama-cookbook issue threads and from the repository's own docs at a tag -> Combination (each value with its source),
and what `check` reports on them. The release matters: 0.0.1 loads float32 and prepares 8-bit models for k-bit
training, 0.0.3 loads bfloat16 and reads 4bit/8bit, 0.0.5 passes use_orig_params; the script's place in the repository
dates the release."""

from __future__ import annotations

import json
import shlex

import pytest
from packaging.version import Version

from loraflow.errors import LoraflowError
from loraflow.frontends import detect, from_command, parse_versions, run_check

CURRENT = {"torch": Version("2.5.1"), "transformers": Version("4.46.0"), "peft": Version("0.13.2")}
# https://github.com/meta-llama/llama-cookbook/issues/945
PTQ_FULL = ("!torchrun --nnodes 1 --nproc_per_node 2 getting-started/finetuning/finetuning.py --model_name "
            "\"RedHatAI/Llama-3.3-70B-Instruct-quantized.w8a8\" --enable_fsdp  --dataset llama_dataset --data_path "
            "'/home/a100server/shared_folder/FFT_mnt/FFT_Research/1.datapreprocess_FFT_LoRA_Agent/llama_dataset/"
            "rulebook_data_QA/rulebook_QA.jsonl' "
            "--save_model --dist_checkpoint_root_folder model_checkpoints --dist_checkpoint_folder fine-tuned "
            "--fsdp_config.pure_bf16 --output_dir "
            "\"/home/a100server/shared_folder/FFT_mnt/FFT_Research/FFT_LoRA_checkpoints/FFT_rulebook_QA_70b\" "
            "--context_length 8200 --gradient_accumulation_steps 1 --batch_size_training 1 --lr 1e-5  "
            "--use_fast_kernels True --num_epochs 15")
# https://github.com/meta-llama/llama-cookbook/issues/556
FSDP_BARE_QUANT = ("CUDA_VISIBLE_DEVICES=0,1 && torchrun --nnodes 1 --nproc_per_node 2 "
                   "recipes/finetuning/finetuning.py --enable_fsdp --use_peft --peft_method lora --model_name "
                   "../Meta-Llama-3-8B/8B --batch_size_training 1 --dataset custom_dataset --custom_dataset.file "
                   "\"examples/chatbot_dataset.py:get_preprocessed_custom\" --output_dir "
                   "../Meta-Llama-3-8B/chatbot\\(finetuned_on_15k\\)/epoch1 --num_epochs 1 --save_model --quantization")
# https://github.com/meta-llama/llama-cookbook/pull/686
FSDP_QLORA = ("FSDP_CPU_RAM_EFFICIENT_LOADING=1 ACCELERATE_USE_FSDP=1 torchrun --nnodes 1 --nproc_per_node 4  "
              "recipes/quickstart/finetuning/finetuning.py --enable_fsdp  --quantization 4bit --model_name "
              "meta-llama/Llama-3.1-70B-Instruct  --mixed_precision False --low_cpu_fsdp --use_peft --peft_method "
              "lora --output_dir Path/to/save/PEFT/model --samsum_dataset.trust_remote_code=True")
# https://github.com/meta-llama/llama-cookbook/pull/572 (the log's terminal wraps inside `meta-llama` and
# `--max_train_step` rejoined)
INT4 = ("FSDP_CPU_RAM_EFFICIENT_LOADING=1 ACCELERATE_USE_FSDP=1 torchrun --nnodes 1 --nproc_per_node 4 "
        "recipes/finetuning/finetuning.py --enable_fsdp --model_name meta-llama/Meta-Llama-3-70B --use_peft "
        "--peft_method lora  --gradient_accumulation_steps 2 --output_dir peft-output --low_cpu_fsdp  --quantization "
        "int4  --mixed_precision False --max_train_step 5 --max_eval_step 5")
# https://github.com/meta-llama/llama-cookbook/pull/791
VISION_FULL = ("torchrun --nnodes 1 --nproc_per_node 4  recipes/quickstart/finetuning/finetuning.py --enable_fsdp "
               "--lr 1e-5  --num_epochs 3 --batch_size_training 2 --model_name "
               "meta-llama/Llama-3.2-11B-Vision-Instruct --dist_checkpoint_root_folder ./finetuned_model "
               "--dist_checkpoint_folder fine-tuned  --use_fast_kernels --dataset \"custom_dataset\" "
               "--custom_dataset.test_split \"test\" --custom_dataset.file "
               "\"recipes/quickstart/finetuning/datasets/ocrvqa_dataset.py\"  --run_validation True "
               "--batching_strategy "
               "padding")
# https://github.com/meta-llama/llama-recipes/blob/190c2e52/README.md (the 0.0.1 release's README)
README_8BIT = ("python -m llama_recipes.finetuning  --use_peft --peft_method lora --quantization --model_name "
               "/patht_of_model_folder/7B --output_dir Path/to/save/PEFT/model")
README_FSDP = ("torchrun --nnodes 1 --nproc_per_node 4  examples/finetuning.py --enable_fsdp --use_peft --peft_method "
               "lora --model_name /patht_of_model_folder/7B --pure_bf16 --output_dir Path/to/save/PEFT/model")
# https://github.com/meta-llama/llama-recipes/blob/v0.0.3/docs/single_gpu.md
SINGLE_FP16 = ("python -m llama_recipes.finetuning  --use_peft --peft_method lora --quantization 8bit --use_fp16 "
               "--model_name /path_of_model_folder/8B --output_dir Path/to/save/PEFT/model")


def check(text: str, versions: dict | None = None) -> tuple[dict, int]:
    out, code = run_check(shlex.split(text), None, [], dict(versions or CURRENT), True)
    return json.loads(out), code


def rules(doc: dict) -> set[str]:
    return {f["rule"] for f in doc["findings"]}


def read(text: str, **release: str):
    versions = dict(CURRENT, **{"llama-recipes": Version(v) for v in release.values()})
    return from_command(shlex.split(text), versions)


def test_a_ptq_checkpoint_under_fsdp_is_a_crash_and_pure_bf16_full_finetuning_loses_updates():
    assert detect(shlex.split(PTQ_FULL)) == "llama-recipes"
    r = read(PTQ_FULL)
    s = r.setup
    assert (s.engine, s.world_size, s.adapter, s.precision, s.ptq_checkpoint) == ("fsdp1", 2, "full", "bf16",
                                                                                   "compressed-tensors")
    assert r.sources["precision"].startswith("--fsdp_config.pure_bf16: model.to(torch.bfloat16)")
    assert "w8a8" in r.sources["ptq_checkpoint"] and r.sources["engine"].startswith("--enable_fsdp")
    assert r.eras["llama-recipes"][0] == ">=0.0.5" and not r.unknown  # --data_path is a dataset config's field
    doc, code = check(PTQ_FULL)
    found = {f["rule"]: f for f in doc["findings"]}
    ptq = found["ptq-model-under-sharding"]
    assert ptq["impact"] == "crash" and ptq["holds_if"] is None
    assert "bf16-lost-updates" in found and code == 2


def test_release_0_0_2_reads_a_bare_quantization_as_8bit_prepared_with_transformers_checkpointing():
    assert detect(shlex.split(FSDP_BARE_QUANT)) == "llama-recipes"
    r = read(FSDP_BARE_QUANT)
    s = r.setup
    assert r.eras["llama-recipes"][0] == ">=0.0.2,<0.0.3"
    assert (s.quantization, s.engine, s.adapter, s.fsdp_use_orig_params, s.fsdp_frozen_units_separate) == (
        "8bit", "fsdp1", "lora", False, True)
    assert "load_in_8bit=True" in r.sources["quantization"]
    assert (s.checkpoint_impl, s.input_grad_hook, s.reentrant) == ("transformers", True, True)
    assert "prepare_model_for_kbit_training" in r.sources["checkpoint_impl"]
    # float32 load, bfSixteen FSDP policy: the GPU decides between bf16 compute and fp32
    assert s.precision == "bf16-mixed" and set(r.unsure["precision"][0]) == {"bf16-mixed", "fp32"}


def test_release_0_0_3_refuses_8bit_under_fsdp_and_reads_a_bare_quantization_as_8bit():
    r = read(FSDP_BARE_QUANT, release="0.0.3")
    assert any("8bit quantization is not supported with FSDP" in n for n in r.notes)
    assert any("FutureWarning" in n for n in r.notes)


def test_fsdp_qlora_keeps_its_storage_in_step_and_checks_clean_on_a_current_peft():
    r = read(FSDP_QLORA)
    s = r.setup
    assert r.eras["llama-recipes"][0] == ">=0.0.3,<0.0.5"
    assert (s.quantization, s.quant_storage_matches, s.precision, s.mixed_param_dtypes) == ("4bit", True,
                                                                                              "bf16-mixed", True)
    assert "quant_storage: torch.bfloat16" in r.sources["quant_storage_matches"]
    assert (s.checkpoint_impl, s.input_grad_hook, s.use_cache) == ("transformers", True, False)
    assert "enable_input_require_grads" in r.sources["input_grad_hook"]
    doc, code = check(FSDP_QLORA)
    assert not [f for f in doc["findings"] if f["holds_if"] is None and f["impact"] in ("crash", "silent")]
    # fp16 weights beside a bfloat16 quant_storage cannot be flattened into one unit
    r = read(FSDP_QLORA + " --use_fp16")
    assert r.setup.quant_storage_matches is False
    assert "qlora-storage-dtype" in rules(check(FSDP_QLORA + " --use_fp16")[0])


def test_fsdp_in_release_0_0_1_checkpoints_through_torch_s_non_reentrant_wrapper():
    r = read(README_FSDP)
    s = r.setup
    assert r.eras["llama-recipes"][0] == "<0.0.2"
    assert (s.checkpointing, s.checkpoint_impl, s.reentrant, s.input_grad_hook) == ("all", "torch-wrapper", False,
                                                                                     False)
    assert "non_reentrant_wrapper" in r.sources["reentrant"]
    assert s.precision == "bf16-mixed" and r.sources["precision"].startswith("--pure_bf16")
    assert check(README_FSDP)[1] == 0


def test_full_finetuning_of_a_vision_model_in_release_0_0_4_stores_bf16_weights():
    r = read(VISION_FULL)
    assert (r.setup.adapter, r.setup.precision) == ("full", "bf16")
    assert "torch_dtype=float16 if use_fp16 else bfloat16" in r.sources["precision"]
    assert any("Vision model is read as its language model" in n for n in r.notes)
    doc, code = check(VISION_FULL)
    assert "bf16-lost-updates" in rules(doc) and code == 2


def test_single_gpu_lines_train_alone_without_checkpointing():
    r = read(README_8BIT)
    s = r.setup
    assert (s.engine, s.world_size, s.checkpointing, s.quantization, s.use_cache) == ("single", 1, "off", "8bit", True)
    old = read(README_8BIT, release="0.0.1")  # prepare_model_for_int8_training turns checkpointing on
    assert (old.setup.checkpointing, old.setup.input_grad_hook, old.setup.precision) == ("all", True, "fp32")
    r = read(SINGLE_FP16)
    assert (r.setup.precision, r.setup.grad_scaler) == ("fp16-mixed", True)
    assert r.sources["grad_scaler"] == "--use_fp16: train_utils.py torch.cuda.amp.GradScaler"
    assert check(SINGLE_FP16)[1] == 0
    r = read("torchrun --nproc_per_node 4 -m llama_recipes.finetuning --use_peft --model_name x")
    assert r.setup.engine == "single" and any("trains its own copy" in n for n in r.notes)


def test_fp16_weights_under_the_plain_grad_scaler_crash_where_peft_keeps_adapters_in_half():
    line = "python -m llama_recipes.finetuning --use_peft --use_fp16 --model_name meta-llama/Llama-3.1-8B"
    assert read(line).setup.precision == "fp16-mixed"
    doc, code = check(line, {"torch": Version("2.5.1"), "transformers": Version("4.46.0")})
    found = {f["rule"]: f for f in doc["findings"]}
    assert "peft" in found["fp16-trainable-unscale"]["holds_if"]  # peft 0.7 - 0.11 create adapters in fp16
    # FSDP's ShardedGradScaler unscales fp16 gradients
    fsdp = read("torchrun --nproc_per_node 2 -m llama_recipes.finetuning --enable_fsdp --use_fp16 --model_name x")
    assert fsdp.setup.grad_scaler is False and "allow_fp16=True" in fsdp.sources["grad_scaler"]


def test_dotted_flags_reach_no_config_in_release_0_0_1():
    line = ("torchrun --nproc_per_node 2 -m llama_recipes.finetuning --enable_fsdp --fsdp_config.pure_bf16 "
            "--model_name x")
    assert read(line, release="0.0.2").setup.precision == "bf16"
    old = read(line, release="0.0.1")
    assert old.setup.precision == "fp32" and any("5da84b29" in n for n in old.notes)
    assert read(line.replace("--fsdp_config.pure_bf16", "--pure_bf16"), release="0.0.1").setup.precision == "bf16"


def test_release_names_and_eras_from_flags():
    assert parse_versions("llama-cookbook=0.0.5.post1") == {"llama-recipes": Version("0.0.5.post1")}
    r = read("torchrun --nproc_per_node 2 -m llama_recipes.finetuning --enable_fsdp --freeze_LLM_only True "
             "--model_name x")
    assert r.eras["llama-recipes"][0] == ">=0.0.5" and r.setup.fsdp_use_orig_params is True
    r = read("python -m llama_recipes.finetuning --use_peft --use_fp16 false --nonsense 3 --fsdp_config.bogus 1")
    assert any("fire reads `false` as a string" in n for n in r.notes)
    assert any(u.startswith("--nonsense 3") for u in r.unknown) and any("no field bogus" in u for u in r.unknown)


def test_usage_errors_name_the_flag():
    with pytest.raises(LoraflowError, match=r"--quantization int4.*--quantization 4bit"):
        read(INT4)
    with pytest.raises(LoraflowError, match="--peft_method qlora"):
        read("python -m llama_recipes.finetuning --use_peft --peft_method qlora")
    with pytest.raises(LoraflowError, match="runs no finetuning"):
        read("python -m llama_recipes.inference.chat_completion --model_name x")


def test_other_repositories_finetuning_scripts_are_not_taken():
    assert detect(shlex.split(INT4)) == "llama-recipes"
    assert detect(shlex.split("python finetuning.py --enable_fsdp --use_peft --model_name x")) == "llama-recipes"
    assert detect(shlex.split("python finetuning.py --model_name_or_path x --bf16 True --output_dir o")) == "hf"
