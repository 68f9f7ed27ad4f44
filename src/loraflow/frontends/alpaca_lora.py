"""alpaca-lora (tloen/alpaca-lora): `python finetune.py --base_model ... --micro_batch_size 4 --cutoff_len 512`, run
plain or under torchrun, and the copies of its finetune.py that forks and tutorials launch the same way.

finetune.py is a fire CLI (`fire.Fire(train)`, since commit 5fa807d, 2023-03-24): each parameter of its train() is a
flag, and what it does with the model is fixed in its code, not in flags. As of commit 65fb822 (2023-04-13), its last
change: LlamaForCausalLM.from_pretrained(load_in_8bit=True, torch_dtype=torch.float16);
prepare_model_for_int8_training(model), which turns on checkpointing and the input-grad hook; LoraConfig on
--lora_target_modules with get_peft_model; transformers.Trainer with TrainingArguments(fp16=True,
ddp_find_unused_parameters=False if ddp else None), ddp being WORLD_SIZE != 1; and `model.state_dict` replaced by
PEFT's adapter state dict (since commit 35029da, 2023-03-16).

When finetune.py is here, hf.py reads its code instead (a copy may differ from alpaca-lora's); when it is not, these
facts are applied, with the TrainingArguments going through hf.py's reader. A launch with flags alpaca-lora's train()
lacks runs a modified copy: the flags are listed as not understood, and whether the copy kept the state_dict patch
(forks dropped it once PEFT's own save was known to empty the adapter) is evaluated both ways.
"""

from __future__ import annotations

from pathlib import Path

from loraflow.frontends import hf, script_setup
from loraflow.frontends.argv import Command, parse_flags, script_command
from loraflow.frontends.base import Framework, FrontendResult
from loraflow.frontends.common import Draft, finish_world, one_process_ddp
from loraflow.frontends.hf_options import Opt
from loraflow.frontends.trl import TRAINERS

NAME = "alpaca-lora"
CODE = "alpaca-lora finetune.py"
# The parameters of finetune.py's train() (fire makes each a flag), commit 65fb822.
PARAMS = frozenset("""base_model data_path output_dir batch_size micro_batch_size num_epochs learning_rate cutoff_len
val_set_size lora_r lora_alpha lora_dropout lora_target_modules train_on_inputs add_eos_token group_by_length
wandb_project wandb_run_name wandb_watch wandb_log_model resume_from_checkpoint prompt_template_name""".split())
# Parameters no TrainingArguments, TRL or common script has: with --base_model, they name alpaca-lora's train().
DISTINCT = frozenset({"micro_batch_size", "cutoff_len", "val_set_size", "train_on_inputs", "prompt_template_name",
                      "add_eos_token"})
# What to change, in the code's words: finetune.py has no flag for any of these.
FLAGS = {"quantization": "from_pretrained(load_in_8bit=True) in finetune.py",
         "checkpointing": "prepare_model_for_int8_training(model) in finetune.py (use_gradient_checkpointing=False)",
         "reentrant": "prepare_model_for_int8_training / gradient_checkpointing_enable(gradient_checkpointing_kwargs="
                      "{\"use_reentrant\": ...}) in finetune.py",
         "input_grad_hook": "prepare_model_for_int8_training in finetune.py (enable_input_require_grads)",
         "precision": "TrainingArguments(fp16=True) in finetune.py",
         "find_unused_parameters": "TrainingArguments(ddp_find_unused_parameters=...) in finetune.py (False only "
                                   "when WORLD_SIZE != 1)",
         "matched_modules": "--lora_target_modules", "world_size": "torchrun --nproc_per_node",
         "state_dict_patched": "the `model.state_dict = ... get_peft_model_state_dict(...)` lines of finetune.py "
                               "(delete them: model.save_pretrained saves the adapter)"}


