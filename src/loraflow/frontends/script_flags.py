"""A script's own flags passed into its training arguments under another name, or left to the parser's default:
`parser.add_argument("--gc", type=bool, default=True)` then `TrainingArguments(gradient_checkpointing=args.gc)`
(tohtana/ds_repro_2746's run_seq2seq_deepspeed_peft.py passes `bf16=args.bf16`, `deepspeed=args.deepspeed`,
`gradient_checkpointing=args.gradient_checkpointing` so). The keyword holds what the launch line gives the flag,
else the parser's default (argparse's, or the script's argument dataclass field); a default the code computes is not
visible. A launch-line flag of the keyword's own name still wins, as hf.py reads it."""

from __future__ import annotations

from loraflow.frontends.common import Draft
from loraflow.frontends.hf_options import Opt
from loraflow.frontends.script_args import as_parsed
from loraflow.frontends.script_code import Code, FromFlag
from loraflow.frontends.script_facts import READ_KEYS, kind


def keyword_flags(draft: Draft, code: Code, flags: dict[str, Opt]) -> tuple[dict[str, Opt], set[str]]:
    """The training-argument keywords the script's flags set, and the flags so consumed under another name (they are
    read, not unknown)."""
    found: dict[str, Opt] = {}
    used: set[str] = set()
    for call in code.calls:
        if kind(call, code) != "args":
            continue
        for key, value in call.kwargs.items():
            if not isinstance(value, FromFlag) or key in flags:
                continue
            name = value.name
            given = [o for o, dest in code.dests.items() if dest == name and o in flags]
            flag = given[0] if given else name if name in flags else None
            if flag is not None:
                opt = flags[flag]
                value, source = as_parsed(code, name, opt.value if opt.value is not None else True, opt.source)
                found[key] = Opt(value, f"{source} (the script passes args.{name} as {call.func}({key}=...))")
                if flag != key:
                    used.add(flag)
            elif name in code.defaults:
                found[key] = Opt(code.defaults[name], f"{call.at(key)}: the launch line leaves --{name} out, and the "
                                 f"script's parser defaults it to {code.defaults[name]!r}")
            elif name in code.computed_defaults and key in READ_KEYS:  # a keyword check reads
                draft.unknown.append(f"{call.at(key)}: the launch line leaves --{name} out, and the script's parser "
                                     f"computes its default ({code.computed_defaults[name]})")
    return found, used
