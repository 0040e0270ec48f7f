"""fd.ops.scaled_mm: a matmul of narrow-precision operands with their scales (nvFuser's ``scaled_mm``).

    out, out_block_scale, out_gamma = fd.ops.scaled_mm(mat1, mat2, scale1, scale2, alpha=None, bias=None,
                                                       beta=None, dtype=DataType.BFloat16)

``mat1`` is ``[M, K]``, ``mat2`` ``[K, N]``; the result is ``alpha * (deq(mat1) @ deq(mat2)) + beta * bias`` in
``dtype``, accumulated in float32. The two extra results are None (post-quantization of the output,
``output_block_scale_size > 0``, is not supported).

| operands                  | scales                                                            |
| Float8_e4m3fn / e5m2      | Float, per tensor (0-dim or [1]) or per row of mat1 [M, 1] / per column of mat2 [1, N] |
| Float4_e2m1fn (NVFP4)     | Float8_e4m3fn, one per 16 elements along K, in CUTLASS's 128x4-swizzled layout:       |
|                           | the padded buffer ``[roundup(M,128), roundup(K/16,4)]`` (``[.., N ..]`` for mat2), or  |
|                           | the logical view of one that ``nv_block_quantize(swizzle_block_scales=True)`` returns   |

The evaluator is pure torch: on CUDA, FP8 with per-tensor scales runs through ``torch._scaled_mm``; everything
else is dequantized to float32 and multiplied (exact products, float32 accumulation).
"""

from __future__ import annotations

import torch

from ..errors import FusionExecutionError, UnsupportedOpError
from ..ir.dtypes import DataType, to_torch_dtype
from ..ir.nodes import IterDomain, TensorView
from .common import FusionDtypeError, fail, fusion_of, new_tensor, require_tensor, round_up
from .registry import OpKind, OpResult, register

_FP8 = (DataType.Float8_e4m3fn, DataType.Float8_e5m2)
_FP4 = DataType.Float4_e2m1fn
_OUT_DTYPES = (DataType.BFloat16, DataType.Half, DataType.Float)
_NVFP4_BLOCK = 16


def _fp8_scale(scale: torch.Tensor, rows: int, per: str) -> torch.Tensor:
    """A float32 scale broadcastable to the operand: per tensor, or per row of mat1 / per column of mat2."""
    s = scale.to(torch.float32)
    if s.numel() == 1:
        return s.reshape(())
    want = (rows, 1) if per == "row" else (1, rows)
    if tuple(s.shape) != want:
        raise FusionExecutionError(
            f"fd.ops.scaled_mm: an FP8 scale must have one element or shape {list(want)}, got {list(s.shape)}")
    return s


def _unswizzle(scale: torch.Tensor, rows: int, k: int, name: str) -> torch.Tensor:
    """Linear float32 block scales [rows, k/16] from a 128x4-swizzled buffer (padded, or viewed as logical)."""
    from ..nvfp4 import reference

    kb = k // _NVFP4_BLOCK
    padded = (round_up(rows, 128), round_up(kb, 4))
    if tuple(scale.shape) != padded:
        if tuple(scale.shape) != (rows, kb):
            raise FusionExecutionError(
                f"fd.ops.scaled_mm: '{name}' must be a 128x4-swizzled e4m3 buffer of shape {list(padded)} "
                f"(or its logical [{rows}, {kb}] view), got {list(scale.shape)}")
        # The logical view of a padded buffer (nv_block_quantize's swizzled output): read the buffer behind it.
        need = (scale.storage_offset() + padded[0] * padded[1]) * scale.element_size()
        if scale.untyped_storage().nbytes() < need:
            raise FusionExecutionError(
                f"fd.ops.scaled_mm: '{name}' [{rows}, {kb}] is not a view of a padded 128x4-swizzled buffer")
        scale = torch.as_strided(scale, padded, (padded[1], 1), scale.storage_offset())
    return reference.swizzled_to_linear_128_4(scale, rows, kb).to(torch.float32)


def _dequant_fp4(packed: torch.Tensor, scale: torch.Tensor, rows: int, k: int, name: str) -> torch.Tensor:
    """float32 [rows, k] from packed FP4 [rows, k/2] (K innermost in memory) and its swizzled block scales."""
    from ..nvfp4 import reference

    vals = reference.from_fp4(packed)  # [rows, k]
    s = _unswizzle(scale, rows, k, name)
    return vals * s.repeat_interleave(_NVFP4_BLOCK, dim=1)


