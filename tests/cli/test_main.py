"""The `orion` command's conventions: --version, `python -m orion`, and the README's
first command as written."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from child_process import OUTSIDE, child_env

import orion
from orion.cli import main

REPO = Path(__file__).resolve().parents[2]


def _run_orion(args: list[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`python -m orion ARGS` on the orion this test process imported."""
    return subprocess.run([sys.executable, "-m", "orion", *args], capture_output=True,
                          text=True, env=child_env(), cwd=OUTSIDE, timeout=timeout,
                          check=False)


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"orion {orion.__version__}\n"


def test_python_dash_m_orion_is_the_command():
    done = _run_orion(["--version"])
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"orion {orion.__version__}\n"
    help_ = _run_orion(["--help"])
    assert help_.returncode == 0 and "generate" in help_.stdout and "train" in help_.stdout


def readme_first_command() -> list[str]:
    """The `orion ...` part of the README's first shell block (after `pip install . &&`)."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```sh\n(.*?)```", readme, re.S)
    assert block, "README.md has no ```sh block"
    line = block.group(1).strip().splitlines()[0]
    command = line.split("&&")[-1].strip()
    assert command.startswith("orion generate "), line
    return shlex.split(command)


@pytest.mark.native
def test_readme_first_command_prints_text():
    args = readme_first_command()
    done = _run_orion(args[1:])
    assert done.returncode == 0, done.stderr
    words = re.findall(r"[A-Za-z']+", done.stdout)
    assert len(words) >= 10, done.stdout           # a continuation, not an empty line
    assert "error" not in done.stderr, done.stderr
