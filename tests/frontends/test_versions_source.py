"""Where `loraflow check` takes another framework's versions from (issue 31): --versions, then --versions-from FILE
(environment listings and the env dumps frameworks print), then --as-of DATE (the release-date table), then the
packages installed here; the first line of the report says which."""

from __future__ import annotations

import json

import pytest
from packaging.version import Version

from loraflow.commands.cli import main
from loraflow.errors import LoraflowError
from loraflow.frontends.versions_source import releases, versions_as_of, versions_from_text

# The shapes these tools print (pip, conda, ds_report, `transformers env`, `trl env`, `llamafactory-cli env`).
PIP_FREEZE = "torch==2.1.2\ntorchvision==0.16.2\npytorch-lightning==2.1.0\npeft @ git+https://github.com/x/peft\n" \
             "transformers==4.36.2\ndeepspeed-kernels==0.0.1.dev0\ndeepspeed==0.12.6\nunsloth_zoo==2025.3.1\n"
PIP_LIST = "Package                  Version\n------------------------ ----------\naccelerate               0.25.0\n" \
           "bitsandbytes             0.41.3.post2\ntorch                    2.1.2+cu121\n"
CONDA = "# Name                    Version                   Build  Channel\npytorch                   2.1.2  " \
        "py3.10_cuda12.1_cudnn8.9.2_0    pytorch\n  - transformers=4.36.2=pyhd8ed1ab_0\n"
DS_REPORT = "DeepSpeed general environment info:\ntorch install path ............... ['/opt/torch']\n" \
            "torch version .................... 2.1.2+cu121\ndeepspeed info ................... 0.12.6, unknown, unknown\n"
HF_ENV = "- `transformers` version: 4.46.0\n- Platform: Linux-5.15\n- Python version: 3.10.12\n" \
         "- PyTorch version (GPU?): 2.5.1+cu124 (True)\n- `Accelerate` version: 1.1.0\n"
LF_ENV = "- `llamafactory` version: 0.9.1.dev0\n- PyTorch version: 2.4.0+cu121 (GPU)\n- Transformers version: 4.45.2\n" \
         "- PEFT version: 0.12.0\n- TRL version: 0.9.6\n- DeepSpeed version: 0.15.1\n- Bitsandbytes version: 0.44.1\n"
REQUIREMENTS = "transformers>=4.41.2,<=4.45.2\ntorch >= 2.0\npeft==0.12.0\n"


@pytest.mark.parametrize("text, want", [
    (PIP_FREEZE, {"torch": "2.1.2", "transformers": "4.36.2", "deepspeed": "0.12.6"}),
    (PIP_LIST, {"accelerate": "0.25.0", "bitsandbytes": "0.41.3.post2", "torch": "2.1.2"}),
    (CONDA, {"torch": "2.1.2", "transformers": "4.36.2"}),
    (DS_REPORT, {"torch": "2.1.2", "deepspeed": "0.12.6"}),
    (HF_ENV, {"transformers": "4.46.0", "torch": "2.5.1", "accelerate": "1.1.0"}),
    (LF_ENV, {"llama-factory": "0.9.1.dev0", "torch": "2.4.0", "transformers": "4.45.2", "peft": "0.12.0",
              "trl": "0.9.6", "deepspeed": "0.15.1", "bitsandbytes": "0.44.1"}),
    (REQUIREMENTS, {"peft": "0.12.0"}),  # ranges state no version
])
def test_listings_and_env_dumps_give_their_versions(text, want):
    assert versions_from_text(text) == {k: Version(v) for k, v in want.items()}


def test_as_of_takes_the_newest_final_release_uploaded_by_that_day():
    table = releases()
    assert {"torch", "transformers", "peft", "deepspeed", "trl", "llama-factory", "unsloth"} <= set(table)
    got = versions_as_of("2024-09-01")
    for package, version in got.items():
        day = table[package][str(version)]
        assert day <= "2024-09-01" and not version.is_prerelease
        later = [v for v, d in table[package].items() if Version(v) > version and d <= "2024-09-01"]
        assert not [v for v in later if not Version(v).is_prerelease], (package, later)
    assert got["transformers"] == Version("4.44.2")  # uploaded 2024-08-22; 4.45.0 came on 2024-09-25
    with pytest.raises(LoraflowError, match="YYYY-MM-DD"):
        versions_as_of("last summer")


def run(capsys, *argv) -> tuple[int, str]:
    code = main(["check", *argv])
    return code, capsys.readouterr().out


def test_the_report_says_which_versions_it_used_and_they_decide(capsys, tmp_path):
    config = tmp_path / "lora.yaml"
    config.write_text("model_name_or_path: meta-llama/Meta-Llama-3-8B\nstage: sft\ndo_train: true\n"
                      "finetuning_type: lora\nlora_target: all\nuse_unsloth: true\ndataset: alpaca_en_demo\n"
                      "template: llama3\noutput_dir: out\nbf16: true\n")
    launch = ["--", "env", "FORCE_TORCHRUN=1", "NPROC_PER_NODE=2", "llamafactory-cli", "train", str(config)]
    freeze = tmp_path / "freeze.txt"
    freeze.write_text(PIP_FREEZE + "unsloth==2024.8\n")
    code, out = run(capsys, "--versions-from", str(freeze), *launch)
    assert out.startswith(f"versions: deepspeed 0.12.6, torch 2.1.2, transformers 4.36.2, unsloth 2024.8 "
                          f"(--versions-from {freeze})")
    assert "unsloth-multi-gpu" in out and code == 2  # decided: this launch fails as given
    code, out = run(capsys, "--as-of", "2026-10-01", "--json", *launch)
    doc = json.loads(out)
    assert "(released by 2026-10-01)" in doc["versions_used"] and code == 0 and not doc["findings"]
    # --versions wins over the other sources for what it names.
    code, out = run(capsys, "--versions", "unsloth=2026.7.1", "--as-of", "2024-09-01", *launch)
    assert "unsloth 2026.7.1 (--versions)" in out.splitlines()[0] and "unsloth-multi-gpu" not in out
    # No hint: this environment's packages, said so.
    code, out = run(capsys, *launch)
    assert out.splitlines()[0].endswith("(installed here; pass --versions, --versions-from or --as-of for the "
                                        "run's own)")


