"""Builders for the hostile-input tests: small model folders written with numpy and
safetensors (no torch), FIFOs with a watchdog that turns a hang into a failure, and a
tiny training set-up."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

GPT2_TINY = {"model_type": "gpt2", "n_layer": 1, "n_embd": 32, "n_head": 2,
             "n_positions": 64, "vocab_size": 50257}


def write_gpt2_folder(folder: Path, config: dict[str, Any] | None = None,
                      tensors: dict[str, np.ndarray] | None = None) -> Path:
    """A GPT-2 folder: config.json and model.safetensors with random weights of the
    shapes the (valid) config implies, or `tensors` as given."""
    from safetensors.numpy import save_file

    from orion.models.architectures.gpt2 import Model

    folder.mkdir(parents=True, exist_ok=True)
    cfg = {**GPT2_TINY, **(config or {})}
    (folder / "config.json").write_text(json.dumps(cfg))
    if tensors is None:
        arch = Model.from_config({**GPT2_TINY}, "GPT2_TINY")
        shapes = {k: s[::-1] if arch.stored_transposed(k) else s
                  for k, s in arch.parameters().items()}
        rng = np.random.default_rng(0)
        tensors = {k: (0.02 * rng.standard_normal(s)).astype(np.float32)
                   for k, s in shapes.items()}
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


class HangWatch:
    """Fails instead of hanging: after `seconds`, opens the FIFO for writing (which
    releases a reader blocked in open or read) and records that it had to."""

    def __init__(self, fifo: Path, seconds: float = 5.0) -> None:
        self.fifo, self.hung = fifo, False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(seconds,), daemon=True)

    def _watch(self, seconds: float) -> None:
        if self._done.wait(seconds):
            return
        self.hung = True
        while not self._done.is_set():
            try:
                os.close(os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
            time.sleep(0.05)

    def __enter__(self) -> HangWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        assert not self.hung, f"reading {self.fifo} blocked: a FIFO must be refused, not read"


@contextmanager
def fifo_at(path: Path, seconds: float = 5.0):
    """A FIFO at `path`, watched (see HangWatch)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        path.unlink()
    os.mkfifo(path)
    with HangWatch(path, seconds) as watch:
        yield watch


def corpus() -> Path:
    """Tiny Shakespeare, shipped in tests/data (one lookup: tests/asset_paths.py)."""
    from asset_paths import require_asset

    return require_asset("text/tinyshakespeare_input.txt")


def tiny_train_config(**kw: Any):
    """A tiny Llama on the numpy reference backend: a step takes milliseconds."""
    from orion.train.config import TrainConfig

    base = dict(model={"dim": 32, "n_layers": 1, "n_heads": 2, "hidden_dim": 64},
                tokenizer="train", vocab_size=384, batch_size=2, seq_len=16, steps=12,
                lr=3e-3, min_lr=3e-4, warmup=2, checkpoint_every=0, backend="reference",
                update="inputs", seed=3)
    base.update(kw)
    return TrainConfig(**base)


def small_corpus(folder: Path, nbytes: int = 60_000) -> Path:
    """The first `nbytes` of tiny Shakespeare (enough for a 384-piece vocabulary)."""
    out = folder / "corpus.txt"
    out.write_bytes(corpus().read_bytes()[:nbytes])
    return out


def copy_folder(src: Path, dst: Path) -> Path:
    """A copy of a model folder that a test may then damage."""
    shutil.copytree(src, dst)
    return dst


# ---- the shipped Llama and PEFT adapters for it, written with numpy and json only ----
# (only public entry points and file formats: the loaders behind them may move)

def shipped_model() -> Path:
    """The Shakespeare Llama the package ships (4 layers, dim 192, vocabulary 2048)."""
    import orion

    return Path(orion.__file__).resolve().parent / "assets" / "shakespeare-llama"


SHIPPED_DIM, SHIPPED_LAYERS = 192, 4


def peft_config(**change: Any) -> dict[str, Any]:
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 2, "lora_alpha": 4.0,
            "lora_dropout": 0.0, "target_modules": ["q_proj"], "bias": "none",
            **change}


def adapter_tensors(r: int = 2, value: float | None = None, seed: int = 0
                    ) -> dict[str, np.ndarray]:
    """A and B of q_proj in every layer of the shipped model, under PEFT's names:
    random and small, or all `value`."""
    rng = np.random.default_rng(seed)
    out = {}
    for layer in range(SHIPPED_LAYERS):
        stem = f"base_model.model.model.layers.{layer}.self_attn.q_proj"
        for which, shape in (("A", (r, SHIPPED_DIM)), ("B", (SHIPPED_DIM, r))):
            arr = (0.01 * rng.standard_normal(shape) if value is None
                   else np.full(shape, value))
            out[f"{stem}.lora_{which}.weight"] = arr.astype(np.float32)
    return out


