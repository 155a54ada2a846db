"""Fixtures of the training tests: the real corpora and a backend to train on (vane when
the C library loads, else the IR's numpy reference with fp16 rounding)."""

from __future__ import annotations

from pathlib import Path

import pytest
from asset_paths import require_asset
from child_process import OUTSIDE, child_env


def _vane_available() -> bool:
    try:
        from orion.runtime import backends

        return "vane" in backends()
    except Exception:  # noqa: BLE001 - no built library: the reference stands in
        return False


@pytest.fixture(scope="session")
def backend() -> str:
    return "vane" if _vane_available() else "reference"


@pytest.fixture(scope="session")
def shakespeare() -> Path:
    return require_asset("text/tinyshakespeare_input.txt")


@pytest.fixture(scope="session")
def sp_model(tmp_path_factory, shakespeare) -> Path:
    """A 512-piece SentencePiece vocabulary trained on tiny Shakespeare."""
    from orion.tokenizers.sentencepiece import train_sentencepiece

    out = tmp_path_factory.mktemp("sp") / "tokenizer.model"
    train_sentencepiece(shakespeare, 512, out)
    return out


# ---- data-parallel ranks on localhost ------------------------------------------------

RANK_TIMEOUT_S = 180        # every rank process is killed by then, whatever happens


def _free_port_run(n: int) -> int:
    """The first of n consecutive free ports for the ring backend's listeners: mlx.launch
    gives rank r the port `-p` + r. They are taken below Linux's ephemeral range
    (32768-60999), where no outgoing connection can take one between this check and
    the rank's bind (CI once lost a run to that: rank 1's port, never checked, was busy)."""
    import random
    import socket

    for _ in range(200):
        first = random.randrange(20000, 32000 - n)
        socks = [socket.socket() for _ in range(n)]
        try:
            for offset, s in enumerate(socks):
                s.bind(("127.0.0.1", first + offset))
            return first
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports between 20000 and 32000")


class Ranks:
    """Starts data-parallel ranks on localhost. `launch` goes through `mlx.launch -n N
    --backend ring`, as a user would; `start` sets what mlx.launch sets (MLX_RANK,
    MLX_HOSTFILE) for each rank itself, so a test can stop or kill one rank and read
    each rank's exit code and output."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.scratch = tmp / "rank-tmp"     # TMPDIR of the ranks: their scratch folders
        self.scratch.mkdir(parents=True, exist_ok=True)
        self.procs: list = []

    def _env(self, **extra: str) -> dict[str, str]:

        return child_env(TMPDIR=str(self.scratch), **extra)

    def launch(self, n: int, argv: list[str]):
        import os
        import shutil
        import signal
        import subprocess
        import sys

        exe = Path(sys.executable).with_name("mlx.launch")
        exe = exe if exe.exists() else shutil.which("mlx.launch")
        if exe is None:
            pytest.skip("mlx.launch is not installed (pip install '.[distributed]')")
        port = _free_port_run(n)
        cmd = [str(exe), "-n", str(n), "--backend", "ring", "-p", str(port),
               "--python", sys.executable, *argv]
        # a session of its own: a timeout kills mlx.launch and the ranks it started
        p = subprocess.Popen(cmd, cwd=OUTSIDE, env=self._env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                             start_new_session=True)
        try:
            out, err = p.communicate(timeout=RANK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
            raise
        return subprocess.CompletedProcess(cmd, p.returncode, out, err)

    def start(self, argvs: list[list[str]]) -> list:
        import json
        import subprocess
        import sys

        first = _free_port_run(len(argvs))
        ports = [first + rank for rank in range(len(argvs))]
        hostfile = self.tmp / f"hosts-{ports[0]}.json"
        hostfile.write_text(json.dumps([[f"127.0.0.1:{p}"] for p in ports]))
        procs = []
        for rank, argv in enumerate(argvs):
            out = open(self.tmp / f"rank{rank}-{ports[0]}.log", "w+")  # noqa: SIM115
            env = self._env(MLX_RANK=str(rank), MLX_HOSTFILE=str(hostfile))
            p = subprocess.Popen([sys.executable, *argv], cwd=OUTSIDE, env=env, stdout=out,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
            p.log = out
            procs.append(p)
        self.procs += procs
        return procs

    @staticmethod
    def finish(p, timeout: float = RANK_TIMEOUT_S) -> tuple[int, str]:
        """(exit code, output) of a rank started by `start`, waiting at most `timeout`."""
        code = p.wait(timeout=timeout)
        p.log.seek(0)
        return code, p.log.read()

    def kill_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            p.log.close()


@pytest.fixture()
def ranks(tmp_path):
    pytest.importorskip("mlx.core", reason="mlx is not installed (pip install "
                        "'.[distributed]'); CI installs it with the test extra")
    r = Ranks(tmp_path)
    yield r
    r.kill_all()
