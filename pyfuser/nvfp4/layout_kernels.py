"""Hand-written Triton kernels for the NVFP4 layout op and the fused block quantizations.

Three launchers, each with the same contract as its pure-torch counterpart in ``reference.py`` (bit-exact):

- ``layout_op(input, input_offsets, output_offsets)``            == reference.preprocess_grouped_matmul_input_sf
- ``block_quantize(x, global_scale, swizzle, block_size)``        == reference.quantize_nvfp4_fused (+ the single-
  group 128x4 swizzle of the scales when ``swizzle``)
- ``grouped_block_quantize(x, input_offsets, output_offsets, ...)`` == reference.grouped_quantize_nvfp4(fused=True),
  quantization and the grouped scale layout in ONE kernel.

No launcher synchronizes with the device: launch shapes depend only on m, k and g (the number of groups), never on
the offsets' values, and ``global_scale`` is read by the kernel.

Group lookup: each row finds its group e (the largest i with ``input_offsets[i] <= row``) by a branch-free binary
search with a FIXED number of steps, ceil(log2(g)), a compile-time constant. Chosen over a loop over g because MoE
layers have up to a few hundred experts: a loop costs g scalar loads and compares per program whatever the row
count, the search costs log2(g) gathers from a g-entry array that stays in L1. Both need non-decreasing offsets
(which callers guarantee; the op trusts them, like upstream). The search is the upstream scan's answer for every
valid offsets tensor, including empty groups (equal consecutive offsets: the row goes to the last of them).

Bounds: the layout op trusts the offsets (upstream never checks them), but these kernels still mask every write
that would land outside the output buffer or belongs to a row before ``input_offsets[0]``, so bad offsets give
wrong values, never memory corruption.

fp32 division: Triton's ``/`` on fp32 compiles to the approximate ``div.full.f32`` on NVIDIA GPUs; the quantize
kernel divides with ``tl.div_rn`` (IEEE round to nearest) so that its scales are bit-exact with torch's.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

# constexpr: jitted code may only read globals that are constexpr (the interpreter does not enforce it).
FLOAT4_E2M1_MAX = tl.constexpr(6.0)
FLOAT8_E4M3_MAX = tl.constexpr(448.0)

# Scale layouts of the quantize kernel (constexpr SCALE_LAYOUT).
_PLAIN, _SWIZZLED, _GROUPED = 0, 1, 2

_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_QUANT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


# ----------------------------------------------------------------------------------------------------------------
# Shared device helpers
# ----------------------------------------------------------------------------------------------------------------

@triton.jit
def _group_of_rows(rows, in_offsets_ptr, g, LOG2_G: tl.constexpr):
    """Largest e in [0, g) with in_offsets[e] <= row (0 when none): binary lifting with LOG2_G fixed steps."""
    e = tl.zeros_like(rows)
    for i in tl.static_range(LOG2_G):
        cand = e + (1 << (LOG2_G - 1 - i))
        in_range = cand < g
        start = tl.load(in_offsets_ptr + cand, mask=in_range, other=0)
        e = tl.where(in_range & (start <= rows), cand, e)
    return e


@triton.jit
def _swizzled_row_offset(local_rows, base_row, pk):
    """Row part of the 128x4 swizzled position (int64): a group's base row times pk, the 128-row tile, and the
    row's place inside the tile (row a*32+b of a tile lands at minor position b*16 + a*4)."""
    lr = local_rows.to(tl.int64)
    return base_row.to(tl.int64) * pk + (lr // 128) * 128 * pk + (lr % 32) * 16 + ((lr % 128) // 32) * 4


@triton.jit
def _swizzled_col_offset(cols):
    """Column part of the 128x4 swizzled position: 4-column tiles of 512 elements, the column inside the tile."""
    c = cols.to(tl.int64)
    return (c // 4) * 512 + c % 4


@triton.jit
def _grouped_row_offsets(rows, row_ok, in_offsets_ptr, out_offsets_ptr, g, pk, LOG2_G: tl.constexpr):
    """(row part of each row's position in the grouped scale buffer, mask of rows that have a group)."""
    e = _group_of_rows(rows, in_offsets_ptr, g, LOG2_G)
    in_start = tl.load(in_offsets_ptr + e, mask=row_ok, other=0)
    out_start = tl.load(out_offsets_ptr + e, mask=row_ok, other=0)
    local = rows - in_start
    return _swizzled_row_offset(local, out_start, pk), row_ok & (local >= 0)


# ----------------------------------------------------------------------------------------------------------------
# Layout op
# ----------------------------------------------------------------------------------------------------------------

@triton.jit
def _layout_op_kernel(
    in_ptr, in_offsets_ptr, out_offsets_ptr, out_ptr,
    m, k, g, stride_m, stride_k, pk, out_numel,
    LOG2_G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
):
    # Pointwise over the input's [m, k] domain: one [BLOCK_M, BLOCK_K] tile per program; the values move as raw
    # bits (integer pointers), so every dtype of the right width is copied exactly.
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    row_ok = rows < m
    row_off, has_group = _grouped_row_offsets(rows, row_ok, in_offsets_ptr, out_offsets_ptr, g, pk, LOG2_G)
    dst = row_off[:, None] + _swizzled_col_offset(cols)[None, :]
    mask = has_group[:, None] & (cols < k)[None, :] & (dst >= 0) & (dst < out_numel)
    src = rows.to(tl.int64)[:, None] * stride_m + cols.to(tl.int64)[None, :] * stride_k
    vals = tl.load(in_ptr + src, mask=mask)
    tl.store(out_ptr + dst, vals, mask=mask)


def layout_op(input: torch.Tensor, input_offsets: torch.Tensor, output_offsets: torch.Tensor, *,
              block_m: int = 32, block_k: int = 64, num_warps: int = 4) -> torch.Tensor:
    """preprocess_grouped_matmul_input_sf: scatter a row-major ``[m, k]`` scale matrix (any dtype, any strides)
    into the zero-filled grouped, padded, 128x4-swizzled buffer of ``(m + 127*g) * roundup(k, 4)`` elements.

    Returns the buffer viewed as logical ``[m, k]`` with strides ``[k, 1]`` (which do not describe the data;
    consumers read the storage). ``block_m``/``block_k`` (powers of two) and ``num_warps`` are tuning knobs."""
    _check_device(input, "layout_op")
    if input.dim() != 2:
        raise ValueError(f"layout_op: input must be 2-D [m, k], got shape {tuple(input.shape)}")
    if input.element_size() not in _INT_OF_SIZE:
        raise TypeError(f"layout_op: unsupported input dtype {input.dtype}")
    g = _check_offsets("layout_op", input, input_offsets, output_offsets)
    _check_block("layout_op", block_m=block_m, block_k=block_k)
    m, k = input.shape
    pk = _round_up(k, 4)
    numel = (m + 127 * g) * pk
    bits = _INT_OF_SIZE[input.element_size()]
    storage = torch.zeros(numel, dtype=bits, device=input.device)
    if m > 0 and k > 0:
        bk = min(block_k, triton.next_power_of_2(k))
        grid = (triton.cdiv(m, block_m), triton.cdiv(k, bk))
        _layout_op_kernel[grid](
            input.view(bits), input_offsets.contiguous(), output_offsets.contiguous(), storage,
            m, k, g, input.stride(0), input.stride(1), pk, numel,
            LOG2_G=_log2_ceil(g), BLOCK_M=block_m, BLOCK_K=bk, num_warps=num_warps,
        )
    return torch.as_strided(storage.view(input.dtype), (m, k), (k, 1))


# ----------------------------------------------------------------------------------------------------------------
# Block quantization (plain, single-group swizzled, or grouped scales)
# ----------------------------------------------------------------------------------------------------------------

@triton.jit
def _fp4_codes(v):
    """FP4 E2M1 codes (uint8) of fp32 values: round to nearest, ties to the even code, saturate at 6; the sign
    bit is the fp32 sign bit (so -0.0 gives 0x8) and NaN gives code 0 with its sign."""
    a = tl.abs(v)
    mag = ((a > 0.25).to(tl.uint8) + (a >= 0.75).to(tl.uint8) + (a > 1.25).to(tl.uint8)
           + (a >= 1.75).to(tl.uint8) + (a > 2.5).to(tl.uint8) + (a >= 3.5).to(tl.uint8) + (a > 5.0).to(tl.uint8))
    sign = ((v.to(tl.uint32, bitcast=True) >> 31) << 3).to(tl.uint8)
    return mag | sign


@triton.jit
def _nan_max(a, b):
    # NaN-propagating max, like torch.amax (the default tl.maximum returns the non-NaN operand on GPUs).
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _block_quantize_kernel(
    x_ptr, gs_ptr, packed_ptr, scales_ptr, in_offsets_ptr, out_offsets_ptr,
    M, K, g, stride_m, stride_k, scale_stride, pk, scales_numel,
    HAS_GS: tl.constexpr, SCALE_LAYOUT: tl.constexpr, LOG2_G: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
):
    NB: tl.constexpr = BLOCK_K // BLOCK_SIZE  # quantization blocks per program row
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    row_ok = rows < M
    rows64 = rows.to(tl.int64)
    # K is a multiple of BLOCK_SIZE, so this mask covers whole quantization blocks.
    mask = row_ok[:, None] & (cols < K)[None, :]
    x = tl.load(x_ptr + rows64[:, None] * stride_m + cols.to(tl.int64)[None, :] * stride_k, mask=mask, other=0.0)
    x = tl.reshape(x.to(tl.float32), (BLOCK_M, NB, BLOCK_SIZE))

    # Fused-op scale: s = min(amax/6 * gs, fp32max); saturating fp8 cast (clamp to 448 first, like the
    # reference; NaN stays NaN); back to fp32; the data is multiplied by gs / fp8 scale.
    amax = tl.reduce(tl.abs(x), 2, _nan_max)
    s = tl.div_rn(amax, tl.full(amax.shape, FLOAT4_E2M1_MAX, tl.float32))
    if HAS_GS:
        gs = tl.load(gs_ptr)
        s = s * gs
        numer = tl.zeros_like(s) + gs
    else:
        numer = tl.full(s.shape, 1.0, tl.float32)
    s = tl.where(s > FLOAT8_E4M3_MAX, FLOAT8_E4M3_MAX, s)  # also covers min(., fp32max); keeps NaN
    s8 = s.to(tl.float8e4nv)
    s32 = s8.to(tl.float32)
    # A zero fp8 scale (amax below the fp8 range) encodes the block as zeros instead of x * inf.
    zero = s32 == 0.0
    mult = tl.where(zero, 0.0, tl.div_rn(numer, tl.where(zero, 1.0, s32)))
    v = x * mult[:, :, None]

    # Pack pairs: element 2j in the low nibble, 2j+1 in the high nibble.
    codes = tl.reshape(_fp4_codes(v), (BLOCK_M, BLOCK_K // 2, 2))
    lo, hi = tl.split(codes)
    packed = lo | (hi << 4)
    pcols = tl.program_id(1) * (BLOCK_K // 2) + tl.arange(0, BLOCK_K // 2)
    pmask = row_ok[:, None] & (pcols < K // 2)[None, :]
    tl.store(packed_ptr + rows64[:, None] * (K // 2) + pcols.to(tl.int64)[None, :], packed, mask=pmask)

    # Scales, as fp8 bits, in the requested layout.
    scols = tl.program_id(1) * NB + tl.arange(0, NB)
    bits = s8.to(tl.uint8, bitcast=True)
    smask = row_ok[:, None] & (scols < K // BLOCK_SIZE)[None, :]
    if SCALE_LAYOUT == 0:
        dst = rows64[:, None] * scale_stride + scols.to(tl.int64)[None, :]
    elif SCALE_LAYOUT == 1:
        dst = _swizzled_row_offset(rows, tl.zeros_like(rows), pk)[:, None] + _swizzled_col_offset(scols)[None, :]
    else:
        row_off, has_group = _grouped_row_offsets(rows, row_ok, in_offsets_ptr, out_offsets_ptr, g, pk, LOG2_G)
        dst = row_off[:, None] + _swizzled_col_offset(scols)[None, :]
        smask = smask & has_group[:, None] & (dst >= 0) & (dst < scales_numel)
    tl.store(scales_ptr + dst, bits, mask=smask)


def block_quantize(x: torch.Tensor, global_scale: torch.Tensor | None = None, swizzle: bool = False,
                   block_size: int = 16, *, block_m: int = 32, block_k: int = 128,
                   num_warps: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4 quantization in the fused ops' order (== reference.quantize_nvfp4_fused, bit-exact).

    Returns (packed float4_e2m1fn_x2 ``[M, K/2]``, float8_e4m3fn scales): ``[M, K/block_size]`` row-major, or with
    ``swizzle`` the zero-padded single-group 128x4 swizzle ``[roundup(M,128), roundup(K/block_size,4)]``."""
    M, K = _check_quant_input("block_quantize", x, global_scale, block_size)
    _check_block("block_quantize", block_m=block_m, block_k=block_k)
    nb = K // block_size
    if swizzle:
        pk = _round_up(nb, 4)
        scales = torch.zeros((_round_up(M, 128), pk), dtype=torch.uint8, device=x.device)
        layout = _SWIZZLED
    else:
        pk = nb
        scales = torch.empty((M, nb), dtype=torch.uint8, device=x.device)
        layout = _PLAIN
    packed = torch.empty((M, K // 2), dtype=torch.uint8, device=x.device)
    dummy = torch.zeros(1, dtype=torch.int32, device=x.device)  # offsets are unused outside the grouped layout
    _launch_quantize(x, global_scale, packed, scales, dummy, dummy, 1, pk, layout, block_size,
                     block_m, block_k, num_warps)
    return packed.view(torch.float4_e2m1fn_x2), scales.view(torch.float8_e4m3fn)


def grouped_block_quantize(x: torch.Tensor, input_offsets: torch.Tensor, output_offsets: torch.Tensor,
                           global_scale: torch.Tensor | None = None, block_size: int = 16, *,
                           block_m: int = 32, block_k: int = 128,
                           num_warps: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4 quantization with the scales written straight into the layout op's grouped swizzled buffer
    (== reference.grouped_quantize_nvfp4(fused=True), bit-exact): returns (packed ``[M, K/2]``, scales as the
    layout op returns them: logical ``[M, K/block_size]`` over a zero-filled ``(M + 127*g) * pk`` storage)."""
    M, K = _check_quant_input("grouped_block_quantize", x, global_scale, block_size)
    g = _check_offsets("grouped_block_quantize", x, input_offsets, output_offsets)
    _check_block("grouped_block_quantize", block_m=block_m, block_k=block_k)
    nb = K // block_size
    pk = _round_up(nb, 4)
    storage = torch.zeros((M + 127 * g) * pk, dtype=torch.uint8, device=x.device)
    packed = torch.empty((M, K // 2), dtype=torch.uint8, device=x.device)
    _launch_quantize(x, global_scale, packed, storage, input_offsets.contiguous(), output_offsets.contiguous(), g,
                     pk, _GROUPED, block_size, block_m, block_k, num_warps)
    scales = torch.as_strided(storage.view(torch.float8_e4m3fn), (M, nb), (nb, 1))
    return packed.view(torch.float4_e2m1fn_x2), scales


def _launch_quantize(x, global_scale, packed, scales, in_offsets, out_offsets, g, pk, layout, block_size,
                     block_m, block_k, num_warps):
    M, K = x.shape
    if M == 0 or K == 0:
        return
    bk = max(block_size, min(block_k, triton.next_power_of_2(K)))
    grid = (triton.cdiv(M, block_m), triton.cdiv(K, bk))
    gs = global_scale if global_scale is not None else packed  # any pointer; unread when HAS_GS is False
    _block_quantize_kernel[grid](
        x, gs, packed, scales, in_offsets, out_offsets,
        M, K, g, x.stride(0), x.stride(1), scales.stride(0), pk, scales.numel(),
        HAS_GS=global_scale is not None, SCALE_LAYOUT=layout, LOG2_G=_log2_ceil(g),
        BLOCK_SIZE=block_size, BLOCK_M=block_m, BLOCK_K=bk, num_warps=num_warps,
    )


# ----------------------------------------------------------------------------------------------------------------
# Argument checks (launch-level; the ops layer adds op-level messages and validates offsets' values)
# ----------------------------------------------------------------------------------------------------------------

def _check_device(t: torch.Tensor, who: str) -> None:
    if t.device.type == "cuda":
        return
    if t.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1":
        return
    raise RuntimeError(f"{who}: Triton kernels need a CUDA tensor (or TRITON_INTERPRET=1 for CPU tensors), "
                       f"got a tensor on {t.device}")


def _check_offsets(who: str, data: torch.Tensor, input_offsets: torch.Tensor, output_offsets: torch.Tensor) -> int:
    for name, off in (("input_offsets", input_offsets), ("output_offsets", output_offsets)):
        if not isinstance(off, torch.Tensor) or off.dim() != 1:
            raise ValueError(f"{who}: {name} must be a 1-D tensor")
        if off.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{who}: {name} must be int32 (or int64), got {off.dtype}")
        if off.device != data.device:
            raise ValueError(f"{who}: {name} is on {off.device} but the data is on {data.device}")
    g = input_offsets.shape[0]
    if g == 0:
        raise ValueError(f"{who}: input_offsets must have at least one group")
    if output_offsets.shape[0] != g:
        raise ValueError(f"{who}: input_offsets has {g} entries but output_offsets has {output_offsets.shape[0]}")
    return g


def _check_quant_input(who: str, x: torch.Tensor, global_scale, block_size: int) -> tuple[int, int]:
    _check_device(x, who)
    if x.dim() != 2:
        raise ValueError(f"{who}: x must be 2-D [M, K], got shape {tuple(x.shape)}")
    if x.dtype not in _QUANT_DTYPES:
        raise TypeError(f"{who}: x must be float32, bfloat16 or float16, got {x.dtype}")
    if not isinstance(block_size, int) or block_size < 2 or block_size & (block_size - 1):
        raise ValueError(f"{who}: block_size must be a power of two >= 2, got {block_size}")
    M, K = x.shape
    if K % block_size:
        raise ValueError(f"{who}: K ({K}) must be a multiple of block_size ({block_size})")
    if global_scale is not None:
        if not isinstance(global_scale, torch.Tensor) or global_scale.dim() != 0:
            raise ValueError(f"{who}: global_scale must be a 0-dim float32 tensor or None")
        if global_scale.dtype != torch.float32:
            raise TypeError(f"{who}: global_scale must be float32, got {global_scale.dtype}")
        if global_scale.device != x.device:
            raise ValueError(f"{who}: global_scale is on {global_scale.device} but x is on {x.device}")
    return M, K


def _check_block(who: str, **blocks: int) -> None:
    for name, b in blocks.items():
        if not isinstance(b, int) or b < 1 or b & (b - 1):
            raise ValueError(f"{who}: {name} must be a power of two, got {b}")


def _round_up(n: int, mult: int) -> int:
    return (n + mult - 1) // mult * mult


def _log2_ceil(g: int) -> int:
    """Binary-search steps that cover g groups: ceil(log2(g)) (0 for a single group)."""
    return (g - 1).bit_length()
