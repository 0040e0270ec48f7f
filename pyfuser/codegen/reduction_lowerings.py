"""Triton lowerings of the reductions, attached to the registry by name.

Inside a kernel the reduced dims are the kernel's column dims (segment/loop_domain.py): a reduction folds the
column tile of each row; keepdim only changes which loop dims the output has.

cumsum scans the column dim of a persistent kernel (the whole row in registers) with ``tl.cumsum``. Integer and
Bool sums are exact in any order. A float scan's rounding depends on its order, and eager's differs by device:
ATen's CPU cumsum adds sequentially in its accumulation type (Double for Float, Float for Half/BFloat16; verified
on torch 2.13: [1, 1e-8 x 1000] in Float ends at 1.00001, which a Float accumulator would leave at 1.0), its CUDA
cumsum is a parallel tree in Float. The kernel scans (Triton's tree) in Double for Float, as ATen's CPU does:
each prefix is then within one rounding of eager's CPU result (both round a Double prefix whose error is about
n * 2^-53 of the row's absolute sum) and more accurate than CUDA's Float tree (error up to about log2(n) * 2^-24
of the absolute sum). Half/BFloat16 compute in Float (nvFuser's rule, and the ATen evaluator's), so they are
Double-accumulated too and rounded once to the output; Double scans in Double (error <= (k-1) * 2^-53 of the
first k terms' absolute sum, against eager's sequential order). The scan starts from +0.0 as ATen's CPU loop
does, so a row of -0.0 sums to +0.0.
"""

from __future__ import annotations

import torch

from ..ir.dtypes import DataType
from ..ops.registry import attach
from ..segment.loop_domain import NotFusable
from .interpreter_compat import interpreting
from .lowering import _operand, check_real, out_dtype


def _lower_input(node, kb, x):
    check_real(node)
    if node.info.get("cast") is not None:
        x = kb.cast(x, node.info["cast"])
    return kb.cast(x, node.info["compute"])


def _reduces_only_broadcasts(node, dims) -> bool:
    inp = node.inputs[0]
    return all(inp.logical[d].is_broadcast and not inp.logical[d].expanded for d in dims)


def _lower_reduce(node, kb, arg, dims, keepdim=False, dtype=DataType.Null):
    x = _lower_input(node, kb, arg)
    if not dims or _reduces_only_broadcasts(node, dims):  # reducing size-1 dims is a copy
        return kb.cast(x, out_dtype(node))
    if x.dtype == torch.bool:  # Triton folds 1-bit values into int32: reduce in int32 throughout
        x = kb.cast(x, torch.int32)
    return kb.cast(kb.reduce(node.op.name, x), out_dtype(node))


def _moments_input(kb, x):
    """``x`` in the dtype var/var_mean/welford accumulate in. ATen's CPU kernels accumulate Welford's moments in
    Double for Float, Half and BFloat16 (its CUDA ones in Float): where the sum of squared deviations overflows
    Float but the variance does not (values near 1e19), eager's CPU result is finite. The interpreter runs the
    CPU's kernels, so they accumulate in Double too; the GPU's stay in Float, as CUDA's eager does (Double would
    halve a LayerNorm's arithmetic rate there). Fuzz seed 1200655 at PYFUSER_FUZZ_MAX_DIM=48."""
    if interpreting() and x.dtype in (torch.float32, torch.float16, torch.bfloat16):
        return kb.cast(x, torch.float64)
    return x


def _lower_moments(node, kb, x):
    """(mean, sum of squared deviations, count) over the column dims, two-pass for accuracy."""
    x = _moments_input(kb, x)
    n = kb.cast(kb.n_reduced(x), x.dtype)
    mean = kb.op("libdevice.div_rn({0}, {1})", [kb.reduce("sum", x), n], x.dtype)
    dev = kb.op("{0} - {1}", [x, mean], x.dtype)
    m2 = kb.reduce("sum", kb.op("{0} * {0}", [dev], x.dtype))
    return mean, m2, n


