"""`loraflow check` on launches posted in public threads, each copied verbatim with its URL: one test per capability a
thread showed missing (a framework fact at its releases, a way launches are posted). Pure parsing, no training."""

from __future__ import annotations

import json
import shlex

from conftest import ROOT
from packaging.version import Version

from loraflow.frontends import from_command, run_check


def argv(posted: str) -> list[str]:
    """A posted launch as the shell reads it: continuation lines joined."""
    return shlex.split(" ".join(line.rstrip("\\").strip() for line in posted.splitlines() if line.strip()))


def findings(args: list[str], versions: dict) -> dict[str, str | None]:
    doc = json.loads(run_check(args, None, [], dict(versions), as_json=True)[0])
    return {f["rule"]: f["holds_if"] for f in doc["findings"]}


# https://github.com/runpod/runpodctl/issues/54 (LLaMA-Factory src/train_bash.py, Dec 2023)
LF_FP16_LORA = r"""CUDA_VISIBLE_DEVICES=0 python src/train_bash.py \
    --stage sft \
    --model_name_or_path openlm-research/open_llama_7b \
    --do_train \
    --dataset train \
    --template default \
    --finetuning_type lora \
    --lora_target q_proj,v_proj \
    --output_dir checkpoint \
    --overwrite_cache \
    --per_device_train_batch_size 4 \
    --gradient_accumulation_steps 4 \
    --lr_scheduler_type cosine \
    --logging_steps 10 \
    --save_steps 2000 \
    --learning_rate 5e-5 \
    --num_train_epochs 3.0 \
    --plot_loss \
    --fp16"""


def test_llama_factory_before_0_4_keeps_the_fp16_adapters_peft_0_7_to_0_11_create():
    """LLaMA-Factory < 0.4.0 loads the base in the compute dtype and does not upcast LoRA (model/adapter.py); PEFT
    0.7 - 0.11 create the adapters in the base's dtype, so fp16 AMP unscales fp16 gradients."""
    old = {"llama-factory": Version("0.3.3"), "peft": Version("0.7.0"), "transformers": Version("4.34.1")}
    assert from_command(argv(LF_FP16_LORA), old).setup.precision == "fp16"
    assert findings(argv(LF_FP16_LORA), old)["fp16-trainable-unscale"] is None
    # PEFT 0.6 created them in float32, LLaMA-Factory 0.4.0 casts what trains to float32.
    assert "fp16-trainable-unscale" not in findings(argv(LF_FP16_LORA), {**old, "peft": Version("0.6.2")})
    new = {**old, "llama-factory": Version("0.4.0"), "transformers": Version("4.36.1")}
    assert from_command(argv(LF_FP16_LORA), new).setup.precision == "fp16-mixed"
    # Unknown releases: the finding names them (train_bash.py dates the run before v0.7.1).
    assert findings(argv(LF_FP16_LORA), {})["fp16-trainable-unscale"] == "llama-factory<0.4.0 and 0.7.0<=peft<0.12.0"


# https://github.com/modelscope/ms-swift/issues/5422 (a Kaggle notebook cell)
SWIFT_NOTEBOOK_QLORA_ZERO3 = r"""!swift sft \
    --model Qwen/Qwen3-Embedding-4B \
    --task_type embedding \
    --model_type qwen3_emb \
    --train_type lora \
    --dataset  /kaggle/working/data.hf/data-00000-of-00001.arrow \
    --split_dataset_ratio 0.05 \
    --eval_strategy steps \
    --output_dir output \
    --eval_steps 20 \
    --num_train_epochs 5 \
    --save_steps 600 \
    --per_device_train_batch_size 1 \
    --per_device_eval_batch_size 1 \
    --gradient_accumulation_steps 8 \
    --learning_rate 6e-6 \
    --loss_type cosine_similarity \
    --label_names labels \
    --dataloader_drop_last true \
    --quant_bits 4 \
    --quant_method bnb \
    --lora_dtype float16 \
    --torch_dtype float16 \
    --target_modules q_proj k_proj v_proj o_proj gate_proj up_proj down_proj \
    --deepspeed zero3"""


