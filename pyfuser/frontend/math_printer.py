"""``fd.fusion.print_math()``: the fusion's math in nvFuser's text layout.

Tensors print as ``T<n>_g_<ctype>[<dims>]`` where each dim is ``<kind>S<id>{<extent>}`` (kind ``i`` iteration,
``b`` broadcast, ``r`` reduction; a symbolic extent prints as ``i<id>``). Binary arithmetic prints infix, other
ops as calls with their attributes. Names are numbered per fusion, in creation order.

``tv.domain()`` (nvFuser's ``TensorView.domain``) is a :class:`TensorDomain`, which prints the tensor's dims as
``print_math`` numbers them: ``[iS0{2}, iS1{4}, iS2{8}]``.
"""

from __future__ import annotations

from ..ir.dtypes import DataType, c_type_name
from ..ir.nodes import Expr, Scalar, TensorView, Val, Vector

_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/"}


class _Names:
    def __init__(self):
        self.tensors: dict[int, str] = {}
        self.dims: dict[int, str] = {}  # id(tv) -> its dims' text, "[iS0{2}, ...]"
        self.scalars: dict[int, str] = {}
        self.dim_id = 0

    def tensor(self, tv: TensorView) -> str:
        text = self.tensors.get(id(tv))
        if text is None:
            dims = []
            for d in tv.logical_domain:
                kind = "r" if d.is_reduction else ("b" if d.is_broadcast else "i")
                extent = f"i{self.dim_id}" if d.extent is None else str(d.extent)
                dims.append(f"{kind}S{self.dim_id}{{{extent}}}")
                self.dim_id += 1
            mem = "g" if tv.fusion is not None else "l"
            self.dims[id(tv)] = "[" + ", ".join(dims) + "]"
            text = f"T{len(self.tensors)}_{mem}_{c_type_name(tv.dtype)}{self.dims[id(tv)]}"
            self.tensors[id(tv)] = text
        return text

    def val(self, v) -> str:
        if isinstance(v, TensorView):
            return self.tensor(v)
        if isinstance(v, Scalar):
            if v.is_constant:
                return repr(v.value)
            name = self.scalars.get(id(v))
            if name is None:
                name = self.scalars[id(v)] = (
                    f"i{len(self.scalars)}"
                    if v.dtype in (DataType.Int, DataType.Index, DataType.Int32)
                    else f"d{len(self.scalars)}"
                )
            return name
        if isinstance(v, Vector):
            return "{" + ", ".join(self.val(e) for e in v.elements) + "}"
        if isinstance(v, (list, tuple)):
            return "{" + ", ".join(self.val(e) for e in v) + "}"
        if isinstance(v, DataType):
            return v.name
        return repr(v)


class TensorDomain:
    """What nvFuser's ``tv.domain()`` returns, for printing: the tensor's logical dims, reductions included,
    numbered as ``print_math`` numbers them in the tensor's fusion at the time of printing."""

    def __init__(self, tv: TensorView):
        self.tv = tv

    def __str__(self) -> str:
        names = _Names()
        if self.tv.fusion is not None:
            math_text(self.tv.fusion, names)
        names.tensor(self.tv)  # (a tensor no statement of its fusion names takes the next numbers)
        return names.dims[id(self.tv)]

    __repr__ = __str__


def math_text(fusion, names: "_Names | None" = None) -> str:
    names = _Names() if names is None else names
    for v in fusion.inputs:  # inputs get the first numbers, as in nvFuser
        names.val(v)
    lines = ["Inputs:"] + [f"  {names.val(v)}" for v in fusion.inputs]
    body = []
    for e in fusion.statements:
        if not isinstance(e, Expr):
            continue
        outs = [names.val(o) for o in e.outputs]
        args = [names.val(a) for a in e.args if isinstance(a, Val) or isinstance(a, (list, tuple))]
        lhs = outs[0] if len(outs) == 1 else "(" + ", ".join(outs) + ")"
        tensor_args = [a for a in e.args if isinstance(a, Val)]
        if e.op.name in _INFIX and len(e.args) == 2 and len(tensor_args) >= 1:
            a, b = (names.val(x) for x in e.args)
            body.append(f"{lhs}\n   = {a}\n   {_INFIX[e.op.name]} {b};")
            continue
        attrs = [f"{k}={names.val(v)}" for k, v in e.kwargs.items()]
        attrs += [names.val(a) for a in e.args if not isinstance(a, (Val, list, tuple))]
        body.append(f"{lhs}\n   = {e.op.name}({', '.join(args + attrs)});")
    outputs = [names.val(v) for v in fusion.all_outputs()]
    lines += ["Outputs:"] + [f"  {o}" for o in outputs]
    lines += ["", "%kernel_math {"] + body + ["} // %kernel_math ", "", ""]
    return "\n".join(lines)
