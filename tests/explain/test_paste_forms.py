"""How people paste errors into issues: a long error line wrapped onto the next line, the checkpoint's metadata
dump shortened to one line, DeepSpeed's own assertion read as if it were a fact about what ran before it."""

from __future__ import annotations

from loraflow.explain import diagnose_log

# https://github.com/huggingface/transformers/issues/47254 (ZeRO-3 + LoRA + non-reentrant checkpointing), as posted:
# the error line wrapped after "tensors", the metadata pair shortened to one line.
WRAPPED = """torch.utils.checkpoint.CheckpointError: Recomputed values for the following tensors
have different metadata than during the forward pass.
tensor at position 4: saved {'shape': [1024]} vs recomputed {'shape': [0]}"""


def _top(text: str):
    _, candidates, _ = diagnose_log(text)
    return (candidates[0].rule.id, candidates[0].confidence) if candidates else None


def test_a_wrapped_error_line_and_a_one_line_metadata_pair_are_read():
    assert _top(WRAPPED) == ("zero3-frozen-recompute", "confirmed")
    # The same pair with another precision instead of a released partition is not ZeRO-3's.
    assert _top(WRAPPED.replace("[0]", "[1024], 'dtype': torch.float32").replace(
        "[1024]}", "[1024], 'dtype': torch.bfloat16}", 1))[0] != "zero3-frozen-recompute"


def test_a_line_break_between_two_records_is_not_a_wrap():
    # The second line starts a new record (upper case): the message must not be stitched across it.
    text = "RuntimeError: Recomputed values for the following tensors\nWARNING have different metadata"
    assert _top(text) is None


def test_deepspeeds_own_assertion_is_not_evidence_of_an_evaluation_before_it():
    _, candidates, _ = diagnose_log("AssertionError: backward pass is invalid for module in evaluation mode")
    top = candidates[0]
    assert top.rule.id == "zero3-eval-backward"
    assert not any("eval mode just before" in reason for reason in top.reasons)
    _, candidates, _ = diagnose_log("trainer.model.eval()\nAssertionError: backward pass is invalid for module in "
                                    "evaluation mode")
    assert any("eval mode just before" in reason for reason in candidates[0].reasons)


def test_a_final_error_line_cut_short_is_read_as_the_start_of_its_message():
    """PhiCookBook#101 pasted `RuntimeError: Expected to have finished reductio`: the same causes as the whole line;
    a cut under 20 characters, or text that is not the start of a message, reads as nothing."""
    from loraflow.explain.diagnose import literal_prefix

    whole = "RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one."
    assert _top("RuntimeError: Expected to have finished reductio") == _top(whole) != None  # noqa: E711
    assert _top("RuntimeError: Expected to hav") is None  # too short to tell
    assert _top("RuntimeError: Expected to have finished something else") is None
    # Mid-log the line is not the paste's end: only the last line can be cut.
    assert _top("RuntimeError: Expected to have finished reductio\nINFO training resumed") is None
    # ...but a launcher's summary after it (torchrun's ChildFailedError, the deepspeed runner's lines) is no part of
    # the run's log, and a markdown quote marks every line (LLaMA-Factory#6376 pasted the cut line so, wild6/09).
    cut = "RuntimeError: Expected to have finished reductio"
    tail = ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n" + "=" * 60 + "\ntrain.py FAILED\n"
            "[2024-05-01 12:00:02,000] [ERROR] [launch.py:325:sigkill_handler] ['python'] exits with return code = 1")
    assert _top(cut + "\n" + tail) == _top(cut) == _top("> " + cut) != None  # noqa: E711
    assert literal_prefix(r"The size of tensor a \(\d+\) must") == "The size of tensor a ("
    assert literal_prefix(r"expected scalar type (Half|Float)") == "expected scalar type "


# tests/fixtures/corpus/explain/requires-grad/021: DeepSpeed-Chat step 3 with LoRA and checkpointing, whose log opens
# with its launch line; the traceback stops before the error line, so only that launch names the failure.
DSCHAT = "tests/fixtures/corpus/explain/requires-grad/021-alpaca-rlhf-dschat-step3-gc-only-lora.log"


def test_an_echoed_launch_line_is_read_behind_a_rank_prefix_a_quote_or_a_shell_prompt():
    from conftest import ROOT

    text = (ROOT / DSCHAT).read_text()
    first, rest = text.split("\n", 1)
    expected = _top(text)
    assert expected is not None
    for pasted in (f"[rank0]: {first}", f"> {first}", f"(venv) user@host:~/alpaca-rlhf$ {first}",
                   f"root@a1b2:/workspace# {first}"):
        assert _top(f"{pasted}\n{rest}") == expected, pasted
    # A commented-out launch is not the run's own.
    assert _top(f"# {first}\n{rest}") != expected


# Found by the paste forms of the wild5/wild6 logs: accelerate launch's own failure traceback names accelerate in
# any failed run, so it is no sign that the run was training; and a cut final line keeps its timestamp prefix.
def test_a_launchers_tail_says_nothing_of_training_and_prefixes_do_not_hide_a_cut():
    from loraflow.explain import diagnose_log
    from loraflow.explain.facts import read_facts

    mmdet = ('Traceback (most recent call last):\n  File "tools/train.py", line 9, in <module>\n    main()\n'
             "RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one.\n")
    tail = ('Traceback (most recent call last):\n  File "/opt/conda/bin/accelerate", line 8, in <module>\n'
            "    sys.exit(main())\n  File \"/opt/conda/lib/python3.10/site-packages/accelerate/commands/launch.py\", "
            "line 703, in simple_launcher\n    raise subprocess.CalledProcessError(returncode=1, cmd=cmd)\n"
            "subprocess.CalledProcessError: Command '['python', 'tools/train.py']' returned non-zero exit status 1.")
    assert "training" not in read_facts(diagnose_log(mmdet + tail, None)[0]).names
    cut = "2024-05-01 12:00:34,123 - RuntimeError: Expected to have finished reductio"
    assert _top(cut) == _top("RuntimeError: Expected to have finished reductio") != None  # noqa: E711


def test_a_two_line_log_kept_in_a_json_string_is_read_as_two_lines():
    """A log copied out of a JSON field keeps its line breaks as `\\n`: with two lines there are only two of them,
    and nothing else on the paste breaks a line (benchmarks/paste_robustness.py's literal-\\n form)."""
    pair = ("saved metadata: {'shape': torch.Size([2, 4096, 32, 128]), 'dtype': torch.bfloat16}\n"
            "recomputed metadata: {'shape': torch.Size([2, 8192, 32, 128]), 'dtype': torch.bfloat16}\n")
    assert _top(pair.replace("\n", "\\n")) == _top(pair) == ("cache-during-recompute", "confirmed")
    # a one-line error whose message holds a `\n` of its own is split too, and still names nothing
    assert _top(r"ValueError: bad template 'user\n{}' in --input_template") is None