def test_a_notebook_cell_launch_is_read_on_the_line_and_from_a_saved_cell(tmp_path):
    """IPython's `!` runs the rest of the line in a shell; ms-swift is configured by flags only, so a cell saved
    under any name is read for its launch line. --model_type names a model group in 3.x as in 2.x: no era clash."""
    result = from_command(argv(SWIFT_NOTEBOOK_QLORA_ZERO3), {})
    assert (result.framework, result.setup.quantization, result.setup.zero_stage) == ("ms-swift", "4bit", 3)
    assert findings(argv(SWIFT_NOTEBOOK_QLORA_ZERO3), {})["qlora-storage-dtype"] is None
    assert result.eras["ms-swift"][0].startswith(">=3.0.0")
    cell = tmp_path / "cell.txt"
    cell.write_text(SWIFT_NOTEBOOK_QLORA_ZERO3 + "\n")
    doc = json.loads(run_check(None, "ms-swift", [str(cell)], {}, as_json=True)[0])
    assert "qlora-storage-dtype" in {f["rule"] for f in doc["findings"]}


# https://github.com/tloen/alpaca-lora/blob/65fb8225c09af81feb5edb1abb12560f02930703/finetune.py (lines 16-23,
# 112-117, 174-184, 263-273; the function body dedented), the script transformers#24551 and peft#580 ran copies of.
ALPACA_LORA_EXCERPT = '''from peft import (
    LoraConfig,
    get_peft_model,
    get_peft_model_state_dict,
    prepare_model_for_int8_training,
    set_peft_model_state_dict,
)
from transformers import LlamaForCausalLM, LlamaTokenizer
model = LlamaForCausalLM.from_pretrained(
    base_model,
    load_in_8bit=True,
    torch_dtype=torch.float16,
    device_map=device_map,
)
model = prepare_model_for_int8_training(model)

config = LoraConfig(
    r=lora_r,
    lora_alpha=lora_alpha,
    target_modules=lora_target_modules,
    lora_dropout=lora_dropout,
    bias="none",
    task_type="CAUSAL_LM",
)
model = get_peft_model(model, config)
old_state_dict = model.state_dict
model.state_dict = (
    lambda self, *_, **__: get_peft_model_state_dict(
        self, old_state_dict()
    )
).__get__(model, type(model))

if torch.__version__ >= "2" and sys.platform != "win32":
    model = torch.compile(model)

trainer.train(resume_from_checkpoint=resume_from_checkpoint)
'''


def test_the_code_that_replaces_state_dict_with_peft_s_adapter_state_dict_is_read(tmp_path):
    """alpaca-lora's patch makes PEFT 0.3 - 0.19 filter an already filtered dict: an empty adapter file."""
    script = tmp_path / "finetune.py"
    script.write_text(ALPACA_LORA_EXCERPT)

    def rules(text: str, peft: str) -> dict:
        script.write_text(text)
        doc = json.loads(run_check(None, "python-script", [str(script)], {"peft": Version(peft)}, as_json=True)[0])
        return {f["rule"]: f["holds_if"] for f in doc["findings"]}

    assert rules(ALPACA_LORA_EXCERPT, "0.3.0")["adapter-state-dict-patched"] is None
    assert "adapter-state-dict-patched" not in rules(ALPACA_LORA_EXCERPT, "0.20.0")
    unpatched = ALPACA_LORA_EXCERPT.split("old_state_dict = ")[0] + "trainer.train()\n"
    assert "adapter-state-dict-patched" not in rules(unpatched, "0.3.0")


# https://github.com/tloen/alpaca-lora/issues/253
ALPACA_LORA_TORCHRUN = ("WORLD_SIZE=1 CUDA_VISIBLE_DEVICES=0 "
                        r"""torchrun --nproc_per_node=1 --master_port=1234 finetune.py \
    --base_model='decapoda-research/llama-7b-hf' \
    --num_epochs=10 \
    --cutoff_len=512 \
    --group_by_length \
    --output_dir='./my-output-dir' \
    --lora_target_modules='[q_proj,k_proj,v_proj,o_proj]' \
    --lora_r=16 \
    --batch_size=128 \
    --micro_batch_size=8 \
    --resume_from_checkpoint './lora-alpaca-output-dir/checkpoint-1800'""")
# https://github.com/huggingface/transformers/issues/24551 (a copy of finetune.py with flags of its own)
ALPACA_LORA_COPY = ("python ./finetune.py --base_model=MODEL --raw_data_path=TEXTFILE --batch_size=32 "
                    "--micro_batch_size=1 --num_epochs=2 --lora_r=128 --lora_alpha=256 --cutoff_len=512 "
                    "--overlap_len=256 --save_steps=1")


