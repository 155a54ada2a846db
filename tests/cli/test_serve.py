"""`orion serve` argument checks that refuse before any model loads (the server
itself is tested in tests/serve)."""

from __future__ import annotations

from orion.cli import main
from orion.cli.serve import _loopback


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


def test_loopback_hosts():
    assert _loopback("127.0.0.1") and _loopback("::1") and _loopback("localhost")
    assert _loopback("127.8.9.10")
    assert not _loopback("0.0.0.0") and not _loopback("192.168.1.2")
    assert not _loopback("example.com")
