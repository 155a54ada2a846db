"""The documentation agrees with the program, where a test can tell:

- every `docs/*.md`, and every source file of ours (tests/, benchmarks/, orion/, csrc/),
  that the README or the docs cite exists here (paths of other projects' files are
  written with their repository in front, `qwen-ane/docs/...`, and are not ours to
  check);
- every `orion ...` command they show names a real subcommand and real options, and a
  whole command in a shell block parses as the CLI would parse it;
- the README's sample output is what its command prints, with the kernels it names."""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from child_process import OUTSIDE, child_env

from orion.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
# (.m files under tests/ are cited from the Orion paper's repository too: not checked)
CITED = re.compile(r"(?<![\w/.-])(?:docs/[\w.-]+\.md|(?:tests|benchmarks|orion)/[\w/.-]+"
                   r"\.(?:py|sh)|csrc/[\w/.-]+\.[chm])")
SOURCES = [REPO / "README.md", *sorted(REPO.glob("docs/*.md"))]
SHELL = ("sh", "console", "bash", "")   # fenced block languages that hold commands
INLINE = re.compile(r"`(orion [^`]*)`")


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def test_every_cited_file_exists():
    missing = {(m, str(src.relative_to(REPO))) for src in SOURCES
               for m in CITED.findall(_read(src)) if not (REPO / m).is_file()}
    assert not missing, sorted(missing)


def fenced_blocks(text: str, languages: tuple[str, ...]) -> list[str]:
    """The bodies of the ``` blocks whose language is one of `languages`."""
    blocks, body, language = [], None, ""
    for line in text.splitlines():
        if line.startswith("```"):
            if body is None:
                body, language = [], line[3:].strip()
            else:
                if language in languages:
                    blocks.append("\n".join(body))
                body = None
        elif body is not None:
            body.append(line)
    return blocks


def shell_commands(text: str) -> list[str]:
    """The `orion ...` commands of a doc's shell blocks: continuations joined, prompts
    and comments dropped, `a && orion ...` split."""
    out = []
    for body in fenced_blocks(text, SHELL):
        for line in body.replace("\\\n", " ").splitlines():
            line = line.strip().removeprefix("$ ")
            for part in line.split("&&"):
                part = part.split(" #")[0].strip()
                if part.startswith("orion "):
                    out.append(part)
    return out


def inline_commands(text: str) -> list[str]:
    """`orion ...` in running text, but not templates (`orion <command>`), pipes, or
    quoted messages (`orion serve: error: ...`)."""
    return [c for c in INLINE.findall(text)
            if "<" not in c and "|" not in c and not re.match(r"orion \S+:", c)]


def _subparsers() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return parser, dict(action.choices)


def _problems(command: str, whole: bool) -> list[str]:
    """What is wrong with a documented command: an unknown subcommand or option; for a
    whole command, anything argparse refuses."""
    parser, commands = _subparsers()
    # [optional] parts: their options must exist; the rest must parse without them
    argv = shlex.split(re.sub(r"\[[^\[\]]*\]", "", command))[1:]
    words = [w for w in shlex.split(re.sub(r"[\[\]]", " ", command))[1:] if w != "--debug"]
    if not words or words[0].startswith("-"):
        return []
    sub = commands.get(words[0])
    if sub is None:
        return [f"{command!r}: no subcommand {words[0]!r}"]
    known = set(sub._option_string_actions)
    bad = [f"{command!r}: {words[0]} has no option {w.split('=')[0]}" for w in words[1:]
           if w.startswith("--") and w.split("=")[0] not in known]
    bad += _placeholder_prompts(command, sub, words)
    if whole and not bad:
        try:
            parser.parse_args(argv)
        except SystemExit:
            bad.append(f"{command!r}: the CLI refuses it")
    return bad


