"""Bash syntax the launch-script reader (shell.py) needs beyond single lines: `if` / `elif` / `else` blocks (which
additions to a variable a branch makes, and one-line `if ...; then ...; fi`), and command substitutions (`$(...)`,
backquotes) kept as the one word bash puts in their place. Imports nothing of loraflow's."""

from __future__ import annotations

import re

# `if [ "$USE_LORA" = 1 ]; then` ... `fi`: assignments in a branch are read as if it runs (so `if [ -z "$X" ]; then
# X=3; fi` defaults come through), and one that adds to a variable the launch uses is said to be conditional.
_IF = re.compile(r"^(?:el)?if\s+(.*?)\s*(?:;\s*then\b.*)?$")
# A heredoc (`python - <<EOF` ... `EOF`, `cat > x.py <<'EOF'`): its body is another program's text, whose `if x:` /
# `else:` are no shell blocks.
_HEREDOC_START = re.compile(r"<<-?\s*['\"]?(\w+)['\"]?")


# `if [ -z "$NPROC" ]; then NPROC=8; fi` on one line, with `else` or several statements: read as the block it is,
# one statement a line.
ONE_LINE_IF = re.compile(r"(?m)^([ \t]*)(if\s[^\n]*?;\s*then\b[^\n]*?;?\s*fi)[ \t]*$")


def if_lines(m: re.Match) -> str:
    indent, text = m.groups()
    out: list[str] = []
    for part in (p.strip() for p in _split_outside_quotes(text)):
        if part == "then" or part.startswith("then "):
            part = part[4:].strip()
        if part == "else" or part.startswith("else "):
            out.append("else")
            part = part[4:].strip()
        if part.startswith(("if ", "elif ")):
            out.append(f"{part}; then")
        elif part:
            out.append(part)
    return "\n".join(indent + line for line in out)


def _split_outside_quotes(text: str) -> list[str]:
    """A line's statements: split at each `;` outside quotes."""
    parts, quote, start = [], "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == ";":
            parts.append(text[start:i])
            start = i + 1
    return parts + [text[start:]]


class Branches:
    """The `if` / `elif` / `else` blocks a script's line is in, read top to bottom. An assignment in a branch is read
    as if the branch runs (so `if [ -z "$X" ]; then X=3; fi` defaults come through). One that adds flags to a variable
    (`ARGS+=" --use_peft"`, `ARGS="$ARGS --use_peft"`) is read in the first branch of an `if`/`elif`/`else` chain
    only (and in none nested inside a later branch): the branches are alternatives, and their union is a launch none
    of them makes. check says which."""

    def __init__(self) -> None:
        self.open: list[list[str]] = []  # per enclosing block: its conditions so far ("else" last when in it)
        self.notes: dict[str, list[str]] = {}  # variable -> what check says of its assignments in branches
        self.heredoc = ""  # the tag that ends the heredoc being skipped

    def see(self, stripped: str) -> None:
        if self.heredoc:
            self.heredoc = "" if stripped == self.heredoc else self.heredoc
            return
        if (start := _HEREDOC_START.search(stripped)) and not stripped.startswith(("if ", "elif ")):
            self.heredoc = start.group(1)
        if stripped.endswith(":"):  # Python's `if x:` / `else:` pasted among the lines, never bash's
            return
        if (m := _IF.match(stripped)) and not re.search(r"\bfi\s*(?:#.*)?$", stripped):  # not a one-line `if`
            if stripped.startswith("if"):
                self.open.append([m.group(1)])
            elif self.open:
                self.open[-1].append(m.group(1))
        elif re.fullmatch(r"else\b\s*(?:#.*)?", stripped) and self.open:
            self.open[-1].append("else")
        elif re.match(r"fi\b", stripped) and self.open:
            self.open.pop()

    def path(self) -> tuple[tuple[int, int], ...]:
        """Where the current line is: each enclosing block (by identity) and the branch of it."""
        return tuple((id(block), len(block)) for block in self.open)

    def _later(self) -> list[str] | None:
        """The innermost enclosing block whose current branch is not its first, if any."""
        return next((block for block in reversed(self.open) if len(block) > 1), None)

    def reads(self, name: str, stripped: str) -> bool:
        """Whether an addition to `name` on this line is read (with what to tell about it)."""
        later = self._later()
        if later is not None:
            branch = "else" if later[-1] == "else" else f"elif {later[-1]}"
            self._say(name, f"`{stripped}` (the `{branch}` branch of `if {later[0]}`) is not read: check reads the "
                            "first branch of the chain")
            return False
        if self.open:
            self._say(name, f"`{stripped}` runs only when `{self.open[-1][0]}`; read as if it does, so what check "
                            "finds with it holds only then")
        return True

    def assigned(self, name: str, stripped: str) -> None:
        """A plain assignment in a later branch is read as bash's last assignment: say which branch that is."""
        later = self._later()
        if later is not None:
            branch = "else" if later[-1] == "else" else f"elif {later[-1]}"
            self._say(name, f"`{stripped}` is in the `{branch}` branch of `if {later[0]}`: read as the last "
                            "assignment, so what check finds with it holds when that branch runs")

    def _say(self, name: str, why: str) -> None:
        self.notes.setdefault(name, []).append(why)

    def about(self, line: str) -> list[str]:
        """What to tell of the branches' assignments to the variables a launch line uses."""
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
