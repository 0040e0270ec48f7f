"""``repr(fd)``: runnable Python that rebuilds an equivalent fusion, in nvFuser's printer style.

nvFuser's style: tensors are named ``tv0, tv1, ...`` and non-inline scalars ``c0, c1, ...`` in creation order;
statements are printed inputs first, then depth first from the outputs (``print_order``); constants whose dtype
a Python literal implies (Bool, Int, Double, ComplexDouble) are written inline (``3.00000``); keyword arguments
equal to the op's default are left out.

The canonical form of the text (names numbered in printing order) is the fusion's structural key (LRUCache):
two fusions have the same key iff they have the same inputs, ops, attributes, dtypes and outputs. Names are
renumbered per fusion, so they never depend on how many values an earlier definition created, and defaults are
only omitted where rebuilding without them gives the same op.
"""

from __future__ import annotations

import inspect
import math
import numbers
from typing import Optional

from ..ir.dtypes import DataType
from ..ir.fusion import Fusion
from ..ir.nodes import Expr, Scalar, TensorView, Val, Vector
from ..ir.order import print_order


# dtypes a Python literal of the constant's value gives back (literal_dtype): such constants print inline.
_INLINE_DTYPES = (DataType.Bool, DataType.Int, DataType.Double, DataType.ComplexDouble)


def is_inline_constant(v) -> bool:
    if not (isinstance(v, Scalar) and v.is_constant):
        return False
    return not getattr(v, "declared", False) or v.dtype in _INLINE_DTYPES


def format_value(v, names: Optional[dict] = None) -> str:
    if names is not None and isinstance(v, Val) and id(v) in names:
        return names[id(v)]
    if is_inline_constant(v):
        return format_value(v.value)
    if isinstance(v, Val):
        return v.name if names is None else names[id(v)]
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
        return "[" + ", ".join(format_value(x, names) for x in v) + "]"
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


def _tensor_input_line(tv: TensorView, names: dict) -> str:
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
    return f"{names[id(tv)]} = fd.define_tensor({', '.join(parts)})"


def _declared_line(v: Val, names: dict) -> Optional[str]:
    if isinstance(v, TensorView):
        return _tensor_input_line(v, names)
    if isinstance(v, Scalar):
        if id(v) not in names:
            return None  # an inline constant: written where it is used
        return f"{names[id(v)]} = fd.define_scalar({format_value(v.value)}, dtype={format_value(v.dtype)})"
    if isinstance(v, Vector):
        return f"{names[id(v)]} = fd.define_vector({format_value(v.elements, names)}, dtype={format_value(v.dtype)})"
    raise TypeError(v)


_NO_DEFAULT = object()


def _defaults(op) -> dict:
    """Keyword defaults of the op's user-facing builder (``fd.ops.<name>``)."""
    cached = _DEFAULTS.get(op.name)
    if cached is None:
        try:
            params = inspect.signature(op.builder).parameters.values()
        except (TypeError, ValueError):
            params = ()
        cached = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
        for k, v in _KEYWORD_DEFAULTS.items():
            # Builders that accept several spellings of an argument use a private sentinel as its default;
            # the value it stands for is nvFuser's documented default.
            if k in cached and not isinstance(cached[k], (bool, int, float, str, type(None), DataType, list, tuple)):
                cached[k] = v
        _DEFAULTS[op.name] = cached
    return cached


_DEFAULTS: dict = {}
_KEYWORD_DEFAULTS = {"keepdim": False, "dtype": DataType.Null}


def _is_default(value, default) -> bool:
    if default is _NO_DEFAULT or isinstance(value, Val) or isinstance(default, Val):
        return False
    if type(value) is not type(default) and not (value is None or default is None):
        # True == 1 and 1 == 1.0 in Python, but they are different arguments.
        return False
    try:
        return bool(value == default)
    except Exception:  # noqa: BLE001 -- e.g. tensors; never omit what cannot be compared
        return False


def _expr_line(e: Expr, names: dict) -> str:
    args = [format_value(a, names) for a in e.args]
    defaults = _defaults(e.op)
    args += [f"{k}={format_value(v, names)}" for k, v in e.kwargs.items()
             if not _is_default(v, defaults.get(k, _NO_DEFAULT))]
    lhs_names = [names[id(o)] for o in e.outputs]
    # Ops whose call returns more slots than values (scaled_mm's (out, None, None)) print "_" for the rest.
    lhs_names += ["_"] * (e.info.get("result_slots", 0) - len(lhs_names)) if e.info else []
    lhs = ", ".join(lhs_names)
    return f"{lhs} = fd.ops.{e.op.name}({', '.join(args)})"


def printed_names(fusion: Fusion, statements=None) -> dict:
    """id(val) -> its printed name: tv<N> for tensors, c<N> for other values, numbered in the order of
    ``statements`` (default: creation order, as nvFuser names values)."""
    names: dict = {}
    counters = {"tv": 0, "c": 0}
    # A constant returned as an output keeps its define_scalar line: add_output takes a value, not a literal.
    outputs = {id(v) for v, _ in fusion.output_log}

    def name(v):
        if id(v) in names or (is_inline_constant(v) and id(v) not in outputs):
            return
        prefix = "tv" if isinstance(v, TensorView) else "c"
        names[id(v)] = f"{prefix}{counters[prefix]}"
        counters[prefix] += 1

    for stmt in fusion.statements if statements is None else statements:
        for v in (stmt.outputs if isinstance(stmt, Expr) else [stmt]):
            name(v)
    return names


def fusion_to_python(fusion: Fusion, fn_name: str = "nvfuser_fusion", canonical: bool = False) -> str:
    """nvFuser's printer text: values named in creation order, statements in printing order (so a name can
    appear before a smaller one, as in nvFuser). ``canonical``: names numbered in printing order instead, which
    makes the text independent of the order independent parts were created in; rebuilding a definition from
    its text keeps this form (the LRU cache's structural key)."""
    order = print_order(fusion)
    names = printed_names(fusion, order if canonical else None)
    lines = [f"def {fn_name}(fd : FusionDefinition) -> None :"]
    for stmt in order:
        line = _expr_line(stmt, names) if isinstance(stmt, Expr) else _declared_line(stmt, names)
        if line is not None:
            lines.append("    " + line)
    for val, alias in fusion.output_log:
        lines.append(f"    fd.add_output({format_value(val, names)}{'' if alias is None else ', ' + names[id(alias)]})")
    return "\n".join(lines) + "\n"
