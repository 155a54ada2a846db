"""A readable text form of a graph, for debugging and for test failure messages.

    graph mlp(%x: fp16[1,768,1,256]) {
      %w_fc: fp16[3072,768,1,1] = const(<3072x768x1x1 mean=0.0012 absmax=0.41>)
      %conv1x1: fp16[1,3072,1,256] = conv1x1(%x, %w_fc)
      %gelu: fp16[1,3072,1,256] = gelu(%conv1x1)
    } -> (y = %gelu)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from orion.ir.graph import Graph, Node
from orion.ir.ops import Op
from orion.ir.quant import QuantTensor


def _attr(value: Any) -> str:
    if isinstance(value, QuantTensor):
        return (f"<{'x'.join(map(str, value.shape))} {value.op} {value.code_dtype}, "
                f"{value.nbytes} bytes>")
    if isinstance(value, np.ndarray):
        if value.ndim == 0:
            return f"{float(value):g}"
        return (f"<{'x'.join(map(str, value.shape))} mean={float(value.mean()):.4g} "
                f"absmax={float(np.abs(value).max()):.4g}>")
    if isinstance(value, tuple):
        return "(" + ", ".join(_attr(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    if hasattr(value, "value") and not isinstance(value, (int, float)):
        return str(value.value)
    return repr(value) if isinstance(value, float) else str(value)


def dump_node(node: Node) -> str:
    results = ", ".join(f"%{v.name}: {v.type}" for v in node.outputs)
    args = [f"%{v.name}" for v in node.inputs]
    if node.op is Op.CONST:
        args.append(_attr(node.attrs["value"]))
    elif node.op is not Op.INPUT:
        args += [f"{k}={_attr(v)}" for k, v in sorted(node.attrs.items())]
    line = f"{results} = {node.op.value}({', '.join(args)})"
    if node.group is not None:
        line += f"  # {node.group[0]}#{node.group[1]}"
    return line


def dump_graph(g: Graph) -> str:
    params = ", ".join(f"%{v.name}: {v.type}" for v in g.inputs)
    lines = [f"graph {g.name}({params}) {{"]
    lines += ["  " + dump_node(n) for n in g.nodes if n.op is not Op.INPUT]
    outs = ", ".join(f"{k} = %{v.name}" for k, v in g.outputs.items())
    lines.append(f"}} -> ({outs})")
    return "\n".join(lines)