def _lower_var_mean(node, kb, arg, dims, correction=1, keepdim=False):
    x = _lower_input(node, kb, arg)
    if not dims or _reduces_only_broadcasts(node, dims):
        raise NotFusable("var over no dims")
    mean, m2, n = _lower_moments(node, kb, x)
    var = kb.op("libdevice.div_rn({0}, {1} - {2})", [m2, n, kb.const(float(correction), m2.dtype)], m2.dtype)
    if node.op.name == "var":
        return kb.cast(var, out_dtype(node))
    return kb.cast(var, out_dtype(node, 0)), kb.cast(mean, out_dtype(node, 1))


def _lower_welford(node, kb, arg, dims):
    x = _lower_input(node, kb, arg)
    mean, m2, n = _lower_moments(node, kb, x)
    return kb.cast(mean, out_dtype(node, 0)), kb.cast(m2, out_dtype(node, 1)), kb.cast(n, out_dtype(node, 2))


for _name in ("sum", "prod", "max", "min"):
    attach(_name, lower=_lower_reduce)
attach("var", lower=_lower_var_mean)
attach("var_mean", lower=_lower_var_mean)
attach("welford", lower=_lower_welford)


def _cumsum_refusal(node):
    compute = node.info.get("compute")
    if compute is None or compute.is_complex:
        return "fd.ops.cumsum of complex values runs on ATen"
    return None


# The scan's accumulation type per compute dtype: ATen's CPU accumulation type (see the module docstring).
_SCAN_ACCUMULATE = {torch.float32: torch.float64}


def _lower_cumsum(node, kb, arg, dim, init=None):
    compute = node.info["compute"]
    x = kb.cast(kb.cast(arg, compute), _SCAN_ACCUMULATE.get(compute, compute))
    # Rows of one element (a size-1 scanned dim: its loop dim was dropped) are their own prefix sums.
    r = kb.scan("cumsum", x) if kb.has_columns else x
    if x.dtype.is_floating_point:
        r = kb.op("{0} + {1}", [r, kb.const(0.0, x.dtype)], x.dtype)  # from +0.0, as ATen's CPU loop: -0.0 -> +0.0
    r = kb.cast(r, compute)
    if init is not None:
        r = kb.op("{0} + {1}", [r, _operand(kb, init, compute)], compute)
    return kb.cast(r, out_dtype(node))


_lower_cumsum.refusal = _cumsum_refusal
attach("cumsum", lower=_lower_cumsum)


# cumprod: as cumsum (ATen's CPU loop multiplies sequentially in Double for Float, from 1, so a zero's sign is
# the product's own). cummax/cummin: exact in any order (kernel_builder's _cummax_combine follows ATen's update
# rule: a later NaN or a later equal value wins, so -0.0 after 0.0 and a later NaN's bits are kept); an ``init``
# (folded in with maximum/minimum) runs on ATen.
def _scan_refusal(node):
    compute = node.info.get("compute")
    if compute is None or compute.is_complex:
        return f"fd.ops.{node.op.name} of complex values runs on ATen"
    if node.op.name in ("cummax", "cummin") and node.kwargs.get("init") is not None:
        return f"fd.ops.{node.op.name} with init runs on ATen"
    return None


def _lower_scan(node, kb, arg, dim, init=None):
    compute = node.info["compute"]
    accumulate = _SCAN_ACCUMULATE.get(compute, compute) if node.op.name == "cumprod" else compute
    x = kb.cast(kb.cast(arg, compute), accumulate)
    r = kb.scan(node.op.name, x) if kb.has_columns else x
    r = kb.cast(r, compute)
    if init is not None:  # (cumprod only)
        r = kb.op("{0} * {1}", [r, _operand(kb, init, compute)], compute)
    return kb.cast(r, out_dtype(node))


_lower_scan.refusal = _scan_refusal
for _name in ("cumprod", "cummax", "cummin"):
    attach(_name, lower=_lower_scan)