def _scaled_mm_eval(node, mat1, mat2, scale1, scale2, alpha=None, bias=None, beta=None, dtype=DataType.BFloat16):
    out_dtype = to_torch_dtype(dtype)
    if node.inputs[0].dtype is _FP4:
        # Packed FP4 at run time: mat1 [M, K/2]; mat2 is [K, N] with K innermost, i.e. storage [N, K/2] (.t()).
        m, k = mat1.shape[0], mat1.shape[1] * 2
        n = mat2.shape[1]
        a = _dequant_fp4(mat1, scale1, m, k, "scale1")
        b = _dequant_fp4(mat2.t(), scale2, n, k, "scale2").t()
        out = a @ b
    else:
        m, n = mat1.shape[0], mat2.shape[1]
        tensorwise = scale1.numel() == 1 and scale2.numel() == 1
        if mat1.is_cuda and tensorwise and mat1.shape[1] % 16 == 0 and n % 16 == 0:
            a = mat1.contiguous()
            b = mat2.t().contiguous().t()  # torch._scaled_mm wants mat2 column-major
            out = torch._scaled_mm(a, b, scale_a=scale1.to(torch.float32).reshape(()),
                                   scale_b=scale2.to(torch.float32).reshape(()), out_dtype=torch.float32)
        else:
            a = mat1.to(torch.float32) * _fp8_scale(scale1, m, "row")
            b = mat2.to(torch.float32) * _fp8_scale(scale2, n, "col")
            out = a @ b
    if alpha is not None:
        out = out * alpha.to(torch.float32)
    if bias is not None:
        out = out + (bias.to(torch.float32) if beta is None else beta.to(torch.float32) * bias.to(torch.float32))
    return out.to(out_dtype)


def _scaled_mm_meta(node, mat1, mat2, scale1, scale2, alpha=None, bias=None, beta=None, dtype=DataType.BFloat16):
    m = mat1.shape[0]
    n = mat2.shape[1]
    return torch.empty((m, n), dtype=to_torch_dtype(dtype), device="meta")


def _scale_tensor(op: str, x, name: str, dtypes) -> TensorView:
    tv = require_tensor(op, x, name)
    if tv.dtype not in dtypes:
        fail(op, f"argument '{name}' must be {' or '.join(map(repr, dtypes))}, got {tv.dtype!r}", FusionDtypeError)
    return tv


@register("scaled_mm", OpKind.ATEN, _scaled_mm_eval, meta=_scaled_mm_meta, accepts_fp4=True)
def scaled_mm(mat1, mat2, scale1, scale2, alpha=None, bias=None, beta=None, dtype: DataType = DataType.BFloat16,
              output_block_scale_size: int = 0, output_block_scale_dtype: DataType = DataType.BFloat16,
              output_gamma: bool = False):
    """See the module docstring. Returns ``(out, None, None)``."""
    op = "scaled_mm"
    a, b = require_tensor(op, mat1, "mat1"), require_tensor(op, mat2, "mat2")
    if a.dtype not in _FP8 + (_FP4,) or b.dtype != a.dtype:
        fail(op, f"'mat1' and 'mat2' must both be Float8_e4m3fn, Float8_e5m2 or Float4_e2m1fn, got {a.dtype!r} and "
                 f"{b.dtype!r}", FusionDtypeError)
    if a.ndim != 2 or b.ndim != 2:
        fail(op, f"'mat1' and 'mat2' must be 2-D ([M, K] and [K, N]), got ranks {a.ndim} and {b.ndim}")
    ka, kb = a.logical[1].extent, b.logical[0].extent
    if ka is not None and kb is not None and ka != kb:
        fail(op, f"K of 'mat1' ({ka}) and of 'mat2' ({kb}) differ")
    if a.dtype is _FP4:
        scale_dtypes = (DataType.Float8_e4m3fn,)
        if ka is not None and ka % _NVFP4_BLOCK:
            fail(op, f"NVFP4 operands need K to be a multiple of {_NVFP4_BLOCK}, got {ka}")
        if b.stride_order() != [0, 1]:
            fail(op, "NVFP4 'mat2' [K, N] must have K innermost in memory (stride_order=[0, 1]), as CUTLASS reads it")
    else:
        scale_dtypes = (DataType.Float,)
    s1 = _scale_tensor(op, scale1, "scale1", scale_dtypes)
    s2 = _scale_tensor(op, scale2, "scale2", scale_dtypes)
    extra = {}
    for name, val in (("alpha", alpha), ("bias", bias), ("beta", beta)):
        if val is not None:
            extra[name] = _scale_tensor(op, val, name, (DataType.Float, DataType.BFloat16, DataType.Half))
    if not isinstance(dtype, DataType) or dtype not in _OUT_DTYPES:
        fail(op, f"argument 'dtype' must be one of {', '.join(map(repr, _OUT_DTYPES))}, got {dtype!r}",
             FusionDtypeError)
    if isinstance(output_block_scale_size, bool) or not isinstance(output_block_scale_size, int):
        fail(op, f"argument 'output_block_scale_size' must be an int, got {output_block_scale_size!r}")
    if output_block_scale_size > 0 or output_gamma:
        raise UnsupportedOpError("fd.ops.scaled_mm: output quantization (output_block_scale_size > 0, output_gamma) "
                                 "is not supported by pyfuser")
    fusion = fusion_of(op, a, b, s1, s2, *extra.values())
    out = new_tensor(fusion, [IterDomain.iteration(a.logical[0].extent), IterDomain.iteration(b.logical[1].extent)],
                     dtype)
    kwargs = dict(extra)
    if dtype is not DataType.BFloat16:
        kwargs["dtype"] = dtype
    # The call returns (out, None, None): the printer writes ``tv, _, _ = fd.ops.scaled_mm(...)`` from result_slots.
    return OpResult([out], (a, b, s1, s2), kwargs, info={"result_slots": 3}, user_result=(out, None, None))