def _placeholder_prompts(command: str, sub: argparse.ArgumentParser,
                         words: list[str]) -> list[str]:
    """A placeholder (DIR, OUT) where generate, chat or serve would take it as the prompt
    or as nothing: `orion generate DIR` runs the shipped model on the prompt "DIR"."""
    if words[0] not in ("generate", "chat", "serve"):
        return []
    bad, i = [], 1
    while i < len(words):
        word = words[i]
        if word.startswith("-"):
            action = sub._option_string_actions.get(word.split("=")[0])
            if action is not None and action.nargs != 0 and "=" not in word:
                i += 1            # the option's value
        elif re.fullmatch(r"[A-Z][A-Z_]*", word):
            bad.append(f"{command!r}: {word} is not an option's value: {words[0]} would "
                       "take it as its prompt")
        i += 1
    return bad


def test_documented_commands_exist_as_written(capsys):
    problems = []
    for src in SOURCES:
        text = _read(src)
        for command in shell_commands(text):
            problems += _problems(command, whole=True)
        for command in inline_commands(text):
            problems += _problems(command, whole=False)
    capsys.readouterr()   # argparse's own messages
    assert not problems, problems


def test_commands_in_the_clis_help_exist_as_written(capsys):
    """`orion train --help` once sent users to `orion generate DIR` (which runs the shipped
    model with "DIR" as the prompt): every command a help text quotes names real options."""
    _, commands = _subparsers()
    problems = []
    for sub in commands.values():
        texts = [sub.description or "", *(a.help or "" for a in sub._actions)]
        for text in texts:
            for command in inline_commands(text):
                problems += _problems(command, whole=False)
    capsys.readouterr()
    assert not problems, problems


def test_the_checks_catch_a_wrong_command(capsys):
    assert _problems("orion generate --modle M x", whole=False)
    assert _problems("orion perplexity --context many FILE", whole=True)
    assert _problems("orion frobnicate", whole=False)
    assert _problems("orion generate DIR", whole=False)
    assert not _problems("orion generate --model DIR", whole=False)
    assert not _problems("orion train --config C --data D --out DIR [--resume]", whole=True)
    capsys.readouterr()


# ---- the README's sample ------------------------------------------------------------


def readme_sample() -> tuple[list[str], str, str, str]:
    """(argv, the plan line, the text shown, the stats line shown) of the README's
    console block."""
    readme = _read(REPO / "README.md")
    block = re.search(r"```console\n\$ (orion generate [^\n]*)\n(loaded in [^\n]*)\n(.*?)\n"
                      r"(prompt \d+ tokens[^\n]*)\n```", readme, re.S)
    assert block, "README.md has no console block with a --stats line"
    return shlex.split(block.group(1))[1:], block.group(2), block.group(3), block.group(4)


@pytest.mark.native
def test_readme_sample_output_is_what_the_command_prints():
    """With the kernels the README names (AVX2), the same text on any x86-64 CPU that has
    them; the timings are not compared."""
    readme = _read(REPO / "README.md")
    assert "ORION_VANE_ISA=avx2" in readme
    env = child_env(ORION_VANE_ISA="avx2")
    doctor = subprocess.run([sys.executable, "-m", "orion", "doctor"], env=env, cwd=OUTSIDE,
                            capture_output=True, text=True, check=True).stdout
    if "vane kernels: avx2" not in doctor:
        pytest.skip("this CPU has no AVX2 kernels (vane runs what it has)")
    argv, plan, text, stats = readme_sample()
    done = subprocess.run([sys.executable, "-m", "orion", *argv], env=env, cwd=OUTSIDE,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == text + "\n"
    shape = re.compile(r"prompt (\d+) tokens, prefill [\d.]+ ms; compiling \d+ ms; generated "
                       r"(\d+) tokens, decode [\d.]+ tokens/s; programs compiled (\d+), reused "
                       r"(\d+), cache hits (\d+); finish: (\w+)")
    got_plan, got_stats = done.stderr.strip().splitlines()
    assert shape.fullmatch(got_stats).groups() == shape.fullmatch(stats).groups()
    loaded = re.compile(r"loaded in \d+ ms; (plan: .*)")
    assert loaded.fullmatch(got_plan).group(1) == loaded.fullmatch(plan).group(1)
