"""TRL's GRPO refuses a generation batch that does not hold whole groups of num_generations completions (a start-up
stop, exit 2). Threads: huggingface/open-r1#249 and #236 (7 or 3 training processes, num_generations 8),
huggingface/trl#2876, #2858, #3061, modelscope/ms-swift#3980. The checked batch per release is read from the trl
wheels 0.14 - 0.23 (grpo_trainer.py __init__ for 0.15 - 0.17, grpo_config.py __post_init__ from 0.18)."""

from __future__ import annotations

import json
import shlex

import pytest

from loraflow.frontends import parse_versions, run_check

OPEN_R1 = ("accelerate launch --num_processes {procs} src/open_r1/grpo.py --model_name_or_path "
           "Qwen/Qwen2.5-1.5B-Instruct --per_device_train_batch_size {batch} --num_generations 8 "
           "--gradient_accumulation_steps {accum}")


def _check(line: str, trl: str) -> dict:
    return json.loads(run_check(shlex.split(line), None, [], dict(parse_versions(f"trl={trl}")), as_json=True)[0])


@pytest.mark.parametrize("procs, batch, accum, trl, stops", [
    (7, 1, 8, "0.15.0", True),  # open-r1#249: the global batch 7 x 1 holds no whole group of 8
    (7, 1, 8, "0.17.0", False),  # 0.17 counts the accumulation steps: 7 x 1 x 8 = 56
    (7, 1, 4, "0.18.0", True),  # 0.18: steps_per_generation (default: the accumulation steps) 7 x 1 x 4 = 28
    (8, 1, 1, "0.15.0", False),
    (7, 1, 8, "0.14.0", False),  # before 0.15 the batch counted prompts: nothing to check
])
def test_the_release_decides_the_batch_checked(procs, batch, accum, trl, stops):
    doc = _check(OPEN_R1.format(procs=procs, batch=batch, accum=accum), trl)
    assert bool(doc["stops"]) == stops, doc["stops"]
    if stops:
        assert doc["exit_code"] == 2 and "--num_generations 8" in doc["stops"][0]


def test_an_unseen_process_count_is_not_guessed():
    # accelerate launch without --num_processes: one process per GPU of a machine check does not see.
    doc = _check("accelerate launch src/open_r1/grpo.py --model_name_or_path m --per_device_train_batch_size 1 "
                 "--num_generations 8", "0.15.0")
    assert not doc["stops"]
    # python runs one process: 1 x 1 holds no group of 8.
    doc = _check("python src/open_r1/grpo.py --model_name_or_path m --per_device_train_batch_size 1 "
                 "--num_generations 8", "0.15.0")
    assert doc["stops"] and doc["exit_code"] == 2