def test_a_listing_without_versions_is_refused_by_name(capsys, tmp_path):
    empty = tmp_path / "notes.txt"
    empty.write_text("we used the latest of everything\n")
    assert main(["check", "--versions-from", str(empty), "--", "llamafactory-cli", "train", "x.yaml"]) == 3
    err = capsys.readouterr().err
    assert err.startswith("error: --versions-from: ") and "notes.txt names none of torch" in err


# NVIDIA's NGC containers ship torch built from main before a release (`2.4.0a0+07cecf4168.nv24.5` in `pip list`),
# and issue threads' `transformers env` often shows a git install (`4.47.0.dev0`). PEP 440 puts such a build in
# neither `>=2.4` nor `<2.4`, so every torch-gated rule went undecided; it reads as a release just before 2.4.0.
def test_prerelease_and_container_builds_read_as_the_release_before_them(capsys, tmp_path):
    from loraflow.environment import as_release
    from loraflow.frontends import parse_versions
    from loraflow.rules.rule import affected_by

    written = versions_from_text("torch                    2.4.0a0+07cecf4168.nv24.5\n"
                                 "transformers             4.47.0.dev0\npeft                     0.13.2\n")
    assert written["torch"] == Version("2.4.0a0")  # read as written; placed when check takes it
    found = {k: as_release(v) for k, v in written.items()}
    assert found["torch"] == Version("2.3.999") and found["transformers"] == Version("4.46.999")
    assert affected_by(found["torch"], "<2.4") and not affected_by(found["torch"], ">=2.4")
    assert affected_by(found["transformers"], ">=4.46,<4.47")
    assert as_release("2.13.0+cpu") == Version("2.13.0") and as_release("0.16.0rc1") == Version("0.16.0")
    assert affected_by(parse_versions("torch=2.6.0.dev20241112")["torch"], "<2.6")
    listing = tmp_path / "pip-list.txt"
    listing.write_text("torch 2.4.0a0+07cecf4168.nv24.5\n")
    main(["check", "--versions-from", str(listing), "--", "python", "train.py", "--output_dir", "o"])
    assert "torch 2.3.999 (read for 2.4.0a0, a build from before its release)" in capsys.readouterr().out


def test_as_of_yields_to_the_releases_the_launch_itself_spells(capsys):
    # `--sft_type` and the `default-zero2` preset exist only before ms-swift 3.0: a run written that way in March
    # 2025 ran 2.x, though 3.1 was the newest release that day.
    launch = ["--", "swift", "sft", "--model_type", "qwen-7b-chat", "--sft_type", "lora", "--deepspeed",
              "default-zero2"]
    code, out = run(capsys, "--as-of", "2025-03-01", *launch)
    first = out.splitlines()[0]
    assert "ms-swift 2.6.1, transformers 4.47.1 (released by 2025-03-01, within what the launch uses)" in first, first
    assert "ms-swift 2.6.1 (--as-of 2025-03-01): --sft_type exists in ms-swift <3.0.0" in out
    assert versions_as_of("2025-03-01")["ms-swift"] >= Version("3.0.0")  # what the date alone would have used
    # ...and what pip installs beside ms-swift 2.x: its requirements pin transformers below 4.48.
    assert "transformers 4.47.1 (--as-of 2025-03-01): ms-swift 2.6.1 requires transformers<4.48" in out
    assert versions_as_of("2025-03-01")["transformers"] >= Version("4.48.0")
    # `--train_type` exists only from 3.0 on, which no release by June 2024 is: the era's range is evaluated.
    code, out = run(capsys, "--as-of", "2024-06-01", "--", "swift", "sft", "--train_type", "lora", "--model",
                    "Qwen/Qwen2.5-7B-Instruct")
    assert "ms-swift" not in out.splitlines()[0]
    assert "ms-swift release not fixed (--as-of 2024-06-01)" in out and "so the range is evaluated" in out
    # Versions the user gives are never moved by the launch's spellings; the era then disagrees in a note.
    code, out = run(capsys, "--versions", "ms-swift=3.1.0", "--as-of", "2025-03-01", *launch)
    assert "ms-swift 3.1.0 (--versions)" in out.splitlines()[0] and "(--as-of" not in out


def test_newest_as_of_within_a_range():
    from loraflow.frontends.versions_source import newest_as_of

    assert newest_as_of("ms-swift", "2025-03-01", "<3.0.0") == Version("2.6.1")
    assert newest_as_of("ms-swift", "2024-06-01", ">=3.0.0") is None
    assert newest_as_of("no-such-package", "2025-03-01", "<1") is None