def write_adapter(folder: Path, config: dict[str, Any] | None = None,
                  tensors: dict[str, np.ndarray] | None = None,
                  raw_weights: bytes | None = None) -> Path:
    """A PEFT adapter folder: adapter_config.json and adapter_model.safetensors (or the
    raw bytes given as the latter)."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text(json.dumps(config or peft_config()))
    weights = folder / "adapter_model.safetensors"
    if raw_weights is not None:
        weights.write_bytes(raw_weights)
    else:
        save_file(tensors if tensors is not None else adapter_tensors(), str(weights))
    return folder


def raw_safetensors(header: dict[str, Any] | str, data: bytes) -> bytes:
    """A safetensors file from a header (a dict, or JSON text as it is) and data."""
    text = header if isinstance(header, str) else json.dumps(header)
    head = text.encode()
    return len(head).to_bytes(8, "little") + head + data


def run_cli(argv: list[str], capsys: Any) -> tuple[int, str, str]:
    """`orion ARGV` in this process: (exit status, stdout, stderr); argparse's usage
    errors exit from inside the parser, which counts the same."""
    from orion.cli import main

    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else 2
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_error(rc: int, err: str, command: str) -> str:
    """Exit 2 and exactly one stderr line `orion <command>: error: ...` (returned)."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, (rc, err)
    assert "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith(f"orion {command}: error: "), err
    return lines[0]


# ---- tokenizer files ------------------------------------------------------------------

def byte_level_tokenizer(merges: tuple[tuple[str, str], ...] = (("Ġ", "t"), ("h", "e"),
                                                                ("Ġt", "he"))):
    """A small byte-level BPE `tokenizers.Tokenizer` (256 bytes, a few merges,
    <|endoftext|>): 260 ids, far fewer than GPT-2's 50,257 embedding rows."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    from orion.tokenizers.gpt2 import byte_decoder

    table = byte_decoder()
    vocab = {c: i for i, c in enumerate(sorted(table, key=table.__getitem__))}
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=list(merges)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    return tok


def write_tokenizer_json(folder: Path, spec: dict[str, Any] | None = None,
                         **change: Any) -> Path:
    """`folder/tokenizer.json`: the byte-level tokenizer above (or `spec`), with
    top-level fields replaced by `change` and `model_change` merged into its model."""
    model_change = change.pop("model_change", {})
    spec = spec or json.loads(byte_level_tokenizer().to_str())
    spec.update(change)
    spec["model"].update(model_change)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    return folder


def gpt2_with_big_rows(folder: Path, first_big: int) -> Path:
    """A GPT-2 folder whose embedding rows from `first_big` on are large (the head is
    tied to them), so that greedy decoding would pick one of them if it could."""
    from safetensors.numpy import load_file, save_file

    write_gpt2_folder(folder)
    tensors = load_file(str(folder / "model.safetensors"))
    wte = next(k for k in tensors if k.endswith("wte.weight"))
    tensors[wte][first_big:] *= 2000.0
    for k in tensors:   # layer norms at 1 so the hidden state is not ~0
        if k.endswith(("ln_f.weight", "ln_1.weight", "ln_2.weight")):
            tensors[k][...] = 1.0
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def shipped_with_rows(folder: Path, rows: int, scale: float = 20.0) -> Path:
    """The shipped Llama (tied embeddings) with `rows` embedding rows past its
    2,048-piece SentencePiece tokenizer, large so greedy decoding would pick them."""
    from safetensors.numpy import load_file, save_file

    shutil.copytree(shipped_model(), folder)
    tensors = load_file(str(folder / "model.safetensors"))
    embed = tensors["model.embed_tokens.weight"]
    extra = np.random.default_rng(1).standard_normal((rows, embed.shape[1])) * scale
    tensors["model.embed_tokens.weight"] = np.concatenate([embed, extra.astype(embed.dtype)])
    save_file(tensors, str(folder / "model.safetensors"))
    cfg = json.loads((folder / "config.json").read_text())
    cfg["vocab_size"] = embed.shape[0] + rows
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


# ---- chat templates --------------------------------------------------------------------

BIG_RENDER = ("{% for i in range(100000) %}{% for j in range(100) %}"
              "{{ messages[0]['content'] * 100 }}{% endfor %}{% endfor %}")   # ~1 GB


def folder_with_template(folder: Path, template: str) -> Path:
    """The shipped model with a chat template of its own."""
    shutil.copytree(shipped_model(), folder)
    (folder / "chat_template.jinja").write_text(template)
    return folder
