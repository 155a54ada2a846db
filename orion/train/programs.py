"""The device programs of a training step, for any architecture: each block (a layer,
and the final norm) as a forward program and a backward program, built from the
architecture's own blocks (`orion.models.blocks`, mode `Train`) and differentiated by
`orion.ir.autodiff`.

    forward    x [1, D, 1, S] -> y
    backward   x, grad_y -> grad_x, and the taps the host needs for the weight
               gradients: each linear layer's input and the gradient at its output
               (dW = dy x^T), each norm's normalized input and output gradient
               (dgamma), each bias's output gradient, each LoRA module's input and
               output gradient (dA, dB)

The backward program recomputes its block's forward from x: between the programs only
each block's input is kept. Weights enter in one of two ways (`mode`):

    "delta"    baked consts (the backward bakes W^T besides W), patched in place in
               the blob and reloaded after each optimizer step (ane-facts §4.2)
    "inputs"   program inputs, so one program per kind of block serves every layer of
               that kind and nothing is ever recompiled or reloaded (§4.3)

LoRA: each adapted module takes A [1, 1, R, in] and B'^T = (s B)^T [1, 1, R, out] as
inputs `lora_a_<module>`, `lora_b_<module>` (and with dropout a mask `lora_m_<module>`
[1, in, 1, S]); with `lora`, only the LoRA taps are computed (the base is frozen).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from orion.ir.autodiff import Forward, Grad, Tap, backward
from orion.ir.graph import Graph, Value
from orion.models.adapters import Signature
from orion.models.architecture import Architecture
from orion.models.blocks import Slot, Train, Use, Weights
from orion.models.frozen import FrozenWeights
from orion.models.weights import ArrayWeights

MODES = ("delta", "inputs")
FINAL = -1   # the block index of the final norm


@dataclass(frozen=True)
class LoraSpec:
    """What the training programs are compiled for: the adapted modules and their
    program ranks, and whether each has a dropout-mask input."""

    ranks: Signature
    dropout: bool = False


def lora_names(module: str) -> tuple[str, str, str]:
    """The input names of a module's A, B'^T and dropout mask."""
    m = module.replace(".", "_")
    return f"lora_a_{m}", f"lora_b_{m}", f"lora_m_{m}"


@dataclass(frozen=True)
class TapSpec:
    """How the host finishes one parameter's gradient from a backward program's outputs
    (`x`, `dy`: output names): see `orion.models.blocks.Use`."""

    param: str
    kind: str
    x: str | None
    dy: str


@dataclass
class BlockPrograms:
    """One block's forward and backward graphs, the weights each holds, and the taps."""

    block: int
    forward: Graph
    backward: Graph
    slots: dict[str, list[Slot]] = field(default_factory=dict)   # "fwd"/"bwd" -> slots
    taps: list[TapSpec] = field(default_factory=list)


def block_programs(arch: Architecture, source: Mapping[str, np.ndarray], block: int,
                   seq: int, mode: str, tag: str, lora: LoraSpec | None = None
                   ) -> BlockPrograms:
    """The programs of layer `block` (or the final norm, FINAL). `tag` goes into the
    graph names, hence into the weight keys and program identifiers: programs whose
    blobs are patched in place must not share a folder with another model's."""
    if mode not in MODES:
        from orion.errors import InvalidArgumentError

        raise InvalidArgumentError(f"mode must be one of {MODES}, not {mode!r}")
    kind = "final" if block == FINAL else f"l{block:02d}"
    name = f"{arch.model_type}_{kind}" + (f"_{tag}" if tag else "")
    g = Graph(f"{name}_fwd")
    x = g.input("x", (1, arch.args.dim, 1, seq))
    mats, masks = _lora_inputs(g, arch, seq, lora) if lora and block != FINAL else ({}, {})
    # a source that holds compressed frozen matrices (orion.models.frozen) is read as it
    # is: its matrices stay compressed consts
    weights = Weights(source if isinstance(source, FrozenWeights) else ArrayWeights(source),
                      as_inputs=mode == "inputs")
    b = Train(g, arch, block, weights, mats, masks)
    y = arch.final_norm(b, x) if block == FINAL else arch.layer(b, x)
    g.output("y", y)
    fwd_slots = list(weights.slots)
    taps, specs = _taps(b.uses, lora is not None)
    bwd = backward(g, wrt=["x"], seeds=["y"], taps=taps, name=f"{name}_bwd")
    by_name = {s.name: s for s in fwd_slots}
    bwd_names = _const_and_input_names(bwd.graph)
    bwd_slots = [s for s in fwd_slots if s.name in bwd_names]
    for t_name, w_name in bwd.transposed.items():
        w = by_name[w_name]
        bwd_slots.append(Slot(t_name, w.param, (w.shape[1], w.shape[0], 1, 1), "transpose"))
    return BlockPrograms(block, g, bwd.graph, {"fwd": fwd_slots, "bwd": bwd_slots}, specs)


