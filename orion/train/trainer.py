"""The training loop as a library: `Trainer(config, data, out).fit()`.

    out/tokenizer.model          the SentencePiece vocabulary (trained on the corpus or copied)
    out/train.tokens(.json)      the corpus tokenized once, memory-mapped
    out/checkpoint.safetensors   master weights + optimizer + metadata (resume from it)
    out/config.json, out/model.safetensors
                                 the model as a Hugging Face folder, for `orion generate`
    out/log.jsonl                one JSON record per logged step, and {"step", "val_loss"}
                                 records: the loss on held-out windows after `step` steps
    out/loss.png                 the training and validation loss curves (needs matplotlib)

Under `mlx.launch` the trainer is one rank of a data-parallel run (`orion.train.parallel`,
docs/distributed.md): rank 0 alone writes the files above.

Programs are compiled once, after any checkpoint is loaded (compiling first and loading
the checkpoint into stale programs was the Orion paper's NaN bug); every later weight
change goes through the chosen update strategy, never a compile.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from orion.atomic import atomic_write_bytes
from orion.errors import ConfigError
from orion.files import (
    MAX_TEXT_BYTES,
    MAX_TOKENIZER_BYTES,
    UnsafeFileError,
    inside,
    read_bytes,
)
from orion.models.weights import check_arrays, init_weights, save_folder
from orion.tokenizers.sentencepiece import SentencePieceTokenizer, train_sentencepiece
from orion.train.checkpoint import (
    CHECKPOINT,
    Checkpoint,
    CheckpointError,
    load_checkpoint,
    save_checkpoint,
)
from orion.train.config import TrainConfig, architecture_of
from orion.train.data import Batches, TokenData, fixed_windows, tokenize_file
from orion.train.distributed import code_digest
from orion.train.optim import AdamW, clip_coef, grad_norm
from orion.train.parallel import DataParallel
from orion.train.plot import loss_curve_png
from orion.train.run_folder import RunFolder
from orion.train.schedule import cosine_lr
from orion.train.stability import LossScaler, SanitizeCounts
from orion.train.step import DeviceStep
from orion.train.update import TrainPrograms


@dataclass
class StepRecord:
    step: int
    loss: float
    lr: float
    grad_norm: float
    ms: float
    update_ms: float
    tokens_per_s: float
    loss_scale: float
    skipped: str | None = None
    sanitized: dict[str, int] = field(default_factory=dict)
    reduce_ms: float | None = None      # data-parallel runs: sharing losses and gradients
    reduce_bytes: int | None = None     # gradient bytes this rank sent into the all-reduce

    def to_json(self) -> str:
        d = {k: v for k, v in self.__dict__.items() if v is not None}
        if not np.isfinite(self.loss):
            d["loss"] = str(self.loss)
        return json.dumps(d)


def _compile_count() -> int:
    from orion.runtime import compile_count

    return compile_count()


def _kept_on_resume(line: str, step: int) -> bool:
    """Whether a log record stays when a run resumes at `step`: records of earlier steps,
    and a validation record of `step` itself (it measured the weights the checkpoint
    holds). A torn or foreign line is dropped."""
    try:
        rec = json.loads(line)
        logged = rec["step"]
    except (ValueError, KeyError, TypeError, RecursionError):
        return False
    if not isinstance(logged, int) or isinstance(logged, bool):
        return False
    return logged < step or ("val_loss" in rec and logged == step)


class _StopRequest:
    """SIGINT and SIGTERM (which a shell sends to background jobs) ask the loop to stop
    after the step it is in, so that the checkpoint it then writes has a step and a
    data position that agree (a KeyboardInterrupt raised inside a step had drawn a
    batch the step never finished). A second signal stops at once, without a save:
    the last checkpoint stays as it was."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def _handler(self, signum: int, frame: object) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt(f"signal {signum} (second)")
        self.signum = signum

    def install(self) -> Callable[[], None]:
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        old = {s: signal.signal(s, self._handler) for s in (signal.SIGTERM, signal.SIGINT)}

        def restore() -> None:
            for s, h in old.items():
                signal.signal(s, h)
        return restore


SMALL_MODEL_DIM = 512


