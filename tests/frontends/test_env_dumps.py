"""`check --versions-from FILE` against environment listings copied from public issue threads (tests/fixtures/
env_dumps, MANIFEST.json says where each came from and what it states), and one focused test for each way a paste
was misread before: the shape is named in the test, the listing in it is ours."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from packaging.version import Version

from loraflow.commands.cli import main
from loraflow.errors import LoraflowError
from loraflow.frontends.versions_source import versions_from_file, versions_from_text

DUMPS = Path(__file__).parents[1] / "fixtures" / "env_dumps"
MANIFEST = json.loads((DUMPS / "MANIFEST.json").read_text())["fixtures"]


def read(text: str) -> dict[str, str]:
    return {k: str(v) for k, v in versions_from_text(text).items()}


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_each_real_listing_gives_the_versions_it_states(name):
    got = {k: str(v) for k, v in versions_from_file(str(DUMPS / name)).items()}
    assert got == MANIFEST[name]["versions"], MANIFEST[name]["source"]


def test_the_manifest_and_the_folder_agree_and_cover_the_shapes():
    files = {p.name for p in DUMPS.iterdir() if p.name != "MANIFEST.json"}
    assert files == set(MANIFEST)
    assert len(files) >= 40 and all(f["source"].startswith("https://github.com/") for f in MANIFEST.values())
    shapes = {f["shape"] for f in MANIFEST.values()}
    assert {"pip list", "pip freeze", "conda list", "ds_report", "torch collect_env", "llamafactory-cli env",
            "trl env", "accelerate env", "transformers env", "Unsloth banner"} <= shapes


def test_collect_env_rows_behind_pip3_and_conda_tags():
    text = "Versions of relevant libraries:\n[pip3] torch-cluster==1.4.5\n[pip3] torch==2.6.0\n" \
           "[pip3] transformers==4.51.3\n[conda] cuda 12.2.2 0 nvidia\n[conda] peft 0.14.0 pypi_0 pypi\n"
    assert read(text) == {"torch": "2.6.0", "transformers": "4.51.3", "peft": "0.14.0"}


def test_numbered_and_bulleted_items():
    assert read("1. Ray: 2.46.0\n2. Python: 3.11.12\n3. DeepSpeed: 0.16.7\n") == {"deepspeed": "0.16.7"}
    assert read("\u2022\tTRL: 0.8.3\n\u2022 Transformers: 4.37.2\n") == {"trl": "0.8.3", "transformers": "4.37.2"}


def test_unsloth_banner_states_unsloth_transformers_and_torch():
    new = "==((====))==  Unsloth 2025.6.8: Fast Qwen3 patching. Transformers: 4.52.4.\n" \
          "O^O/ \\_/ \\    Torch: 2.7.0+cu126. CUDA: 8.0. CUDA Toolkit: 12.6. Triton: 3.3.0\n"
    assert read(new) == {"unsloth": "2025.6.8", "transformers": "4.52.4", "torch": "2.7.0"}
    old = "==((====))==  Unsloth: Fast Mistral patching release 2024.5\n" \
          "O^O/ \\_/ \\    Pytorch: 2.2.0+cu121. CUDA = 8.0. CUDA Toolkit = 12.1.\n"
    assert read(old) == {"unsloth": "2024.5", "torch": "2.2.0"}  # CUDA = 8.0 is the compute capability


def test_pip_show_lock_files_and_json():
    assert read("Name: torch\nVersion: 2.2.1\nSummary: Tensors\n") == {"torch": "2.2.1"}
    assert read('[[package]]\nname = "peft"\nversion = "0.7.1"\n') == {"peft": "0.7.1"}
    assert read('[{"name": "torch", "version": "2.1.0"}, {"name": "trl", "version": "0.9.6"}]') == \
        {"torch": "2.1.0", "trl": "0.9.6"}


def test_name_alone_over_its_version_and_python_prompts():
    assert read("torch\n2.1.1\npeft\n0.6.1\nCUDA\n12.1\n") == {"torch": "2.1.1", "peft": "0.6.1"}
    text = ">>> import torch\n>>> torch.__version__\n'2.1.0+cu121'\n" \
           "$ python -c 'import peft, trl; print(peft.__version__, trl.__version__)'\n0.7.1 0.9.6\n"
    assert read(text) == {"torch": "2.1.0", "peft": "0.7.1", "trl": "0.9.6"}


def test_table_rows_take_the_cell_beside_the_name_only():
    text = "| Package | Version |\n|---|---|\n| torch | 2.1.0+cu121 |\n| `transformers` | 4.41.2 |\n" \
           "| peft | >=0.11,<0.20 | 0.17.1 |\n"  # a requirements table: the range is no version of the run
    assert read(text) == {"torch": "2.1.0", "transformers": "4.41.2"}


def test_html_and_ansi_pastes():
    text = "<details><summary>env</summary>\n<p>torch==2.1.0<br>transformers==4.36.2<br/>peft&#61;&#61;0.7.1</p>\n" \
           "<table><tr><td>trl</td><td>0.9.6</td></tr></table>\n\x1b[92mdeepspeed info ....... 0.12.6\x1b[0m\n"
    assert read(text) == {"torch": "2.1.0", "transformers": "4.36.2", "peft": "0.7.1", "trl": "0.9.6",
                          "deepspeed": "0.12.6"}


def test_wheel_urls_extras_and_several_pins_on_a_line():
    text = "torch @ https://download.pytorch.org/whl/cu121/torch-2.1.0%2Bcu121-cp310-cp310-linux_x86_64.whl\n" \
           "transformers @ file:///home/conda/feedstock_root/build_artifacts/transformers_1701/work\n" \
           "deepspeed[autotuning]==0.12.6\ntorch (2.0.1)\n"
    assert read(text) == {"torch": "2.1.0", "deepspeed": "0.12.6"}
    assert read("accelerate==0.25.0, peft==0.7.1; trl==0.7.4\n") == {"accelerate": "0.25.0", "peft": "0.7.1",
                                                                    "trl": "0.7.4"}
    # A command that installs pins says what was asked for (often the fix), not what the run had.
    assert read("pip install transformers==4.45.0 peft==0.12.0\n") == {}


def test_pip_conflict_report_states_what_is_installed():
    line = "ms-swift 3.2.1 requires trl<0.17,>=0.13, but you have trl 0.10.1 which is incompatible.\n"
    assert read(line) == {"ms-swift": "3.2.1", "trl": "0.10.1"}


def test_a_cuda_or_python_number_is_not_the_package_version_and_not_installed_is_none():
    text = "- torch (CUDA): 12.1\n- PyTorch CUDA version: 12.1\ntorch.version.cuda: 12.1\n" \
           "- bitsandbytes version: N/A\n- DeepSpeed version: not installed\n- Python version: 3.10.12\n" \
           "torch cuda version ............... 12.1\n- PyTorch version (GPU?): 2.3.0+cu121 (True)\n"
    assert read(text) == {"torch": "2.3.0"}


def test_dev_rc_post_local_and_nightly_versions_keep_their_release_and_drop_the_local_label():
    text = "torch 2.6.0.dev20241112+cu124\ntransformers 4.41.0rc1\nbitsandbytes 0.45.0.dev0+7e6f865\n" \
           "deepspeed info ....... 0.15.5+46d7d0d1, 46d7d0d1, patch-1\npeft 0.13.2.post1\n" \
           "- `llamafactory` version: 0.9.1.dev0\nunsloth_zoo 2025.3.9\nunsloth 2025.3.10\n"
    assert read(text) == {"torch": "2.6.0.dev20241112", "transformers": "4.41.0rc1", "bitsandbytes": "0.45.0.dev0",
                          "deepspeed": "0.15.5", "peft": "0.13.2.post1", "llama-factory": "0.9.1.dev0",
                          "unsloth": "2025.3.10"}


def test_names_spelled_as_frameworks_print_them():
    text = "LLaMA-Factory version: 0.9.2.dev0\nms_swift 3.4.0\nOpenRLHF 0.6.1\nBitsAndBytes 0.43.1\n"
    assert read(text) == {"llama-factory": "0.9.2.dev0", "ms-swift": "3.4.0", "openrlhf": "0.6.1",
                          "bitsandbytes": "0.43.1"}


def test_windows_files_utf16_bom_and_crlf(tmp_path):
    freeze = "torch==2.1.0+cu121\r\ntransformers==4.36.2\r\n"
    for encoding in ("utf-16", "utf-8-sig", "utf-8"):
        path = tmp_path / f"{encoding}.txt"
        path.write_bytes(freeze.encode(encoding))
        assert {k: str(v) for k, v in versions_from_file(str(path)).items()} == \
            {"torch": "2.1.0", "transformers": "4.36.2"}, encoding


def test_concatenated_listings_keep_the_first_and_a_half_readable_one_gives_what_it_can(tmp_path):
    text = "- `llamafactory` version: 0.9.3.dev0\n- PyTorch version: 2.6.0+cu118 (GPU)\n\n" \
           "Package Version\n------- -------\ntorch 2.6.0+cu118\npeft ???\ntrl\n"
    path = tmp_path / "env.txt"
    path.write_text(text)
    assert versions_from_file(str(path)) == {"llama-factory": Version("0.9.3.dev0"), "torch": Version("2.6.0")}
    nothing = tmp_path / "nothing.txt"
    nothing.write_text("peft ???\nPyTorch version: N/A\n")
    with pytest.raises(LoraflowError, match="nothing.txt names none of"):
        versions_from_file(str(nothing))


def test_check_reads_a_real_listing_and_says_so(capsys):
    path = DUMPS / "llamafactory-7588-lf-env-after-logs.txt"
    main(["check", "--versions-from", str(path), "--", "llamafactory-cli", "train", "x.yaml"])
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("versions: ") and "llama-factory 0.9.2.999 (read for 0.9.3.dev0" in first and f"--versions-from {path}" in first


# Found in review: numbers that are not the run's releases, read before the listing's own.
def test_benchmark_tables_commands_and_sentences_state_no_versions():
    bench = "| Method | Speed-up | VRAM |\n|---|---|---|\n| Unsloth | 1.5 | 10 GB |\n| TRL | 3.2 | 20 GB |\n" \
            "trl==0.9.6\nunsloth==2024.8\n"
    assert read(bench) == {"trl": "0.9.6", "unsloth": "2024.8"}
    colab = "!pip install -q trl==0.8.6 peft==0.10.0\nRUN pip install torch==2.0.0 peft==0.9.0\n" \
            "I tried torch==2.0.0 and torch==2.1.0 first\npeft==0.13.2\ntrl==0.12.1\ntorch==2.5.1\n"
    assert read(colab) == {"peft": "0.13.2", "trl": "0.12.1", "torch": "2.5.1"}
    conflict = "verl 0.2.0 requires torch==2.4.0, vllm==0.6.3, but you have torch 2.5.1 which is incompatible.\n"
    assert read(conflict) == {"verl": "0.2.0", "torch": "2.5.1"}
    assert read("If you have trl 0.9 installed, upgrade\npeft==0.7.1\n") == {"peft": "0.7.1"}
    assert read("torch 12.1 (CUDA)\ntorch==2.1.0\n") == {"torch": "2.1.0"}
