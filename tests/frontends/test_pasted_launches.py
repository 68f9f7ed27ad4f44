"""A launch as people paste it into an issue or copy it from a terminal: in a markdown fence, with Windows line ends,
behind a shell prompt. check reads the command inside, as it would read the script itself."""

from __future__ import annotations

import json
import shlex

import pytest

from loraflow.frontends import parse_versions, run_check

VERSIONS = dict(parse_versions("torch=2.13.0,transformers=5.23.0,peft=0.21.2,trl=1.16.0,accelerate=1.15.0,"
                               "bitsandbytes=0.50.2,deepspeed=0.19.8"))
LAUNCH = ("CUDA_VISIBLE_DEVICES=0,1 torchrun --nproc_per_node 2 train.py \\\n"
          "   --model_name_or_path meta-llama/Llama-2-7b-hf --use_peft --load_in_4bit \\\n"
          "   --deepspeed ds_z3.json --gradient_checkpointing --bf16\n")


def _setup(doc: dict) -> tuple:
    s = doc["setup"]
    return s["adapter"], s["quantization"], s["engine"], s["zero_stage"], s["world_size"], doc["exit_code"]


def _script(tmp_path, text: str) -> dict:
    path = tmp_path / "run.sh"
    path.write_bytes(text.encode())
    return json.loads(run_check(["bash", str(path)], None, [], dict(VERSIONS), True)[0])


@pytest.mark.parametrize("pasted", [
    "```bash\n" + LAUNCH + "```\n",
    LAUNCH.replace("\n", "\r\n"),
    "$ " + LAUNCH,
    "(venv) user@host:~/finetune$ " + LAUNCH,
    "root@a1b2c3:/workspace# " + LAUNCH,
])
def test_a_pasted_launch_script_reads_as_the_script_itself(tmp_path, pasted):
    assert _setup(_script(tmp_path, pasted)) == _setup(_script(tmp_path, LAUNCH))


def test_a_prompt_before_the_command_line_is_not_the_program(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plain = " ".join(LAUNCH.replace("\\\n", " ").split())
    want = json.loads(run_check(shlex.split(plain), None, [], dict(VERSIONS), True)[0])
    for prompt in ("$", "(venv) user@host:~/x$", "root@a1b2:/w#"):
        got = json.loads(run_check(shlex.split(f"{prompt} {plain}"), None, [], dict(VERSIONS), True)[0])
        assert _setup(got) == _setup(want), prompt


def test_a_variable_at_the_start_of_a_line_is_not_a_prompt(tmp_path):
    doc = _script(tmp_path, "LAUNCHER=torchrun\n$LAUNCHER --nproc_per_node 2 train.py --use_peft\n")
    assert doc["setup"]["world_size"] == 2


def test_a_config_pasted_in_a_markdown_fence_with_windows_line_ends_is_read(tmp_path):
    body = ("base_model: meta-llama/Llama-2-7b-hf\nadapter: qlora\nload_in_4bit: true\nfsdp:\n  - full_shard\n"
            "bf16: true\n")
    plain, fenced = tmp_path / "plain.yml", tmp_path / "fenced.yml"
    plain.write_text(body)
    fenced.write_bytes(("```yaml\n" + body + "```\n").replace("\n", "\r\n").encode())
    read = [json.loads(run_check(None, "axolotl", [str(p)], dict(VERSIONS), True)[0]) for p in (plain, fenced)]
    assert read[0]["setup"] == read[1]["setup"] and read[1]["setup"]["quantization"] == "4bit"


def test_a_script_s_config_is_found_from_the_folder_it_is_run_from(tmp_path, monkeypatch):
    """`repo/scripts/run.sh` names `configs/ds.json` as seen from `repo/`, where it runs; check run elsewhere looks
    beside the script and up its folders after the working directory."""
    (tmp_path / "repo" / "scripts").mkdir(parents=True)
    (tmp_path / "repo" / "configs").mkdir()
    (tmp_path / "repo" / "configs" / "myds.json").write_text('{"zero_optimization": {"stage": 3}}')
    (tmp_path / "repo" / "scripts" / "run.sh").write_text(
        "torchrun --nproc_per_node 2 train.py --model_name_or_path m --use_peft --deepspeed configs/myds.json\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    doc = json.loads(run_check(["bash", str(tmp_path / "repo" / "scripts" / "run.sh")], None, [], dict(VERSIONS),
                               True)[0])
    assert doc["setup"]["zero_stage"] == 3 and doc["sources"]["zero_stage"].endswith("myds.json: "
                                                                                      "zero_optimization.stage")
