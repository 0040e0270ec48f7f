"""Helpers that op modules use to declare their Triton lowering next to their ATen evaluator.

``elementwise(template)`` lowers an op whose evaluator casts operands to ``node.info["cast"]`` dtypes, applies
a function and casts to the output dtype: the template is that function in Triton ({0}, {1}, ... are operands).
Complex dtypes have no Triton form: such nodes make their segment fall back to ATen.
"""

from __future__ import annotations

from typing import Callable, Optional, Union

import torch

from ..ir.dtypes import to_torch_dtype
from .kernel_builder import KernelBuilder, KValue
from ..segment.loop_domain import NotFusable


def _operand(kb: KernelBuilder, x, dtype: Optional[torch.dtype]) -> KValue:
    if isinstance(x, KValue):
        return x if dtype is None else kb.cast(x, dtype)
    if isinstance(x, complex):
        raise NotFusable("complex scalars have no Triton lowering")
    return kb.const(x, dtype if dtype is not None else _literal_dtype(x))


def _literal_dtype(x) -> torch.dtype:
    if isinstance(x, bool):
        return torch.bool
    if isinstance(x, int):
        return torch.int64
    return torch.float32


def out_dtype(node, i: int = 0) -> torch.dtype:
    return to_torch_dtype(node.outputs[i].dtype)


def check_real(node) -> None:
    for v in list(node.inputs) + list(node.outputs):
        dt = to_torch_dtype(v.dtype) if hasattr(v, "dtype") else None
        if dt is not None and dt.is_complex:
            raise NotFusable(f"fd.ops.{node.op.name} on complex values has no Triton lowering")


def elementwise(template: Optional[str], float_template: Union[str, Callable, None] = None, result: str = "compute",
                bool_ok: bool = False):
    """Lowering from a Triton template over the cast operands ({0}, {1}, ...).

    ``float_template`` replaces ``template`` when computing in a floating dtype (a callable: the template for the
    compute dtype); ``template=None`` means only floats are supported. ``result``: the template's dtype,
    "compute" (the last operand's cast dtype, which for where(pred, a, b) is that of a and b) or "bool".
    Arithmetic on Bool (1-bit in Triton: True + True would wrap to False) is refused unless ``bool_ok``."""

    def lower(node, kb: KernelBuilder, *args):
        check_real(node)
        casts = node.info.get("cast") or [None] * len(args)
        vals = [_operand(kb, a, c) for a, c in zip(args, casts)]
        compute = vals[-1].dtype
        if compute == torch.bool and not bool_ok:
            raise NotFusable(f"fd.ops.{node.op.name} on Bool has no Triton lowering")
        tpl = float_template if (float_template and compute.is_floating_point) else template
        if callable(tpl):
            tpl = tpl(compute)
        if tpl is None:
            raise NotFusable(f"fd.ops.{node.op.name} on {compute} has no Triton lowering")
        r = kb.op(tpl, vals, torch.bool if result == "bool" else compute)
        return kb.cast(r, out_dtype(node))

    return lower


def cast_lowering(node, kb: KernelBuilder, x, dtype=None):
    check_real(node)
    if not isinstance(x, KValue):
        x = _operand(kb, x, None)
    target = out_dtype(node)
    if target == torch.bool and x.dtype != torch.bool:
        if x.dtype.is_floating_point and x.dtype.itemsize == 1:  # Triton compares no fp8 with an int
            x = kb.cast(x, torch.float32)
        return kb.op("{0} != 0", [x], torch.bool)
    return kb.cast(x, target)


def identity_view(node, kb: KernelBuilder, x, *args, **kwargs):
    """View ops inside a kernel only re-index: the loop domain maps their dims, the value is unchanged."""
    return x