def test_alpaca_lora_finetune_py_not_here_is_read_with_the_facts_of_its_code():
    """An 8-bit base prepared by prepare_model_for_int8_training (checkpointing + input hook), LoRA, fp16, and the
    state_dict patch; a copy with flags of its own leaves the patch to its code."""
    peft = {"peft": Version("0.3.0")}
    result = from_command(argv(ALPACA_LORA_TORCHRUN), peft)
    s = result.setup
    assert result.framework == "alpaca-lora" and not result.unknown
    assert (s.adapter, s.quantization, s.checkpointing, s.input_grad_hook, s.precision, s.state_dict_patched) == (
        "lora", "8bit", "all", True, "fp16-mixed", True)
    assert findings(argv(ALPACA_LORA_TORCHRUN), peft)["adapter-state-dict-patched"] is None
    copy = from_command(shlex.split(ALPACA_LORA_COPY), peft)
    assert copy.framework == "alpaca-lora" and "--overlap_len=256" in copy.unknown
    assert "state_dict_patched" in copy.unsure
    assert findings(shlex.split(ALPACA_LORA_COPY), peft)["adapter-state-dict-patched"] == (
        "the copy keeps alpaca-lora's state_dict patch")
    # Several processes: the script turns ddp_find_unused_parameters off.
    two = from_command(argv(ALPACA_LORA_TORCHRUN.replace("WORLD_SIZE=1 ", "").replace("=1 ", "=2 ")), peft).setup
    assert (two.world_size, two.engine, two.find_unused_parameters) == (2, "ddp", False)


def test_an_axolotl_merge_command_is_read_as_a_merge_into_the_base_it_loads(monkeypatch):
    """https://github.com/axolotl-ai-cloud/axolotl/issues/596: merge_lora on a QLoRA config merged into the 4-bit base
    before v0.4.0 (the thread's workaround: --load_in_4bit=False on the line); since v0.4.0 (PR #1086) the merge
    loads the base unquantized whatever the config says."""
    monkeypatch.chdir(ROOT / "tests" / "fixtures" / "frontends" / "axolotl")
    merge = 'python3 -m axolotl.cli.merge_lora code-llama-7b-qlora.yml --lora_model_dir="./qlora-out"'
    old, new = {"axolotl": Version("0.3.0")}, {"axolotl": Version("0.4.0")}
    assert from_command(shlex.split(merge), old).setup.merge_into_quantized
    assert "kbit-merge" in findings(shlex.split(merge), old)
    assert "kbit-merge" not in findings(shlex.split(merge), new)
    unquantized = merge + " --load_in_8bit=False --load_in_4bit=False"
    assert "kbit-merge" not in findings(shlex.split(unquantized), old)
    assert "merge_into_quantized" in from_command(shlex.split("axolotl merge-lora code-llama-7b-qlora.yml"),
                                                  {}).sources


# https://github.com/modelscope/ms-swift/issues/938
SWIFT_DEEPSEEK_VL_ZERO3 = ("NPROC_PER_NODE=2 CUDA_VISIBLE_DEVICES=1,2 swift sft --model_type deepseek-vl-7b-chat "
                           "--custom_train_dataset_path data/train.json  --custom_val_dataset_path data/val.json "
                           "--sft_type full --eval_steps 100 --deepspeed default-zero3")


def test_ms_swift_before_2_3_1_runs_deepseek_vl_s_tower_in_the_template_encode():
    """deepseek-vl's template called model.prepare_inputs_embeds while encoding samples, outside the ZeRO-3 engine's
    forward, until 2.3.1 moved it into a forward pre-hook (_post_encode)."""
    old = {"ms-swift": Version("2.0.4")}
    assert from_command(shlex.split(SWIFT_DEEPSEEK_VL_ZERO3), old).setup.weights_outside_forward
    assert findings(shlex.split(SWIFT_DEEPSEEK_VL_ZERO3), old)["sharded-weights-outside-forward"] is None
    new = from_command(shlex.split(SWIFT_DEEPSEEK_VL_ZERO3), {"ms-swift": Version("2.3.1")}).setup
    assert not new.weights_outside_forward
    zero2 = SWIFT_DEEPSEEK_VL_ZERO3.replace("default-zero3", "default-zero2")
    assert "sharded-weights-outside-forward" not in findings(shlex.split(zero2), old)


