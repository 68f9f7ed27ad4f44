"""AdaLoRA's orthogonal regularization under reentrant checkpointing and DDP (adalora-reentrant-ddp): huggingface/peft
#663 and #1745; the term is built in AdaLoraModel.forward in every release 0.3.0 - 0.21.2. Reproduced here on CPU with
real torch and peft: one gloo process is enough, static_graph avoids it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
from script_check import check, rules

from loraflow.explain import diagnose_log

RULE = "adalora-reentrant-ddp"
SCRIPT = '''
    from peft import AdaLoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments
    model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-0.5B")
    model = get_peft_model(model, AdaLoraConfig(target_modules=["q_proj", "v_proj"], total_step=1000{task}))
    args = TrainingArguments(output_dir="o", gradient_checkpointing=True,
                             gradient_checkpointing_kwargs={{"use_reentrant": {reentrant}}}{more})
    Trainer(model=model, args=args, train_dataset=data).train()
'''
TORCHRUN = ["torchrun", "--nproc_per_node", "2", "train.py"]


@pytest.mark.parametrize("task, reentrant, more, holds", [
    (', task_type="CAUSAL_LM"', "True", "", True),
    (', task_type="CAUSAL_LM"', "True", ", ddp_find_unused_parameters=False", True),  # not the plain-LoRA fix
    (', task_type="CAUSAL_LM"', "False", "", False),
    (', task_type="CAUSAL_LM"', "True", ", ddp_static_graph=True", False),
    ("", "True", "", False),  # a plain PeftModel skips the regularization
])
def test_the_launch_decides(tmp_path, monkeypatch, task, reentrant, more, holds):
    report = check(tmp_path, monkeypatch, SCRIPT.format(task=task, reentrant=reentrant, more=more), TORCHRUN)
    assert (RULE in rules(report)) == holds, rules(report)


def test_explain_names_it_where_adalora_shows():
    line = ("RuntimeError: Expected to mark a variable ready only once. This error is caused by one of the following "
            "reasons: 1) Use of a module parameter outside the `forward` function.")
    _, candidates, _ = diagnose_log("peft_config = AdaLoraConfig(init_r=12, target_r=8)\n" + line)
    assert candidates and candidates[0].rule.id == RULE
    _, plain, _ = diagnose_log(line)
    assert not plain or plain[0].rule.id != RULE


# The live run is a child process: a DDP wrapper collected after a failed backward destroys its gloo group from the
# thread that holds the GIL while one of the group's worker threads waits for it (a deadlock seen once in a full pytest
# run); the child prints its outcome and leaves with os._exit, before any of that teardown.
LIVE = """
import os, sys, torch, torch.distributed as dist
from peft import AdaLoraConfig, get_peft_model
from torch.nn.parallel import DistributedDataParallel
from transformers import LlamaConfig, LlamaForCausalLM
dist.init_process_group("gloo", rank=0, world_size=1)
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=4)
model = get_peft_model(LlamaForCausalLM(cfg), AdaLoraConfig(target_modules=["q_proj", "v_proj"], init_r=4, target_r=2,
                                                            total_step=20, task_type="CAUSAL_LM"))
model.base_model.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
model.base_model.model.enable_input_require_grads()
ddp = DistributedDataParallel(model, static_graph=sys.argv[1] == "static")
x = torch.randint(0, 64, (2, 8))
try:
    ddp(input_ids=x, labels=x).loss.backward()
    missing = sum(p.grad is None for n, p in model.named_parameters() if "lora_B" in n)
    print(f"ok, {missing} lora_B without a gradient", flush=True)
except RuntimeError as exc:
    print("error:", str(exc).splitlines()[0][:120], flush=True)
os._exit(0)
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("static_graph", [False, True])
def test_the_failure_on_real_torch_and_peft(static_graph):
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_port()), "OMP_NUM_THREADS": "1",
           "PYTHONWARNINGS": "ignore"}
    out = subprocess.run([sys.executable, "-c", LIVE, "static" if static_graph else "default"], env=env,
                         capture_output=True, text=True, timeout=180).stdout
    if static_graph:
        assert "ok, 0 lora_B without a gradient" in out, out
    else:
        assert "error: Expected to mark a variable ready only once" in out, out
