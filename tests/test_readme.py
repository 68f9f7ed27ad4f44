"""The README is the front door: its first commands are the ones CI and the demo test run, its links lead somewhere,
the image-text families it names are the ones the composition sweep trains, and its quickstart parses and checks.

The demo itself (`loraflow train sft`, what scripts/demo.sh runs) is trained by tests/test_demo.py, not here; these
checks read files, parse commands, run two cheap `loraflow` subprocesses and train the quickstart for two steps (a few
seconds in all)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
FIRST_SCREEN = 40
"""Lines a reader sees before scrolling: the two commands must start within them."""


def _fenced(text: str) -> list[tuple[int, str, str]]:
    """(line number of the opening fence, language, body) of every fenced block in `text`."""
    blocks, opened, lang, body = [], None, "", []
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            if opened is None:
                opened, lang, body = number, line[3:].strip(), []
            else:
                blocks.append((opened, lang, "\n".join(body)))
                opened = None
        elif opened is not None:
            body.append(line)
    return blocks


def _commands(body: str) -> list[str]:
    """The commands of a bash block: comments cut, continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", body)
    lines = [line.split(" #")[0].strip() for line in joined.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def _section(text: str, heading: str) -> str:
    """The text from the `## heading...` line to the next `## ` heading."""
    start = text.index(f"\n## {heading}")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def test_the_first_screen_runs_what_ci_and_the_demo_test_run():
    text = README.read_text()
    opened, lang, body = _fenced(text)[0]
    assert lang == "bash" and opened <= FIRST_SCREEN, f"README.md: the two commands must open it (line {opened})"
    first = _commands(body)
    ci = [line.strip() for line in (ROOT / ".ci/run").read_text().splitlines()
          if line.strip() and not line.startswith("#") and not line.startswith(("set ", "cd "))]
    assert ci == ["bash scripts/test.sh"], f".ci/run runs {ci}: change README.md's first block with it"
    assert ci[0] in first, f"README.md's first block {first} lacks the command CI runs ({ci[0]})"
    assert "bash scripts/demo.sh" in first
    # scripts/demo.sh ends in `loraflow train sft`, the run tests/test_demo.py checks (conftest's sft_demo).
    assert re.search(r"^exec \.venv/bin/loraflow train sft \"\$@\"$", (ROOT / "scripts/demo.sh").read_text(), re.M)
    # The scripts install into .venv without activating it: the README says how to reach `loraflow`.
    head = "\n".join(text.splitlines()[:FIRST_SCREEN])
    assert "source .venv/bin/activate" in head and ".venv/bin/loraflow" in head


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", "")).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
    seen: dict[str, int] = {}
    anchors = set()
    for heading in re.findall(r"^#+ (.+)$", text, re.M):
        slug = _slug(heading)
        anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def _links(path: Path) -> list[tuple[int, str]]:
    """(line, target) of every markdown link outside code blocks and code spans."""
    found, in_code = [], False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("```"):
            in_code = not in_code
            continue
        if not in_code:
            prose = re.sub(r"`[^`]*`", "", line)
            found += [(number, target) for target in re.findall(r"\]\(([^)\s]+)\)", prose)]
    return found


def test_every_relative_link_in_the_readme_and_docs_leads_to_a_file_of_this_repository():
    broken = []
    for page in [README, *DOCS]:
        for line, target in _links(page):
            if re.match(r"[a-z]+:", target):
                continue  # a URL: not checked offline
            file, _, anchor = target.partition("#")
            resolved = (page.parent / file).resolve() if file else page
            where = f"{page.relative_to(ROOT)}:{line}: {target}"
            if not resolved.exists():
                broken.append(f"{where}: no such file")
            elif ROOT not in resolved.parents and resolved != ROOT:
                broken.append(f"{where}: outside the repository, so broken in a clone")
            elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
                broken.append(f"{where}: no heading with that anchor")
    assert not broken, "\n".join(broken)


EXTRA_IMAGE_TEXT_NAMES = {"minicpm_v", "minicpmv", "pixtral", "smolvlm", "internvl", "llava_next_video", "qwen3_vl"}
"""Image-text models users name that transformers' image-text auto mapping spells otherwise or lacks (remote code)."""
NOT_MODEL_NAMES = {"git"}
"""model_types that are also everyday words of a README (`git` is a captioning model and the version control tool)."""


def _name(word: str) -> str:
    return re.sub(r"[.\-]", "_", word.lower())


def test_the_readme_names_only_image_text_families_the_sweep_trains():
    from loraflow.families import auto_mapping
    from loraflow.verify.sweep_vision import FAMILIES

    image_text = ({_name(t) for t in auto_mapping("image-text")} | EXTRA_IMAGE_TEXT_NAMES) - NOT_MODEL_NAMES
    words = {_name(w) for w in re.findall(r"[A-Za-z][A-Za-z0-9.\-]*[A-Za-z0-9]", README.read_text())}
    named = words & image_text
    assert named, "README.md names no image-text family: the sweep's list was expected in it"
    untrained = sorted(named - set(FAMILIES))
    assert not untrained, (f"README.md names image-text families the composition sweep does not train: {untrained}; "
                           f"name only {', '.join(FAMILIES)} (src/loraflow/verify/sweep_vision.py) or move the "
                           "others to docs/image-text.md")


def _readme_loraflow_commands() -> list[list[str]]:
    argvs = []
    for _, lang, body in _fenced(README.read_text()):
        if lang == "bash":
            argvs += [shlex.split(c)[1:] for c in _commands(body) if c.startswith("loraflow ")]
    return argvs


def test_every_loraflow_command_in_the_readme_parses_and_the_command_list_is_the_real_one():
    from loraflow.commands.cli import build_parser

    parser = build_parser()
    argvs = _readme_loraflow_commands()
    assert len(argvs) >= 4
    for argv in argvs:
        args, extra = parser.parse_known_args(argv)
        assert not [e for e in extra if "=" not in e], f"`loraflow {shlex.join(argv)}`: unknown arguments {extra}"
    table = re.findall(r"^- `loraflow (\w+)", _section(README.read_text(), "Commands"), re.M)
    commands = set(parser._subparsers._group_actions[0].choices)
    assert set(table) == commands, f"README.md's command list {sorted(table)} != the CLI's {sorted(commands)}"


def test_the_quickstart_config_checks_clean_on_the_bundled_model_and_data(tmp_path, monkeypatch, capsys):
    """The quickstart's my.yaml, with its model and data pointed at the bundled ones (no download): every key valid,
    the plan resolved, no rule error. `loraflow --help` runs as a new user's first command would, in a subprocess;
    check runs in this process (as tests/test_cli.py's do), which has torch imported already: a subprocess would add
    its 5-8 s start-up to this file's few seconds."""
    from loraflow.commands.cli import main

    quickstart = _section(README.read_text(), "Quickstart")
    config = [body for _, lang, body in _fenced(quickstart) if lang == "yaml"]
    assert len(config) == 1, "README.md's quickstart should show one my.yaml"
    (tmp_path / "my.yaml").write_text(config[0] + "\n")
    helped = subprocess.run([sys.executable, "-m", "loraflow", "--help"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    assert helped.returncode == 0 and "train" in helped.stdout, helped.stderr
    monkeypatch.chdir(tmp_path)
    code = main(["check", "my.yaml", "model.path=builtin:tiny-base", "data.train=builtin:reverse/train.jsonl",
                 "data.eval=builtin:reverse/eval.jsonl"])
    out, err = capsys.readouterr()
    assert code in (0, 1), out[-2000:] + err[-2000:]
    assert "loraflow plan" in out


def test_the_quickstart_trains_on_data_in_the_readme_s_format_and_generates(tmp_path, monkeypatch, capsys):
    """A new user's own data: the quickstart's record (the JSON line it shows), its my.yaml and its train and generate
    lines, run as written but on the bundled model for two steps (no download)."""
    import json

    from loraflow.commands.cli import main

    quickstart = _section(README.read_text(), "Quickstart")
    blocks = _fenced(quickstart)
    record = json.loads(next(body for _, lang, body in blocks if lang == "json"))
    config = next(body for _, lang, body in blocks if lang == "yaml")
    commands = [c for _, lang, body in blocks if lang == "bash" for c in _commands(body)]
    train = next(c for c in commands if c.startswith("loraflow train sft my.yaml"))
    generate = next(c for c in commands if c.startswith("loraflow generate runs/my-first-run"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my.yaml").write_text(config + "\n")
    for name in ("train.jsonl", "eval.jsonl"):
        (tmp_path / name).write_text((json.dumps(record) + "\n") * 8)
    small = ["model.path=builtin:tiny-base", "train.max_steps=2", "train.micro_batch_size=2",
             "train.gradient_accumulation_steps=1", "output.progress_bar=false", "output.tensorboard=false"]
    assert main([*shlex.split(train)[1:], *small]) == 0, capsys.readouterr()
    assert (tmp_path / "runs" / "my-first-run" / "adapter" / "adapter_config.json").is_file()
    capsys.readouterr()
    assert main([*shlex.split(generate)[1:], "--max-new-tokens", "4"]) == 0
    assert capsys.readouterr().out.strip()
