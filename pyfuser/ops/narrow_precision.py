"""NVFP4 ops: the layout op, block quantization and the NVFP4 grouped GEMM (layout_op.md, nvfp4.md).

Each op is one registry entry: a builder with the definition-time checks, the pure-torch reference
(``pyfuser.nvfp4.reference``) as its evaluator, a meta function, and a hand-written Triton implementation
(``OpDef.kernel``) that executors launch on CUDA and under the Triton interpreter.

Run-time checks of the offsets' values (ops/offset_checks.py) run on the device by default, without a host
sync; decreasing or overlapping offsets would otherwise give silently wrong placements (the kernels mask writes
to their buffers, so never memory corruption).

Returned block-scale tensors in the swizzled grouped layout have logical shape ``[m, k]`` and strides
``[k, 1]``, which do not describe the data: the values live in a zero-filled buffer of ``(m + 127*g) * pk``
elements (pk = roundup(k, 4)), group ``e`` starting at row ``output_offsets[e]`` in 128x4 swizzled tiles.
Only ``cutlass_nvfp4_grouped_mm`` (as scale1/scale2) may consume them; the registry enforces that.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from ..errors import FusionExecutionError, UnsupportedOpError
from ..ir.dtypes import DataType, to_torch_dtype
from ..ir.nodes import IterDomain, TensorView
from ..ir.packing import packed_shape
from .mxfp8 import block_quantize_mxfp8
from .offset_checks import GroupCheck, check_group_offsets
from .common import FusionDtypeError, fail, fusion_of, new_tensor, require_tensor, round_up
from ..nvfp4.gemm_contract import check_operands
from .registry import OpKind, OpResult, register, swizzled_scales_producer

_QUANT_INPUT = (DataType.Float, DataType.BFloat16, DataType.Half)


def _ref():
    from ..nvfp4 import reference

    return reference


# --------------------------------------------------------------------------------------------------------------
# definition-time checks


def _tensor(
    op: str, x, name: str, rank: Optional[int] = None, dtypes: Optional[Sequence[DataType]] = None
) -> TensorView:
    tv = require_tensor(op, x, name)
    if rank is not None and tv.ndim != rank:
        fail(op, f"argument '{name}' ({tv.name}) must have rank {rank}, got rank {tv.ndim}")
    if dtypes is not None and tv.dtype not in dtypes:
        want = " or ".join(repr(d) for d in dtypes)
        fail(op, f"argument '{name}' ({tv.name}) must be {want}, got {tv.dtype!r}", FusionDtypeError)
    return tv


def _offsets(op: str, input_offsets, output_offsets) -> tuple[TensorView, TensorView]:
    a = _tensor(op, input_offsets, "input_offsets", 1, (DataType.Int32,))
    b = _tensor(op, output_offsets, "output_offsets", 1, (DataType.Int32,))
    ga, gb = a.static_shape()[0], b.static_shape()[0]
    if ga is not None and gb is not None and ga != gb:
        fail(op, f"input_offsets ({a.name}) has {ga} groups but output_offsets ({b.name}) has {gb}")
    return a, b


def _no_swizzled_operand(op: str, **operands) -> None:
    """The registry lets swizzled block scales reach the grouped GEMM only; there, only as scale1/scale2."""
    for name, x in operands.items():
        producer = swizzled_scales_producer(x) if isinstance(x, TensorView) else None
        if producer is not None:
            fail(op, f"argument '{name}' ({x.name}) is the output of fd.ops.{producer}: swizzled block scales may "
                     f"only be scale1 or scale2")


def _global_scale(op: str, global_scale) -> Optional[TensorView]:
    if global_scale is None:
        return None
    return _tensor(op, global_scale, "global_scale", 0, (DataType.Float,))


def _quant_input(op: str, x, block_size, dtype) -> TensorView:
    tv = _tensor(op, x, "input", 2, _QUANT_INPUT)
    if dtype is DataType.Float8_e4m3fn:
        raise UnsupportedOpError(f"fd.ops.{op}: the MXFP8 variant (dtype=Float8_e4m3fn) is not supported")
    if dtype is not DataType.Float4_e2m1fn:
        want = "DataType.Float4_e2m1fn or DataType.Float8_e4m3fn" if op == "nv_block_quantize" else \
            "DataType.Float4_e2m1fn"
        fail(op, f"argument 'dtype' must be {want}, got {dtype!r}", FusionDtypeError)
    if block_size != 16:
        fail(op, f"argument 'block_size' must be 16 for NVFP4, got {block_size!r}")
    k = tv.static_shape()[1]
    if k is not None and k % block_size:
        fail(op, f"the last dim of input ({tv.name}) is {k}, not a multiple of block_size {block_size}")
    return tv


def _quant_outputs(op: str, x: TensorView) -> tuple[TensorView, TensorView]:
    fusion = fusion_of(op, x)
    m, k = (IterDomain.iteration(e) for e in x.static_shape())
    data = new_tensor(fusion, [m, k], DataType.Float4_e2m1fn)
    kb = None if k.extent is None else k.extent // 16
    scales = new_tensor(fusion, [IterDomain.iteration(m.extent), IterDomain.iteration(kb)], DataType.Float8_e4m3fn)
    return data, scales


# --------------------------------------------------------------------------------------------------------------
# run-time checks (shared by the reference and the kernel path)


def _check_offset_tensors(op: str, input_offsets: torch.Tensor, output_offsets: Optional[torch.Tensor]) -> None:
    """dtype and length checks: free, always done."""
    for name, t in (("input_offsets", input_offsets), ("output_offsets", output_offsets)):
        if t is None:
            continue
        if t.dtype != torch.int32 or t.dim() != 1:
            raise FusionExecutionError(f"fd.ops.{op}: {name} must be a 1-D int32 tensor, got {t.dtype} {list(t.shape)}")
    g = input_offsets.numel()
    if output_offsets is not None and output_offsets.numel() != g:
        raise FusionExecutionError(
            f"fd.ops.{op}: input_offsets has {g} entries but output_offsets has {output_offsets.numel()}"
        )
    if g == 0:
        raise FusionExecutionError(f"fd.ops.{op}: the offsets are empty (at least one group is needed)")


def offsets_check(op: str, m: int, input_offsets: torch.Tensor, output_offsets: torch.Tensor) -> GroupCheck:
    """The layout op's offsets for an m-row input: their dtypes and lengths checked at once (metadata), and the
    check of their values (ops/offset_checks.py)."""
    _check_offset_tensors(op, input_offsets, output_offsets)
    g = input_offsets.numel()
    return GroupCheck(op, m, capacity=m + 127 * g, capacity_what=f"the buffer's m + 127*g = {m + 127 * g} rows")


def check_offsets(op: str, m: int, input_offsets: torch.Tensor, output_offsets: torch.Tensor) -> None:
    """The layout op's offsets: shapes at once, values as the call's offset-check mode says (ops/offset_checks.py)."""
    check_group_offsets(offsets_check(op, m, input_offsets, output_offsets), input_offsets, output_offsets)


def check_k(op: str, k: int, block_size: int = 16) -> None:
    if k % block_size:
        raise FusionExecutionError(
            f"fd.ops.{op}: the last dim of input is {k}, not a multiple of block_size {block_size}"
        )


def _grouped_scales_meta(m: int, k: int, g: int, dtype: torch.dtype) -> torch.Tensor:
    return logical_view(torch.empty(((m + 127 * g) * round_up(k, 4),), dtype=dtype, device="meta"), m, k)


# --------------------------------------------------------------------------------------------------------------
# preprocess_grouped_matmul_input_sf (the layout op)


def _layout_eval(node, input, input_offsets, output_offsets):
    check_offsets(node.op.name, input.shape[0], input_offsets, output_offsets)
    return _ref().preprocess_grouped_matmul_input_sf(input, input_offsets, output_offsets)


def _layout_meta(node, input, input_offsets, output_offsets):
    m, k = input.shape
    return _grouped_scales_meta(m, k, input_offsets.shape[0], input.dtype)


@register("preprocess_grouped_matmul_input_sf", OpKind.OWN_KERNEL, _layout_eval, meta=_layout_meta)
def preprocess_grouped_matmul_input_sf(input, input_offsets, output_offsets):
    """Lay out row-major block scales [m, k] per group in the padded 128x4-swizzled buffer CUTLASS expects."""
    op = "preprocess_grouped_matmul_input_sf"
    x = _tensor(op, input, "input", 2)
    a, b = _offsets(op, input_offsets, output_offsets)
    out = new_tensor(fusion_of(op, x, a, b), [IterDomain.iteration(e) for e in x.static_shape()], x.dtype)
    return OpResult([out], (x, a, b), info={"swizzled_output": 0})


# --------------------------------------------------------------------------------------------------------------
# nv_block_quantize / nv_grouped_block_quantize


def logical_view(buffer: torch.Tensor, m: int, k: int) -> torch.Tensor:
    """A padded, swizzled scale buffer returned like the layout op's result: logical [m, k], strides [k, 1]."""
    return torch.as_strided(buffer, (m, k), (k, 1))


