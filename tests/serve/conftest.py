"""The real server in a subprocess on 127.0.0.1 (a free port), for the tests to talk
to with the real `openai` client."""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import time

import pytest
from child_process import OUTSIDE, child_env

MODEL = "shakespeare-llama"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, *args: str, host: str = "127.0.0.1") -> None:
        self.port = free_port()
        self.base = f"http://{host}:{self.port}"
        # stderr to a file, not a pipe: the server logs a line per request, and a pipe
        # nobody reads until stop() would fill and block it
        self.log = tempfile.TemporaryFile("w+", encoding="utf-8")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "orion.cli", "serve", "--host", host, "--port",
             str(self.port), *args], cwd=OUTSIDE, env=child_env(), stdout=subprocess.DEVNULL,
            stderr=self.log, text=True)

    def wait_ready(self, timeout: float = 60.0) -> Server:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited: {self.stderr()}")
            try:
                if httpx.get(self.base + "/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.1)
        raise TimeoutError("the server did not come up")

    def client(self, **kwargs):
        openai = pytest.importorskip("openai")
        kwargs.setdefault("api_key", "none")
        kwargs.setdefault("max_retries", 0)
        return openai.OpenAI(base_url=self.base + "/v1", **kwargs)

    def stderr(self) -> str:
        """What the server wrote to stderr so far."""
        self.log.seek(0)
        return self.log.read()

    def stop(self) -> str:
        """Stops the server; its stderr."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        err = self.stderr()
        self.log.close()
        return err


@pytest.fixture(scope="module")
def server():
    pytest.importorskip("uvicorn")
    s = Server("--max-queue", "8", "--batch-slots", "0", "--prompt-cache", "always").wait_ready()
    yield s
    err = s.stop()
    assert "Traceback" not in err, err
