"""Pure-torch reference math for NVFP4: FP4 E2M1 codes and packing, block quantization, 128x4 scale swizzles,
the grouped block-scale layout (the "layout op") and the NVFP4 grouped GEMM.

Everything here is plain torch, device-agnostic (CPU and CUDA) and written for clarity, not speed: it is the
oracle that the Triton kernels (`layout_kernels`, `grouped_gemm`) and the op evaluators are checked against,
bit for bit where the contract says so. The contract (formats, the layout op's index formula, both quantization
orders) is written out in docs/nvfp4.md.

Conventions (shared with the kernels):
- FP4 code c in 0..15: magnitude [0, .5, 1, 1.5, 2, 3, 4, 6][c & 7], negative when c & 8.
- Packed FP4 (`torch.float4_e2m1fn_x2`, 1 byte = 2 values): element 2j in the LOW nibble, 2j+1 in the HIGH one.
  torch has almost no ops on that dtype, so all bit work goes through `.view(torch.uint8)`.
- FP8 block scales are `torch.float8_e4m3fn`; every cast to it is preceded by a clamp to [-448, 448] because torch
  turns overflow into NaN while device casts saturate.
- Layout-op / grouped offsets are int32 START offsets (exclusive prefix sums, one entry per group).
"""

from __future__ import annotations

from typing import Sequence, Tuple, Union

import torch

FLOAT4_E2M1_MAX = 6.0
FLOAT8_E4M3_MAX = 448.0
FLOAT8_E4M3_EPS = 2.0**-6  # smallest normal e4m3 value: the reference order's lower clamp for block scales
FLOAT32_MAX = torch.finfo(torch.float32).max

_FP4_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Decision thresholds between consecutive magnitudes. A strict ">" at a midpoint sends the tie down and ">=" sends
# it up; they alternate so that every tie lands on the even code (0.25 -> 0, 0.75 -> 2, 1.25 -> 2, 1.75 -> 4,
# 2.5 -> 4, 3.5 -> 6, 5 -> 6), which is exactly round-to-nearest-even in E2M1.
_FP4_THRESHOLDS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))

GlobalScale = Union[None, float, torch.Tensor]


# --------------------------------------------------------------------------------------------------------------
# FP4 E2M1 codes and packing
# --------------------------------------------------------------------------------------------------------------


def _fp4_table(device) -> torch.Tensor:
    # Code 8 is -0.0 so that decode keeps the sign bit (encode(-0.0) == 8 round trips to -0.0).
    vals = list(_FP4_MAGNITUDES) + [-v for v in _FP4_MAGNITUDES]
    return torch.tensor(vals, dtype=torch.float32, device=device)


def fp4_encode(x: torch.Tensor) -> torch.Tensor:
    """Encode values as FP4 E2M1 codes (uint8 in 0..15, same shape as ``x``).

    Round to nearest, ties to the even code, saturating at +-6 (so +-inf -> +-6). The sign bit is the input's sign
    bit, so -0.1 and -0.0 both encode as 0x8. NaN has no FP4 encoding: it becomes code 0 with NaN's sign bit
    (all comparisons with NaN are false); the kernels reproduce this quirk.
    """
    if not (x.is_floating_point() or x.dtype in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)):
        raise TypeError(f"fp4_encode: expected a real tensor, got {x.dtype}")
    # float64 is compared as is (rounding it to fp32 first could move a value across a threshold); the other
    # float dtypes convert to fp32 exactly, and the thresholds are exact in every float dtype.
    xf = x if x.dtype in (torch.float32, torch.float64) else x.to(torch.float32)
    a = xf.abs()
    code = torch.zeros(x.shape, dtype=torch.uint8, device=x.device)
    for t, inclusive in _FP4_THRESHOLDS:
        code += (a >= t if inclusive else a > t).to(torch.uint8)
    return code | (torch.signbit(xf).to(torch.uint8) << 3)


