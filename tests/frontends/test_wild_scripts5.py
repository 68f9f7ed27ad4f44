"""`loraflow check` on training scripts that run their own loop (no HF Trainer): torch FSDP / DDP wrapped in the
code, a GradScaler, manual checkpoint calls, the model's mode at backward (a fifth sweep). Each test writes a short
synthetic script of the shape the named public repository showed."""

from __future__ import annotations

from script_check import check, rules


TORCHRUN = ["torchrun", "--nproc_per_node", "2", "train.py"]

# A LoRA model wrapped in torch's FSDP by the script itself, with a transformer-layer wrap policy and no
# use_orig_params (VectorInstitute's vectorlm-style model_utils and several llama FSDP+PEFT benchmarks): engine was
# read as plain DDP from the process count; torch's FSDP defaults to use_orig_params=False.
FSDP_LOOP = '''
    import functools, torch
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
    from transformers import AutoModelForCausalLM
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer
    from peft import LoraConfig, get_peft_model
    model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-7b-hf", torch_dtype=torch.{dtype})
    model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    policy = {policy}
    model = FSDP(model, auto_wrap_policy=policy{extra})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model.train()
    for batch in loader:
        loss = model(**batch).loss
        loss.backward()
        opt.step()
'''
MIXING = "functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={LlamaDecoderLayer})"


def test_fsdp_in_the_code_is_fsdp1_with_torch_s_use_orig_params_default(tmp_path, monkeypatch):
    report = check(tmp_path, monkeypatch, FSDP_LOOP.format(dtype="float32", policy=MIXING, extra=""), TORCHRUN)
    setup = report["setup"]
    assert setup["engine"] == "fsdp1" and setup["fsdp_use_orig_params"] is False
    assert "fsdp1-mixed-requires-grad" in rules(report) and report["exit_code"] == 2


def test_fsdp_with_orig_params_and_a_bf16_base_fails_on_the_dtype_only(tmp_path, monkeypatch):
    text = FSDP_LOOP.format(dtype="bfloat16", policy=MIXING, extra=", use_orig_params=True")
    report = check(tmp_path, monkeypatch, text, TORCHRUN)
    assert rules(report) >= {"fsdp1-mixed-dtype"} and "fsdp1-mixed-requires-grad" not in rules(report)


def test_peft_s_wrap_policy_keeps_the_adapters_apart(tmp_path, monkeypatch):
    text = FSDP_LOOP.format(dtype="bfloat16", policy="fsdp_auto_wrap_policy(model)", extra="").replace(
        "from peft import", "from peft.utils.other import fsdp_auto_wrap_policy\n    from peft import")
    report = check(tmp_path, monkeypatch, text, TORCHRUN)
    assert report["setup"]["fsdp_frozen_units_separate"] is True
    assert not rules(report) & {"fsdp1-mixed-requires-grad", "fsdp1-mixed-dtype"}


# torch DDP wrapped by the script (a prepare_model_for_ddp helper, DDP DPO loops): DDP's own default is
# find_unused_parameters=False, not the HF Trainer's True for a PeftModel.
DDP_LOOP = '''
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    from transformers import AutoModelForCausalLM
    from peft import LoraConfig, get_peft_model
    model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-1.5B")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={{"use_reentrant": True}})
    model.enable_input_require_grads()
    model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    model = DDP(model.cuda(), device_ids=[0]{extra})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model.train()
    for batch in loader:
        model(**batch).loss.backward()
        opt.step()
'''


def test_ddp_in_the_code_takes_torch_s_find_unused_default(tmp_path, monkeypatch):
    report = check(tmp_path, monkeypatch, DDP_LOOP.format(extra=""), TORCHRUN)
    assert report["setup"]["engine"] == "ddp" and report["setup"]["find_unused_parameters"] is False
    assert "ddp-reentrant-unused" not in rules(report)


def test_ddp_asked_to_find_unused_parameters_with_reentrant_checkpointing(tmp_path, monkeypatch):
    report = check(tmp_path, monkeypatch, DDP_LOOP.format(extra=", find_unused_parameters=True"), TORCHRUN)
    assert "ddp-reentrant-unused" in rules(report)


# A plain torch loop with torch.cuda.amp.GradScaler and model.half() after get_peft_model (LoRA classification
# and Llama fine-tuning notebooks exported to .py): the scaler is fp16 mixed precision, so the fp16 adapters crash
# at unscale; before, the cast was only noted as "without loss scaling".
SCALER_LOOP = '''
    import torch
    from transformers import AutoModelForCausalLM
    from peft import LoraConfig, get_peft_model
    model = AutoModelForCausalLM.from_pretrained("facebook/opt-1.3b").cuda()
    model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    {cast}
    scaler = torch.cuda.amp.GradScaler()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model.train()
    for batch in loader:
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(**batch).loss
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
'''