def _code_options(given: dict, world: int) -> dict[str, Opt]:
    """The options finetune.py's code gives the HF Trainer reader (hf.py), as its flags leave them."""
    opts = {"use_peft": Opt(True, f"{CODE}: LoraConfig + get_peft_model"),
            "load_in_8bit": Opt(True, f"{CODE}: LlamaForCausalLM.from_pretrained(load_in_8bit=True)"),
            "torch_dtype": Opt("float16", f"{CODE}: from_pretrained(torch_dtype=torch.float16)"),
            "gradient_checkpointing": Opt(True, f"{CODE}: prepare_model_for_int8_training(model) (peft "
                                                "use_gradient_checkpointing=True by default)"),
            "fp16": Opt(True, f"{CODE}: TrainingArguments(fp16=True)")}
    if world != 1:  # `ddp_find_unused_parameters=False if ddp else None`; None leaves the Trainer's default
        opts["ddp_find_unused_parameters"] = Opt(False, f"{CODE}: ddp_find_unused_parameters=False (WORLD_SIZE "
                                                        f"{world})")
    if "base_model" in given:
        opts["model_name_or_path"] = Opt(given["base_model"].one() or "", given["base_model"].raw)
    return opts


def from_command(cmd: Command, versions: dict) -> FrontendResult:
    draft = Draft(NAME, versions)
    args, positionals, _ = parse_flags(cmd.args)
    given = {a.name: a for a in args}
    extra = [a.raw for a in args if a.name not in PARAMS]
    draft.unknown += extra + [f"{p} (a positional argument; finetune.py takes flags only)" for p in positionals]
    # torchrun sets WORLD_SIZE to its process count; a plain `python finetune.py` leaves it unset (1). A value the
    # shell would expand (`WORLD_SIZE=$N`) is not visible: read as one process, as the launch line says nothing more.
    env = str(cmd.env.get("WORLD_SIZE") or "1")
    world = cmd.world_size or (int(env) if env.isdigit() else 1)
    stage = (TRAINERS["sft"], f"{CODE}: transformers.Trainer on LlamaForCausalLM")
    hf.apply(draft, _code_options(given, world), False, stage, cmd, [], "sft")
    draft.set("input_grad_hook", True, f"{CODE}: prepare_model_for_int8_training calls enable_input_require_grads")
    patch = f"{CODE}: model.state_dict = (lambda ...: get_peft_model_state_dict(self, old_state_dict()))"
    if extra:
        draft.note(f"{Path(cmd.program).name} takes flags alpaca-lora's finetune.py does not ({', '.join(extra)}): "
                   "a modified copy, read with alpaca-lora's code; pass the script itself to check to read its own")
        draft.maybe("state_dict_patched", {True: "the copy keeps alpaca-lora's state_dict patch",
                                           False: "the copy saves without the patch"},
                    f"{patch} is in alpaca-lora's script; whether this copy kept it is in its code, not here")
    else:
        draft.set("state_dict_patched", True, patch)
    draft.note(f"{cmd.program} is not here: read as {CODE} (commit 65fb822), whose model setup is code, not flags")
    one_process_ddp(draft, cmd)
    finish_world(draft, cmd)
    draft.flags = dict(FLAGS)
    return draft.result()


def from_files(paths: list[str], versions: dict) -> FrontendResult:
    """alpaca-lora is configured by flags only: the launch line of a script (`python finetune.py ...`)."""
    return from_command(script_command(paths, NAME, "python finetune.py ..."), versions)


def _recognise(view) -> bool:
    # finetune.py with alpaca-lora's own parameters; a finetune.py that is here is read as code by hf.py.
    if Path(view.program).name != "finetune.py" or script_setup.script_of(view.program) is not None:
        return False
    return "base_model" in view.flags and len(view.flags & DISTINCT) >= 2


FRAMEWORK = Framework(name=NAME, title="alpaca-lora finetune.py", module="alpaca_lora", recognise=_recognise,
                      flags=FLAGS, log_paths=r"alpaca-lora[/\\]", aliases=("alpaca_lora",))
