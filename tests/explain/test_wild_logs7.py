"""The seventh sweep of logs posted in issue threads (tests/fixtures/corpus/explain/wild7/), aimed at long logs as
users attach them: several ranks' tracebacks interleaved, tqdm bars and warnings, the launch command echoed at the
top, environment dumps, and noise after the traceback. Two misreadings were found and fixed: a paste that stops
inside one rank's copy of the traceback after another rank printed its error line was read as cut before the
failure's error line (and a rule whose raise path the cut copy passes was claimed), and an echoed launch command
written one flag a line (trailing backslashes) or traced by bash's `set -x` (`+ python3 -m ...`) was not read."""

from __future__ import annotations

import json

from conftest import ROOT

from loraflow.explain import diagnose_log, view
from loraflow.explain.facts import read_facts

WILD7 = ROOT / "tests" / "fixtures" / "corpus" / "explain" / "wild7"


def _found(text: str) -> list[tuple[str, str]]:
    _, candidates, _ = diagnose_log(text)
    return [(c.rule.id, c.confidence) for c in candidates]


# The shape of modelscope/ms-swift#1574 and huggingface/trl#2600 (torchrun's `[rankN]:` record prefixes): one rank
# prints its traceback and error line in full, another rank's copy of the same traceback follows and the paste stops
# inside it. Here rank 0 ran out of memory in a ZeRO-3 backward hook and rank 1's copy stops in that hook.
_RANK0_FULL_RANK1_CUT = """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "/w/train.py", line 90, in <module>
[rank0]:     trainer.train()
[rank0]:   File "/py/site-packages/accelerate/accelerator.py", line 2246, in backward
[rank0]:     self.deepspeed_engine_wrapped.backward(loss, **kwargs)
[rank0]:   File "/py/deepspeed/runtime/zero/parameter_offload.py", line 397, in _run_before_backward_function
[rank0]:     self.pre_sub_module_backward_function(sub_module)
[rank0]:   File "/py/deepspeed/runtime/zero/partitioned_param_coordinator.py", line 338, in fetch_sub_module
[rank0]:     self.__all_gather_params(params_to_fetch, forward)
[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB. GPU 0 has a total capacity of 79.11 GiB
[rank1]: Traceback (most recent call last):
[rank1]:   File "/w/train.py", line 90, in <module>
[rank1]:     trainer.train()
[rank1]:   File "/py/site-packages/accelerate/accelerator.py", line 2246, in backward
[rank1]:     self.deepspeed_engine_wrapped.backward(loss, **kwargs)
[rank1]:   File "/py/deepspeed/runtime/zero/parameter_offload.py", line 397, in _run_before_backward_function
"""


def test_a_cut_copy_of_another_ranks_traceback_is_not_a_log_cut_before_its_error():
    log = view(_RANK0_FULL_RANK1_CUT)
    assert not log.truncated and log.shape == "full"
    # The out-of-memory error is the failure: the cut copy's ZeRO-3 backward hook does not make an evaluation-mode
    # backward (zero3-eval-backward) likely.
    assert _found(_RANK0_FULL_RANK1_CUT) == []
    # The other order (trl#2600: rank 2's error line, then rank 0's traceback, cut) is complete too.
    assert not view("[rank2]: IndexError: pop from an empty deque\n[rank0]: Traceback (most recent call last):\n"
                    '[rank0]:   File "/w/grpo.py", line 55, in <module>\n').truncated


def test_one_ranks_own_cut_traceback_is_still_cut():
    # The same rank's earlier error (a caught exception it printed) says nothing of the traceback it stops inside,
    # and a log without rank prefixes cannot tell its processes apart.
    same_rank = ("[rank1]: ValueError: caught and logged\n[rank1]: Traceback (most recent call last):\n"
                 '[rank1]:   File "/w/train.py", line 90, in <module>\n')
    assert view(same_rank).truncated
    plain = 'ValueError: caught\nTraceback (most recent call last):\n  File "/w/train.py", line 90, in <module>\n'
    assert view(plain).truncated


def _setups(text: str) -> list[str]:
    return sorted(n for n in read_facts(view(text)).names if n.startswith("setup"))


_TAIL = 'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\nRuntimeError: boom\n'
_ONE_LINE = ("deepspeed --num_gpus 2 src/train_bash.py --deepspeed ds_z3.json --stage sft --finetuning_type lora "
             "--gradient_checkpointing --fp16 --quantization_bit 4\n")


def test_an_echoed_launch_written_one_flag_a_line_is_read_whole():
    # pengxiao-song/LaWGPT#148 and hiyouga/LLaMA-Factory#2650 paste their launch script above the log, one flag a
    # line with trailing backslashes, as the shell joins them.
    multi = ("deepspeed --num_gpus 2 src/train_bash.py \\\n    --deepspeed ds_z3.json \\\n    --stage sft \\\n"
             "    --finetuning_type lora \\\n    --gradient_checkpointing \\\n    --fp16 \\\n"
             "    --quantization_bit 4\n")
    assert _setups(_ONE_LINE + _TAIL) != []
    assert _setups(multi + _TAIL) == _setups(_ONE_LINE + _TAIL)