# https://github.com/deepspeedai/DeepSpeed/issues/627 (the DeepSpeed config as the thread's excerpt holds it: cut
# after zero_optimization)
DS_CONFIG_CUT = """{
  "train_micro_batch_size_per_gpu": 1,
  "gradient_accumulation_steps": 1,
  "steps_per_print": 1,
  "optimizer": {
    "type": "Adam",
    "params": {
      "lr": 0.00015,
      "weight_decay": 1e-2
    }
  },
  "zero_optimization": {
    "stage": 2,
    "cpu_offload": true,
    "contiguous_gradients": true,
    "overlap_comm": true,
    "reduce_scatter": true,\x20\x20
    "reduce_bucket_size": 50000000,
    "allgather_bucket_size": 500000000
  },"""


def test_a_deepspeed_config_is_read_as_deepspeed_loads_it_and_a_cut_one_is_named(tmp_path):
    """DeepSpeed reads its config with hjson (PR #2783, 0.8.1): a root without braces, as pasted in
    https://github.com/axolotl-ai-cloud/axolotl/issues/1381, is a config to it; transformers' json.load is not."""
    import pytest

    from loraflow.errors import LoraflowError
    from loraflow.frontends import guess_framework_for_files

    bare = tmp_path / "ds_config.json"
    bare.write_text('"gradient_clipping": "auto"\n')
    doc = json.loads(run_check(None, "deepspeed", [str(bare)], {"deepspeed": Version("0.19.8")}, as_json=True)[0])
    assert "hjson" in " ".join(doc["notes"])
    with pytest.raises(LoraflowError, match="not valid JSON"):  # DeepSpeed before hjson, and the HF Trainer
        run_check(None, "deepspeed", [str(bare)], {"deepspeed": Version("0.8.0")}, as_json=True)
    cut = tmp_path / "ds_cut.json"
    cut.write_text(DS_CONFIG_CUT)
    assert guess_framework_for_files([str(cut)]) == "deepspeed"  # not a loraflow config, though it does not parse
    # check reads a pasted excerpt up to where it stops, names what it could not see, and never exits 0 on it.
    doc = json.loads(run_check(None, "deepspeed", [str(cut)], {}, as_json=True)[0])
    assert any("ends before the `{` opened on line 1 is closed" in u for u in doc["unknown"]) and doc["exit_code"]
    assert doc["setup"]["zero_stage"] == 2
    from loraflow.frontends.common import load_mapping
    with pytest.raises(LoraflowError, match="ends before the `{` opened on line 1 is closed"):
        load_mapping(cut, "DeepSpeed config")  # outside check a cut file stays an error


# https://github.com/OpenRLHF/OpenRLHF/issues/1150
OPENRLHF_4BIT_GRPO = r"""ray job submit --address="http://127.0.0.1:8265" \
   --runtime-env-json='{"working_dir": "./"}' \
   -- python3 -m openrlhf.cli.train_ppo_ray \
   --ref_num_nodes 1 \
   --ref_num_gpus_per_node 1 \
   --critic_num_nodes 1 \
   --critic_num_gpus_per_node 1 \
   --actor_num_nodes 1 \
   --actor_num_gpus_per_node 1 \
   --vllm_num_engines 1 \
   --vllm_tensor_parallel_size 1 \
   --vllm_gpu_memory_utilization 0.4 \
   --colocate_actor_ref \
   --colocate_all_models \
   --pretrain Qwen/Qwen3-0.6B \
   --remote_rm_url /home/TestOpenRLHF/reward_func.py \
   --label_key id \
   --save_path ./checkpoint/qwen3-0.6b-rlhf \
   --micro_train_batch_size 16 \
   --train_batch_size 16 \
   --micro_rollout_batch_size 8 \
   --rollout_batch_size 8 \
   --max_samples 1000 \
   --max_epochs 1 \
   --prompt_max_len 1024 \
   --generate_max_len 1024 \
   --zero_stage 3 \
   --bf16 \
   --load_in_4bit \
   --actor_learning_rate 5e-7 \
   --critic_learning_rate 9e-6 \
   --init_kl_coef 1e-5 \
   --prompt_data /home/TestOpenRLHF/data/stock_analysis_merged.jsonl \
   --input_key question \
   --normalize_reward \
   --packing_samples \
   --adam_offload \
   --attn_implementation flash_attention_2 \
   --gradient_checkpointing \
"""


