"""A Python training script, read statically, for `loraflow check`: `loraflow check train.py`, `loraflow check
--framework python snippet.py`, and launch lines (`python|torchrun|accelerate launch train.py --flags`) whose script
is here, which the HF Trainer / TRL frontend (hf.py) hands over so the code and the flags are read together.

The script is parsed with Python's `ast` and never run (script_code.py); its calls become the options hf.py already
parses (script_facts.py: a TrainingArguments keyword is the flag of the same name), so every HF / TRL default and
rule applies unchanged. What only code shows - a model moved or cast after a quantized load, an adapter merged into
a quantized base, a saved adapter loaded frozen, the input-grad hook, Unsloth - is set from the calls, each with its
line (script_setup.py). Values the code computes are listed as not read; a snippet that shows no trainer leaves what
it does not show (full fine-tuning or an adapter) as a choice `check` evaluates both ways.
"""

from __future__ import annotations

from pathlib import Path

from loraflow.errors import LoraflowError
from loraflow.frontends import hf, lightning
from loraflow.frontends import trl as trl_rel
from loraflow.frontends.argv import Command
from loraflow.frontends.base import Framework, FrontendResult
from loraflow.frontends.common import Draft, load_mapping
from loraflow.frontends.hf_options import Opt, options_from_file
from loraflow.frontends.script_wild import cause_fixes
from loraflow.frontends.script_setup import FLAGS, NAME, UNSLOTH_VISION_DDP, read_script, recognised, script_of


def from_files(paths: list[str], versions: dict) -> FrontendResult:
    """One script, optionally with a DeepSpeed JSON or a YAML/JSON of training arguments beside it (which the code
    reads, e.g. through HfArgumentParser)."""
    scripts = [p for p in paths if p.endswith(".py")]
    if len(scripts) != 1:
        raise LoraflowError(f"--framework {NAME} reads one Python training script (.py), got "
                            f"{len(scripts) or 'none'}: {' '.join(paths)}.")
    script = read_script(scripts[0])
    if not recognised(script.code):
        raise LoraflowError(f"{scripts[0]} imports or calls nothing check reads (transformers, peft, trl, "
                            "bitsandbytes, unsloth): there is no training setup in it to check.")
    extra: dict[str, Opt] = {}
    for path in (p for p in paths if p not in scripts):
        if "zero_optimization" in load_mapping(path, "config file"):
            extra["deepspeed"] = Opt(path, path)  # a DeepSpeed JSON beside the script is its --deepspeed
        else:
            options_from_file(Path(path), extra, "training config")
    draft = Draft(NAME, versions)
    hf.apply_script(draft, script, None, extra, False, None, [script.path.parent])
    if script.facts.parser:
        draft.note(f"{script.facts.parser}: the script takes its arguments from the command line; check its launch "
                   f"line to read them too (`loraflow check -- python {script.path.name} --flags...`)")
    draft.flags.update(FLAGS)
    if script.facts.lightning is not None:  # Lightning's Trainer arguments, not TrainingArguments, are the fixes
        draft.flags.update(lightning.FLAGS)
    draft.flags.update(cause_fixes(draft.sources))
    return draft.result()


def from_command(cmd: Command, versions: dict) -> FrontendResult:
    """`--framework python -- torchrun train.py --flags`: the launch line's script read with its flags, as hf.py
    reads any launch line whose script is here."""
    if script_of(cmd.program) is None:
        raise LoraflowError(f"--framework {NAME}: `{cmd.program}` is not a Python training script in this directory "
                            "that check can read (one that uses transformers, peft, trl, bitsandbytes or unsloth); "
                            "run check where the script is, or give its path on the launch line.")
    return hf.from_command(cmd, versions)


FRAMEWORK = Framework(name=NAME, title="Python training script", module="python_script", recognise=None,
                      flags=FLAGS, depends=trl_rel.DEPENDS, aliases=("python", "py"),
                      # Lightning's loop (lightning.py reads it from the script): pytorch_lightning, lightning/fabric.
                      log_paths=r"pytorch_lightning[/\\]|lightning[/\\](?:pytorch|fabric)[/\\]",
                      mitigations=(UNSLOTH_VISION_DDP,))