def test_a_set_x_traced_launch_is_read():
    # verl's and OpenRLHF's example scripts run under `set -x`, so their logs open with `+ python3 -m ...`
    # (verl-project/verl#1127's log starts so).
    assert _setups("+ " + _ONE_LINE + _TAIL) == _setups(_ONE_LINE + _TAIL)
    # A module no frontend recognises is passed over, and a later launch line is still read.
    assert _setups("python -m pip install -U deepspeed\n" + _ONE_LINE + _TAIL) == _setups(_ONE_LINE + _TAIL)


# OpenRLHF's and verl's drivers end on Ray's wrapper of the remote failure (OpenRLHF/OpenRLHF#862 and #813:
# `ray.exceptions.RayTaskError(ActorDiedError): ray::ActorModelRayActor.fit() (pid=...)`), whose class names the
# cause in parentheses (ray/exceptions.py, RayTaskError.as_instanceof_cause).
_RAY_DRIVER = """\
ray job submit --address=http://127.0.0.1:8265 -- python3 -m openrlhf.cli.train_ppo_ray --zero_stage 3 \
--lora_rank 64 --vllm_num_engines 2 --colocate_all_models --gradient_checkpointing --bf16
Traceback (most recent call last):
  File "/w/openrlhf/cli/train_ppo_ray.py", line 181, in train
    ray.get(refs)
  File "/py/ray/_private/worker.py", line 861, in get_objects
    raise value.as_instanceof_cause()
ray.exceptions.RayTaskError(KeyError): ray::ActorModelRayActor.fit() (pid=90836, ip=10.47.0.60)
"""


def test_rays_wrapped_remote_error_is_the_logs_error_line():
    log = view(_RAY_DRIVER)
    assert log.shape == "full" and log.final_error[1].startswith("ray.exceptions.RayTaskError(KeyError)")
    # The launch line sets up three conflicts, but the run failed with a KeyError: a complete log whose error is no
    # rule's message is not a log cut before its error line, so the launch alone claims nothing.
    assert _found(_RAY_DRIVER) == []


def test_wild7_decoys_claim_nothing():
    manifest = json.loads((WILD7 / "MANIFEST.json").read_text())
    for name, meta in manifest.items():
        if meta["decoy"]:
            assert _found((WILD7 / name).read_text()) == [], name


def test_wild7_failures_are_named_or_left_unclaimed():
    manifest = json.loads((WILD7 / "MANIFEST.json").read_text())
    for name, meta in manifest.items():
        if meta["decoy"]:
            continue
        found = _found((WILD7 / name).read_text())
        if meta.get("evidence_in_log") is False or meta["hard"]:  # no trace, or a generic one: no wrong claim
            assert not found or found[0][0] == meta["expected"], name
        else:
            assert found and found[0][0] == meta["expected"], name


# Found by the wild7 sweep: TRL's and OpenRLHF's file names (`grpo_trainer.py`, `train_ppo_ray`) show an RL stage.
def test_rl_file_names_show_an_rlhf_stage():
    from loraflow.rules.signs import COMPILED_FACTS

    assert COMPILED_FACTS["rlhf"].search('File "/x/trl/trainer/grpo_trainer.py", line 9')
    assert COMPILED_FACTS["rlhf"].search("python -m openrlhf.cli.train_ppo_ray --pretrain m")
    assert not COMPILED_FACTS["rlhf"].search("grpoo appo")


# Found in review: an echoed vLLM server line before the run is no launch to read the setup from, and a launch pasted
# in a markdown quote (`> ` on every line) is joined as one command.
def test_echoed_servers_are_skipped_and_quoted_launches_joined():
    from loraflow.explain import diagnose_log

    error = ("RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn\n")
    # The shape of a DeepSpeed-Chat step 3 LoRA launch (alpaca-rlhf's, as requires-grad/021 echoes it).
    launch = ("deepspeed training/step3_rlhf_finetuning/main.py --actor_model_name_or_path m \\\n"
              "    --critic_model_name_or_path c --actor_zero_stage 2 --critic_zero_stage 2 --deepspeed \\\n"
              "    --actor_gradient_checkpointing --actor_lora_dim 8 --actor_lora_module_name q_proj \\\n"
              "    --only_optimize_lora --output_dir out\n")
    server = "python -m vllm.entrypoints.openai.api_server --model m --enable-lora --port 8000\n"
    def from_launch(text: str) -> bool:
        found = diagnose_log(text, None)[1]
        return bool(found) and found[0].rule.id == "reentrant-frozen-inputs" and any(
            "launch line in the log" in r for r in found[0].reasons)

    assert from_launch(launch + error) and from_launch(server + launch + error)
    assert from_launch("".join("> " + line + "\n" for line in launch.splitlines()) + error)
