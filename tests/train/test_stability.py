from __future__ import annotations

import numpy as np

from orion.train.stability import FP16_MAX, LossScaler, SanitizeCounts, sanitize


def test_sanitize_replaces_and_counts():
    x = np.array([1.0, np.nan, np.inf, -np.inf, FP16_MAX, -2.0], np.float32)
    counts = SanitizeCounts()
    y = sanitize(x, counts)
    np.testing.assert_array_equal(y, [1.0, 0.0, FP16_MAX, -FP16_MAX, FP16_MAX, -2.0])
    assert (counts.nan, counts.inf, counts.saturated) == (1, 2, 1)
    assert counts.overflow


def test_sanitize_fixes_writable_fp32_in_place():
    x = np.array([np.nan, 2.0, -np.inf], np.float32)
    assert sanitize(x) is x
    np.testing.assert_array_equal(x, [0.0, 2.0, -FP16_MAX])
    frozen = np.array([np.inf], np.float32)
    frozen.setflags(write=False)
    assert sanitize(frozen)[0] == FP16_MAX and np.isinf(frozen[0])


def test_sanitize_clean_input_untouched():
    x = np.linspace(-3, 3, 7, dtype=np.float32)
    counts = SanitizeCounts()
    assert sanitize(x, counts) is x
    assert not counts.overflow


def test_loss_scaler_backs_off_and_grows():
    s = LossScaler(scale=1024.0, growth_interval=3)
    s.update(overflow=True)
    assert s.scale == 512.0
    for _ in range(3):
        s.update(overflow=False)
    assert s.scale == 1024.0
    static = LossScaler(scale=8.0, dynamic=False)
    static.update(overflow=True)
    assert static.scale == 8.0