def _blas_limits(threads: int | None, dim: int) -> Any:
    """Caps the host BLAS threads for the loop (`TrainConfig.blas_threads`). A small
    model's host matmuls are small, and a multi-threaded BLAS on a busy machine spends
    more time spinning than computing (measured: 121 ms vs 16 ms per step of a tiny
    model on 2 loaded cores); Stories110M's run 2x faster on 2 threads."""
    from threadpoolctl import threadpool_limits

    if threads is None:
        threads = 1 if dim < SMALL_MODEL_DIM else None
    return None if threads is None else threadpool_limits(limits=threads, user_api="blas")


class Trainer:
    def __init__(self, config: TrainConfig, data: str | os.PathLike[str],
                 out: str | os.PathLike[str], resume: bool = False,
                 progress: bool = True, overwrite: bool = False,
                 parallel: DataParallel | None = None) -> None:
        config.validate()
        self.config = config
        # one process, or one rank of an mlx.launch group (orion.train.parallel)
        self.parallel = parallel or DataParallel.from_env(config.collective_timeout_s,
                                                          config.reduce_dtype)
        self.out = self.parallel.out_dir(Path(out))
        self.progress = progress and self.parallel.writes
        # rank 0 owns the run folder (lock, resume/overwrite rule); another rank's is a
        # fresh scratch folder of its own, and what it resumes comes from rank 0
        owner = self.parallel.writes
        self.run = RunFolder(self.out, resume=resume and owner, overwrite=overwrite or not owner,
                             trained_tokenizer=config.tokenizer == "train")
        try:
            self._setup(Path(data), resume)
        except BaseException:
            self.run.close(failed=True)   # a folder this run created goes again
            self.parallel.close()
            raise

    def _setup(self, data: Path, resume: bool) -> None:
        config = self.config
        self.tokenizer = self._tokenizer(data, resume and self.parallel.writes)
        tokens = tokenize_file(data, self.tokenizer, self.out / "train.tokens",
                               bos_id=self.tokenizer.bos_token_id)
        self.data = TokenData(tokens, config.val_fraction)
        if self.parallel.size > 1:
            self.parallel.check_same(self._identity(resume))
        self.batches = Batches(self.data.train, config.batch_size, config.seq_len, config.seed,
                               self.parallel.rank, self.parallel.size)
        self.history: list[tuple[int, float]] = []
        self.val_windows = fixed_windows(self.data.val, config.batch_size, config.seq_len,
                                         config.val_batches)
        self.val_history: list[tuple[int, float]] = []
        self.step = 0
        self.scaler = LossScaler(config.loss_scale, config.dynamic_loss_scale)
        self.arch = config.model_config(self.tokenizer.vocab_size)
        if resume:   # rank 0 loads and checks the checkpoint; every rank continues from it
            self._resume(self.parallel.checkpoint(self._resumable_checkpoint))
        else:
            self.weights = init_weights(self.arch, config.seed)
            self.opt = self._optimizer()
        if self.arch.args.max_positions < config.seq_len:
            raise ConfigError(f"seq_len {config.seq_len} exceeds the model's context "
                              f"{self.arch.args.max_positions}")
        # compile only now, with the weights the run continues from
        on_device = config.backend != "reference"
        before = _compile_count() if on_device else 0
        t0 = time.perf_counter()
        self.programs = TrainPrograms(self.arch, self.weights, config.seq_len,
                                      config.update, config.backend)
        self.compile_ms = (time.perf_counter() - t0) * 1e3
        self.compiles = (_compile_count() - before) if on_device else 0
        self.device_step = DeviceStep(self.arch, self.programs)
        self.records: list[StepRecord] = []
        self._mid_step = False
        self._grad_sum: dict[str, np.ndarray] = {}   # grad_accum > 1: the step's sum

    def _resumable_checkpoint(self) -> Checkpoint:
        """The run folder's checkpoint, refused (saying what differs) unless it was written
        by a run of the same model config, tokenizer and training data. Run-folder files,
        like model-folder ones, must be inside the folder."""
        where = self.out / CHECKPOINT
        ck = load_checkpoint(self._inside(CHECKPOINT))
        meta = ck.meta
        missing = [k for k in ("model", "step", "optim_t", "loss_scaler", "data", "history",
                               "tokenizer", "data_sha256") if k not in meta]
        if missing:
            raise CheckpointError(f"{where}: metadata lacks {', '.join(missing)}")
        try:
            saved = architecture_of(meta["model"], str(where))
        except ConfigError:
            raise CheckpointError(f"{where}: its model config does not parse") from None
        if saved != self.arch:
            now, then = self.arch.args.to_dict(), saved.args.to_dict()
            diff = ", ".join(f"{k} {then.get(k)!r} -> {now[k]!r}" for k in now
                             if now[k] != then.get(k)) or f"{saved.model_type} -> " \
                f"{self.arch.model_type}"
            raise CheckpointError(f"{where}: the model config changed since the checkpoint "
                                  f"({diff}); resume needs the same model")
        if meta["tokenizer"] != self.tokenizer.identity:
            raise CheckpointError(f"{where}: the tokenizer changed since the checkpoint "
                                  f"({meta['tokenizer']} -> {self.tokenizer.identity})")
        data_now = self.data.meta.get("source_sha256")
        if meta["data_sha256"] != data_now:
            raise CheckpointError(
                f"{where}: the training data changed since the checkpoint (sha256 "
                f"{str(meta['data_sha256'])[:12]}... -> {str(data_now)[:12]}...); its data "
                "position means nothing in other data: restore the data, or start a new "
                "run with --overwrite")
        return ck

    def _resume(self, ck: Checkpoint) -> None:
        """Continues from a checked checkpoint (rank 0's, on every rank)."""
        where = self.out / CHECKPOINT
        meta = ck.meta
        try:
            self.weights = check_arrays(self.arch, ck.weights, str(where))
            self.opt = self._optimizer()
            self.opt.load_state_tensors(ck.optim, int(meta["optim_t"]))
            self.step = int(meta["step"])
            self.scaler.load_state_dict(meta["loss_scaler"])
            self.batches.load_state_dict(meta["data"])
            self.history = [(int(s), float(v)) for s, v in meta["history"]]
            self.val_history = [(int(s), float(v)) for s, v in meta.get("val_history", [])]
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{where}: inconsistent checkpoint ({type(exc).__name__}: "
                                  f"{exc})") from None
        self._truncate_log()

    def _inside(self, name: str) -> Path:
        try:
            return inside(self.out, name)
        except UnsafeFileError as exc:
            raise CheckpointError(str(exc)) from None

    def _identity(self, resume: bool) -> dict[str, Any]:
        """What data-parallel ranks must share. Ranks that trained their own tokenizer
        agree on its pieces, not on its file (SentencePiece records temporary paths)."""
        sp = self.tokenizer.sp
        return {"config": self.config.to_dict(), "code": code_digest(), "resume": resume,
                "data": {k: v for k, v in self.data.meta.items() if k != "tokenizer"},
                "vocabulary": [(sp.id_to_piece(i), sp.get_score(i))
                               for i in range(sp.vocab_size())]}

    def _truncate_log(self) -> None:
        """Drops log records of steps after the checkpoint (a run stopped between
        checkpoints logged steps that the resumed run does again). A validation record
        of the checkpoint's step stays: it measured the weights the checkpoint holds."""
        log = self.out / "log.jsonl"
        if log.exists():
            text = read_bytes(log, max_bytes=MAX_TEXT_BYTES).decode("utf-8", "replace")
            keep = [line for line in text.splitlines() if _kept_on_resume(line, self.step)]
            atomic_write_bytes(log, "".join(line + "\n" for line in keep).encode())

    def _tokenizer(self, data: Path, resume: bool) -> SentencePieceTokenizer:
        dest = self.out / "tokenizer.model"
        if os.path.lexists(dest):
            dest = self._inside("tokenizer.model")
        if self.config.tokenizer == "train":
            if not dest.exists():
                train_sentencepiece(data, self.config.vocab_size, dest)
            return SentencePieceTokenizer(dest)
        try:
            wanted = read_bytes(self.config.tokenizer, max_bytes=MAX_TOKENIZER_BYTES)
        except UnsafeFileError as exc:
            raise ConfigError(f"tokenizer {exc}") from None
        have = read_bytes(dest, max_bytes=MAX_TOKENIZER_BYTES) if dest.is_file() else None
        if have != wanted:
            if resume:   # the run's tokenizer is part of what a checkpoint continues
                raise CheckpointError(f"{self.config.tokenizer}: differs from the run's "
                                      f"{dest}; resume needs the same tokenizer")
            SentencePieceTokenizer(self.config.tokenizer)   # refuse a corrupt one first
            atomic_write_bytes(dest, wanted)
        return SentencePieceTokenizer(dest)

    def _optimizer(self) -> AdamW:
        c = self.config
        return AdamW(self.weights, c.lr, (c.beta1, c.beta2), weight_decay=c.weight_decay)

    # ---- one optimizer step -------------------------------------------------------------

    def train_step(self) -> StepRecord:
        c = self.config
        t0 = time.perf_counter()
        lr = cosine_lr(self.step, c.lr, c.warmup, c.steps, c.min_lr)
        grads: dict[str, np.ndarray] | None = None
        losses, counts, skipped = [], SanitizeCounts(), None
        try:
            for micro in range(c.grad_accum):
                x, y = self.batches.next()
                out = self.device_step(self.weights, x, y, self.scaler.scale)
                counts.add(out.counts)
                losses.append(out.loss)
                if not out.finite or not np.isfinite(out.loss):
                    skipped = "non-finite loss"
                    self.batches.skip(c.grad_accum - 1 - micro)
                    break
                grads = self._accumulate(out.grads, micro)
        except Exception:
            self.parallel.fail(c.grad_accum)    # the other ranks stop too, naming this one
            raise
        # every rank's losses and flags (unchanged when alone), so all decide alike
        shared = self.parallel.share(losses, counts.overflow, skipped, c.grad_accum)
        losses, skipped = shared.losses, shared.skipped
        accum = c.grad_accum * self.parallel.size   # micro-batches in the global batch
        if skipped is None and shared.overflow and self.scaler.dynamic:
            skipped = "fp16 overflow in backward"
        gnorm = float("nan")
        update_ms = 0.0
        if skipped is None and grads is not None:
            self.parallel.sum_grads(grads)
            # the mean over micro-batches and the clipping scale fold into AdamW's one
            # pass (grad_scale) instead of two more passes over every gradient
            gnorm = grad_norm(grads) / accum
            if not np.isfinite(gnorm):
                skipped = "non-finite gradient norm"
        if skipped is None and grads is not None:
            # AdamW's pass also rounds the weights to the fp16 copies the programs use
            self.opt.step(self.weights, grads, lr,
                          grad_scale=clip_coef(gnorm, c.grad_clip) / accum,
                          half=self.programs.half)
            update_ms = self.programs.update(self.weights, rounded=True)
        self.scaler.update(shared.overflow)
        ms = (time.perf_counter() - t0) * 1e3
        loss = float(np.mean(losses))
        rec = StepRecord(self.step, loss, lr, gnorm, ms, update_ms,
                         c.batch_size * c.seq_len * accum / (ms / 1e3),
                         self.scaler.scale, skipped, counts.to_dict())
        if self.parallel.size > 1:
            rec.reduce_ms, rec.reduce_bytes = self.parallel.reduce_ms, self.parallel.reduce_bytes
        if np.isfinite(loss):
            self.history.append((self.step, loss))
        self.step += 1
        return rec

    def validate(self) -> float | None:
        """The mean loss over the fixed held-out windows with the current weights
        (None when `val_fraction` leaves no window); kept in `val_history`."""
        if not self.val_windows:
            return None
        loss = float(np.mean([self.device_step.loss(self.weights, x, y)
                              for x, y in self.val_windows]))
        self.val_history.append((self.step, loss))
        return loss

    def _accumulate(self, grads: dict[str, np.ndarray], micro: int) -> dict[str, np.ndarray]:
        """The sum of the step's micro-batch gradients so far. Each micro-batch's are
        summed whole (g0 + g1 + ...), the order data-parallel ranks sum theirs in, so 2
        ranks equal 1 process with grad_accum 2 to the bit."""
        if self.config.grad_accum == 1:
            return grads
        acc = self._grad_sum
        for k, g in grads.items():
            if micro == 0:
                if k not in acc or acc[k].shape != g.shape:
                    acc[k] = np.empty_like(g)
                np.copyto(acc[k], g)
            else:
                np.add(acc[k], g, out=acc[k])
        return acc

    # ---- checkpoints --------------------------------------------------------------------

    def meta(self) -> dict[str, Any]:
        return {"model": self.arch.to_config(), "train": self.config.to_dict(),
                "step": self.step, "optim_t": self.opt.t,
                "loss_scaler": self.scaler.state_dict(), "data": self.batches.state_dict(),
                "history": self.history, "val_history": self.val_history,
                "tokenizer": self.tokenizer.identity,
                "data_sha256": self.data.meta.get("source_sha256"),
                "world_size": self.parallel.size}

    def save(self) -> None:
        if not self.parallel.writes:
            return
        save_folder(self.out, self.arch, self.weights, self.config.export_dtype)
        save_checkpoint(self.out / CHECKPOINT, self.weights, self.opt.state_tensors(),
                        self.meta())
        self.run.created = False   # the folder now holds a run: never removed on failure
        if self.history:
            loss_curve_png(self.out / "loss.png", self.history, self.val_history)

    # ---- the loop -----------------------------------------------------------------------

    def fit(self, steps: int | None = None,
            on_step: Callable[[StepRecord], None] | None = None) -> list[StepRecord]:
        """Trains until `config.steps` optimizer steps are done, or, given `steps`, that
        many more (past config.steps the learning rate stays at min_lr); checkpoints
        every `checkpoint_every` steps, at the end, and on Ctrl-C / SIGTERM (after the
        step in progress, so that resuming is exact)."""
        c = self.config
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int)
                                  or steps < 0):
            raise ConfigError(f"steps must be an integer >= 0, got {steps!r}")
        end = c.steps if steps is None else self.step + steps
        self.parallel.check_same({"start": self.step, "end": end})
        bar = None
        if self.progress:
            from tqdm import tqdm

            bar = tqdm(total=end, initial=self.step, unit="step", dynamic_ncols=True)
        stop = _StopRequest()
        restore = stop.install()
        limits = _blas_limits(c.blas_threads, self.arch.args.dim)
        val = self.val_history[-1][1] if self.val_history else None

        def log_val(log: Any) -> None:
            nonlocal val
            val = self.validate()
            if val is not None:
                log.write(json.dumps({"step": self.step, "val_loss": val}) + "\n")
                log.flush()

        try:
            log_mode = "a" if self.step > 0 else "w"   # a fresh run starts a fresh log
            with open(self.out / "log.jsonl", log_mode, encoding="utf-8") as log:
                while self.step < end:
                    self._mid_step = True
                    rec = self.train_step()
                    self._mid_step = False
                    self.records.append(rec)
                    if rec.step % c.log_every == 0 or rec.skipped:
                        log.write(rec.to_json() + "\n")
                        log.flush()
                    if on_step is not None:
                        on_step(rec)
                    if c.val_every > 0 and self.step % c.val_every == 0:
                        log_val(log)
                    if bar is not None:
                        bar.update(1)
                        bar.set_postfix(loss=f"{rec.loss:.3f}",
                                        val="-" if val is None else f"{val:.3f}",
                                        ms=f"{rec.ms:.0f}", reload_ms=f"{rec.update_ms:.1f}",
                                        tok_s=f"{rec.tokens_per_s:.0f}")
                    if c.checkpoint_every > 0 and self.step % c.checkpoint_every == 0:
                        self.save()
                    if stop.signum is not None:
                        raise KeyboardInterrupt(f"signal {stop.signum}")
                if not self.val_history or self.val_history[-1][0] != self.step:
                    log_val(log)        # the end of the run is always measured
        except KeyboardInterrupt:
            if not self._mid_step:   # the state is whole between steps: keep it
                self.save()
            raise
        finally:
            restore()
            if limits is not None:
                limits.restore_original_limits()
            if bar is not None:
                bar.close()
        self.save()
        return self.records

    def close(self) -> None:
        self.programs.release()
        self.run.close()
        self.parallel.close()
