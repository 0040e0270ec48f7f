"""fd.ops.grouped_mm: torch._grouped_mm over groups given by cumulative END offsets (nvfp4.md, "grouped_mm").

| mat1    | mat2    | output  | grouped over |
| [m,k]   | [g,k,n] | [m,n]   | rows of mat1 (offsets end rows)            |
| [g,m,k] | [k,n]   | [m,n]   | columns of mat2 and the output (N)         |
| [m,k]   | [k,n]   | [g,m,n] | the reduction dim K                        |

Tokens [2,3,5] give offsets [2,5,10]. This is NOT the start-offset convention of the layout op and
cutlass_nvfp4_grouped_mm. The scaled form (scale1/scale2, 3-tuple result) is not supported.
"""

from __future__ import annotations

import torch

from ..errors import FusionExecutionError, UnsupportedOpError
from ..ir.dtypes import DataType
from ..ir.nodes import IterDomain
from .common import FusionDtypeError, fail, fusion_of, new_tensor, require_tensor
from .offset_checks import GroupCheck, check_group_offsets
from .registry import OpKind, OpResult, register

_DTYPES = (DataType.BFloat16, DataType.Half)


def _out_shape(mat1_shape, mat2_shape, g):
    if len(mat1_shape) == 2 and len(mat2_shape) == 3:
        return [mat1_shape[0], mat2_shape[2]]
    if len(mat1_shape) == 3:
        return [mat1_shape[1], mat2_shape[1]]
    return [g, mat1_shape[0], mat2_shape[1]]


def _grouped_extent(mat1: torch.Tensor, mat2: torch.Tensor) -> tuple[str, int]:
    if mat1.dim() == 2 and mat2.dim() == 3:
        return "rows of mat1", mat1.shape[0]
    if mat1.dim() == 3:
        return "columns of mat2", mat2.shape[1]
    return "K", mat1.shape[1]


def _check(mat1: torch.Tensor, mat2: torch.Tensor, offsets: torch.Tensor) -> None:
    if offsets.dtype != torch.int32 or offsets.dim() != 1:
        raise FusionExecutionError(
            f"fd.ops.grouped_mm: offsets must be a 1-D int32 tensor, got {offsets.dtype} {list(offsets.shape)}"
        )
    groups = mat2.shape[0] if mat2.dim() == 3 else (mat1.shape[0] if mat1.dim() == 3 else None)
    if groups is not None and offsets.numel() != groups:
        raise FusionExecutionError(
            f"fd.ops.grouped_mm: offsets has {offsets.numel()} entries but there are {groups} groups"
        )
    what, extent = _grouped_extent(mat1, mat2)
    # Cumulative group ends: the start-offset rule (non-decreasing in [0, extent]) without a first-row rule.
    check_group_offsets(GroupCheck("grouped_mm", extent, starts_name="offsets", every_row=False,
                                   starts_what=f"cumulative group ends within the {extent} {what}"), offsets)


def _grouped_mm_eval(node, mat1, mat2, offsets):
    _check(mat1, mat2, offsets)
    return torch._grouped_mm(mat1, mat2, offsets)


def _grouped_mm_meta(node, mat1, mat2, offsets):
    """torch._grouped_mm pads the output's row pitch to 16 bytes (measured on CPU and CUDA); ATen's meta function
    pads only in CUDA builds and rejects operands the CPU path accepts, so the layout is computed here."""
    shape = _out_shape(mat1.shape, mat2.shape, offsets.shape[0])
    align = 16 // mat1.element_size()
    pitch = (shape[-1] + align - 1) // align * align
    strides = [pitch, 1] if len(shape) == 2 else [shape[1] * pitch, pitch, 1]
    return torch.empty_strided(shape, strides, dtype=mat1.dtype, device="meta")


@register("grouped_mm", OpKind.ATEN, _grouped_mm_eval, meta=_grouped_mm_meta)
def grouped_mm(mat1, mat2, offsets, scale1=None, scale2=None, **scaled_kwargs):
    """Grouped matmul as torch._grouped_mm; ``offsets`` are int32 cumulative group ends."""
    op = "grouped_mm"
    if scale1 is not None or scale2 is not None or scaled_kwargs:
        raise UnsupportedOpError(
            "fd.ops.grouped_mm: the scaled form (scale1/scale2, alpha, bias, ...) is not supported"
        )
    a, b = require_tensor(op, mat1, "mat1"), require_tensor(op, mat2, "mat2")
    off = require_tensor(op, offsets, "offsets")
    for name, tv in (("mat1", a), ("mat2", b)):
        if tv.dtype not in _DTYPES:
            fail(op, f"argument '{name}' ({tv.name}) must be BFloat16 or Half, got {tv.dtype!r}", FusionDtypeError)
    if a.dtype is not b.dtype:
        fail(op, f"mat1 is {a.dtype!r} but mat2 is {b.dtype!r}", FusionDtypeError)
    if off.dtype is not DataType.Int32 or off.ndim != 1:
        fail(op, f"argument 'offsets' ({off.name}) must be a 1-D Int32 tensor, got {off.dtype!r} of rank {off.ndim}",
             FusionDtypeError)
    ranks = (a.ndim, b.ndim)
    if ranks not in ((2, 3), (3, 2), (2, 2)):
        fail(op, f"mat1/mat2 ranks must be (2, 3), (3, 2) or (2, 2), got {ranks}")
    sa, sb = a.static_shape(), b.static_shape()
    ka, kb = sa[-1], sb[-2]
    if ka is not None and kb is not None and ka != kb:
        fail(op, f"mat1's K={ka} does not match mat2's K={kb}")
    g = off.static_shape()[0]
    batch = {(2, 3): sb[0], (3, 2): sa[0]}.get(ranks)
    if batch is not None and g is not None and batch != g:
        fail(op, f"offsets has {g} groups but the batch dim of the 3-D operand has {batch}")
    dims = _out_shape(sa, sb, g)
    out = new_tensor(fusion_of(op, a, b, off), [IterDomain.iteration(e) for e in dims], a.dtype)
    return OpResult([out], (a, b, off))
