"""``repr(fd)``: runnable Python that rebuilds an equivalent fusion.

The text is also the fusion's structural key (LRUCache): two fusions print the same iff they have the same
inputs, ops, attributes, dtypes and outputs.
"""

from __future__ import annotations

import math
import numbers

from ..ir.dtypes import DataType
from ..ir.fusion import Fusion
from ..ir.nodes import Expr, Scalar, TensorView, Val, Vector


def format_value(v) -> str:
    if isinstance(v, Scalar) and v.is_constant and not getattr(v, "declared", False):
        return format_value(v.value)
    if isinstance(v, Val):
        return v.name
    if isinstance(v, DataType):
        return f"DataType.{v.name}"
    if isinstance(v, bool) or v is None:
        return repr(v)
    # numpy (or other non-builtin) numbers would print as e.g. np.float32(2.5), which the printed definition
    # cannot evaluate; print them as the Python number they stand for.
    if isinstance(v, numbers.Integral):
        v = int(v)
    elif isinstance(v, numbers.Real):
        v = float(v)
    elif isinstance(v, numbers.Complex):
        v = complex(v)
    if isinstance(v, float):
        return format_float(v)
    if isinstance(v, complex):
        return f"complex({format_float(v.real)}, {format_float(v.imag)})"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(format_value(x) for x in v) + "]"
    return repr(v)


def format_float(x: float) -> str:
    if math.isnan(x):
        return 'float("nan")'
    if math.isinf(x):
        return 'float("inf")' if x > 0 else 'float("-inf")'
    # nvFuser prints "3.00000"; we keep that look for integral values and print the shortest exact repr
    # otherwise, so the printed definition rebuilds bit-identical constants.
    if x.is_integer() and abs(x) < 1e15:
        return f"{x:.5f}"
    return repr(x)


def _tensor_input_line(tv: TensorView) -> str:
    shape = []
    for d in tv.logical:
        if d.is_broadcast and not d.expanded:
            shape.append(1)
        else:
            shape.append(-1 if d.extent is None else d.extent)
    parts = [
        f"shape={format_value(shape)}",
        f"contiguity={format_value(list(tv.contiguity))}",
        f"dtype={format_value(tv.dtype)}",
        f"is_cpu={tv.is_cpu}",
    ]
    if tv.alloc_order is not None:
        parts.append(f"stride_order={format_value(tv.stride_order())}")
    return f"{tv.name} = fd.define_tensor({', '.join(parts)})"


def _declared_line(v: Val) -> str:
    if isinstance(v, TensorView):
        return _tensor_input_line(v)
    if isinstance(v, Scalar):
        return f"{v.name} = fd.define_scalar({format_value(v.value)}, dtype={format_value(v.dtype)})"
    if isinstance(v, Vector):
        return f"{v.name} = fd.define_vector({format_value(v.elements)}, dtype={format_value(v.dtype)})"
    raise TypeError(v)


def _expr_line(e: Expr) -> str:
    args = [format_value(a) for a in e.args]
    args += [f"{k}={format_value(v)}" for k, v in e.kwargs.items()]
    lhs = ", ".join(o.name for o in e.outputs)
    return f"{lhs} = fd.ops.{e.op.name}({', '.join(args)})"


def fusion_to_python(fusion: Fusion, fn_name: str = "nvfuser_fusion") -> str:
    lines = [f"def {fn_name}(fd : FusionDefinition) -> None :"]
    for stmt in fusion.statements:
        lines.append("    " + (_expr_line(stmt) if isinstance(stmt, Expr) else _declared_line(stmt)))
    for val, alias in fusion.output_log:
        lines.append(f"    fd.add_output({val.name}{'' if alias is None else ', ' + alias.name})")
    return "\n".join(lines) + "\n"