def fp4_decode(codes: torch.Tensor) -> torch.Tensor:
    """Decode FP4 E2M1 codes (uint8, 0..15) to float32 values of the same shape (code 8 is -0.0)."""
    if codes.dtype != torch.uint8:
        raise TypeError(f"fp4_decode: expected uint8 codes, got {codes.dtype}")
    # A table lookup, not arithmetic: an out-of-range code fails loudly in the indexing instead of decoding to junk.
    return _fp4_table(codes.device)[codes.long()]


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """Pack uint8 FP4 codes ``[..., K]`` (K even, any strides) into ``float4_e2m1fn_x2`` ``[..., K/2]``.

    Element 2j goes to the low nibble and 2j+1 to the high nibble of byte j, as CUTLASS and torch expect.
    Codes must be in 0..15 (only the dtype is checked: a value check would need a device-to-host sync).
    """
    if codes.dtype != torch.uint8:
        raise TypeError(f"pack_fp4: expected uint8 codes, got {codes.dtype}")
    if codes.dim() == 0 or codes.shape[-1] % 2 != 0:
        raise ValueError(f"pack_fp4: the last dim must be even, got shape {tuple(codes.shape)}")
    packed = (codes[..., 1::2] << 4) | codes[..., 0::2]  # strided slices: works for any input strides
    return packed.contiguous().view(torch.float4_e2m1fn_x2)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """Unpack ``float4_e2m1fn_x2`` (or its uint8 bytes) ``[..., K/2]`` into uint8 codes ``[..., K]`` (contiguous)."""
    if packed.dtype not in (torch.float4_e2m1fn_x2, torch.uint8):
        raise TypeError(f"unpack_fp4: expected float4_e2m1fn_x2 (or uint8 bytes), got {packed.dtype}")
    if packed.dim() == 0:
        raise ValueError("unpack_fp4: expected at least one dim")
    b = packed.view(torch.uint8)  # same element size: a dtype view is legal for any strides
    codes = torch.stack((b & 0xF, b >> 4), dim=-1)
    return codes.reshape(*b.shape[:-1], b.shape[-1] * 2)


def to_fp4(x: torch.Tensor) -> torch.Tensor:
    """Round ``x`` ``[..., K]`` to FP4 (RNE, saturating) and pack it: ``float4_e2m1fn_x2`` ``[..., K/2]``."""
    return pack_fp4(fp4_encode(x))


def from_fp4(packed: torch.Tensor) -> torch.Tensor:
    """Unpack and decode ``float4_e2m1fn_x2`` ``[..., K/2]`` to float32 ``[..., K]``."""
    return fp4_decode(unpack_fp4(packed))


# --------------------------------------------------------------------------------------------------------------
# Block quantization
# --------------------------------------------------------------------------------------------------------------


def _global_scale_tensor(global_scale: GlobalScale, device, fn: str) -> torch.Tensor:
    """gs as a 0-dim fp32 tensor on ``device`` (None means 1.0: no global scaling)."""
    if global_scale is None:
        return torch.ones((), dtype=torch.float32, device=device)
    if isinstance(global_scale, torch.Tensor):
        if global_scale.numel() != 1:
            raise ValueError(f"{fn}: global_scale must hold one value, got shape {tuple(global_scale.shape)}")
        return global_scale.reshape(()).to(device=device, dtype=torch.float32)
    return torch.tensor(float(global_scale), dtype=torch.float32, device=device)


