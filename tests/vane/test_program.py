"""vane programs as wholes: weights baked at load and the delta path, the decode
slice/pad path, multi-output binding, oversized surfaces, and buffer reuse
(liveness) over random op chains."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orion.errors import BlobFormatError
from orion.runtime import Program, Surface, compile_count
from orion.runtime.blob import blob_bytes, patch_blob, write_blob
from vane.milgen import Mil
from vane.refs import assert_dot_close, f16, up

pytestmark = pytest.mark.native

WKEY = "@model_path/weights/w.bin"


def conv_program(c: int, o: int, s: int, offset: int) -> str:
    m = Mil()
    m.input("xa", (1, c, 1, s))
    m.conv("xa", m.blob((o, c, 1, 1), WKEY, offset), (1, o, 1, s), "ya")
    return m.text(["ya"])


def conv_ref(w: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    o, c = w.shape[:2]
    w2 = up(w).reshape(o, c).astype(np.float64)
    x2 = up(x).reshape(c, -1).astype(np.float64)
    return f16(w2 @ x2).reshape(1, o, 1, -1), (np.abs(w2) @ np.abs(x2)).reshape(1, o, 1, -1)


def test_patch_reload_gives_new_result_without_a_compile(no_leaks):
    c, o, s = 768, 768, 32
    rng = np.random.default_rng(3)
    x = f16(rng.standard_normal((1, c, 1, s)))
    w1 = f16(rng.standard_normal((o, c, 1, 1)) / 28)
    w2 = f16(rng.standard_normal((o, c, 1, 1)) / 28)
    blob, offs = blob_bytes([("w", w1)])
    with Program.compile(conv_program(c, o, s, offs["w"]), {WKEY: blob}, backend="vane") as p:
        first = p.run({"xa": x})["ya"]
        want1, scale = conv_ref(w1, x)
        assert_dot_close(first, want1, scale)
        compiles = compile_count()
        p.unload()
        p.patch_weight(WKEY, offs["w"], w2)
        p.load()
        second = p.run({"xa": x})["ya"]
        want2, scale = conv_ref(w2, x)
        assert_dot_close(second, want2, scale)
        assert not np.array_equal(first, second)
        assert compile_count() == compiles


def test_weights_are_baked_at_load(no_leaks):
    """A write to the weight file while loaded is not seen until the next load."""
    c, o, s = 768, 768, 32
    rng = np.random.default_rng(4)
    x = f16(rng.standard_normal((1, c, 1, s)))
    w1, w2 = (f16(rng.standard_normal((o, c, 1, 1)) / 28) for _ in range(2))
    blob, offs = blob_bytes([("w", w1)])
    with Program.compile(conv_program(c, o, s, offs["w"]), {WKEY: blob}, backend="vane") as p:
        before = p.run({"xa": x})["ya"]
        patch_blob(p.weight_path(WKEY), offs["w"], w2)   # behind the runtime's back
        np.testing.assert_array_equal(p.run({"xa": x})["ya"], before)
        p.unload()
        p.load()
        want2, scale = conv_ref(w2, x)
        assert_dot_close(p.run({"xa": x})["ya"], want2, scale)


def test_load_refuses_a_weight_file_that_no_longer_matches(no_leaks):
    c, o, s = 768, 768, 32
    w = f16(np.ones((o, c, 1, 1)))
    blob, offs = blob_bytes([("w", w)])
    with Program.compile(conv_program(c, o, s, offs["w"]), {WKEY: blob}, backend="vane") as p:
        path = p.weight_path(WKEY)
        write_blob(path, [("w", w.astype(np.float32))])   # same offset, wrong dtype and size
        with pytest.raises(BlobFormatError, match="declares"):
            p.load()
        assert not p.loaded
        path.write_bytes(blob)
        p.load()
        assert p.run({"xa": f16(np.ones((1, c, 1, s)))})["ya"][0, 0, 0, 0] == np.float16(768)


def test_decode_column_slice_conv_pad():
    """The decode shape: one column of a width-32 input through a GEMV, padded back."""
    c, o, s, col = 768, 1024, 32, 5
    rng = np.random.default_rng(5)
    x = f16(rng.standard_normal((1, c, 1, s)))
    w = f16(rng.standard_normal((o, c, 1, 1)) / 28)
    blob, offs = blob_bytes([("w", w)])
    m = Mil()
    m.input("xa", (1, c, 1, s))
    v = m.op("slice_by_index", (1, c, 1, 1), x="xa", begin=m.const([0, 0, 0, col], "int32"),
             end=m.const([1, c, 1, col + 1], "int32"))
    r = m.conv(v, m.blob((o, c, 1, 1), WKEY, offs["w"]), (1, o, 1, 1))
    m.op("pad", (1, o, 1, s), result_name="ya", x=r, pad=m.const([0, 0, 0, 0, 0, s - 1], "int32"),
         mode=m.const("constant", "string"), constant_val=m.const(0.0, "fp16"))
    with Program.compile(m.text(["ya"]), {WKEY: blob}, backend="vane") as p:
        y = p.run({"xa": x})["ya"]
    w2 = up(w).reshape(o, c).astype(np.float64)
    xc = up(x)[0, :, 0, col].astype(np.float64)
    assert_dot_close(y[0, :, 0, 0], f16(w2 @ xc), np.abs(w2) @ np.abs(xc))
    assert (y[0, :, 0, 1:] == 0).all()


def test_outputs_bind_sorted_and_are_written_packed_from_byte_0(no_leaks):
    """Two outputs of different sizes share one surface size; the program returns
    them in the order (yb, ya), binding is by name; bytes past a tensor are untouched."""
    m = Mil()
    m.input("xa", (1, 768, 1, 32))
    m.input("xb", (1, 1536, 1, 32))
    m.op("mul", (1, 1536, 1, 32), result_name="yb", x="xb", y=m.const(2.0, "fp16"))
    m.op("neg", (1, 768, 1, 32), result_name="ya", x="xa")
    rng = np.random.default_rng(6)
    xa, xb = f16(rng.standard_normal((1, 768, 1, 32))), f16(rng.standard_normal((1, 1536, 1, 32)))
    with Program.compile(m.text(["yb", "ya"]), backend="vane") as p:
        assert [io.name for io in p.outputs] == ["ya", "yb"]
        p.load()
        nbytes = 1536 * 32 * 2
        ins = [Surface(nbytes), Surface(nbytes)]
        outs = [Surface(nbytes), Surface(nbytes)]
        try:
            ins[0].numpy(np.float16, (xa.size,))[...] = xa.reshape(-1)
            ins[0].numpy()[xa.size:] = np.float16(9)          # junk past the small input
            ins[1].numpy(np.float16, (xb.size,))[...] = xb.reshape(-1)
            outs[0].numpy()[...] = np.float16(7)
            p.eval(ins, outs)
            ya, rest = outs[0].numpy()[: xa.size], outs[0].numpy()[xa.size:]
            np.testing.assert_array_equal(ya.reshape(xa.shape), -xa)
            assert (rest == np.float16(7)).all()
            np.testing.assert_array_equal(outs[1].read(xb.shape), xb * np.float16(2))
        finally:
            for sf in ins + outs:
                sf.release()


# ---- liveness: random chains of ops, checked op by op ------------------------

UN = {"neg": lambda a: -a, "relu": lambda a: np.maximum(a, np.float32(0)),
      "tanh": np.tanh}
BIN = {"add": np.add, "sub": np.subtract, "mul": np.multiply}


@st.composite
def chains(draw: st.DrawFn):
    n = draw(st.integers(1, 24))
    ops = []
    for i in range(n):
        avail = i + 1   # value 0 is the input
        if draw(st.booleans()):
            ops.append((draw(st.sampled_from(sorted(UN))), draw(st.integers(0, avail - 1)), None))
        else:
            ops.append((draw(st.sampled_from(sorted(BIN))), draw(st.integers(0, avail - 1)),
                        draw(st.integers(0, avail - 1))))
    outs = sorted(draw(st.sets(st.integers(1, n), min_size=1, max_size=3)))
    return ops, outs


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=chains(), seed=st.integers(0, 2**32 - 1))
def test_random_op_chains_reuse_buffers_correctly(case, seed):
    ops, outs = case
    shape = (1, 768, 1, 32)
    x = f16(np.random.default_rng(seed).uniform(-1.5, 1.5, shape))
    m = Mil()
    names = [m.input("xa", shape)]
    vals = [x]
    for op, a, b in ops:
        if b is None:
            names.append(m.op(op, shape, x=names[a]))
            vals.append(f16(UN[op](up(vals[a]))))
        else:
            names.append(m.op(op, shape, x=names[a], y=names[b]))
            vals.append(f16(BIN[op](up(vals[a]), up(vals[b]))))
    result = []
    for k, i in enumerate(outs):
        result.append(m.op("identity", shape, result_name=f"y{k}", x=names[i]))
    with Program.compile(m.text(result), backend="vane") as p:
        got = p.run({"xa": x})
    for k, i in enumerate(outs):
        np.testing.assert_array_equal(got[f"y{k}"], vals[i])


def _chain_program(c: int, s: int, offset: int) -> str:
    """conv -> tanh -> mul: intermediates that live in the run arena."""
    m = Mil()
    m.input("xa", (1, c, 1, s))
    y = m.conv("xa", m.blob((c, c, 1, 1), WKEY, offset), (1, c, 1, s))
    t = m.op("tanh", (1, c, 1, s), x=y)
    m.op("mul", (1, c, 1, s), result_name="ya", x=t, y=m.const(0.5, "fp16"))
    return m.text(["ya"])


def test_programs_sharing_a_threads_arena_and_running_on_two_threads(no_leaks):
    """Intermediate buffers live in one arena per thread, shared by every program run
    there: programs of different sizes run in turns on one thread, and at the same time
    on two threads, give exactly the results each gives alone; and so does a program
    run on one thread, then another, then reloaded (its slots' pointers, kept from one
    eval to the next, follow the arena and the weights)."""
    import threading

    rng = np.random.default_rng(5)
    shapes = [(512, 64), (768, 32)]   # both at least the minimum surface (ANE-C23)
    progs, xs, want = [], [], []
    try:
        for c, s in shapes:
            blob, offs = blob_bytes([("w", f16(rng.standard_normal((c, c, 1, 1)) / 8))])
            p = Program.compile(_chain_program(c, s, offs["w"]), {WKEY: blob}, backend="vane")
            progs.append(p)
            p.load()
            xs.append(f16(rng.standard_normal((1, c, 1, s))))
            want.append(p.run({"xa": xs[-1]})["ya"].copy())
        for _ in range(3):                              # in turns, one thread
            for p, x, w in zip(progs, xs, want, strict=True):
                np.testing.assert_array_equal(p.run({"xa": x})["ya"], w)
        failures: list[str] = []

        def hammer(i: int) -> None:
            for _ in range(40):
                if not np.array_equal(progs[i].run({"xa": xs[i]})["ya"], want[i]):
                    failures.append(f"program {i}")
                    return

        threads = [threading.Thread(target=hammer, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not failures
        # a program keeps its slots' pointers from one eval to the next while its
        # thread's arena and its weights stay: another thread, back here, a reload
        for i in (1, 0):
            other = threading.Thread(target=hammer, args=(i,))
            other.start()
            other.join()
            np.testing.assert_array_equal(progs[i].run({"xa": xs[i]})["ya"], want[i])
            progs[i].unload()
            progs[i].load()
            np.testing.assert_array_equal(progs[i].run({"xa": xs[i]})["ya"], want[i])
        assert not failures
    finally:
        for p in progs:
            p.release()
