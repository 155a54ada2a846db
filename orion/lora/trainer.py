"""LoRA fine-tuning of a model folder (any architecture) on an mlx-lm data folder (`orion lora`).

    out/adapter_config.json, adapter_model.safetensors   the adapter (PEFT's format),
                                                           rewritten at each checkpoint
    out/training_state.safetensors   adapter, AdamW moments and step, written
                                     atomically (orion.train.checkpoint); --resume
                                     continues from it exactly
    out/log.jsonl                    one record per step, and one per validation
    out/loss.png                     training (blue) and validation (orange) loss

The data order is a pure function of (seed, step): optimizer step k, micro-batch m
takes positions (k * accum + m) * batch ... of the concatenated per-epoch permutations
`default_rng([seed, epoch]).permutation(n)`, and its dropout masks come from
`default_rng([seed, k, m, 1])`. So the RNG state *is* the seed and the step, and a
resumed run draws the same batches and masks as a straight one.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from orion.errors import LoraError
from orion.formats.peft import LoraConfig
from orion.lora.batching import BucketRunners, capped_seq_length, padded_batch
from orion.lora.data import Split, load_folder
from orion.lora.folders import STATE, adapter_folder
from orion.lora.naming import base_model_name
from orion.lora.options import check_train_config
from orion.lora.step import LoraStep
from orion.models.adapters import Adapter, init_adapter, save_adapter
from orion.train.checkpoint import load_checkpoint, save_checkpoint
from orion.train.optim import AdamW
from orion.train.schedule import cosine_lr


@dataclass
class LoraTrainConfig:
    iters: int = 100
    batch_size: int = 4
    grad_accum: int = 1
    lr: float = 1e-4
    lr_schedule: str = "constant"     # or "cosine" (to min_lr after warmup)
    warmup: int = 0
    min_lr: float = 0.0
    weight_decay: float = 0.0
    max_seq_length: int = 2048
    val_every: int = 20               # 0: only at the end
    val_batches: int = 25             # -1: the whole validation set
    save_every: int = 100
    seed: int = 0
    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = ("q_proj", "v_proj")
    loss_scale: float = 256.0         # static: fp16 activation gradients stay normal

    def __post_init__(self) -> None:
        check_train_config(self)    # every field's type and range (orion.lora.options)
        self.targets = tuple(self.targets)


@dataclass
class StepRecord:
    step: int
    loss: float
    lr: float
    tokens: int
    ms: float
    host_ms: float        # A/B gradients + AdamW + LoRA input writes
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        d = {k: v for k, v in asdict(self).items() if k != "extra"}
        return json.dumps({**d, **self.extra})


class LoraTrainer:
    def __init__(self, model: str | Path, data: str | Path, out: str | Path,
                 config: LoraTrainConfig, *, resume: bool = False, backend: str | None = None,
                 progress: bool = True, overwrite: bool = False) -> None:
        self.config, self.out, self.progress = config, Path(out), progress
        self.saved = False
        # the output folder's rule first, before a model is loaded (orion.lora.folders)
        self.folder = adapter_folder(self.out, resume=resume, overwrite=overwrite)
        try:
            self._setup(Path(model), data, resume, backend)
        except BaseException:
            self.folder.close(failed=True)   # folders this run created go again
            raise

    def _setup(self, model: Path, data: str | Path, resume: bool, backend: str | None
               ) -> None:
        from orion.models.frozen import frozen_base, is_quantized
        from orion.models.registry import default_model_path, folder_tokenizer, load_hf_arrays

        config = self.config
        self.model_path = model
        if is_quantized(model):   # QLoRA's shape: the base's matrices stay compressed
            self.arch, self.weights, tok = frozen_base(model)
        else:
            self.arch, self.weights = load_hf_arrays(self.model_path)
            tok = folder_tokenizer(self.model_path, self.arch.args.vocab_size)
        if tok is None:
            raise LoraError(f"{self.model_path}: no tokenizer Orion reads (tokenizer.json "
                            "or tokenizer.model)")
        # never past the model's context (orion.lora.batching); the CLI says so
        self.max_seq_length = capped_seq_length(config.max_seq_length,
                                                self.arch.args.max_positions)
        self.data = load_folder(data, tok, self.max_seq_length)
        self.seq = min(self.max_seq_length, max(s.longest for s in self.data.values()))
        lcfg = LoraConfig(r=config.rank, alpha=config.alpha, targets=config.targets,
                          dropout=config.dropout,
                          base_model=base_model_name(model, default_model_path()))
        self.adapter: Adapter = init_adapter(lcfg, self.arch, config.seed)
        self.params = self.adapter.params()
        self.optim = AdamW(self.params, lr=config.lr, betas=(0.9, 0.999), eps=1e-8,
                           weight_decay=config.weight_decay)
        self.step = 0
        if resume:
            self._resume()
        # one step per bucket of sequence lengths, compiled when first needed
        self.runners = BucketRunners(lambda seq: LoraStep(
            self.arch, self.weights, self.adapter, seq, backend, config.loss_scale,
            config.dropout))
        self.losses: list[tuple[int, float]] = []

    # ---- state ---------------------------------------------------------------

    def _meta(self) -> dict[str, Any]:
        c = asdict(self.config)
        c["targets"] = list(self.config.targets)
        return {"step": self.step, "optim_t": self.optim.t, "config": c,
                "model": str(self.model_path), "sampler": {"seed": self.config.seed}}

    def save(self) -> None:
        save_adapter(self.out, self.adapter)
        save_checkpoint(self.out / STATE, self.params, self.optim.state_tensors(), self._meta())
        self.saved = True

    def _resume(self) -> None:
        path = self.out / STATE
        if not path.exists():
            raise LoraError(f"{path}: nothing to resume (no training state)")
        try:
            ck = load_checkpoint(path)
        except ValueError as exc:
            raise LoraError(str(exc)) from None
        saved = dict(ck.meta["config"])
        now = dict(asdict(self.config), targets=list(self.config.targets))
        differ = [k for k in ("rank", "alpha", "targets", "batch_size", "grad_accum", "seed",
                              "max_seq_length") if saved.get(k) != now[k]]
        if differ:
            raise LoraError(f"{path}: was trained with other {differ}; resume with the same")
        if set(ck.weights) != set(self.params):
            raise LoraError(f"{path}: its tensors do not match this adapter")
        for k, v in ck.weights.items():
            self.params[k][...] = v
        self.optim.load_state_tensors(ck.optim, int(ck.meta["optim_t"]))
        self.step = int(ck.meta["step"])
        log = self.out / "log.jsonl"
        if log.exists():   # records past the checkpoint are replayed by this run
            keep = [ln for ln in log.read_text().splitlines()
                    if json.loads(ln).get("step", 0) <= self.step]
            log.write_text("".join(ln + "\n" for ln in keep))

    # ---- training ------------------------------------------------------------

    def _indices(self, split: Split, start: int, count: int) -> np.ndarray:
        n = len(split.examples)
        out = np.empty(count, np.int64)
        for j in range(count):
            pos = start + j
            epoch = pos // n
            perm = np.random.default_rng([self.config.seed, epoch]).permutation(n)
            out[j] = perm[pos % n]
        return out

    def lr_at(self, step: int) -> float:
        c = self.config
        if c.lr_schedule == "cosine":
            return cosine_lr(step, c.lr, c.warmup, c.iters, c.min_lr)
        return c.lr * (step + 1) / c.warmup if step < c.warmup else c.lr

    def train_step(self) -> StepRecord:
        c, split = self.config, self.data["train"]
        t0 = time.perf_counter()
        host0 = self.runners.host_ms
        micro = []
        for m in range(c.grad_accum):
            start = (self.step * c.grad_accum + m) * c.batch_size
            micro.append(padded_batch(split, self._indices(split, start, c.batch_size),
                                      self.seq))
        norm = max(int(sum(b[2].sum() for b in micro)), 1)
        grads: dict[str, np.ndarray] = {}
        total = 0.0
        for m, (tokens, targets, mask) in enumerate(micro):
            drop = np.random.default_rng([c.seed, self.step, m, 1]) if c.dropout else None
            out = self.runners(tokens.shape[1])(self.adapter, tokens, targets, mask,
                                                norm=norm, dropout=drop)
            if not out.finite:
                raise LoraError(f"step {self.step}: non-finite loss or fp16 overflow")
            total += out.loss * out.tokens
            for k, g in out.grads.items():
                grads[k] = grads[k] + g if k in grads else g
        t_opt = time.perf_counter()
        lr = self.lr_at(self.step)
        self.optim.step(self.params, grads, lr=lr)
        self.runners.write_adapter(self.adapter)    # surfaces only: nothing reloaded
        host_ms = self.runners.host_ms - host0 + (time.perf_counter() - t_opt) * 1e3
        self.step += 1
        return StepRecord(self.step, total / norm, lr, norm,
                          (time.perf_counter() - t0) * 1e3, host_ms)

    def evaluate(self, name: str = "valid") -> float:
        c, split = self.config, self.data[name]
        n = len(split.examples)
        if c.val_batches > 0:
            n = min(n, c.val_batches * c.batch_size)
        total, count = 0.0, 0
        for start in range(0, n, c.batch_size):
            idx = np.arange(start, min(start + c.batch_size, n))
            batch = padded_batch(split, idx, self.seq)
            out = self.runners(batch[0].shape[1])(self.adapter, *batch, loss_only=True)
            total += out.loss * out.tokens
            count += out.tokens
        return total / max(count, 1)

    def fit(self, on_step: Callable[[StepRecord], None] | None = None) -> list[StepRecord]:
        c = self.config
        bar = None
        if self.progress:
            from tqdm import tqdm

            bar = tqdm(total=c.iters, initial=self.step, unit="step", dynamic_ncols=True)
        records = []
        try:
            with open(self.out / "log.jsonl", "a", encoding="utf-8") as log:
                if self.step == 0:
                    val = self.evaluate()
                    log.write(json.dumps({"step": 0, "val_loss": val}) + "\n")
                while self.step < c.iters:
                    rec = self.train_step()
                    if (c.val_every and rec.step % c.val_every == 0) or rec.step == c.iters:
                        rec.extra["val_loss"] = self.evaluate()
                    records.append(rec)
                    self.losses.append((rec.step, rec.loss))
                    log.write(rec.to_json() + "\n")
                    log.flush()
                    if on_step is not None:
                        on_step(rec)
                    if bar is not None:
                        bar.update(1)
                        bar.set_postfix(loss=f"{rec.loss:.3f}", ms=f"{rec.ms:.0f}",
                                        **({"val": f"{rec.extra['val_loss']:.3f}"}
                                           if "val_loss" in rec.extra else {}))
                    if c.save_every > 0 and self.step % c.save_every == 0:
                        self.save()
        except KeyboardInterrupt:
            self.save()
            raise
        finally:
            if bar is not None:
                bar.close()
        self.save()
        self._plot()
        return records

    def _plot(self) -> None:
        from orion.train.plot import loss_curve_png

        rows = [json.loads(ln) for ln in (self.out / "log.jsonl").read_text().splitlines()]
        pts = [(r["step"], r["loss"]) for r in rows if "loss" in r and math.isfinite(r["loss"])]
        val = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
        if pts:
            loss_curve_png(self.out / "loss.png", pts, val, title="LoRA fine-tuning loss")

    def close(self, failed: bool = False) -> None:
        """Releases the programs and the folder's lock; `failed` (the run raised):
        also removes the folders this run created, unless it saved an adapter."""
        self.runners.release()
        self.folder.close(failed=failed and not self.saved)