def test_a_grad_scaler_over_fp16_adapters_is_the_unscale_crash(tmp_path, monkeypatch):
    report = check(tmp_path, monkeypatch, SCALER_LOOP.format(cast="model.half()"))
    assert report["setup"]["precision"] == "fp16" and "fp16-trainable-unscale" in rules(report)


def test_a_grad_scaler_over_float32_adapters_is_fp16_mixed(tmp_path, monkeypatch):
    report = check(tmp_path, monkeypatch, SCALER_LOOP.format(cast="pass"))
    assert report["setup"]["precision"] == "fp16-mixed" and "fp16-trainable-unscale" not in rules(report)


# The model's mode at backward in the script's own loop (RL and distillation loops that evaluate or generate before
# the step, and loops that never call model.train()): from_pretrained returns the model in eval mode.
MODE_LOOP = '''
    import torch
    from transformers import AutoModelForCausalLM
    from peft import LoraConfig, get_peft_model
    model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-1.5B")
    model.gradient_checkpointing_enable()
    model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    {mode}
    for batch in loader:
        loss = model(**batch).loss
        loss.backward()
        opt.step()
'''


def test_a_loop_that_never_calls_train_runs_backward_in_eval_mode(tmp_path, monkeypatch):
    report = check(tmp_path, monkeypatch, MODE_LOOP.format(mode="pass"))
    assert report["setup"]["train_mode_at_backward"] is False
    assert "from_pretrained returns the model in eval mode" in report["sources"]["train_mode_at_backward"]


def test_eval_before_the_first_backward_is_eval_mode_and_train_is_train_mode(tmp_path, monkeypatch):
    assert check(tmp_path, monkeypatch, MODE_LOOP.format(mode="model.eval()"))["setup"][
        "train_mode_at_backward"] is False
    assert check(tmp_path, monkeypatch, MODE_LOOP.format(mode="model.train()"))["setup"][
        "train_mode_at_backward"] is True


# An accelerate loop launched with FSDP (a DeepSeek-R1-Distill LoRA script with a save_fsdp_peft_model helper, seen
# by its code in the index): accelerate alone wraps by the config's policy; PEFT's adapter policy is the Trainer's.
ACCEL_FSDP = '''
    import torch
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM
    from peft import LoraConfig, get_peft_model
    accelerator = Accelerator()
    model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-7B", torch_dtype=torch.bfloat16)
    model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    model.train()
    for batch in loader:
        accelerator.backward(model(**batch).loss)
        opt.step()
'''


def test_an_accelerate_fsdp_loop_has_no_adapter_wrap_policy(tmp_path, monkeypatch):
    report = check(tmp_path, monkeypatch, ACCEL_FSDP,
                   ["accelerate", "launch", "--use_fsdp", "--num_processes", "2", "train.py"])
    assert report["setup"]["fsdp_frozen_units_separate"] is False
    assert "fsdp1-mixed-dtype" in rules(report)


# torch.utils.checkpoint.checkpoint called by the script's own blocks on a LoRA model: checkpointing is on, and
# without use_reentrant torch warns and takes the reentrant path (torch/utils/checkpoint.py: use_reentrant=None
# warns, then True).
MANUAL_CKPT = '''
    import torch
    from torch.utils.checkpoint import checkpoint
    from transformers import AutoModelForCausalLM
    from peft import LoraConfig, get_peft_model
    model = get_peft_model(AutoModelForCausalLM.from_pretrained("m"), LoraConfig(r=8))
    model.train()
    opt = torch.optim.AdamW(model.parameters())
    for batch in []:
        hidden = checkpoint(model.base_model.model.model.layers[0], batch["x"]{kw})
        loss = hidden.sum()
        loss.backward()
        opt.step()
'''


def test_a_manual_checkpoint_call_is_checkpointing_reentrant_unless_told(tmp_path, monkeypatch):
    report = check(tmp_path, monkeypatch, MANUAL_CKPT.format(kw=""))
    assert report["setup"]["checkpointing"] != "off" and report["setup"]["reentrant"] is True
    report = check(tmp_path, monkeypatch, MANUAL_CKPT.format(kw=", use_reentrant=False"))
    assert report["setup"]["reentrant"] is False
