"""The loss-curve PNG of a training run, drawn with matplotlib (the optional `plot`
extra: `pip install ".[plot]"` from a checkout). Without matplotlib no PNG is written
and one line on the `orion.train` logger says why; training itself never needs it."""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Sequence
from typing import Any

from orion.atomic import atomic_write_bytes

log = logging.getLogger("orion.train")
_said_why = False

Curve = Sequence[tuple[int, float]]   # (step, loss) pairs


def loss_figure(train: Curve, val: Curve = (), title: str = "Training loss") -> Any:
    """A matplotlib Figure of the train and validation curves (raises ImportError
    without matplotlib). No pyplot: no global figure state, no GUI backend."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(8, 5), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    if train:
        steps, losses = zip(*train, strict=True)
        ax.plot(steps, losses, lw=1.0, color="tab:blue", label="train")
    if val:
        steps, losses = zip(*val, strict=True)
        ax.plot(steps, losses, lw=1.8, color="tab:orange", marker="o", ms=4,
                label="validation (held out)")
    ax.set_title(title)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("cross-entropy loss (nats per token)")
    ax.xaxis.set_major_locator(MaxNLocator(nbins=8, steps=[1, 2, 2.5, 5, 10], integer=True))
    ax.grid(True, color="0.9")
    if train or val:
        ax.legend(loc="upper right")
    return fig


def loss_curve_png(path: str | os.PathLike[str], train: Curve, val: Curve = (),
                   title: str = "Training loss") -> bool:
    """Writes `loss_figure` to `path` (atomically); False, with one logged line the
    first time in the process, when matplotlib is not installed."""
    global _said_why
    try:
        fig = loss_figure(train, val, title)
    except ImportError:
        if not _said_why:
            from orion.extras import install_hint

            log.warning("%s not written: matplotlib is not installed (%s)",
                        os.fspath(path), install_hint("plot"))
            _said_why = True
        return False
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    atomic_write_bytes(path, buf.getvalue())
    return True
