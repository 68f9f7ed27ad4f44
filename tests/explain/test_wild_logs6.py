"""The sixth sweep of logs posted in issue threads (tests/fixtures/corpus/explain/wild6/), aimed at the frameworks the
corpus was thin on: Unsloth's patched trainers, Lightning/Fabric strategies, torchtune, accelerate FSDP, OpenRLHF and
ms-swift rollouts on vLLM, LLaMA-Factory and ms-swift multimodal runs; two thirds of them decoys with look-alike
errors. One misreading was found: a colocated vLLM engine that cannot wake up from sleep mode (its cumem allocator
runs out of memory re-mapping weights and KV cache beside the trainer) was not read as the colocation memory family,
and sleep mode, which only a colocated engine uses, did not count as the engine sharing the trainer's GPUs."""

from __future__ import annotations

import json

from conftest import ROOT

from loraflow.explain import diagnose_log, view
from loraflow.explain.facts import read_facts

WILD6 = ROOT / "tests" / "fixtures" / "corpus" / "explain" / "wild6"


def _found(text: str) -> list[tuple[str, str]]:
    _, candidates, _ = diagnose_log(text)
    return [(c.rule.id, c.confidence) for c in candidates]


# The shape of TideDra/lmm-r1#43 (OpenRLHF's hybrid engine with vLLM sleep mode): the engine's wake_up re-maps its
# memory through vllm/device_allocator/cumem.py, whose C side (csrc/cumem_allocator.cpp, CUDA_CHECK) prints and
# raises `CUDA Error: out of memory at <file>:<line>` while the trainer still holds the GPU.
_WAKE_UP_OOM = """\
(LLMRayActor pid=11) CUDA Error: out of memory at /workspace/csrc/cumem_allocator.cpp:62
(ActorModelRayActor pid=12)   File "/usr/lib/python3/dist-packages/vllm/worker/worker.py", line 140, in wake_up
(ActorModelRayActor pid=12)     allocator.wake_up()
(ActorModelRayActor pid=12)   File "/usr/lib/python3/dist-packages/vllm/device_allocator/cumem.py", line 207, in wake_up
(ActorModelRayActor pid=12)     create_and_map(handle)
(ActorModelRayActor pid=12) RuntimeError: CUDA Error: out of memory at /workspace/csrc/cumem_allocator.cpp:62
"""


def test_a_sleep_mode_wake_up_out_of_memory_is_the_colocated_engine_memory():
    assert _found(_WAKE_UP_OOM)[:1] == [("vllm-colocate-memory", "confirmed")]
    # The bare message, with nothing that shows the engine shares a GPU, is only a possible cause.
    assert _found("RuntimeError: CUDA Error: out of memory at /workspace/csrc/cumem_allocator.cpp:62\n") == [
        ("vllm-colocate-memory", "possible")]
    # Another cumem error (ms-swift#9144's `invalid argument`, a vLLM version bug) is not a memory shortage.
    assert _found("CUDA Error: invalid argument at cumem_allocator.cpp:119\n") == []


def test_vllm_sleep_mode_lines_show_a_colocated_engine():
    # vLLM's gpu_worker.py and executor_base.py log lines of a sleeping engine, as ms-swift colocate runs print them.
    log = view("INFO 08-27 09:29:24 [gpu_worker.py:81] Sleep mode freed 42.16 GiB memory, 16.79 GiB memory is "
                  "still in use.\nINFO 08-27 09:29:24 [executor_base.py:210] It took 1.98 seconds to fall asleep.\n")
    assert "vllm_colocated" in read_facts(log)
    # A server that never sleeps says nothing of the kind.
    assert "vllm_colocated" not in read_facts(view("INFO [api_server.py:1] Starting vLLM API server on :8000\n"))


def test_wild6_decoys_claim_nothing():
    manifest = json.loads((WILD6 / "MANIFEST.json").read_text())
    for name, meta in manifest.items():
        if meta["decoy"]:
            assert _found((WILD6 / name).read_text()) == [], name


def test_wild6_failures_are_named_or_left_unclaimed():
    manifest = json.loads((WILD6 / "MANIFEST.json").read_text())
    for name, meta in manifest.items():
        if meta["decoy"]:
            continue
        found = _found((WILD6 / name).read_text())
        if meta.get("evidence_in_log") is False:  # cut before any trace of the failure: no wrong claim
            assert not found or found[0][0] == meta["expected"], name
        else:
            assert found and found[0][0] == meta["expected"], name


def test_torchs_own_cuda_out_of_memory_is_not_a_cut_wake_up_message():
    # LlamaFactory#9331's one line: torch's complete CUDA out-of-memory error, the same words the cumem allocator's
    # message starts with. A line that ends there is that error, not the allocator's message cut short.
    assert _found("torch.AcceleratorError: CUDA error: out of memory\n") == []


# Found by the wild6 sweep: Unsloth's frames (it patches TRL's and transformers' trainers) and Lightning's loop name
# the framework a log came from.
def test_unsloth_and_lightning_frames_name_the_framework():
    from loraflow.frontends.base import framework_of_log

    assert framework_of_log('  File "/usr/lib/python3.11/site-packages/unsloth_zoo/loss_utils.py", line 12') == "hf"
    assert framework_of_log('  File "/opt/venv/lib/python3.10/site-packages/lightning/pytorch/trainer/trainer.py", '
                            'line 9') == "python-script"