def _const_and_input_names(g: Graph) -> set[str]:
    return {n.name for n in g.nodes if n.op.value in ("const", "input")}


def _lora_inputs(g: Graph, arch: Architecture, seq: int, lora: LoraSpec
                 ) -> tuple[dict[str, list[tuple[Value, Value]]], dict[str, Value]]:
    mats: dict[str, list[tuple[Value, Value]]] = {}
    masks: dict[str, Value] = {}
    for module, rank in lora.ranks:
        out, inp = arch.module_shape(module)
        a_name, b_name, m_name = lora_names(module)
        mats[module] = [(g.input(a_name, (1, 1, rank, inp)),
                         g.input(b_name, (1, 1, rank, out)))]
        if lora.dropout:
            masks[module] = g.input(m_name, (1, inp, 1, seq))
    return mats, masks


def _taps(uses: list[Use], lora_only: bool) -> tuple[dict[str, Tap], list[TapSpec]]:
    """The backward outputs the weight gradients need, each value tapped once."""
    taps: dict[str, Tap] = {}
    names: dict[tuple[str, Value], str] = {}

    def tap(kind: str, v: Value) -> str:
        key = (kind, v)
        if key not in names:
            names[key] = f"t{len(names):03d}"
            taps[names[key]] = Forward(v) if kind == "x" else Grad(v)
        return names[key]

    specs = []
    for u in uses:
        if (u.kind == "lora") != lora_only:
            continue
        x = tap("x", u.x) if u.x is not None else None
        specs.append(TapSpec(u.param, u.kind, x, tap("dy", u.y)))
    return taps, specs


def slot_value(slot: Slot, half: Mapping[str, np.ndarray], master: Mapping[str, np.ndarray]
               ) -> np.ndarray:
    """What a program's const or input holds for `slot`, fp16, in its declared shape."""
    if slot.transform == "plus_one":   # rounded once from fp32, as the graph built it
        return (1.0 + np.asarray(master[slot.param], np.float32)).astype(np.float16) \
            .reshape(slot.shape)
    w = half[slot.param]
    if slot.transform == "transpose":
        w = np.ascontiguousarray(w.T)
    return w.reshape(slot.shape)


def param_gradient(spec: TapSpec, outs: Mapping[str, np.ndarray]) -> np.ndarray:
    """One use's contribution to its parameter's gradient (not for "lora" taps)."""
    dy = outs[spec.dy]
    if spec.kind == "linear":
        x = outs[spec.x]  # type: ignore[index]
        return _mat(dy) @ _mat(x).T
    axes = tuple(i for i in range(dy.ndim) if i != 1)
    if spec.kind == "scale":
        return np.sum(dy * outs[spec.x], axis=axes)  # type: ignore[index]
    return np.sum(dy, axis=axes)


def _mat(a: np.ndarray) -> np.ndarray:
    """Device [1, C, 1, S] -> [C, S]."""
    return a.reshape(a.shape[1], -1)
