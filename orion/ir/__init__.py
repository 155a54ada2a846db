"""orion.ir: the compiler front end. A graph IR of 27 ops (ane-facts §2.4b), composites
built from them, legalization passes that make a graph acceptable to the ANE, a MIL
emitter, and a partitioner that cuts a model into programs."""

from orion.ir.graph import Graph, Node, Value
from orion.ir.ops import IR_OPS, Op
from orion.ir.types import DType, ShapeError, TensorType

__all__ = ["IR_OPS", "DType", "Graph", "Node", "Op", "ShapeError", "TensorType", "Value"]
