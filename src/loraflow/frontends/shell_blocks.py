"""Bash syntax the launch-script reader (shell.py) needs beyond single lines: `if` / `elif` / `else` blocks (which
additions to a variable a branch makes, and one-line `if ...; then ...; fi`), and command substitutions (`$(...)`,
backquotes) kept as the one word bash puts in their place. Imports nothing of loraflow's."""

from __future__ import annotations

import re

# `if [ "$USE_LORA" = 1 ]; then` ... `fi`: assignments in a branch are read as if it runs (so `if [ -z "$X" ]; then
# X=3; fi` defaults come through), and one that adds to a variable the launch uses is said to be conditional.
_IF = re.compile(r"^(?:el)?if\s+(.*?)\s*(?:;\s*then\b.*)?$")


# `if [ -z "$NPROC" ]; then NPROC=8; fi` on one line: read as the block it is, its body one statement a line.
ONE_LINE_IF = re.compile(r"(?m)^([ \t]*)if\s+([^\n;]+?);\s*then\s+([^\n]+?);?\s*fi[ \t]*$")


def if_lines(m: re.Match) -> str:
    indent, condition, body = m.groups()
    if re.search(r"[\"'][^\"'\n]*;", body):  # a `;` inside quotes: not split (left as one line, unread)
        return m.group(0)
    return "\n".join([f"{indent}if {condition}; then", *(indent + "  " + part.strip() for part in body.split(";")
                                                          if part.strip()), f"{indent}fi"])


class Branches:
    """The `if` / `elif` / `else` blocks a script's line is in, read top to bottom. An assignment in a branch is read
    as if the branch runs (so `if [ -z "$X" ]; then X=3; fi` defaults come through). One that adds flags to a variable
    (`ARGS+=" --use_peft"`, `ARGS="$ARGS --use_peft"`) is read in the first branch of an `if`/`elif`/`else` chain
    only: the branches are alternatives, and their union is a launch none of them makes. check says which."""

    def __init__(self) -> None:
        self.open: list[list[str]] = []  # per enclosing block: its conditions so far ("else" last when in it)
        self.notes: dict[str, list[str]] = {}  # variable -> what check says of its additions in branches

    def see(self, stripped: str) -> None:
        if (m := _IF.match(stripped)) and not re.search(r"\bfi\s*(?:#.*)?$", stripped):  # not a one-line `if`
            if stripped.startswith("if"):
                self.open.append([m.group(1)])
            elif self.open:
                self.open[-1].append(m.group(1))
        elif re.match(r"else\b", stripped) and self.open:
            self.open[-1].append("else")
        elif re.match(r"fi\b", stripped) and self.open:
            self.open.pop()

    def reads(self, name: str, stripped: str) -> bool:
        """Whether an addition to `name` on this line is read (with what to tell about it)."""
        if not self.open:
            return True
        conditions = self.open[-1]
        if len(conditions) == 1:
            self.notes.setdefault(name, []).append(f"`{stripped}` runs only when `{conditions[0]}`; read as if it "
                                                   "does, so what check finds with it holds only then")
            return True
        branch = "else" if conditions[-1] == "else" else f"elif {conditions[-1]}"
        self.notes.setdefault(name, []).append(f"`{stripped}` (the `{branch}` branch of `if {conditions[0]}`) is "
                                               "not read: check reads the first branch of the chain")
        return False

    def about(self, line: str) -> list[str]:
        """What to tell of the branches' additions to the variables a launch line uses."""
        return [why for name, whys in self.notes.items() if re.search(rf"\$\{{?{name}\b", line) for why in whys]


def one_word_substitutions(line: str) -> str:
    """`--master_addr $(scontrol show hostnames $NODES | head -n1)`, `key=$(realpath "../x.py")`, a backquoted
    command: bash puts the command's output in as one word, so each is kept as one opaque word (its spaces and quotes
    dropped), not split at its `|` as a pipe or into stray positional words."""
    out, i = [], 0
    while i < len(line):
        end = _substitution_end(line, i)
        if end is None:
            out.append(line[i])
            i += 1
            continue
        out.append(re.sub(r"[\s'\"]", "", line[i:end]))
        i = end
    return "".join(out)


def _substitution_end(line: str, i: int) -> int | None:
    """Where the `$(...)` (not `$((`, arithmetic) or backquoted command starting at i ends; None if none starts."""
    if line.startswith("`", i):
        close = line.find("`", i + 1)
        return close + 1 if close > 0 else None
    if not line.startswith("$(", i) or line.startswith("$((", i):
        return None
    depth, j = 0, i + 1
    while j < len(line):
        depth += {"(": 1, ")": -1}.get(line[j], 0)
        if depth == 0:
            return j + 1
        j += 1
    return None