def _blocks(x: torch.Tensor, block_size: int, fn: str) -> torch.Tensor:
    """``x`` ``[..., K]`` as fp32 ``[..., K/bs, bs]`` after checking the shape."""
    if not x.is_floating_point() or x.element_size() == 1:
        raise TypeError(f"{fn}: expected a Float, BFloat16 or Half tensor, got {x.dtype}")
    if block_size <= 0 or block_size % 2 != 0:
        raise ValueError(f"{fn}: block_size must be a positive even number, got {block_size}")
    if x.dim() == 0 or x.shape[-1] % block_size != 0:
        raise ValueError(f"{fn}: the last dim must be a multiple of block_size={block_size}, got {tuple(x.shape)}")
    return x.to(torch.float32).reshape(*x.shape[:-1], x.shape[-1] // block_size, block_size)


def _to_e4m3(s: torch.Tensor) -> torch.Tensor:
    # Saturating cast as on the device: torch's own cast would turn overflow into NaN. NaN stays NaN.
    return s.clamp(-FLOAT8_E4M3_MAX, FLOAT8_E4M3_MAX).to(torch.float8_e4m3fn)


def _fp4_max(device) -> torch.Tensor:
    """6.0 as a 0-dim tensor: CUDA torch computes ``tensor / python_float`` as a multiplication by the fp32
    reciprocal, one ulp off an IEEE division for some values (enough to move an e4m3 scale across a rounding
    midpoint); dividing by a tensor is a true division on every device, as in the spec and the kernels."""
    return torch.tensor(FLOAT4_E2M1_MAX, dtype=torch.float32, device=device)


def quantize_nvfp4(
    x: torch.Tensor, global_scale: GlobalScale = None, block_size: int = 16
) -> Tuple[torch.Tensor, torch.Tensor]:
    """NVFP4-quantize ``x`` ``[..., K]`` in the spec's REFERENCE order; returns (packed ``[..., K/2]``,
    e4m3 scales ``[..., K/bs]``).

    Per block of ``block_size`` values v (all in fp32):
    1. s_g = (max|v| / 6) * gs;
    2. clamp s_g to [2^-6, 448] (no zero scale, no division by zero, no NaN from torch's fp8 cast);
    3. the stored scale is e4m3(s_g);
    4. the data is divided by s_g / gs using the UNROUNDED fp32 s_g, not the fp8 value that is stored;
    5. clamp to +-6 and round to nearest even in E2M1.
    This is nvFuser's decomposed in-fusion quantization (docs/nvfp4.md, "Quantization orders"; upstream #5345).
    Because step 4 ignores the fp8 rounding of the scale, it can differ from the fused ops (`quantize_nvfp4_fused`)
    by one FP4 ulp.
    ``global_scale`` is an ENCODE multiplier (typically 448*6/amax(|x|)); None means 1.
    """
    blocks = _blocks(x, block_size, "quantize_nvfp4")
    gs = _global_scale_tensor(global_scale, x.device, "quantize_nvfp4")
    s_g = (blocks.abs().amax(dim=-1) / _fp4_max(x.device)) * gs
    s_g = s_g.clamp(FLOAT8_E4M3_EPS, FLOAT8_E4M3_MAX)
    scales = s_g.to(torch.float8_e4m3fn)  # already inside [-448, 448]: torch's cast cannot overflow here
    data = (blocks / (s_g / gs).unsqueeze(-1)).clamp(-FLOAT4_E2M1_MAX, FLOAT4_E2M1_MAX)
    return to_fp4(data.reshape(x.shape)), scales


def quantize_nvfp4_fused(
    x: torch.Tensor, global_scale: GlobalScale = None, block_size: int = 16
) -> Tuple[torch.Tensor, torch.Tensor]:
    """NVFP4-quantize ``x`` ``[..., K]`` in the FUSED ops' order (what ``nv_block_quantize`` and
    ``nv_grouped_block_quantize`` compute); returns (packed ``[..., K/2]``, e4m3 scales ``[..., K/bs]``).

    Per block, all in fp32, with exactly these roundings (the Triton kernels must do the same operations):
    1. s_g = min((max|v| / 6) * gs, fp32max)   (two roundings: the division, then the product; no lower clamp);
    2. scale = e4m3(clamp(s_g, -448, 448))     (saturating cast, RNE);
    3. r = gs / float(scale), one fp32 division per block;
    4. data = clamp(v * r, -6, 6), rounded to nearest even in E2M1.
    Choice for a zero scale (a block whose s_g rounds below e4m3's smallest subnormal, e.g. an all-zero block):
    r is 0 instead of gs/0 = inf, so the data become +-0 (v * 0 keeps v's sign: negative values give code 8) rather
    than NaN. Dividing by the ROUNDED scale is why this can differ from `quantize_nvfp4` by one FP4 ulp.
    """
    blocks = _blocks(x, block_size, "quantize_nvfp4_fused")
    gs = _global_scale_tensor(global_scale, x.device, "quantize_nvfp4_fused")
    s_g = torch.clamp_max((blocks.abs().amax(dim=-1) / _fp4_max(x.device)) * gs, FLOAT32_MAX)
    scales = _to_e4m3(s_g)
    scale_f = scales.to(torch.float32)
    r = torch.where(scale_f == 0, torch.zeros_like(scale_f), gs / scale_f)
    data = (blocks * r.unsqueeze(-1)).clamp(-FLOAT4_E2M1_MAX, FLOAT4_E2M1_MAX)
    return to_fp4(data.reshape(x.shape)), scales


def dequantize_nvfp4(
    packed: torch.Tensor,
    scales: torch.Tensor,
    global_scale: GlobalScale = None,
    block_size: int = 16,
    *,
    swizzled: bool = False,
) -> torch.Tensor:
    """Dequantize NVFP4 data: float32 ``[..., K]`` = fp4(code) * (float(scale[..., k // bs]) / gs).

    ``packed`` is ``float4_e2m1fn_x2`` ``[..., K/2]``; ``scales`` e4m3 ``[..., K/bs]`` (linear) or, with
    ``swizzled=True``, a 2-D 128x4-swizzled ``[roundup(M,128), roundup(K/bs,4)]`` buffer that is un-swizzled and
    cropped first (a flag rather than shape sniffing: when M % 128 == 0 and (K/bs) % 4 == 0 both shapes agree).
    The factor scale/gs is formed first, as upstream's ``dequantize_to_dtype`` does (fp32 rounding order matters
    for bit-exact comparisons). ``global_scale`` is the encode multiplier used at quantization (None = 1).
    """
    vals = from_fp4(packed)
    k = vals.shape[-1]
    if k % block_size != 0:
        raise ValueError(f"dequantize_nvfp4: K={k} is not a multiple of block_size={block_size}")
    if swizzled:
        if vals.dim() != 2:
            raise ValueError("dequantize_nvfp4: swizzled scales need 2-D data")
        scales = swizzled_to_linear_128_4(scales, vals.shape[0], k // block_size)
    expected = (*vals.shape[:-1], k // block_size)
    if tuple(scales.shape) != expected:
        raise ValueError(f"dequantize_nvfp4: scales have shape {tuple(scales.shape)}, expected {expected}")
    gs = _global_scale_tensor(global_scale, packed.device, "dequantize_nvfp4")
    factor = scales.to(torch.float32) / gs
    blocks = vals.reshape(*expected, block_size) * factor.unsqueeze(-1)
    return blocks.reshape(vals.shape)


# --------------------------------------------------------------------------------------------------------------
# 128x4 swizzle (single group)
# --------------------------------------------------------------------------------------------------------------


def _round_up(a: int, b: int) -> int:
    return (a + b - 1) // b * b


_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The same bytes as an integer dtype: copies and scatters of fp8/fp4 are then bit-exact and always supported."""
    return t.view(_INT_OF_SIZE[t.element_size()])


def _zeros_like_dtype(shape, dtype, device) -> torch.Tensor:
    return torch.zeros(shape, dtype=_INT_OF_SIZE[torch.empty((), dtype=dtype).element_size()], device=device).view(
        dtype
    )


def linear_to_swizzled_128_4(s: torch.Tensor) -> torch.Tensor:
    """Swizzle a block-scale matrix ``[m, k]`` into CUTLASS's 128x4 tile order: ``[roundup(m,128), roundup(k,4)]``.

    Zero-pad to [R, pk], view as [R/128, 4, 32, pk/4, 4], swap axes 1 and 3, make contiguous. Within a 128x4 tile,
    row a*32+b, column d lands at b*16 + a*4 + d; tiles of one 128-row band are 512 elements apart along k. The
    padding is zero (upstream's test helper leaves it uninitialised) so results are deterministic.
    """
    if s.dim() != 2:
        raise ValueError(f"linear_to_swizzled_128_4: expected a 2-D tensor, got shape {tuple(s.shape)}")
    m, k = s.shape
    rows, pk = _round_up(m, 128), _round_up(k, 4)
    padded = _zeros_like_dtype((rows, pk), s.dtype, s.device)
    _bits(padded)[:m, :k] = _bits(s)
    tiles = _bits(padded).view(rows // 128, 4, 32, pk // 4, 4).permute(0, 3, 2, 1, 4)
    return tiles.contiguous().view(rows, pk).view(s.dtype)


def swizzled_to_linear_128_4(sw: torch.Tensor, m: int, k: int) -> torch.Tensor:
    """Inverse of `linear_to_swizzled_128_4`: un-swizzle ``[R, pk]`` and crop to a contiguous ``[m, k]``."""
    if sw.dim() != 2 or sw.shape[0] % 128 != 0 or sw.shape[1] % 4 != 0:
        raise ValueError(f"swizzled_to_linear_128_4: expected [multiple of 128, multiple of 4], got {tuple(sw.shape)}")
    rows, pk = sw.shape
    if not (0 <= m <= rows and 0 <= k <= pk):
        raise ValueError(f"swizzled_to_linear_128_4: crop [{m}, {k}] does not fit in {tuple(sw.shape)}")
    # Through the integer bits: reshape may copy, and copies of fp8/fp4 dtypes are not supported everywhere.
    tiles = _bits(sw).reshape(rows // 128, pk // 4, 32, 4, 4).permute(0, 3, 2, 1, 4)
    return tiles.reshape(rows, pk)[:m, :k].contiguous().view(sw.dtype)


# --------------------------------------------------------------------------------------------------------------
# Grouped block-scale layout (preprocess_grouped_matmul_input_sf, the "layout op")
# --------------------------------------------------------------------------------------------------------------


def _check_offsets(input_offsets: torch.Tensor, output_offsets: torch.Tensor, fn: str) -> int:
    for name, off in (("input_offsets", input_offsets), ("output_offsets", output_offsets)):
        if not isinstance(off, torch.Tensor) or off.dim() != 1 or off.dtype.is_floating_point:
            raise TypeError(f"{fn}: {name} must be a 1-D integer tensor")
    g = input_offsets.numel()
    if g == 0 or output_offsets.numel() != g:
        raise ValueError(
            f"{fn}: need g >= 1 groups and as many output_offsets as input_offsets, got "
            f"{g} and {output_offsets.numel()}"
        )
    return g


def grouped_buffer_numel(m: int, k: int, g: int) -> int:
    """Elements of the layout-op allocation: (m + 127*g) rows (worst-case padding) of roundup(k, 4) columns."""
    return (m + 127 * g) * _round_up(k, 4)


def grouped_scale_index(input_offsets: torch.Tensor, output_offsets: torch.Tensor, m: int, k: int) -> torch.Tensor:
    """int64 ``[m, k]``: the flat buffer position of each element (r, c) of the layout op's input.

    e = the largest i with input_offsets[i] <= r (the kernel's scan of i = 1..g-1 that stops at the first
    r < input_offsets[i]; empty groups are skipped because equal offsets all satisfy <=), lr = r - input_offsets[e]:
        output_offsets[e]*pk + (lr//128)*128*pk + (c//4)*512 + (lr%32)*16 + ((lr%128)//32)*4 + c%4.
    Offsets are trusted as the op trusts them (validation belongs to the ops layer).
    """
    _check_offsets(input_offsets, output_offsets, "grouped_scale_index")
    device = input_offsets.device
    pk = _round_up(k, 4)
    inp = input_offsets.to(torch.int64)
    out = output_offsets.to(device=device, dtype=torch.int64)
    r = torch.arange(m, dtype=torch.int64, device=device)
    # Counting the entries of input_offsets[1:] that are <= r is the scan above (for non-decreasing offsets).
    e = torch.searchsorted(inp[1:].contiguous(), r, right=True)
    lr = (r - inp[e]).unsqueeze(1)
    c = torch.arange(k, dtype=torch.int64, device=device).unsqueeze(0)
    return (
        out[e].unsqueeze(1) * pk
        + (lr // 128) * 128 * pk
        + (c // 4) * 512
        + (lr % 32) * 16
        + ((lr % 128) // 32) * 4
        + c % 4
    )


def preprocess_grouped_matmul_input_sf(
    input: torch.Tensor, input_offsets: torch.Tensor, output_offsets: torch.Tensor
) -> torch.Tensor:
    """Reference of ``fd.ops.preprocess_grouped_matmul_input_sf``: scatter block scales ``[m, k]`` (any dtype) into
    the grouped, padded, 128x4-swizzled buffer.

    The buffer is a ZERO-filled 1-D storage of (m + 127*g) * roundup(k,4) elements (upstream leaves padding
    uninitialised; a NaN scale times zero data would be NaN). Only the m*k real elements are written, at
    `grouped_scale_index`. The result is ``torch.as_strided(storage, (m, k), (k, 1))``: the op's logical shape,
    with strides that do NOT describe the data; consumers read the storage (``data_ptr()``), e.g. through
    `grouped_scales_to_linear` or ``torch.as_strided(out, (m + 127*g, pk), (pk, 1))``.
    """
    if input.dim() != 2:
        raise ValueError(f"preprocess_grouped_matmul_input_sf: input must be 2-D, got {tuple(input.shape)}")
    m, k = input.shape
    g = _check_offsets(input_offsets, output_offsets, "preprocess_grouped_matmul_input_sf")
    storage = _zeros_like_dtype((grouped_buffer_numel(m, k, g),), input.dtype, input.device)
    idx = grouped_scale_index(input_offsets.to(input.device), output_offsets.to(input.device), m, k)
    _bits(storage)[idx.reshape(-1)] = _bits(input).reshape(-1)
    return torch.as_strided(storage, (m, k), (k, 1))


def grouped_scales_to_linear(
    out: torch.Tensor, input_offsets: torch.Tensor, output_offsets: torch.Tensor
) -> torch.Tensor:
    """Inverse of `preprocess_grouped_matmul_input_sf`: gather the op's returned tensor back to a contiguous
    ``[m, k]``. ``out`` must be the returned tensor (its storage, from its storage offset, holds the buffer)."""
    if out.dim() != 2:
        raise ValueError(f"grouped_scales_to_linear: expected the layout op's [m, k] result, got {tuple(out.shape)}")
    m, k = out.shape
    g = _check_offsets(input_offsets, output_offsets, "grouped_scales_to_linear")
    numel = grouped_buffer_numel(m, k, g)
    available = out.untyped_storage().nbytes() // out.element_size() - out.storage_offset()
    if available < numel:
        raise ValueError(
            f"grouped_scales_to_linear: the storage holds {available} elements from the tensor's start, the "
            f"layout-op buffer needs {numel}: pass the op's returned tensor, not a plain [m, k] copy"
        )
    buffer = torch.as_strided(out, (numel,), (1,))
    idx = grouped_scale_index(input_offsets.to(out.device), output_offsets.to(out.device), m, k)
    return _bits(buffer)[idx].view(out.dtype)


def grouped_quantize_nvfp4(
    x: torch.Tensor,
    input_offsets: torch.Tensor,
    output_offsets: torch.Tensor,
    global_scale: GlobalScale = None,
    block_size: int = 16,
    fused: bool = True,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Reference of ``nv_grouped_block_quantize``: quantize ``x`` ``[M, K]`` and lay the e4m3 scales out as the
    layout op does. Returns (packed ``[M, K/2]``, layout-op-style scale tensor: logical ``[M, K/bs]`` over the
    zero-padded grouped buffer).

    Quantization is row-local with one global scale, so quantizing all rows at once equals quantizing each group.
    ``fused=True`` uses the fused ops' order (`quantize_nvfp4_fused`, what the kernel computes); False the spec's
    reference order (`quantize_nvfp4`).
    """
    if x.dim() != 2:
        raise ValueError(f"grouped_quantize_nvfp4: x must be 2-D [M, K], got {tuple(x.shape)}")
    quantize = quantize_nvfp4_fused if fused else quantize_nvfp4
    packed, scales = quantize(x, global_scale, block_size)
    return packed, preprocess_grouped_matmul_input_sf(scales, input_offsets, output_offsets)


# --------------------------------------------------------------------------------------------------------------
# NVFP4 grouped GEMM (cutlass_nvfp4_grouped_mm)
# --------------------------------------------------------------------------------------------------------------


def _ints(t: Union[torch.Tensor, Sequence[int]]) -> list:
    return t.tolist() if isinstance(t, torch.Tensor) else list(t)


def nvfp4_grouped_mm(
    mat1: torch.Tensor,
    mat2: torch.Tensor,
    scale1: torch.Tensor,
    scale2: torch.Tensor,
    alpha: torch.Tensor,
    problem_sizes: torch.Tensor,
    expert_offsets: torch.Tensor,
    sf_offsets: torch.Tensor,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """Reference of ``fd.ops.cutlass_nvfp4_grouped_mm`` with its run-time operands; returns ``[M, N]`` contiguous.

    - mat1: packed FP4 ``[M, K/2]`` (tokens grouped by expert).
    - mat2: packed FP4 as the op receives it: ``[G, K/2, N]`` with strides ``[N*K/2, 1, K/2]``, i.e. a ``[G, N, K/2]``
      weight transposed; any strides work here since it is read through ``transpose(-1, -2)``.
    - scale1: e4m3, either the layout op's result (logical ``[M, K/16]`` over the grouped buffer) or a plain
      ``[sum R_i, K/16]`` tensor; both are read as the buffer that starts at the tensor's first element with row
      pitch K/16 (K % 64 == 0, so K/16 is already a multiple of 4). Group i is rows [sf_i, sf_i + R_i), swizzled.
    - scale2: e4m3 ``[G, roundup(N,128), K/16]``, each slice 128x4-swizzled (= ``[G, N, K/16]`` when N % 128 == 0).
    - alpha: fp32 ``[G]``; problem_sizes: int ``[G, 3]`` rows (m_i, N, K); expert_offsets, sf_offsets: int ``[G]``
      start offsets (exclusive prefix sums of m_i and of roundup(m_i, 128)).
    out[e_i : e_i + m_i] = alpha[i] * (A_i @ B_i) with A_i, B_i dequantized in fp32 (fp4 * e4m3 is exact in fp32),
    an fp32 matmul and one final rounding to ``out_dtype``. Rows no group covers are zero. Host syncs are fine here:
    this is the oracle, not the kernel.
    """
    if mat1.dim() != 2 or mat2.dim() != 3:
        raise ValueError(f"nvfp4_grouped_mm: mat1 must be [M, K/2] and mat2 [G, K/2, N], got "
                         f"{tuple(mat1.shape)} and {tuple(mat2.shape)}")
    m_total, k = mat1.shape[0], mat1.shape[1] * 2
    g, n = mat2.shape[0], mat2.shape[2]
    if mat2.shape[1] * 2 != k:
        raise ValueError(f"nvfp4_grouped_mm: mat2's K/2 is {mat2.shape[1]}, mat1's is {mat1.shape[1]}")
    if k % 64 != 0:
        raise ValueError(f"nvfp4_grouped_mm: K must be a multiple of 64, got {k}")
    sk = k // 16
    n_rows = _round_up(n, 128)
    if scale2.dim() != 3 or tuple(scale2.shape) != (g, n_rows, sk):
        raise ValueError(f"nvfp4_grouped_mm: scale2 must be [G, roundup(N,128), K/16] = {(g, n_rows, sk)}, "
                         f"got {tuple(scale2.shape)}")
    sizes = [list(map(int, row)) for row in _ints(problem_sizes)]
    e_offs, sf_offs = _ints(expert_offsets), _ints(sf_offsets)
    alphas = alpha.to(torch.float32).reshape(-1)
    if len(sizes) != g or len(e_offs) != g or len(sf_offs) != g or alphas.numel() != g:
        raise ValueError(f"nvfp4_grouped_mm: problem_sizes, offsets and alpha must have G={g} entries")

    a_vals = from_fp4(mat1)  # [M, K]
    b_vals = from_fp4(mat2.transpose(-1, -2))  # [G, N, K]
    scale1_base = scale1.storage_offset()
    scale1_numel = scale1.untyped_storage().nbytes() // scale1.element_size()
    out = torch.zeros((m_total, n), dtype=torch.float32, device=mat1.device)
    for i, ((m_i, n_i, k_i), e_i, sf_i) in enumerate(zip(sizes, e_offs, sf_offs)):
        if (n_i, k_i) != (n, k):
            raise ValueError(f"nvfp4_grouped_mm: problem_sizes[{i}] = {(m_i, n_i, k_i)} disagrees with N={n}, K={k}")
        if m_i == 0:
            continue
        rows = _round_up(m_i, 128)
        start = scale1_base + sf_i * sk
        if start + rows * sk > scale1_numel or e_i + m_i > m_total:
            raise ValueError(f"nvfp4_grouped_mm: group {i} (m_i={m_i}, e_i={e_i}, sf_i={sf_i}) is out of bounds")
        s1 = swizzled_to_linear_128_4(torch.as_strided(scale1, (rows, sk), (sk, 1), start), m_i, sk)
        s2 = swizzled_to_linear_128_4(scale2[i], n, sk)
        a_i = a_vals[e_i:e_i + m_i] * s1.to(torch.float32).repeat_interleave(16, dim=1)
        b_i = b_vals[i] * s2.to(torch.float32).repeat_interleave(16, dim=1)  # [N, K]
        out[e_i:e_i + m_i] = (a_i @ b_i.t()) * alphas[i]
    return out.to(out_dtype)
