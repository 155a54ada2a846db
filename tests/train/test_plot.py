"""The loss plot: matplotlib draws train and validation curves; without matplotlib,
no PNG and one logged line."""

from __future__ import annotations

import logging
import sys

import numpy as np
import pytest

from orion.train import plot

TRAIN = [(s, 5.0 - 0.004 * s) for s in range(0, 1000)]
VAL = [(s, 5.2 - 0.004 * s) for s in range(100, 1001, 100)]


def test_figure_has_both_curves_title_labels_and_integer_ticks():
    pytest.importorskip("matplotlib", reason="the plot extra")
    ax = plot.loss_figure(TRAIN, VAL).axes[0]
    assert ax.get_title() == "Training loss"
    assert ax.get_xlabel() == "optimizer step" and "loss" in ax.get_ylabel()
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "train", "validation (held out)"]
    train_line, val_line = ax.get_lines()
    np.testing.assert_array_equal(val_line.get_xdata(), [s for s, _ in VAL])
    assert len(train_line.get_xdata()) == len(TRAIN)
    ticks = [t for t in ax.get_xticks() if 0 <= t <= 1000]
    assert 4 <= len(ticks) <= 9 and all(float(t).is_integer() for t in ticks)


def test_png_is_written_and_readable(tmp_path):
    image = pytest.importorskip("matplotlib.image", reason="the plot extra")
    assert plot.loss_curve_png(tmp_path / "loss.png", TRAIN, VAL)
    pixels = image.imread(tmp_path / "loss.png")      # matplotlib's own PNG reader
    assert pixels.shape[:2] == (500, 800)
    rgb = (pixels[..., :3] * 255).round()
    blue = np.all(np.abs(rgb - (31, 119, 180)) < 8, axis=-1)     # tab:blue, train
    orange = np.all(np.abs(rgb - (255, 127, 14)) < 8, axis=-1)   # tab:orange, validation
    assert blue.sum() > 200 and orange.sum() > 200   # more than the legend's swatches


def test_without_matplotlib_no_png_and_one_line(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "matplotlib", None)       # import raises ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    monkeypatch.setattr(plot, "_said_why", False)
    with caplog.at_level(logging.WARNING, logger="orion.train"):
        assert not plot.loss_curve_png(tmp_path / "a.png", TRAIN, VAL)
        assert not plot.loss_curve_png(tmp_path / "b.png", TRAIN, VAL)
    assert not list(tmp_path.iterdir())
    assert len(caplog.records) == 1
    assert "matplotlib is not installed" in caplog.records[0].getMessage()
