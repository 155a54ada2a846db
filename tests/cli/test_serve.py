"""`orion serve` start-up: argument checks that refuse before any model loads, and
every way it can fail ends in one line and exit 2 (130 on Ctrl-C), said before the
"serving" line (the server itself is tested in tests/serve)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys

import pytest
from child_process import OUTSIDE, child_env

from orion.cli import main
from orion.cli.serve import _loopback

SERVING = " on http://"   # the line that says the server is up


def test_adapter_path_needs_name_equals_dir(capsys):
    for spec in ("poet", "=/tmp/poet", "poet="):
        assert main(["serve", "--adapter-path", spec]) == 2
        assert f"--adapter-path {spec!r}: give NAME=DIR" in capsys.readouterr().err
    assert main(["serve", "--adapter-path", "a=/x", "--adapter-path", "a=/y"]) == 2
    assert "each NAME once" in capsys.readouterr().err


def test_bad_queue_and_port(capsys):
    assert main(["serve", "--max-queue", "0"]) == 2
    assert main(["serve", "--port", "70000"]) == 2
    assert "--max-queue must be >= 1" in capsys.readouterr().err


def test_bad_batch_flags(capsys):
    assert main(["serve", "--prompt-round-ms", "-1"]) == 2
    assert "--prompt-round-ms must be in [0, 60000], got -1" in capsys.readouterr().err
    assert main(["serve", "--prefill-chunk", "-1"]) == 2
    assert "--prefill-chunk must be 0 or more" in capsys.readouterr().err


def test_loopback_hosts():
    assert _loopback("127.0.0.1") and _loopback("::1") and _loopback("localhost")
    assert _loopback("127.8.9.10")
    assert not _loopback("0.0.0.0") and not _loopback("192.168.1.2")
    assert not _loopback("example.com")


def test_missing_model_exits_2(tmp_path, capsys):
    assert main(["serve", "--port", "0", "--model", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("orion serve: error: ") and "no model at" in err
    assert err.count("\n") == 1 and SERVING not in err


def test_without_the_extra_exits_2_with_a_hint_that_works(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "uvicorn", None)   # as if not installed
    assert main(["serve"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("orion serve: error: orion serve needs uvicorn")
    assert "pip install '.[serve]' from an Orion checkout" in err   # works from a checkout
    assert err.count("\n") == 1


def test_busy_port_is_said_before_serving(capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["serve", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err == (f"orion serve: error: 127.0.0.1:{port} is already in use (another "
                   "server?); stop it or pick another --port\n")


@pytest.mark.native
def test_ctrl_c_exits_130_after_serving():
    pytest.importorskip("uvicorn")
    proc = subprocess.Popen(
        [sys.executable, "-m", "orion.cli", "serve", "--port", "0"], cwd=OUTSIDE,
        env=child_env(), stderr=subprocess.PIPE, text=True,
        # Ctrl-C as at a terminal: a background job inherits SIGINT ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        lines = [proc.stderr.readline()]   # "preparing the batch programs", then up
        if SERVING not in lines[0]:
            lines.append(proc.stderr.readline())
        assert SERVING in lines[-1], lines
        proc.send_signal(signal.SIGINT)
        _, rest = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130, rest
    assert "orion serve: interrupted" in rest and "Traceback" not in rest
