"""LLaMA-Factory's `check --framework llama-factory FILE`: what the file holds decides how it is read."""

from __future__ import annotations

import json

from loraflow.frontends import parse_versions, run_check
from loraflow.frontends.shell import is_launch_script

VERSIONS = dict(parse_versions("torch=2.13.0,transformers=5.23.0,peft=0.21.2,trl=1.16.0,accelerate=1.15.0,"
                               "deepspeed=0.19.8,llama-factory=0.9.3"))
LAUNCH = ("#!/bin/bash\naccelerate launch src/train_bash.py \\\n    --stage sft \\\n    --do_train \\\n"
          "    --model_name_or_path meta-llama/Llama-2-7b-chat-hf \\\n    --finetuning_type lora \\\n"
          "    --lora_target q_proj,v_proj \\\n    --output_dir out \\\n    --fp16\n")


def test_a_launch_script_saved_under_a_config_name_is_read_for_its_launch_line(tmp_path):
    """LLaMA-Factory#274 pasted `#!/bin/bash` + `accelerate launch src/train_bash.py ...` as its config: the file is
    read as the launch script it is (flags, launcher), not refused as a YAML file that holds no mapping."""
    path = tmp_path / "run.yaml"
    path.write_text(LAUNCH)
    text, _ = run_check(None, "llama-factory", [str(path)], dict(VERSIONS), True)
    doc = json.loads(text)
    setup = doc["setup"]
    assert (setup["adapter"], setup["precision"]) == ("lora", "fp16-mixed"), setup
    assert is_launch_script(str(path))
    # Without the shebang the text is still no YAML mapping with a launch line in it: read the same way.
    path.write_text(LAUNCH.removeprefix("#!/bin/bash\n"))
    assert is_launch_script(str(path))


def test_a_yaml_config_is_not_taken_for_a_launch_script(tmp_path):
    path = tmp_path / "sft.yaml"
    path.write_text("stage: sft\nfinetuning_type: lora\nlora_target: all\noutput_dir: out\n")
    assert not is_launch_script(str(path))
    broken = tmp_path / "broken.yaml"
    broken.write_text("stage: sft\n  finetuning_type: lora\n")  # bad YAML, and no launch line: keeps its own error
    assert not is_launch_script(str(broken))


def test_use_ray_runs_ray_num_workers_processes_and_its_ray_keys_are_read(tmp_path, monkeypatch):
    """examples/train_lora/llama3_lora_sft_ray.yaml (USE_RAY=1): llamafactory-cli starts no torchrun under Ray, whose
    TorchTrainer runs ray_num_workers processes; its RayArguments keys (ray_run_name, placement_strategy, ...) were
    listed as not understood and the world size was taken as one process."""
    (tmp_path / "ray.yaml").write_text("stage: sft\nfinetuning_type: lora\nlora_target: all\noutput_dir: out\n"
                                       "ray_run_name: r\nray_storage_path: ./saves\nray_num_workers: 4\n"
                                       "placement_strategy: PACK\nresources_per_worker:\n  GPU: 1\n")
    monkeypatch.chdir(tmp_path)
    line = ["env", "USE_RAY=1", "llamafactory-cli", "train", "ray.yaml"]
    doc = json.loads(run_check(line, None, [], dict(VERSIONS), True)[0])
    assert doc["setup"]["world_size"] == 4 and not doc["unknown"], doc["unknown"]
    # FORCE_TORCHRUN wins over Ray (cli.py), and without USE_RAY the Ray keys start nothing.
    for env in (["env", "USE_RAY=1", "FORCE_TORCHRUN=1", "NPROC_PER_NODE=2"], ["env", "NPROC_PER_NODE=2"]):
        doc = json.loads(run_check(env + line[2:], None, [], dict(VERSIONS), True)[0])
        assert doc["setup"]["world_size"] == 2
