"""`orion chat` through a pseudo-terminal (pexpect), with a scripted conversation:
streaming answers, history trimmed to the context with a notice, slash commands
(/help, /reset, /system, unknown ones) never sent to the model, Ctrl-C stopping an
answer but not the program, /exit."""

from __future__ import annotations

import signal
import sys

import pytest
from child_process import OUTSIDE, child_env

from orion.cli.chat import command_help, fit_history, slash_command

PROMPT = ">>> "


def _spawn(*args: str):
    pexpect = pytest.importorskip("pexpect")
    # Ctrl-C as at a terminal: a shell's background job (as CI may run us) inherits
    # SIGINT ignored, and Python then keeps it ignored in the child
    child = pexpect.spawn(sys.executable, ["-m", "orion.cli", "chat", *args], cwd=str(OUTSIDE),
                          env=child_env(), encoding="utf-8", timeout=60,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    child.expect("orion chat \\(256-token context\\)")
    child.expect("no chat template")
    child.expect_exact(PROMPT)
    return child


@pytest.mark.slow
def test_scripted_conversation():
    child = _spawn("--temperature", "0", "--max-tokens", "24")
    try:
        # commands are answered by the program, not the model
        child.sendline("/help")
        child.expect_exact(PROMPT)
        assert child.before.replace("\r\n", "\n").strip() == "/help\n" + command_help()
        child.sendline("/frobnicate now")
        child.expect_exact(PROMPT)
        assert "(unknown command /frobnicate: /help lists the commands" in child.before
        child.sendline("/system")
        child.expect_exact("(no system message)")
        child.expect_exact(PROMPT)
        child.sendline("/system Speak plainly.")
        child.expect_exact("(system message set; conversation cleared)")
        child.expect_exact(PROMPT)
        child.sendline("/system")
        child.expect_exact("(system message: 'Speak plainly.')")
        child.expect_exact(PROMPT)
        child.sendline("Who goes there?")
        child.expect_exact(PROMPT)
        first = child.before
        assert len(first.strip()) > len("Who goes there?")   # an answer was written
        child.sendline("/reset")
        child.expect_exact("(conversation cleared)")
        child.expect_exact(PROMPT)
        child.sendline("Who goes there?")
        child.expect_exact(PROMPT)
        assert child.before.strip() == first.strip()   # greedy, fresh history: the same
        # long turns overflow the 256-token context: the oldest drop, with a notice
        for n in range(6):
            child.sendline(f"Speak {n}, " + "good friend and noble sir, " * 8)
            child.expect_exact(PROMPT)
            if "dropped the" in child.before:
                break
        else:
            pytest.fail("the history never overflowed the context")
        assert "to stay within the 256-token context" in child.before
        child.sendline("/exit")
        child.expect(pytest.importorskip("pexpect").EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0


@pytest.mark.slow
def test_ctrl_c_stops_the_answer_not_the_program():
    pexpect = pytest.importorskip("pexpect")
    child = _spawn("--temperature", "0", "--max-tokens", "256")
    try:
        child.sendline("hi")          # compiles the programs
        child.expect_exact(PROMPT)
        child.sendintr()              # at the prompt: a hint, not an exit
        child.expect_exact("/exit or Ctrl-D quits")
        child.expect_exact(PROMPT)
        child.sendline("/reset")      # the whole context for the next answer: a long one
        child.expect_exact(PROMPT)
        child.sendline("Tell me of Verona")
        child.expect_exact("Tell me of Verona\r\n")   # the terminal's echo
        child.expect(r"\S")            # the answer has begun: stop it mid-way
        child.sendintr()
        child.expect_exact("(stopped)")
        child.expect_exact(PROMPT)
        child.sendline("/exit")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0


def test_missing_model_exits_2(tmp_path, capsys):
    from orion.cli import main

    assert main(["chat", "--model", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("orion chat: error: ") and "no model at" in err
    assert err.count("\n") == 1


def test_slash_commands():
    assert slash_command("/help") == ("/help", "")
    assert slash_command("  /QUIT ") == ("/exit", "")
    assert slash_command("/clear") == ("/reset", "")
    assert slash_command("/system Be brief. ") == ("/system", "Be brief.")
    assert slash_command("/usr/bin is a path") == ("/usr/bin", "is a path")   # unknown
    assert slash_command("//etc is sent") is None and slash_command("hi /help") is None
    for name in ("/help", "/reset", "/system", "/exit"):
        assert name in command_help()


def test_fit_history_drops_oldest_turns_keeping_the_system():
    history = [{"role": "system", "content": "s"}]
    for i in range(4):
        history += [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}]
    history.append({"role": "user", "content": "last"})

    def ids(messages):
        return [0] * sum(len(m["content"]) + 1 for m in messages)

    got, dropped = fit_history(history, ids, 12)
    assert len(got) <= 12 and dropped == 6
    assert [m["content"] for m in history] == ["s", "q3", "a", "last"]
    assert fit_history([{"role": "user", "content": "x" * 50}], ids, 12) == (None, 0)


@pytest.mark.slow
def test_adapter_path_changes_the_answers(tmp_path):
    from lora.conftest import shipped_adapter

    answers = []
    for extra in ((), ("--adapter-path", str(shipped_adapter(tmp_path / "ad", seed=1)))):
        child = _spawn("--temperature", "0", "--max-tokens", "16", *extra)
        try:
            child.sendline("Who goes there?")
            child.expect_exact(PROMPT)
            answers.append(child.before.strip())
            child.sendline("/exit")
            child.expect(pytest.importorskip("pexpect").EOF)
        finally:
            child.close(force=True)
    assert answers[0] != answers[1] and len(answers[1]) > len("Who goes there?")