def test_openrlhf_hands_its_4bit_models_without_an_adapter_to_deepspeed_engines():
    """The reference model (and here the policy, no --lora_rank) are transformers models in 4 bits that
    deepspeed.initialize moves to its device: refused before bitsandbytes 0.43.2 (OpenRLHF#403's traceback)."""
    old = {"bitsandbytes": Version("0.43.1")}
    s = from_command(argv(OPENRLHF_4BIT_GRPO), old).setup
    assert (s.quantization, s.quantized_moved) == ("4bit", True)
    assert "kbit-model-moved" in findings(argv(OPENRLHF_4BIT_GRPO), old)
    assert not from_command(argv(OPENRLHF_4BIT_GRPO), {"bitsandbytes": Version("0.43.2")}).setup.quantized_moved
    # QLoRA SFT: the trained model reaches the engine as a PeftModel, and there is no reference model.
    sft = ("deepspeed --module openrlhf.cli.train_sft --pretrain Qwen/Qwen3-0.6B --load_in_4bit --lora_rank 16 "
           "--zero_stage 2 --bf16")
    assert not from_command(shlex.split(sft), old).setup.quantized_moved


def test_lora_flags_without_use_peft_on_a_script_of_its_own_are_evaluated_both_ways():
    """--lora_r is TRL's ModelConfig flag (ignored without --use_peft) and many scripts' own: read with --framework hf,
    transformers#24551's launch is LoRA first, full fine-tuning as TRL would read it second."""
    own = "python my_sft.py --model_name_or_path M --dataset_name d --lora_r=128 --output_dir o"
    result = from_command(shlex.split(own), {}, name="hf")
    assert result.setup.adapter == "lora" and set(result.forks["trainer_library"][0]) == {False, True}
    as_trl = from_command(shlex.split(own), {"fork:trainer_library": True}, name="hf")
    assert as_trl.setup.adapter == "full"
    # Flags TRL's parser would reject (--base_model, --num_epochs): only the script's own reading is left.
    copy = from_command(shlex.split(ALPACA_LORA_COPY), {}, name="hf")
    assert copy.setup.adapter == "lora" and "trainer_library" not in copy.forks
    trl = from_command(shlex.split("trl sft --model_name_or_path Qwen/Qwen2.5-0.5B --lora_r 16 --output_dir o"), {})
    assert trl.setup.adapter == "full" and "adapter" not in trl.unsure  # TRL's own CLI: ModelConfig decides


# https://github.com/hiyouga/LlamaFactory/issues/9166 (an entry of dataset_info.json, as pasted)
LF_DATASET_ENTRY = """"foodmonitor":{
    "file_name": "train_llama_filtered.json",
    "formatting": "sharegpt",
    "columns": {
      "messages": "messages",
      "videos": "videos"
    },"""


def test_members_lifted_out_of_a_json_file_are_named_as_such(tmp_path):
    import pytest

    from loraflow.errors import LoraflowError

    pasted = tmp_path / "config.yaml"
    pasted.write_text(LF_DATASET_ENTRY)
    with pytest.raises(LoraflowError, match=r"line 1, column 14.*members of a JSON object without the `\{ \}`"):
        run_check(None, "llama-factory", [str(pasted)], {}, as_json=True)


def test_torchrun_with_one_process_still_wraps_the_trainer_s_model_in_ddp_before_accelerate_1_10():
    """tloen/alpaca-lora#253: one torchrun process sets LOCAL_RANK, accelerate < 1.10 wraps the PeftModel in DDP,
    and the Trainer's find_unused_parameters=True meets reentrant recompute."""
    old = {"accelerate": Version("0.18.0"), "transformers": Version("4.28.0"), "peft": Version("0.3.0")}
    s = from_command(argv(ALPACA_LORA_TORCHRUN), old).setup
    assert (s.world_size, s.engine, s.find_unused_parameters, s.reentrant) == (1, "ddp", True, True)
    assert findings(argv(ALPACA_LORA_TORCHRUN), old)["ddp-reentrant-unused"] is None
    new = {**old, "accelerate": Version("1.10.0")}
    assert from_command(argv(ALPACA_LORA_TORCHRUN), new).setup.engine == "single"
    plain = ALPACA_LORA_TORCHRUN.split("finetune.py", 1)[1]  # `python finetune.py ...`: no LOCAL_RANK
    assert from_command(argv("python finetune.py" + plain), old).setup.engine == "single"