def _block_quantize_eval(node, input, global_scale=None, swizzle_block_scales=False, block_size=16, dtype=None):
    check_k(node.op.name, input.shape[1], block_size)
    data, scales = _ref().quantize_nvfp4_fused(input, global_scale, block_size)
    if swizzle_block_scales:
        scales = logical_view(_ref().linear_to_swizzled_128_4(scales), *scales.shape)
    return data, scales


def _block_quantize_meta(node, input, global_scale=None, swizzle_block_scales=False, block_size=16, dtype=None):
    m, k = input.shape
    data = torch.empty(packed_shape([m, k], 1), dtype=torch.float4_e2m1fn_x2, device="meta")
    if swizzle_block_scales:
        storage = torch.empty((round_up(m, 128) * round_up(k // 16, 4),), dtype=torch.float8_e4m3fn, device="meta")
        return data, logical_view(storage, m, k // 16)
    return data, torch.empty((m, k // 16), dtype=torch.float8_e4m3fn, device="meta")


@register("nv_block_quantize", OpKind.OWN_KERNEL, _block_quantize_eval, meta=_block_quantize_meta)
def nv_block_quantize(input, global_scale=None, swizzle_block_scales: bool = False, block_size: int = 16,
                      dtype: DataType = DataType.Float4_e2m1fn):
    """Quantize [M, K] to NVFP4: FP4 values [M, K] and e4m3 block scales [M, K/16] (optionally 128x4-swizzled).

    ``global_scale`` (0-dim Float) is an encode multiplier: dequantization divides by it. With
    ``dtype=DataType.Float8_e4m3fn`` and ``block_size=32``: MXFP8 (ops/mxfp8.py)."""
    op = "nv_block_quantize"
    if dtype is DataType.Float8_e4m3fn:  # MXFP8: e8m0 scales of 32-element blocks, any rank (ops/mxfp8.py)
        x = _tensor(op, input, "input", None, _QUANT_INPUT)
        return block_quantize_mxfp8(op, x, global_scale, swizzle_block_scales, block_size, nv_block_quantize)
    x = _quant_input(op, input, block_size, dtype)
    gs = _global_scale(op, global_scale)
    if not isinstance(swizzle_block_scales, bool):
        fail(op, f"argument 'swizzle_block_scales' must be a bool, got {swizzle_block_scales!r}")
    data, scales = _quant_outputs(op, x)
    info = {"swizzled_output": 1} if swizzle_block_scales else {}
    info["prologue_input"] = 0  # (see nv_grouped_block_quantize)
    kwargs = {"global_scale": gs, "swizzle_block_scales": swizzle_block_scales, "block_size": block_size,
              "dtype": dtype}
    return OpResult([data, scales], (x,), kwargs, info=info)


def _grouped_quantize_eval(node, input, input_offsets, output_offsets, global_scale=None, block_size=16, dtype=None):
    check_k(node.op.name, input.shape[1], block_size)
    check_offsets(node.op.name, input.shape[0], input_offsets, output_offsets)
    return _ref().grouped_quantize_nvfp4(input, input_offsets, output_offsets, global_scale, block_size, fused=True)


def _grouped_quantize_meta(node, input, input_offsets, output_offsets, global_scale=None, block_size=16,
                           dtype=None):
    m, k = input.shape
    data = torch.empty(packed_shape([m, k], 1), dtype=torch.float4_e2m1fn_x2, device="meta")
    return data, _grouped_scales_meta(m, k // 16, input_offsets.shape[0], torch.float8_e4m3fn)


@register("nv_grouped_block_quantize", OpKind.OWN_KERNEL, _grouped_quantize_eval, meta=_grouped_quantize_meta)
def nv_grouped_block_quantize(input, input_offsets, output_offsets, global_scale=None, block_size: int = 16,
                              dtype: DataType = DataType.Float4_e2m1fn):
    """nv_block_quantize whose scales go straight into the layout op's grouped swizzled buffer (one kernel)."""
    op = "nv_grouped_block_quantize"
    x = _quant_input(op, input, block_size, dtype)
    a, b = _offsets(op, input_offsets, output_offsets)
    gs = _global_scale(op, global_scale)
    data, scales = _quant_outputs(op, x)
    kwargs = {"global_scale": gs, "block_size": block_size, "dtype": dtype}
    # prologue_input: the kernel can compute its input tile through a merged pointwise producer (a load prologue,
    # segment/segmenter.py) instead of reading it from memory.
    return OpResult([data, scales], (x, a, b), kwargs, info={"swizzled_output": 1, "prologue_input": 0})


# --------------------------------------------------------------------------------------------------------------
# cutlass_nvfp4_grouped_mm


def check_gemm(op, mat1, mat2, scale1, scale2, alpha, problem_sizes, expert_offsets, sf_offsets) -> tuple:
    """The grouped GEMM's operand contract (:func:`gemm_contract`) and, with offset_checks, the offsets' and problem
    sizes' values. Returns (M, N, K, G)."""
    m, n, k, g, check = gemm_contract(op, mat1, mat2, scale1, scale2, alpha, problem_sizes, expert_offsets,
                                      sf_offsets)
    check_group_offsets(check, expert_offsets, sf_offsets, problem_sizes)
    return m, n, k, g


def scale1_capacity(scale1: torch.Tensor) -> int:
    """The e4m3 elements scale1's storage holds from its start: the padded block-scale rows of every group must fit.
    Not part of an input signature (a tensor's storage may outlast its view), so a prepared GEMM compares it per
    call."""
    return scale1.untyped_storage().nbytes() - scale1.storage_offset()


def gemm_contract(op, mat1, mat2, scale1, scale2, alpha, problem_sizes, expert_offsets, sf_offsets) -> tuple:
    """What the operands' metadata must satisfy (one implementation, shared with the kernel's launcher) and the
    op's own N rule, raising FusionExecutionError; returns (M, N, K, G, the GroupCheck of the offsets' values and
    scale1's capacity)."""
    try:
        m, n, k, g = check_operands(mat1, mat2, scale1, scale2, alpha, problem_sizes, expert_offsets, sf_offsets)
    except ValueError as e:
        raise FusionExecutionError(f"fd.ops.{op}: {e}") from None
    if n % 128:
        raise FusionExecutionError(
            f"fd.ops.{op}: N={n} must be a multiple of 128 (scale2 holds each expert's 128x4-swizzled [N, K/16] "
            f"scales without padding)"
        )
    available = scale1_capacity(scale1) // (k // 16)
    check = GroupCheck(op, m, starts_name="expert_offsets", outs_name="sf_offsets", every_row=False,
                       capacity=available, n=n, k=k,  # rows before the first group stay zero
                       capacity_what=f"scale1 holds {available} block-scale rows of K/16={k // 16}")
    return m, n, k, g, check


def _gemm_eval(node, mat1, mat2, scale1, scale2, alpha, problem_sizes, expert_offsets, sf_offsets, dtype):
    check_gemm(node.op.name, mat1, mat2, scale1, scale2, alpha, problem_sizes, expert_offsets, sf_offsets)
    return _ref().nvfp4_grouped_mm(mat1, mat2, scale1, scale2, alpha, problem_sizes, expert_offsets, sf_offsets,
                                   to_torch_dtype(dtype))


def _gemm_meta(node, mat1, mat2, scale1, scale2, alpha, problem_sizes, expert_offsets, sf_offsets, dtype):
    m, n = mat1.shape[0], mat2.shape[2]  # packed operands: mat1 [M, K/2], mat2 [G, K/2, N]
    return torch.empty((m, n), dtype=to_torch_dtype(dtype), device="meta")


@register("cutlass_nvfp4_grouped_mm", OpKind.ATEN, _gemm_eval, meta=_gemm_meta,
          accepts_fp4=True)
def cutlass_nvfp4_grouped_mm(mat1, mat2, scale1, scale2, alpha, problem_sizes, expert_offsets, sf_offsets,
                             dtype: DataType = DataType.BFloat16):
    """out[e_i:e_i+m_i] = alpha[i] * (A_i @ B_i) with NVFP4 operands (nvfp4.md). On GPUs without FP4 tensor
    cores it runs pyfuser's Triton grouped GEMM, which dequantizes the packed operands in registers."""
    op = "cutlass_nvfp4_grouped_mm"
    a = _tensor(op, mat1, "mat1", 2, (DataType.Float4_e2m1fn,))
    b = _tensor(op, mat2, "mat2", 3, (DataType.Float4_e2m1fn,))
    s1 = _tensor(op, scale1, "scale1", 2, (DataType.Float8_e4m3fn,))
    s2 = _tensor(op, scale2, "scale2", 3, (DataType.Float8_e4m3fn,))
    al = _tensor(op, alpha, "alpha", 1, (DataType.Float,))
    ps = _tensor(op, problem_sizes, "problem_sizes", 2, (DataType.Int32,))
    eo, so = _offsets(op, expert_offsets, sf_offsets)
    if dtype not in (DataType.BFloat16, DataType.Half):
        fail(op, f"argument 'dtype' must be DataType.BFloat16 or DataType.Half, got {dtype!r}", FusionDtypeError)
    _no_swizzled_operand(op, mat1=a, mat2=b, alpha=al, problem_sizes=ps, expert_offsets=eo, sf_offsets=so)
    ka, kb = a.static_shape()[1], b.static_shape()[1]
    if ka is not None and kb is not None and ka != kb:
        fail(op, f"mat1 ({a.name}) has K={ka} but mat2 ({b.name}) has K={kb}")
    k = ka if ka is not None else kb
    if k is not None and k % 64:
        fail(op, f"K={k} must be a multiple of 64")
    n = b.static_shape()[2]
    if n is not None and n % 128:
        fail(op, f"N={n} (mat2 dim 2) must be a multiple of 128")
    for name, tv, d, want in (("scale1", s1, 1, k // 16 if k else None), ("scale2", s2, 2, k // 16 if k else None),
                              ("scale2", s2, 1, n), ("problem_sizes", ps, 1, 3)):
        got = tv.static_shape()[d]
        if got is not None and want is not None and got != want:
            fail(op, f"argument '{name}' ({tv.name}) dim {d} must be {want}, got {got}")
    out = new_tensor(fusion_of(op, a, b, s1, s2, al, ps, eo, so),
                     [IterDomain.iteration(a.static_shape()[0]), IterDomain.iteration(n)], dtype)
    return OpResult([out], (a, b, s1, s2, al, ps, eo, so, dtype))
