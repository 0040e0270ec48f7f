"""Hand-written Triton kernels for the NVFP4 layout op and the fused block quantizations.

Three launchers, each with the same contract as its pure-torch counterpart in ``reference.py`` (bit-exact):

- ``layout_op(input, input_offsets, output_offsets)``            == reference.preprocess_grouped_matmul_input_sf
- ``block_quantize(x, global_scale, swizzle, block_size)``        == reference.quantize_nvfp4_fused (+ the single-
  group 128x4 swizzle of the scales when ``swizzle``)
- ``grouped_block_quantize(x, input_offsets, output_offsets, ...)`` == reference.grouped_quantize_nvfp4(fused=True),
  quantization and the grouped scale layout in ONE kernel.

No launcher synchronizes with the device: launch shapes depend only on m, k and g (the number of groups), never on
the offsets' values, and ``global_scale`` is read by the kernel. So everything but the pointers depends only on the
arguments' metadata: :class:`LayoutOp` and :class:`BlockQuantize` hold one launch prepared for it (the ops'
kernels keep one per input signature, OpDef.prepare); the functions above prepare and call one.

The offsets' device check (ops/offset_checks.py) needs no launch of its own for the prepared layout op and grouped
quantize: given the check (``check=``), they also bind the launch with constexpr CHECK, whose first program ORs
``group_offsets_check.group_offsets_bits`` into the call's flag (``PreparedGroupCheck.device_flag``) before its own
work. A call that checks on the device launches that variant; with checks off or done on the host, the plain one.
With nothing to launch (no columns) the prepared op launches the check on its own.

Layout op: OUTPUT-driven. Each program owns a [rows x columns] tile of the padded, swizzled buffer (a contiguous
range of it when the tile spans whole buffer rows), finds for every position the input element it holds (or that it
is padding) and writes it: every byte of the buffer is written exactly once, in wide contiguous stores, so there is
no separate zero fill. The input side is a gather, but the input is small (the scales are 1/16 of the activations)
and each 4-column unit of a row moves as one integer load. On the H200, e4m3 [16384, 256], g=8: 4.5 us of GPU
time, 0.7x a copy_ of the same bytes; the input-driven scatter it replaces (4 of every 16 bytes per program, after
a memset of the whole buffer) took 16 us. At this size a call's wall time is the host's launch work (40-70 us,
Triton's launch included), not the kernel.

Group lookups are branch-free binary searches with a FIXED number of steps, ceil(log2(g)), a compile-time
constant: the layout op looks up each buffer row's group in ``output_offsets`` (the slabs are disjoint and in
order, so the group is the last one starting at or before the row); the quantize kernel looks up each input row's
group in ``input_offsets`` (the largest e with ``input_offsets[e] <= row``, the upstream scan's answer, empty groups
included). A loop over g would cost g loads per row; MoE layers have up to a few hundred experts. Up to 16 groups
the quantize compares each row with every offset instead (``_group_starts_scan``: g - 1 independent loads, then
two at the group found, where the search's loads each wait for the one before), after its first tile's encoding,
so that nothing of the lookup is scheduled ahead of the program's loads of x.

Bounds: the offsets are trusted (upstream never checks them; the ops layer can), but every load and store stays
inside its tensor whatever the offsets hold, so bad offsets give wrong values, never memory corruption. Input rows
before ``input_offsets[0]`` belong to no group and are not placed.

Quantize kernel, per 16-element block: the fused ops' scale math exactly as the reference does it (fp32 IEEE
divisions with ``tl.div_rn``: Triton's plain ``/`` is the approximate ``div.full.f32`` on NVIDIA GPUs; a NaN-
propagating block max like torch.amax). The per-ELEMENT instruction count matters: the previous kernel issued ~48
per element (threshold compares on uint8, a layout shuffle through shared memory for the nibble packing, block math
repeated by the two threads sharing a block), about its whole 125 us at [16384, 4096]; this one ~16 (64 us, 63% of
copy bandwidth). On the GPU the fast encoding's codes and sign bits are packed 4 pairs to a 32-bit word by
``FP4_PACK_PTX`` (inline PTX: multiply-adds for the codes, byte permutes for the signs; 2 instructions per element
against 4.4), and a program's tiles along K share one division by k_tiles: compiled for sm_90, about 16
instructions per element of x for the plain and swizzled layouts and 17.0 for the grouped one (18.7, 18.7 and
19.5 before). Two encodings, bit-identical on the values they are used for:
- exact (``_fp4_code_exact``): the 7 rounding thresholds, correct for every fp32 value (NaN, inf, > 6);
- fast (``_fp4_code_fast``): round-to-nearest-even on a piecewise-linear map of |v| using the fp32 adder
  (see there), about half the instructions, correct for finite |v| < 7. A tile uses it when every block in it is
  "tame": its fp8 scale is zero or a normal e4m3 value that did not saturate, and its multiplier is finite; then
  |v| <= 6 * (1 + 2^-4) and nothing is NaN (see ``_quantize_tile``). Tiles with a NaN, an inf, a saturated or
  subnormal scale take the exact path.
bf16/f16/f32 rows with unit stride are read as pairs of elements packed in one integer (16-byte loads, the pair
split with bit operations); other strides load element by element. A program may quantize several consecutive
tiles, issuing the next tile's loads before computing the current one (``tiles``, see ``quantize_config``).
"""

from __future__ import annotations


import torch
import triton
import triton.language as tl

from ..codegen.interpreter_compat import interpreting
from ..codegen.kernel_builder import COMPILE_OPTIONS
from ..codegen.launcher import bound_launch, cdiv, next_pow2, triton_usable
from ..codegen.plan import sm_count
from ..codegen.prologue import LoadPrologue
from ..ops import narrow_precision as ops
from ..ops.offset_checks import PreparedGroupCheck
from ..ops.common import round_up
from ..ops.registry import attach
from .group_offsets_check import fused_check_args, group_offsets_bits, or_into_flags

# constexpr: jitted code may only read globals that are constexpr (the interpreter does not enforce it).
FLOAT4_E2M1_MAX = tl.constexpr(6.0)
FLOAT8_E4M3_MAX = tl.constexpr(448.0)
FLOAT8_E4M3_MIN_NORMAL = tl.constexpr(2.0**-6)
FLOAT32_MAX = tl.constexpr(3.4028234663852886e38)
INT32_MAX = tl.constexpr(2**31 - 1)
# 1.5 * 2**23: for 0 <= y < 2**22, the fp32 sum y + MAGIC is y rounded to an integer (nearest, ties to even),
# and that integer is the sum's bit pattern minus MAGIC's.
RNE_MAGIC = tl.constexpr(12582912.0)
RNE_MAGIC_BITS = tl.constexpr(0x4B400000)

# The grouped quantize looks its rows' groups up by comparing them with every offset up to 2**SCAN_LOG2_G_MAX
# groups (_group_starts_scan), by a binary search beyond (_group_of).
SCAN_LOG2_G_MAX = tl.constexpr(4)

# Registers per thread of the quantize kernel (without a load prologue). Uncapped, ptxas takes 87-91 (allocated 88-96:
# 10-11 two-warp programs per SM); at 80 there are no spills and 12 fit. H200, bf16 [16384, 4096], GPU time in CUDA
# graphs (benchmarks/results/2026-12-03-quantize-layouts-run3.md): plain 49.7 -> 47.3 us, swizzled 49.8 -> 49.5,
# grouped 51.9 -> 51.3. At 72 it spills.
QUANTIZE_MAX_REGISTERS = 80

# The layout op asks L2 for its whole input first (_prefetch_input_share) when its grid is one wave (at most one
# program per multiprocessor: the launch's time is then latency, two DRAM trips in a row) and the input's memory
# span is at most this many bytes. benchmarks/ab_layout_prefetch.py, e4m3 [m, 256], g=8, H100: decode (m=128, 36
# programs) 5.98 -> 5.28 us, 1.19x -> 1.05x a copy of its bytes; prefill (m=16384, 544 programs, bandwidth-bound)
# 8.29 -> 9.34 us with it, so it stays off there.
LAYOUT_PREFETCH_MAX_BYTES = 1 << 20

# Scale layouts of the quantize kernel (constexpr SCALE_LAYOUT).
_PLAIN, _SWIZZLED, _GROUPED = 0, 1, 2
# How the quantize kernel stores swizzled scales (constexpr SCALE_STORE; the row-major layout always takes bytes):
# one byte per block; the 4 blocks whose scales the swizzle makes contiguous as one 32-bit word; words, from tiles
# whose rows are interleaved within 128-row blocks (see _tile_coords). Bit-identical; which is fastest is measured
# by benchmarks/ab_quantize_layouts.py.
SCALE_BYTES, SCALE_WORDS, SCALE_WORDS_INTERLEAVED = 0, 1, 2
# How the quantize kernel reads x (constexpr X_FORMAT): element by element in x's dtype, or each pair of
# neighbouring elements as one integer (element 2j in the low half, as memory is little-endian).
_X_ELEMENTS, _X_BF16_PAIRS, _X_F16_PAIRS, _X_F32_PAIRS = 0, 1, 2, 3
_PAIR_FORMAT = {torch.bfloat16: _X_BF16_PAIRS, torch.float16: _X_F16_PAIRS, torch.float32: _X_F32_PAIRS}

_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_QUANT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_INT32_LIMIT = 2**31


# ----------------------------------------------------------------------------------------------------------------
# Shared device helpers
# ----------------------------------------------------------------------------------------------------------------

@triton.jit
def _group_of(vals, offsets_ptr, g, LOG2_G: tl.constexpr):
    """Largest e in [0, g) with offsets[e] <= val (0 when none), for non-decreasing offsets: binary lifting with
    LOG2_G fixed steps."""
    e = tl.zeros_like(vals).to(tl.int32)
    for i in tl.static_range(LOG2_G):
        cand = e + (1 << (LOG2_G - 1 - i))
        in_range = cand < g
        start = tl.load(offsets_ptr + cand, mask=in_range, other=0)
        e = tl.where(in_range & (start <= vals), cand, e)
    return e


@triton.jit
def _group_starts_scan(rows, in_offsets_ptr, out_offsets_ptr, g, G: tl.constexpr):
    """(input_offsets[e], output_offsets[e]) of each row's group e, the last e in [0, g) whose input offset is <=
    the row (0 when none): the same as ``_group_of`` and two loads of e for non-decreasing offsets. The G - 1
    input offsets past the first are loaded by independent (uniform) loads, offsets past g as INT32_MAX (above
    every row, so never taken: no second mask), and each is compared with every row, keeping the index; then the
    two starts are loaded at it (in bounds: e < g). The binary search's ceil(log2(g)) dependent loads, then two
    more, kept each program's loads of x waiting (~5 us of the grouped quantize's 57.7 at bf16 [16384, 4096],
    g=8, on the H200); selecting both starts at every step instead of the index cost 2 loads, 2 compares and 2
    selects per offset where this takes 1 of each. For small g only (SCAN_LOG2_G_MAX): the work grows with g."""
    e = tl.zeros_like(rows).to(tl.int32)
    for j in tl.static_range(1, G):
        if 2 * j <= G:  # (G = 2**ceil(log2(g)): g > G/2, so these are in bounds)
            start = tl.load(in_offsets_ptr + j)
        else:
            start = tl.load(in_offsets_ptr + j, mask=j < g, other=INT32_MAX)
        e = tl.where(start <= rows, j, e)
    return tl.load(in_offsets_ptr + e), tl.load(out_offsets_ptr + e)


@triton.jit
def _offsets_check(flags_ptr, in_offsets_ptr, out_offsets_ptr, g, check_m, check_capacity,
                   EVERY_ROW: tl.constexpr, BLOCK: tl.constexpr):
    """The call's device check of the offsets (group_offsets_check.py: the bits its own launch would compute, with
    the same extents), ORed into the call's flag by the one program that calls this: no launch of its own."""
    bits = group_offsets_bits(in_offsets_ptr, out_offsets_ptr, in_offsets_ptr, g, check_m, check_capacity, 0, 0, 0,
                              EVERY_ROW, True, False, BLOCK)
    or_into_flags(flags_ptr, bits)


@triton.jit
def _swizzled_row_offset(local_rows, base_row, pk, WIDE: tl.constexpr):
    """Row part of the 128x4 swizzled position: a group's base row times pk, the 128-row tile, and the row's place
    inside the tile (row a*32+b of a tile lands at minor position b*16 + a*4). Shifts and masks, in int32 unless
    WIDE (a buffer of 2**31 elements or more): int64 division and remainder here cost the swizzled quantize 5 of its
    57 us at bf16 [16384, 4096] on the H200. A negative local row gives garbage, which callers mask."""
    if WIDE:
        lr = local_rows.to(tl.int64)
        base = base_row.to(tl.int64)
    else:
        lr = local_rows.to(tl.int32)
        base = base_row.to(tl.int32)
    return base * pk + (lr >> 7) * (128 * pk) + ((lr & 31) << 4) + (((lr >> 5) & 3) << 2)


@triton.jit
def _swizzled_col_offset(cols, WIDE: tl.constexpr):
    """Column part of the 128x4 swizzled position: 4-column tiles of 512 elements, the column inside the tile."""
    c = cols.to(tl.int64) if WIDE else cols.to(tl.int32)
    return ((c >> 2) << 9) + (c & 3)


@triton.jit
def _grouped_row_offsets(rows, row_ok, in_offsets_ptr, out_offsets_ptr, g, pk, buffer_rows, LOG2_G: tl.constexpr,
                         WIDE: tl.constexpr):
    """(row part of each input row's position in the grouped scale buffer, mask of rows that have a group). A
    group whose output offset lies outside the buffer's rows has none (its offsets fail the device check),
    so that the position's arithmetic cannot wrap around in int32."""
    if LOG2_G <= SCAN_LOG2_G_MAX:
        in_start, out_start = _group_starts_scan(rows, in_offsets_ptr, out_offsets_ptr, g, 1 << LOG2_G)
    else:
        e = _group_of(rows, in_offsets_ptr, g, LOG2_G)
        in_start = tl.load(in_offsets_ptr + e, mask=row_ok, other=0)
        out_start = tl.load(out_offsets_ptr + e, mask=row_ok, other=0)
    local = rows - in_start
    in_buffer = (out_start >= 0) & (out_start < buffer_rows)
    return _swizzled_row_offset(local, out_start, pk, WIDE), row_ok & (local >= 0) & in_buffer


@triton.jit
def _scale_rows(rows, M, in_offsets_ptr, out_offsets_ptr, g, pk, buffer_rows, SCALE_LAYOUT: tl.constexpr,
                LOG2_G: tl.constexpr, WIDE: tl.constexpr):
    """(row part of each row's scale position, rows that have one) in a swizzled scale layout (1: one group, 2:
    grouped); the row-major layout (0) computes its positions in the store."""
    row_ok = rows < M
    if SCALE_LAYOUT == 1:
        return _swizzled_row_offset(rows, tl.zeros_like(rows), pk, WIDE), row_ok
    elif SCALE_LAYOUT == 2:
        return _grouped_row_offsets(rows, row_ok, in_offsets_ptr, out_offsets_ptr, g, pk, buffer_rows, LOG2_G,
                                    WIDE)
    else:
        return tl.zeros_like(rows), row_ok


@triton.jit
def _buffer_sources(brow, ucol, in_offsets_ptr, out_offsets_ptr, g, m, k_units, pk_units, n_rows,
                    GROUPED: tl.constexpr, LOG2_G: tl.constexpr, UNIT_LOG2: tl.constexpr):
    """The swizzled buffer seen from the output side, as [n_rows, pk_units] units of 2**UNIT_LOG2 consecutive
    elements (a unit never straddles a 4-column group, so it moves as a whole). For the units (brow[:, None],
    ucol[None, :]) returns (input row, input unit column, holds-data mask, inside-the-buffer mask); a unit inside
    the buffer that holds no data is padding (zero).

    GROUPED: the slab of group e starts at buffer row output_offsets[e] and holds input rows
    [input_offsets[e], input_offsets[e+1]) (m for the last group); else one group: all m rows from row 0."""
    if GROUPED:
        e = _group_of(brow, out_offsets_ptr, g, LOG2_G)
        base = tl.load(out_offsets_ptr + e)
        start = tl.load(in_offsets_ptr + e)
        end = tl.minimum(tl.load(in_offsets_ptr + e + 1, mask=e + 1 < g, other=m), m)
    else:
        base = tl.zeros_like(brow)
        start = base
        end = base + m
    lrow = brow - base  # row inside the group's slab; negative before the first slab
    row_ok = (brow < n_rows) & (lrow >= 0) & (start >= 0)
    # Inside a 128-row band of the slab, 128x4 tiles follow each other along the columns (512 elements each);
    # inside a tile, element (a*32 + b, d) sits at b*16 + a*4 + d. Shifts and masks: the operands are >= 0
    # wherever the result is used.
    within = ((lrow & 127) * pk_units)[:, None] + ucol[None, :]
    rem = within & ((512 >> UNIT_LOG2) - 1)
    b = rem >> (4 - UNIT_LOG2)
    a = (rem >> (2 - UNIT_LOG2)) & 3
    src_row = (start + (lrow & -128))[:, None] + a * 32 + b
    src_ucol = ((within >> (9 - UNIT_LOG2)) << (2 - UNIT_LOG2)) + (rem & ((4 >> UNIT_LOG2) - 1))
    inside = (brow < n_rows)[:, None] & (ucol < pk_units)[None, :]
    data = row_ok[:, None] & (ucol < pk_units)[None, :] & (src_row < end[:, None]) & (src_ucol < k_units)
    return src_row, src_ucol, data, inside


# ----------------------------------------------------------------------------------------------------------------
# Layout op
# ----------------------------------------------------------------------------------------------------------------

@triton.jit
def _prefetch_input_share(in_ptr, span_units, LINE_UNITS: tl.constexpr, LINES: tl.constexpr):
    """Ask L2 for this program's share of the input's memory span: LINES lines of LINE_UNITS units, the program's
    linear id-th such share (programs past the span ask for nothing). Inline PTX, a hint with no result: it
    overlaps the input's trip from DRAM with the program's offset loads and group search, which the input loads
    wait for (see _layout_op_kernel)."""
    pid = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
    first = pid.to(tl.int64) * (LINES * LINE_UNITS)
    if first < span_units:
        lines = tl.minimum(first + tl.arange(0, LINES) * LINE_UNITS, span_units - 1)
        tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [in_ptr + lines],
                                  dtype=tl.int32, is_pure=False, pack=1)


@triton.jit(do_not_specialize=["check_m", "check_capacity", "span_units"])
def _layout_op_kernel(
    in_ptr, in_offsets_ptr, out_offsets_ptr, out_ptr, flags_ptr,
    m, k_units, g, stride_m, stride_k, pk_units, n_rows, check_m, check_capacity, span_units,
    LOG2_G: tl.constexpr, UNIT_LOG2: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
    WIDE: tl.constexpr, CHECK: tl.constexpr, CHECK_EVERY_ROW: tl.constexpr, CHECK_BLOCK: tl.constexpr,
    PREFETCH_LINES: tl.constexpr, LINE_UNITS: tl.constexpr,
):
    # One [BLOCK_R, BLOCK_C] tile of the buffer (units of 2**UNIT_LOG2 elements, moved as raw integer bits, so
    # every dtype is copied exactly); padding is written as zeros.
    if PREFETCH_LINES > 0:
        # A program's input loads wait for its group search, which waits for the offsets: two trips to DRAM in a
        # row where a copy makes one. The grid first asks L2 for the input (PREFETCH_LINES lines a program, which
        # covers the small inputs it is on for), so the second trip ends in L2.
        _prefetch_input_share(in_ptr, span_units, LINE_UNITS, PREFETCH_LINES)
    if CHECK:  # the offsets' device check, by program (0, 0)
        if (tl.program_id(0) == 0) & (tl.program_id(1) == 0):
            _offsets_check(flags_ptr, in_offsets_ptr, out_offsets_ptr, g, check_m, check_capacity, CHECK_EVERY_ROW,
                           CHECK_BLOCK)
    brow = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    ucol = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    if WIDE:  # int64 positions: a buffer or an input of 2**31 units or more
        brow = brow.to(tl.int64)
        ucol = ucol.to(tl.int64)
    src_row, src_ucol, data, inside = _buffer_sources(
        brow, ucol, in_offsets_ptr, out_offsets_ptr, g, m, k_units, pk_units, n_rows,
        GROUPED=True, LOG2_G=LOG2_G, UNIT_LOG2=UNIT_LOG2)
    vals = tl.load(in_ptr + src_row * stride_m + src_ucol * stride_k, mask=data, other=0)
    tl.store(out_ptr + (brow * pk_units)[:, None] + ucol[None, :], vals, mask=inside)


def layout_op(input: torch.Tensor, input_offsets: torch.Tensor, output_offsets: torch.Tensor, *,
              block_rows: int | None = None, block_cols: int | None = None, num_warps: int = 4) -> torch.Tensor:
    """preprocess_grouped_matmul_input_sf: lay a row-major ``[m, k]`` scale matrix (any dtype, any strides) out in
    the grouped, padded, 128x4-swizzled buffer of ``(m + 127*g) * roundup(k, 4)`` elements, padding zero.

    Returns the buffer viewed as logical ``[m, k]`` with strides ``[k, 1]`` (which do not describe the data;
    consumers read the storage). ``block_rows`` x ``block_cols`` (powers of two) is the buffer tile of one program,
    in rows and in units (up to 4 elements, 8 bytes, moved as one integer); None picks the default. The same as
    preparing a :class:`LayoutOp` and calling it once."""
    layout = LayoutOp(input, input_offsets, output_offsets, block_rows=block_rows, block_cols=block_cols,
                      num_warps=num_warps)
    return layout(input, input_offsets, output_offsets)


class LayoutOp:
    """:func:`layout_op` for arguments of fixed metadata (sizes, strides, dtypes, device, alignment): checked, tiled
    and bound once; a call allocates the buffer and launches. The kernel moves raw integer units, so its pointers
    are the tensors' own addresses: the integer views it takes are built only where Triton's JIT sees them.

    ``check`` (an offset_checks.GroupCheck of these offsets): also bind the launch whose program (0, 0) runs the
    offsets' device check (``fuses_check``; a call passes ``check_flags``), saving the check's own launch.
    ``prefetch``: whether the programs first ask L2 for the input (on the GPU); None decides by
    LAYOUT_PREFETCH_MAX_BYTES and the grid."""

    def __init__(self, input, input_offsets, output_offsets, *, block_rows=None, block_cols=None, num_warps=4,
                 check=None, prefetch=None):
        _check_device(input, "layout_op")
        if input.dim() != 2:
            raise ValueError(f"layout_op: input must be 2-D [m, k], got shape {tuple(input.shape)}")
        if input.element_size() not in _INT_OF_SIZE:
            raise TypeError(f"layout_op: unsupported input dtype {input.dtype}")
        g = _check_offsets("layout_op", input, input_offsets, output_offsets)
        _check_block("layout_op", block_rows=block_rows, block_cols=block_cols)
        m, k = input.shape
        pk = round_up(k, 4)
        n_rows = m + 127 * g
        self.shape, self.dtype, self.device, self.numel = (m, k), input.dtype, input.device, n_rows * pk
        self.dense_offsets = input_offsets.stride(0) == 1 and output_offsets.stride(0) == 1
        self.launch = self.checked = None  # (nothing to launch: an empty buffer, k = 0)
        self.prefetch = False
        if self.numel == 0:
            return
        unit_log2 = _unit_log2(input)
        unit = 1 << unit_log2
        self.bits = _INT_OF_SIZE[input.element_size()]
        self.unit_bits = _INT_OF_SIZE[input.element_size() * unit]
        src = self._src(input)
        pk_units = pk // unit
        bc, br = _layout_tile(pk_units, block_rows, block_cols)
        wide = max(self.numel // unit, m * abs(src.stride(0)) + k * abs(src.stride(1))) >= _INT32_LIMIT
        span_units = (m - 1) * abs(src.stride(0)) + (k // unit - 1) * abs(src.stride(1)) + 1 if m else 0
        unit_bytes = input.element_size() * unit
        grid = (cdiv(n_rows, br), cdiv(pk_units, bc))
        if prefetch is None:
            prefetch = layout_prefetch_pays(span_units * unit_bytes, grid[0] * grid[1], sm_count())
        prefetch = prefetch and span_units > 0 and not interpreting()  # (inline PTX: the GPU only)
        self.prefetch = prefetch

        def bind(check):
            check_ints, check_meta = fused_check_args(check, g)
            return bound_launch(
                _layout_op_kernel, grid,
                (m, k // unit, g, src.stride(0), src.stride(1), pk_units, n_rows, *check_ints, span_units),
                dict(LOG2_G=_log2_ceil(g), UNIT_LOG2=unit_log2, BLOCK_R=br, BLOCK_C=bc, WIDE=wide, **check_meta,
                     PREFETCH_LINES=32 * num_warps if prefetch else 0, LINE_UNITS=max(128 // unit_bytes, 1)),
                num_warps, device=input.device)

        self.launch = bind(None)
        if check is not None:
            self.checked = bind(check)

    @property
    def fuses_check(self) -> bool:
        """Whether a call can run the offsets' device check inside the layout's own launch (``check_flags``)."""
        return self.checked is not None

    def _src(self, input: torch.Tensor) -> torch.Tensor:
        """The input as the kernel reads it: units of up to 4 elements as integers."""
        src = input.view(self.bits)
        return src if self.unit_bits is self.bits else src.view(self.unit_bits)

    def __call__(self, input, input_offsets, output_offsets, check_flags=None) -> torch.Tensor:
        """The laid-out buffer of these arguments, which must have the metadata it was prepared for.
        ``check_flags`` (with fuses_check): the int32 flag the launch ORs the offsets' check bits into."""
        storage = torch.empty(self.numel, dtype=self.dtype, device=self.device)
        if self.launch is not None:
            if not self.dense_offsets:
                input_offsets, output_offsets = input_offsets.contiguous(), output_offsets.contiguous()
            launch, flags = self.launch, input_offsets  # (without the check any pointer stands for the flags)
            if check_flags is not None:
                launch, flags = self.checked, check_flags
            launch((input, input_offsets, output_offsets, storage, flags), (),
                   lambda: (self._src(input), input_offsets, output_offsets,
                            storage.view(self.bits).view(self.unit_bits), flags))
        m, k = self.shape
        return torch.as_strided(storage, (m, k), (k, 1))


def layout_prefetch_pays(span_bytes: int, programs: int, sms: int) -> bool:
    """Whether the layout op's programs should first ask L2 for the input: a grid of one wave (its time is the
    latency of two DRAM trips in a row) over an input of at most LAYOUT_PREFETCH_MAX_BYTES."""
    return 0 < span_bytes <= LAYOUT_PREFETCH_MAX_BYTES and programs <= sms


def _unit_log2(t: torch.Tensor) -> int:
    """log2 of the widest unit (1, 2 or 4 elements, at most 8 bytes) that the input's layout lets the layout op
    load as one integer: unit-stride rows, k and the row stride multiples of the unit, an aligned start."""
    m, k = t.shape
    for ul in (2, 1):
        u = 1 << ul
        size = t.element_size() * u
        if (size <= 8 and k % u == 0 and t.stride(1) == 1 and t.stride(0) % u == 0
                and t.storage_offset() % u == 0 and t.data_ptr() % size == 0):
            return ul
    return 0


def _layout_tile(pk_units: int, block_rows: int | None, block_cols: int | None) -> tuple[int, int]:
    """(block_cols, block_rows): whole buffer rows when they are narrow (contiguous tiles), ~2048 units a tile.
    On the H200 (e4m3 [16384, 256], g=8) 32 x 64 units on 4 warps took 4.5 us, 0.7x a copy_ of the same bytes;
    16 to 128 rows were within 25% of it."""
    bc = block_cols or min(next_pow2(pk_units), 64)
    br = block_rows or max(2048 // bc, 1)
    return bc, br


# ----------------------------------------------------------------------------------------------------------------
# Block quantization (plain, single-group swizzled, or grouped scales)
# ----------------------------------------------------------------------------------------------------------------

@triton.jit
def _fp4_code_exact(v):
    """FP4 E2M1 codes (int32, 0..15) of any fp32 values: round to nearest, ties to the even code, saturate at 6;
    the sign bit is the fp32 sign bit (so -0.0 gives 0x8) and NaN gives code 0 with its sign. Each threshold
    compare is false for NaN."""
    a = tl.abs(v)
    mag = ((a > 0.25).to(tl.int32) + (a >= 0.75).to(tl.int32) + (a > 1.25).to(tl.int32)
           + (a >= 1.75).to(tl.int32) + (a > 2.5).to(tl.int32) + (a >= 3.5).to(tl.int32) + (a > 5.0).to(tl.int32))
    return mag | ((v.to(tl.int32, bitcast=True) >> 28) & 8)


@triton.jit
def _fp4_code_fast(v):
    """The same codes as ``_fp4_code_exact`` for finite |v| < 7 (not for NaN, inf or larger values).

    The E2M1 magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6 are the code c where f(a) = c, with f piecewise linear:
    f = 2a on [0, 2] (step .5), a + 2 on [2, 4] (step 1), a/2 + 4 on [4, 8) (step 2). f is concave, so it is the
    min of the three lines, and rounding f to the nearest integer (ties to even) is exactly E2M1's
    round-to-nearest-even (midpoints map to x.5; the even integer is the even code), and f < 7.5 for a < 7
    gives code 7 (= 6, saturated) up to there. Rounding is monotonic, so it commutes with the min: each line is
    rounded by adding RNE_MAGIC (a*2 and a*0.5 are exact, so a fused multiply-add gives the same sum)."""
    mag = _fp4_lines(v).to(tl.int32, bitcast=True) - RNE_MAGIC_BITS
    return mag | ((v.to(tl.int32, bitcast=True) >> 28) & 8)


@triton.jit
def _fp4_lines(v):
    """RNE_MAGIC + the FP4 magnitude code of v (finite |v| < 7), as the fp32 sum of ``_fp4_code_fast``."""
    a = tl.abs(v)
    return tl.minimum(tl.minimum(a * 2.0 + RNE_MAGIC, a + (RNE_MAGIC + 2.0)), a * 0.5 + (RNE_MAGIC + 4.0))


# The packed bytes of 4 pairs (8 elements) in one 32-bit word, from the fast encoding's sums (_fp4_lines) and the
# values' sign bits: operands $1-$4 the sums of the pairs' low elements as bits (RNE_MAGIC_BITS + code), $5-$8 of
# their high elements, $9-$12 and $13-$16 the low and high elements' fp32 bits. Codes: one multiply-add per
# element (nibble i of the word weighs 16**i; the magic's multiples are subtracted once, as PACK_MAGIC_BITS =
# RNE_MAGIC_BITS * 0x11111111 mod 2**32). Signs: the values' top bytes gathered by byte permutes with sign
# replication (0x00 or 0xFF per byte), low elements' into bit 3 and high elements' into bit 7 of each byte. 16
# instructions for 8 elements, where the element-wise form takes 35 (subtract, shift, or per element, a shift
# and an or per pair, three byte permutes per word). The interpreter has no PTX: it runs the element-wise form,
# which gives the same bits (tests/test_nvfp4_layout_kernels.py also runs this text through a model of its
# instructions).
PACK_MAGIC_BITS = (RNE_MAGIC_BITS.value * 0x11111111) % 2**32
FP4_PACK_PTX = tl.constexpr("""{
    .reg .b32 w, a, b, l, h;
    mad.lo.u32 w, $8, 16, $4;
    mad.lo.u32 w, w, 16, $7;
    mad.lo.u32 w, w, 16, $3;
    mad.lo.u32 w, w, 16, $6;
    mad.lo.u32 w, w, 16, $2;
    mad.lo.u32 w, w, 16, $5;
    mad.lo.u32 w, w, 16, $1;
    sub.u32 w, w, PACK_MAGIC;
    prmt.b32 a, $9, $10, 0xFB;
    prmt.b32 b, $11, $12, 0xFB;
    prmt.b32 l, a, b, 0x5410;
    prmt.b32 a, $13, $14, 0xFB;
    prmt.b32 b, $15, $16, 0xFB;
    prmt.b32 h, a, b, 0x5410;
    and.b32 l, l, 0x08080808;
    and.b32 h, h, 0x80808080;
    or.b32 w, w, l;
    or.b32 $0, w, h;
}""".replace("PACK_MAGIC", hex(PACK_MAGIC_BITS)))


@triton.jit
def _nan_max(a, b):
    # NaN-propagating max, like torch.amax (the default tl.maximum returns the non-NaN operand on GPUs).
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _tile_coords(tile, k_tiles, M, K, BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                 Q: tl.constexpr, WIDE: tl.constexpr, INTERLEAVE: tl.constexpr):
    """Rows, blocks, and the [BLOCK_M, blocks, Q] pair indices and mask of tile number ``tile`` (tiles run along
    K first). A tile past the last one has rows >= M: everything in it is masked.

    INTERLEAVE (4 | BLOCK_M | 128): a tile's rows are BLOCK_M // 4 consecutive rows in each quarter of a 128-row
    block (rows j.., j+32.., j+64.., j+96..), whose scales the 128x4 swizzle puts side by side: runs of 16
    contiguous bytes (two runs where a group starts inside the block) instead of 4-byte pieces 16 bytes apart. The
    tiles still cover every row once, whatever the offsets."""
    pid_m = tile // k_tiles
    return _tile_coords_at(pid_m, tile - pid_m * k_tiles, M, K, BLOCK_SIZE, BLOCK_M, BLOCK_K, Q, WIDE, INTERLEAVE)


@triton.jit
def _tile_coords_at(pid_m, k_tile, M, K, BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                    Q: tl.constexpr, WIDE: tl.constexpr, INTERLEAVE: tl.constexpr):
    """``_tile_coords`` of the tile in row band ``pid_m`` and column band ``k_tile``."""
    NB: tl.constexpr = BLOCK_K // BLOCK_SIZE
    if INTERLEAVE:
        C: tl.constexpr = BLOCK_M // 4
        PER_BLOCK: tl.constexpr = 128 // BLOCK_M
        i = tl.arange(0, BLOCK_M)
        rows = (pid_m // PER_BLOCK) * 128 + (pid_m % PER_BLOCK) * C + (i % C) + (i // C) * 32
    else:
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    blocks = k_tile * NB + tl.arange(0, NB)
    rows_w = rows.to(tl.int64) if WIDE else rows
    r3 = rows_w[:, None, None]
    pairs = (blocks * (BLOCK_SIZE // 2))[None, :, None] + tl.arange(0, Q)[None, None, :]
    # K is a multiple of BLOCK_SIZE, so this mask covers whole quantization blocks.
    mask = (rows < M)[:, None, None] & (blocks < K // BLOCK_SIZE)[None, :, None]
    return rows, blocks, r3, pairs, mask


@triton.jit
def _load_half(x_ptr, r3, pairs, mask, stride_m, stride_k, X_FORMAT: tl.constexpr, PROLOGUE: tl.constexpr,
               PARGS):
    """Raw x of the pairs (2p, 2p+1): one integer per pair (pair formats; returned twice), or the two elements.
    With a load PROLOGUE (a generated function, codegen/prologue.py) the two elements are computed by it from its
    arguments PARGS, at x's (row, column) coordinates, already in x's dtype (X_FORMAT is then 0): in one call,
    along a trailing axis of 2, so that its columns run contiguously over the pairs (its loads of x-like
    operands can be as wide as the pair loads), then split apart."""
    if PROLOGUE is not None:
        cols = (2 * pairs)[:, :, :, None] + tl.arange(0, 2)[None, None, None, :]
        a, b = tl.split(PROLOGUE(r3[:, :, :, None], cols, mask[:, :, :, None], PARGS))
    elif X_FORMAT == 0:
        ptr = x_ptr + r3 * stride_m + (2 * pairs) * stride_k
        a = tl.load(ptr, mask=mask, other=0.0)
        b = tl.load(ptr + stride_k, mask=mask, other=0.0)
    else:
        a = tl.load(x_ptr + r3 * stride_m + pairs, mask=mask, other=0)
        b = a
    return a, b


@triton.jit
def _to_f32(a, b, X_FORMAT: tl.constexpr):
    """fp32 (x[2p], x[2p+1]) from ``_load_half``'s raw data (bf16/f16/f32 pairs split with bit operations)."""
    if X_FORMAT == 0:
        lo = a.to(tl.float32)
        hi = b.to(tl.float32)
    elif X_FORMAT == 1:  # bf16 is the top half of an fp32: exact conversions by shifting and masking
        lo = (a << 16).to(tl.float32, bitcast=True)
        hi = (a & -65536).to(tl.float32, bitcast=True)
    elif X_FORMAT == 2:
        lo = a.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        hi = (a >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    else:
        lo = a.to(tl.int32).to(tl.float32, bitcast=True)
        hi = (a >> 32).to(tl.int32).to(tl.float32, bitcast=True)
    return lo, hi


@triton.jit
def _pair_amax(lo, hi):
    """NaN-propagating max |x| over the last axis (the pairs one thread holds), both elements of each pair."""
    return tl.reduce(_nan_max(tl.abs(lo), tl.abs(hi)), 2, _nan_max)


@triton.jit
def _encode_store(lo, hi, mult, fast, ptrs, mask, ASM: tl.constexpr):
    """Scale the pairs by their block's multiplier, encode both elements, pack (2j low nibble) and store. ASM (a
    GPU, 4 pairs per thread along the last axis): the fast encoding packs 4 pairs per word by FP4_PACK_PTX."""
    v_lo = lo * mult
    v_hi = hi * mult
    if fast:
        if ASM:
            byte = tl.inline_asm_elementwise(
                FP4_PACK_PTX, "=r" + ",r" * 16,
                [_fp4_lines(v_lo).to(tl.int32, bitcast=True), _fp4_lines(v_hi).to(tl.int32, bitcast=True),
                 v_lo.to(tl.int32, bitcast=True), v_hi.to(tl.int32, bitcast=True)],
                dtype=tl.int8, is_pure=True, pack=4).to(tl.uint8, bitcast=True)
        else:
            byte = (_fp4_code_fast(v_lo) | (_fp4_code_fast(v_hi) << 4)).to(tl.uint8)
    else:
        byte = (_fp4_code_exact(v_lo) | (_fp4_code_exact(v_hi) << 4)).to(tl.uint8)
    tl.store(ptrs, byte, mask=mask)


@triton.jit
def _quantize_tile(
    a0, b0, a1, b1, rows, blocks, r3, pairs, mask, row_off, has_group,
    gs_ptr, packed_ptr, scales_ptr, in_offsets_ptr, out_offsets_ptr, M, K, g, pk, scales_numel, buffer_rows,
    HAS_GS: tl.constexpr, SCALE_LAYOUT: tl.constexpr, X_FORMAT: tl.constexpr, LOG2_G: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, H: tl.constexpr, Q: tl.constexpr, WIDE: tl.constexpr, SCALE_STORE: tl.constexpr,
    ASM: tl.constexpr, LOOKUP: tl.constexpr,
):
    """Quantize one loaded tile: block scales, FP4 codes, packed data and scale stores (``row_off``,
    ``has_group``: the rows' scale positions, from _scale_rows; with LOOKUP computed here, after the tile's
    encoding, and returned for the next tiles of the same rows). Here, the group lookup's loads and compares
    cannot be scheduled ahead of the program's loads of x, which they would hold back (the compares stall on
    their loads); after the encoding's branch they are, and the next tile's loads are in flight meanwhile."""
    lo0, hi0 = _to_f32(a0, b0, X_FORMAT)
    amax = _pair_amax(lo0, hi0)
    if H == 2:
        lo1, hi1 = _to_f32(a1, b1, X_FORMAT)
        amax = _nan_max(amax, _pair_amax(lo1, hi1))

    # Fused-op scale: s = min(amax/6 * gs, fp32max); saturating fp8 cast (clamp to 448 first, like the
    # reference; NaN stays NaN); back to fp32; the data is multiplied by gs / fp8 scale.
    s = tl.div_rn(amax, tl.full(amax.shape, FLOAT4_E2M1_MAX, tl.float32))
    if HAS_GS:
        gs = tl.load(gs_ptr)
        s = s * gs
        numer = tl.zeros_like(s) + gs
    else:
        numer = tl.full(s.shape, 1.0, tl.float32)
    s8 = tl.where(s > FLOAT8_E4M3_MAX, FLOAT8_E4M3_MAX, s).to(tl.float8e4nv)  # also min(., fp32max); keeps NaN
    s32 = s8.to(tl.float32)
    # A zero fp8 scale (amax below the fp8 range) encodes the block as zeros instead of x * inf.
    zero = s32 == 0.0
    mult = tl.where(zero, 0.0, tl.div_rn(numer, tl.where(zero, 1.0, s32)))
    # Tame block: zero multiplier (its x are finite: an inf or NaN x makes s inf or NaN, never a zero scale), or a
    # normal unsaturated e4m3 scale (within 2^-4 of s = amax*gs/6) and a finite multiplier: then every |v| is at
    # most 6 * (1 + 2^-4) < 7 and finite, which the fast encoding needs. Rows and blocks past the end are zeros.
    tame = zero | ((s32 >= FLOAT8_E4M3_MIN_NORMAL) & (s <= FLOAT8_E4M3_MAX) & (mult <= FLOAT32_MAX))
    fast = tl.min(tame.to(tl.int32)) == 1
    mult3 = mult[:, :, None]

    # Pack pairs: element 2j in the low nibble, 2j+1 in the high nibble; byte j of a row is pair j.
    out = packed_ptr + r3 * (K // 2) + pairs
    _encode_store(lo0, hi0, mult3, fast, out, mask, ASM)
    if H == 2:
        _encode_store(lo1, hi1, mult3, fast, out + Q, mask, ASM)

    # Scales, as fp8 bits, in the requested layout.
    if LOOKUP:
        row_off, has_group = _scale_rows(rows, M, in_offsets_ptr, out_offsets_ptr, g, pk, buffer_rows,
                                         SCALE_LAYOUT, LOG2_G, WIDE)
    row_ok = rows < M
    bits = s8.to(tl.uint8, bitcast=True)
    smask = row_ok[:, None] & (blocks < K // BLOCK_SIZE)[None, :]
    if SCALE_LAYOUT == 0:
        rows_w = rows.to(tl.int64) if WIDE else rows
        dst = rows_w[:, None] * (K // BLOCK_SIZE) + blocks[None, :]
        tl.store(scales_ptr + dst, bits, mask=smask)
    else:
        if SCALE_STORE == 0:
            dst = row_off[:, None] + _swizzled_col_offset(blocks, WIDE)[None, :]
            smask = smask & has_group[:, None] & (dst >= 0) & (dst < scales_numel)
            tl.store(scales_ptr + dst, bits, mask=smask)
        else:
            # Blocks 4j..4j+3 of a row (the tile's blocks start at a multiple of 4) have 4 contiguous, 4-aligned
            # scale bytes: packed little-endian into one word. Blocks past the row's last one are zeros (their x
            # are masked to 0) and are the buffer's padding columns, zero anyway.
            NB: tl.constexpr = bits.shape[1]
            BM: tl.constexpr = bits.shape[0]
            quads = tl.reshape(bits.to(tl.uint32), [BM, NB // 4, 4])
            words = tl.sum(quads << (tl.arange(0, 4) * 8).to(tl.uint32)[None, None, :], axis=2)
            first = tl.min(blocks, axis=0) + tl.arange(0, NB // 4) * 4
            dst = row_off[:, None] + ((first >> 2) << 9)[None, :]
            wmask = has_group[:, None] & (first < K // BLOCK_SIZE)[None, :] & (dst >= 0) & (dst + 4 <= scales_numel)
            tl.store((scales_ptr + dst).to(tl.pointer_type(tl.uint32)), words, mask=wmask)
    return row_off, has_group


@triton.jit
def _quantize_tiles(
    first_tile, x_ptr, gs_ptr, packed_ptr, scales_ptr, in_offsets_ptr, out_offsets_ptr,
    M, K, g, stride_m, stride_k, pk, scales_numel, buffer_rows, k_tiles,
    HAS_GS: tl.constexpr, SCALE_LAYOUT: tl.constexpr, X_FORMAT: tl.constexpr, LOG2_G: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, TILES: tl.constexpr,
    WIDE: tl.constexpr, PROLOGUE: tl.constexpr, PARGS, SCALE_STORE: tl.constexpr, ROWS_SHARED: tl.constexpr,
    ASM: tl.constexpr,
):
    """TILES consecutive tiles; the loads of tile i+1 are issued before tile i is quantized, so that they are in
    flight while it computes (one load-compute-store tile per program leaves the memory idle during compute).
    ROWS_SHARED (TILES divides the tiles along K): every tile has the same rows, whose scale positions (in the
    grouped layout a lookup of the rows' groups) are then computed once."""
    P: tl.constexpr = BLOCK_SIZE // 2  # element pairs per block
    # A block's pairs are loaded in H loads of Q pairs along the tile's last axis (16 bytes of bf16 for Q = 4),
    # H = 2 for 16-element blocks: both loads give the same register layout, so one thread holds the whole block
    # and its scale math runs once per block (with one load of 8 pairs, two threads would share a block).
    H: tl.constexpr = 2 if P >= 8 else 1
    Q: tl.constexpr = P // H
    IL: tl.constexpr = SCALE_STORE == 2
    pid_m0 = first_tile // k_tiles
    k_tile0 = first_tile - pid_m0 * k_tiles
    rows, blocks, r3, pairs, mask = _tile_coords_at(pid_m0, k_tile0, M, K, BLOCK_SIZE, BLOCK_M, BLOCK_K, Q, WIDE,
                                                    IL)
    a0, b0 = _load_half(x_ptr, r3, pairs, mask, stride_m, stride_k, X_FORMAT, PROLOGUE, PARGS)
    a1, b1 = a0, b0
    if H == 2:
        a1, b1 = _load_half(x_ptr, r3, pairs + Q, mask, stride_m, stride_k, X_FORMAT, PROLOGUE, PARGS)
    row_off = tl.zeros_like(rows)  # (set by the first tile's lookup)
    has_group = rows < M
    for i in tl.static_range(TILES):
        if i + 1 < TILES:
            if ROWS_SHARED:  # (the same row band: no second division by k_tiles)
                n_rows, n_blocks, n_r3, n_pairs, n_mask = _tile_coords_at(
                    pid_m0, k_tile0 + i + 1, M, K, BLOCK_SIZE, BLOCK_M, BLOCK_K, Q, WIDE, IL)
            else:
                n_rows, n_blocks, n_r3, n_pairs, n_mask = _tile_coords(
                    first_tile + i + 1, k_tiles, M, K, BLOCK_SIZE, BLOCK_M, BLOCK_K, Q, WIDE, IL)
            n_a0, n_b0 = _load_half(x_ptr, n_r3, n_pairs, n_mask, stride_m, stride_k, X_FORMAT, PROLOGUE, PARGS)
            n_a1, n_b1 = n_a0, n_b0
            if H == 2:
                n_a1, n_b1 = _load_half(x_ptr, n_r3, n_pairs + Q, n_mask, stride_m, stride_k, X_FORMAT, PROLOGUE, PARGS)
        # The rows' scale positions: looked up by the first tile (all tiles without ROWS_SHARED), after its
        # encoding (see _quantize_tile).
        row_off, has_group = _quantize_tile(
            a0, b0, a1, b1, rows, blocks, r3, pairs, mask, row_off, has_group,
            gs_ptr, packed_ptr, scales_ptr, in_offsets_ptr, out_offsets_ptr, M, K, g, pk, scales_numel, buffer_rows,
            HAS_GS, SCALE_LAYOUT, X_FORMAT, LOG2_G, BLOCK_SIZE, H, Q, WIDE, SCALE_STORE, ASM and Q % 4 == 0,
            i == 0 or not ROWS_SHARED)
        if i + 1 < TILES:
            rows, blocks, r3, pairs, mask = n_rows, n_blocks, n_r3, n_pairs, n_mask
            a0, b0, a1, b1 = n_a0, n_b0, n_a1, n_b1


@triton.jit
def _zero_padding_tile(
    units_ptr, in_offsets_ptr, out_offsets_ptr, z, z_cols, M, nb_units, g, pk_units, n_rows,
    GROUPED: tl.constexpr, LOG2_G: tl.constexpr, UNIT_LOG2: tl.constexpr, ZERO_R: tl.constexpr,
    ZERO_C: tl.constexpr,
):
    """Zeros for the padding units of one tile of the swizzled scale buffer; the quantize tiles write the rest."""
    brow = (z // z_cols) * ZERO_R + tl.arange(0, ZERO_R)
    ucol = (z % z_cols) * ZERO_C + tl.arange(0, ZERO_C)
    _, _, data, inside = _buffer_sources(brow, ucol, in_offsets_ptr, out_offsets_ptr, g, M, nb_units, pk_units,
                                         n_rows, GROUPED=GROUPED, LOG2_G=LOG2_G, UNIT_LOG2=UNIT_LOG2)
    zeros = tl.zeros([ZERO_R, ZERO_C], dtype=units_ptr.dtype.element_ty)
    tl.store(units_ptr + (brow * pk_units)[:, None] + ucol[None, :], zeros, mask=inside & ~data)


@triton.jit
def _quantize_program(
    pid, x_ptr, gs_ptr, packed_ptr, scales_ptr, units_ptr, in_offsets_ptr, out_offsets_ptr, flags_ptr,
    M, K, g, stride_m, stride_k, pk, scales_numel, n_rows, quant_programs, k_tiles, z_cols, check_m, check_capacity,
    HAS_GS: tl.constexpr, SCALE_LAYOUT: tl.constexpr, X_FORMAT: tl.constexpr, LOG2_G: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, TILES: tl.constexpr,
    WIDE: tl.constexpr, UNIT_LOG2: tl.constexpr, ZERO_R: tl.constexpr, ZERO_C: tl.constexpr,
    PROLOGUE: tl.constexpr, PARGS, CHECK: tl.constexpr, CHECK_EVERY_ROW: tl.constexpr, CHECK_BLOCK: tl.constexpr,
    SCALE_STORE: tl.constexpr, ROWS_SHARED: tl.constexpr, ASM: tl.constexpr,
):
    # Programs quantize TILES [BLOCK_M, BLOCK_K] tiles of x each, quant_programs of them; with a padded (swizzled)
    # scale layout, the grid's FIRST programs, the ones before them, write the padding zeros of the scale buffer,
    # so it needs no memset. First: their lookups' dependent loads (the grouped layout's binary search) then overlap
    # the quantize programs' work instead of making up the grid's tail (a grid without them was 0.7 us faster at
    # bf16 [16384, 4096], g=8 on the H200). Their count is the grid's size less quant_programs, so a grid cut to
    # quant_programs (timing only: benchmarks/ab_quantize_layouts.py) quantizes everything and zeros nothing.
    # CHECK (grouped layout only): program 0 also runs the offsets' device check.
    if CHECK:
        if pid == 0:
            _offsets_check(flags_ptr, in_offsets_ptr, out_offsets_ptr, g, check_m, check_capacity, CHECK_EVERY_ROW,
                           CHECK_BLOCK)
    if SCALE_LAYOUT == 0:
        _quantize_tiles(pid * TILES, x_ptr, gs_ptr, packed_ptr, scales_ptr, in_offsets_ptr, out_offsets_ptr,
                        M, K, g, stride_m, stride_k, pk, scales_numel, n_rows, k_tiles,
                        HAS_GS, SCALE_LAYOUT, X_FORMAT, LOG2_G, BLOCK_SIZE, BLOCK_M, BLOCK_K, TILES, WIDE,
                        PROLOGUE, PARGS, SCALE_STORE, ROWS_SHARED, ASM)
    else:
        zero_programs = tl.num_programs(0) - quant_programs
        if pid >= zero_programs:
            _quantize_tiles((pid - zero_programs) * TILES, x_ptr, gs_ptr, packed_ptr, scales_ptr, in_offsets_ptr,
                            out_offsets_ptr, M, K, g, stride_m, stride_k, pk, scales_numel, n_rows, k_tiles,
                            HAS_GS, SCALE_LAYOUT, X_FORMAT, LOG2_G, BLOCK_SIZE, BLOCK_M, BLOCK_K, TILES, WIDE,
                            PROLOGUE, PARGS, SCALE_STORE, ROWS_SHARED, ASM)
        else:
            nb_units = (K // BLOCK_SIZE) >> UNIT_LOG2
            _zero_padding_tile(units_ptr, in_offsets_ptr, out_offsets_ptr, pid, z_cols, M, nb_units,
                               g, pk >> UNIT_LOG2, n_rows, SCALE_LAYOUT == 2, LOG2_G, UNIT_LOG2, ZERO_R, ZERO_C)


@triton.jit(do_not_specialize=["check_m", "check_capacity"])
def _block_quantize_kernel(
    x_ptr, gs_ptr, packed_ptr, scales_ptr, units_ptr, in_offsets_ptr, out_offsets_ptr, flags_ptr,
    M, K, g, stride_m, stride_k, pk, scales_numel, n_rows, quant_programs, k_tiles, z_cols, check_m, check_capacity,
    HAS_GS: tl.constexpr, SCALE_LAYOUT: tl.constexpr, X_FORMAT: tl.constexpr, LOG2_G: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, TILES: tl.constexpr,
    WIDE: tl.constexpr, UNIT_LOG2: tl.constexpr, ZERO_R: tl.constexpr, ZERO_C: tl.constexpr,
    CHECK: tl.constexpr, CHECK_EVERY_ROW: tl.constexpr, CHECK_BLOCK: tl.constexpr, SCALE_STORE: tl.constexpr = 0,
    ROWS_SHARED: tl.constexpr = False, ASM: tl.constexpr = True,
):
    # x read from memory (no prologue: PARGS is never read).
    _quantize_program(tl.program_id(0), x_ptr, gs_ptr, packed_ptr, scales_ptr, units_ptr, in_offsets_ptr,
                      out_offsets_ptr, flags_ptr, M, K, g, stride_m, stride_k, pk, scales_numel, n_rows,
                      quant_programs, k_tiles, z_cols, check_m, check_capacity, HAS_GS, SCALE_LAYOUT, X_FORMAT,
                      LOG2_G, BLOCK_SIZE, BLOCK_M, BLOCK_K, TILES, WIDE, UNIT_LOG2, ZERO_R, ZERO_C, None, x_ptr,
                      CHECK, CHECK_EVERY_ROW, CHECK_BLOCK, SCALE_STORE, ROWS_SHARED, ASM)


@triton.jit(do_not_specialize=["check_m", "check_capacity"])
def _block_quantize_prologue_kernel(
    gs_ptr, packed_ptr, scales_ptr, units_ptr, in_offsets_ptr, out_offsets_ptr, flags_ptr, PARGS,
    M, K, g, pk, scales_numel, n_rows, quant_programs, k_tiles, z_cols, check_m, check_capacity,
    HAS_GS: tl.constexpr, SCALE_LAYOUT: tl.constexpr, LOG2_G: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, TILES: tl.constexpr,
    WIDE: tl.constexpr, UNIT_LOG2: tl.constexpr, ZERO_R: tl.constexpr, ZERO_C: tl.constexpr,
    PROLOGUE: tl.constexpr, CHECK: tl.constexpr, CHECK_EVERY_ROW: tl.constexpr, CHECK_BLOCK: tl.constexpr,
    SCALE_STORE: tl.constexpr = 0, ROWS_SHARED: tl.constexpr = False, ASM: tl.constexpr = True,
):
    # x computed by PROLOGUE from PARGS (a tuple of its pointers and ints) element by element: a separate entry,
    # so the memory-reading kernel above keeps its signature and its direct launches.
    _quantize_program(tl.program_id(0), gs_ptr, gs_ptr, packed_ptr, scales_ptr, units_ptr, in_offsets_ptr,
                      out_offsets_ptr, flags_ptr, M, K, g, 0, 0, pk, scales_numel, n_rows, quant_programs,
                      k_tiles, z_cols, check_m, check_capacity, HAS_GS, SCALE_LAYOUT, 0, LOG2_G, BLOCK_SIZE, BLOCK_M,
                      BLOCK_K, TILES, WIDE, UNIT_LOG2, ZERO_R, ZERO_C, PROLOGUE, PARGS, CHECK, CHECK_EVERY_ROW,
                      CHECK_BLOCK, SCALE_STORE, ROWS_SHARED, ASM)


def block_quantize(x: torch.Tensor, global_scale: torch.Tensor | None = None, swizzle: bool = False,
                   block_size: int = 16, *, block_m: int | None = None, block_k: int | None = None,
                   tiles: int | None = None, num_warps: int | None = None,
                   scale_store: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4 quantization in the fused ops' order (== reference.quantize_nvfp4_fused, bit-exact).

    Returns (packed float4_e2m1fn_x2 ``[M, K/2]``, float8_e4m3fn scales): ``[M, K/block_size]`` row-major, or with
    ``swizzle`` the zero-padded single-group 128x4 swizzle ``[roundup(M,128), roundup(K/block_size,4)]``.
    ``block_m``/``block_k``/``tiles``/``num_warps``/``scale_store`` (SCALE_BYTES, SCALE_WORDS,
    SCALE_WORDS_INTERLEAVED) are tuning knobs (None: ``quantize_config``); every setting gives the same bits."""
    quantize = BlockQuantize(x, global_scale, swizzle=swizzle, block_size=block_size, block_m=block_m,
                             block_k=block_k, tiles=tiles, num_warps=num_warps, scale_store=scale_store)
    return quantize(x, global_scale)


def grouped_block_quantize(x: torch.Tensor, input_offsets: torch.Tensor, output_offsets: torch.Tensor,
                           global_scale: torch.Tensor | None = None, block_size: int = 16, *,
                           block_m: int | None = None, block_k: int | None = None, tiles: int | None = None,
                           num_warps: int | None = None,
                           scale_store: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4 quantization with the scales written straight into the layout op's grouped swizzled buffer
    (== reference.grouped_quantize_nvfp4(fused=True), bit-exact): returns (packed ``[M, K/2]``, scales as the
    layout op returns them: logical ``[M, K/block_size]`` over a zero-padded ``(M + 127*g) * pk`` storage).
    ``x`` may be a LoadPrologue (codegen/prologue.py): x's elements are then computed by its function."""
    quantize = BlockQuantize(x, global_scale, input_offsets, output_offsets, block_size=block_size,
                             block_m=block_m, block_k=block_k, tiles=tiles, num_warps=num_warps,
                             scale_store=scale_store)
    return quantize(x, global_scale, input_offsets, output_offsets)


class BlockQuantize:
    """:func:`block_quantize` (no offsets) or :func:`grouped_block_quantize` for arguments of fixed metadata (x's
    sizes, strides, dtype and alignment, or the function of a load prologue standing for x; the offsets' and
    global scale's): checked and configured once; a call allocates the outputs and launches.

    ``check`` (grouped only; an offset_checks.GroupCheck of the offsets): also bind the launch whose program 0 runs
    the offsets' device check (``fuses_check``; a call passes ``check_flags``), saving the check's own launch."""

    def __init__(self, x, global_scale=None, input_offsets=None, output_offsets=None, *, swizzle=False,
                 block_size=16, block_m=None, block_k=None, tiles=None, num_warps=None, check=None,
                 scale_store=None):
        self.grouped = grouped = input_offsets is not None
        who = "grouped_block_quantize" if grouped else "block_quantize"
        M, K = _check_quant_input(who, x, global_scale, block_size)
        g = _check_offsets(who, x, input_offsets, output_offsets) if grouped else 1
        _check_tuning(who, block_m, block_k, tiles)
        if scale_store not in (None, SCALE_BYTES, SCALE_WORDS, SCALE_WORDS_INTERLEAVED):
            raise ValueError(f"{who}: scale_store must be SCALE_BYTES, SCALE_WORDS or SCALE_WORDS_INTERLEAVED "
                             f"(0, 1, 2) or None, got {scale_store!r}")
        self.nb = nb = K // block_size
        if grouped:
            layout, n_rows, pk = _GROUPED, M + 127 * g, round_up(nb, 4)
        else:
            layout, n_rows, pk = (_SWIZZLED, round_up(M, 128), round_up(nb, 4)) if swizzle else (_PLAIN, M, nb)
        self.shape, self.device, self.n_rows, self.pk = (M, K), x.device, n_rows, pk
        self.dense_offsets = not grouped or (input_offsets.stride(0) == 1 and output_offsets.stride(0) == 1)
        self.prologue = x.fn if isinstance(x, LoadPrologue) else None
        self.launch = _QuantizeLaunch(x, global_scale is not None, g, pk, n_rows, layout, block_size, block_m,
                                      block_k, tiles, num_warps, check if grouped else None, scale_store)

    @property
    def fuses_check(self) -> bool:
        """Whether a call can run the offsets' device check inside the quantize launch (``check_flags``)."""
        return self.launch.checked is not None

    def accepts(self, x) -> bool:
        """Whether x is what the launch was prepared for: a tensor, or a load prologue of the same function."""
        return (x.fn if type(x) is LoadPrologue else None) is self.prologue

    def __call__(self, x, global_scale=None, input_offsets=None, output_offsets=None, check_flags=None):
        """(packed data, scales) of these arguments, which must have the metadata they were prepared for.
        ``check_flags`` (with fuses_check): the int32 flag the launch ORs the offsets' check bits into."""
        M, K = self.shape
        packed = torch.empty((M, K // 2), dtype=torch.float4_e2m1fn_x2, device=self.device)
        scales = torch.empty(self.n_rows * self.pk, dtype=torch.float8_e4m3fn, device=self.device)
        if not self.grouped:
            input_offsets = output_offsets = _dummy_offsets(self.device)  # unused outside the grouped layout
        elif not self.dense_offsets:
            input_offsets, output_offsets = input_offsets.contiguous(), output_offsets.contiguous()
        self.launch(x, global_scale, packed, scales, input_offsets, output_offsets, check_flags)
        if self.grouped:
            return packed, torch.as_strided(scales, (M, self.nb), (self.nb, 1))
        return packed, scales.view(self.n_rows, self.pk)


def quantize_config(M: int, K: int, block_size: int = 16) -> tuple[int, int, int, int]:
    """Default (block_m, block_k, tiles, num_warps) of the quantize kernel, from benchmarks/sweep_nvfp4_layout.py on
    the H200 (bf16 [16384, 4096], g=8, kernel time with L2 flushed): 4 x 512 tiles on 2 warps (16 elements, one
    block, per thread at 64 registers: many resident warps) took 64 us (2.7 TB/s, 63% of copy bandwidth), the same
    with 4 warps 72 us, 8 x 512 on 4 warps 73 us, 16 x 512 (64 elements per thread, 124 registers) 88 us. Two
    tiles per program (the second's loads in flight while the first computes) gained 6% there; with few tiles
    (decode: [128, 4096] is 256 tiles) one per program keeps more programs than SMs, 3.1 us against 4.0."""
    block_m, block_k = 4, 512
    tiles = 2 if cdiv(M, block_m) * cdiv(K, block_k) >= 2048 else 1
    return block_m, block_k, tiles, 2


def _scale_store(scale_store: int | None, layout: int, block_m: int, blocks_per_tile: int) -> int:
    """The scale store a launch takes: the requested one (None: SCALE_BYTES, the measured default) where the tile
    allows it. Words need a swizzled layout and a multiple of 4 blocks per tile; interleaved rows 4 | block_m | 128;
    a request the tile does not allow takes the next simpler store."""
    store = SCALE_BYTES if scale_store is None else scale_store
    if layout == _PLAIN or blocks_per_tile % 4:
        return SCALE_BYTES
    if store == SCALE_WORDS_INTERLEAVED and (block_m % 4 or 128 % block_m):
        return SCALE_WORDS
    return store


class _QuantizeLaunch:
    """The one launch of a quantization: (padded layouts) the programs that zero the scale buffer's padding, then
    the quantize programs, for x of fixed metadata (a tensor's sizes, strides, dtype and pair alignment, or a load
    prologue's function). Host work is kept small: at decode sizes it, not the GPU, sets the time of a call. A call
    takes ``scales``, the flat e4m3 scale storage ([M, nb] row-major, or the [n_rows, pk] swizzled buffer), and
    ``packed`` ([M, K/2] fp4x2); the kernel sees both as uint8 (the padding zeros as int32 units where whole).
    With ``check`` (grouped layout) a second launch, ``checked``, is bound whose program 0 also ORs the offsets'
    device check bits into a flag (group_offsets_check.group_offsets_bits)."""

    def __init__(self, x, has_gs, g, pk, n_rows, layout, block_size, block_m, block_k, tiles, num_warps,
                 check=None, scale_store=None):
        M, K = x.shape
        dm, dk, dt, dw = quantize_config(M, K, block_size)
        bm, tiles, num_warps = block_m or dm, tiles or dt, num_warps or dw
        bk = max(block_size, min(block_k or dk, next_pow2(K)))
        k_tiles = max(cdiv(K, bk), 1)
        store = _scale_store(scale_store, layout, bm, bk // block_size)
        # A program's tiles run along K: all of them have the same rows when their count divides k_tiles.
        rows_shared = k_tiles % tiles == 0
        # Interleaved tiles cover whole 128-row blocks (the last one's missing rows masked).
        m_tiles = cdiv(M, 128) * (128 // bm) if store == SCALE_WORDS_INTERLEAVED else cdiv(M, bm)
        quant_programs = cdiv(m_tiles * k_tiles, tiles) if K > 0 else 0
        zero_programs = z_cols = 0
        unit_log2, zr, zc = 0, 1, 1
        scales_numel = n_rows * pk
        if layout != _PLAIN and pk > 0:
            # Padding zeros in 4-byte units when whole (K/block_size a multiple of 4: a unit must not cover scales).
            if (K // block_size) % 4 == 0:
                unit_log2 = 2
            pk_units = pk >> unit_log2
            zc = min(next_pow2(pk_units), 64)
            zr = max(2048 // zc, 1)
            z_cols = cdiv(pk_units, zc)
            zero_programs = cdiv(n_rows, zr) * z_cols
        self.units = torch.int32 if unit_log2 == 2 else torch.uint8
        self.has_gs = has_gs
        self.bound = self.checked = None
        if quant_programs + zero_programs == 0:  # (nothing to launch: K = 0)
            return
        grid = (quant_programs + zero_programs,)
        ints = (M, K, g, pk, scales_numel, n_rows, quant_programs, k_tiles, max(z_cols, 1))
        self.x_pairs = None
        if isinstance(x, LoadPrologue):
            # x is computed by a generated function (its own index arithmetic: int64 where it needs it), compiled as
            # generated kernels are (no multiply-add contraction, no flushed subnormals: the producer's ops round as
            # op by op; the quantize math is exact either way). Its arguments travel as one tuple (tensors by
            # address), passed per call.
            wide = M * K >= _INT32_LIMIT or M * (K // 2) >= _INT32_LIMIT or scales_numel >= _INT32_LIMIT
            meta = dict(HAS_GS=has_gs, SCALE_LAYOUT=layout, LOG2_G=_log2_ceil(g), BLOCK_SIZE=block_size, BLOCK_M=bm,
                        BLOCK_K=bk, TILES=tiles, WIDE=wide, UNIT_LOG2=unit_log2, ZERO_R=zr, ZERO_C=zc, PROLOGUE=x.fn)

            def bind(check):
                check_ints, check_meta = fused_check_args(check, g)
                return bound_launch(_block_quantize_prologue_kernel, grid, (*ints, *check_ints),
                                    {**meta, **check_meta, "SCALE_STORE": store, "ROWS_SHARED": rows_shared,
                                     "ASM": not interpreting()}, num_warps, device=x.device,
                                    compile_options=COMPILE_OPTIONS, tuple_scalars=True)
        else:
            # The pair formats read x as integers of twice its element size: unit-stride rows and aligned pairs.
            x_format, strides = _X_ELEMENTS, x.stride()
            if (x.stride(1) == 1 and x.stride(0) % 2 == 0 and x.storage_offset() % 2 == 0
                    and x.data_ptr() % (2 * x.element_size()) == 0):
                x_format, self.x_pairs = _PAIR_FORMAT[x.dtype], _INT_OF_SIZE[2 * x.element_size()]
                strides = (x.stride(0) // 2, 1)
            wide = (M * abs(strides[0]) + K * abs(strides[1]) >= _INT32_LIMIT or M * (K // 2) >= _INT32_LIMIT
                    or scales_numel >= _INT32_LIMIT)
            meta = dict(HAS_GS=has_gs, SCALE_LAYOUT=layout, X_FORMAT=x_format, LOG2_G=_log2_ceil(g),
                        BLOCK_SIZE=block_size, BLOCK_M=bm, BLOCK_K=bk, TILES=tiles, WIDE=wide, UNIT_LOG2=unit_log2,
                        ZERO_R=zr, ZERO_C=zc)

            def bind(check):
                check_ints, check_meta = fused_check_args(check, g)
                return bound_launch(_block_quantize_kernel, grid, (*ints[:3], *strides, *ints[3:], *check_ints),
                                    {**meta, **check_meta, "SCALE_STORE": store, "ROWS_SHARED": rows_shared,
                                     "ASM": not interpreting()}, num_warps, device=x.device,
                                    compile_options=None if interpreting() else {"maxnreg": QUANTIZE_MAX_REGISTERS})

        self.bound = bind(None)
        if check is not None and layout == _GROUPED:
            self.checked = bind(check)

    def __call__(self, x, global_scale, packed, scales, in_offsets, out_offsets, check_flags=None) -> None:
        bound, flags = self.bound, in_offsets  # (without the check any pointer stands for the flags: never read)
        if bound is None:
            return
        if check_flags is not None:
            bound, flags = self.checked, check_flags
        gs = global_scale if global_scale is not None else packed  # any pointer; unread when HAS_GS is False
        tensors = (gs, packed, scales, scales, in_offsets, out_offsets, flags)

        def jit():  # Triton's JIT path sees the bytes as uint8; a direct launch takes the same addresses
            packed8 = packed.view(torch.uint8)
            return (packed8 if global_scale is None else global_scale, packed8, scales.view(torch.uint8),
                    scales.view(self.units), in_offsets, out_offsets, flags)

        if type(x) is LoadPrologue:
            bound(tensors, (x.args,), jit)
        else:
            bound((x, *tensors), (), lambda: (x if self.x_pairs is None else x.view(self.x_pairs), *jit()))


_DUMMY_OFFSETS: dict = {}


def _dummy_offsets(device: torch.device) -> torch.Tensor:
    """A one-entry int32 tensor on ``device`` for the offsets the non-grouped layouts never read (allocated once:
    a fresh torch.zeros would cost a fill kernel on every call)."""
    t = _DUMMY_OFFSETS.get(device)
    if t is None:
        t = _DUMMY_OFFSETS[device] = torch.zeros(1, dtype=torch.int32, device=device)
    return t


# ----------------------------------------------------------------------------------------------------------------
# Argument checks (launch-level; the ops layer adds op-level messages and validates offsets' values)
# ----------------------------------------------------------------------------------------------------------------

def _check_device(t: torch.Tensor, who: str) -> None:
    if triton_usable(t.device):
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


def _check_block(who: str, **blocks) -> None:
    for name, b in blocks.items():
        if b is None:
            continue
        if not isinstance(b, int) or b < 1 or b & (b - 1):
            raise ValueError(f"{who}: {name} must be a power of two, got {b}")


def _check_tuning(who: str, block_m, block_k, tiles) -> None:
    _check_block(who, block_m=block_m, block_k=block_k)
    if tiles is not None and (not isinstance(tiles, int) or tiles < 1):
        raise ValueError(f"{who}: tiles must be a positive int, got {tiles}")


def _log2_ceil(g: int) -> int:
    """Binary-search steps that cover g groups: ceil(log2(g)) (0 for a single group)."""
    return (g - 1).bit_length()


# --------------------------------------------------------------------------------------------------------------
# The ops these kernels implement (pyfuser/ops/narrow_precision.py holds their semantics and checks).


def _layout_op_for(node, input, input_offsets, output_offsets):
    ops.check_offsets(node.op.name, input.shape[0], input_offsets, output_offsets)
    return layout_op(input, input_offsets, output_offsets)


def _prepare_layout_op(node, input, input_offsets, output_offsets):
    """The layout op's kernel for one input signature (OpDef.prepare): checks and launch once; a call checks the
    offsets' values (on the device by default: inside the layout's own launch, program (0, 0)) and launches."""
    check = ops.offsets_check(node.op.name, input.shape[0], input_offsets, output_offsets)
    offsets = PreparedGroupCheck(check)
    layout = LayoutOp(input, input_offsets, output_offsets, check=check)
    fused_check = layout.fuses_check  # (decided once: False only when there is no launch to carry it, k = 0)

    def run(node, input, input_offsets, output_offsets):
        if not fused_check:
            offsets(input_offsets, output_offsets)
            return layout(input, input_offsets, output_offsets)
        return layout(input, input_offsets, output_offsets, offsets.device_flag(input_offsets, output_offsets))

    return run


def _block_quantize_for(node, input, global_scale=None, swizzle_block_scales=False, block_size=16, dtype=None):
    ops.check_k(node.op.name, input.shape[1], block_size)
    data, scales = block_quantize(input, global_scale, swizzle=swizzle_block_scales, block_size=block_size)
    if swizzle_block_scales:  # the launcher returns the padded buffer itself
        scales = ops.logical_view(scales, input.shape[0], input.shape[1] // block_size)
    return data, scales


def _prepare_block_quantize(node, input, global_scale=None, swizzle_block_scales=False, block_size=16, dtype=None):
    ops.check_k(node.op.name, input.shape[1], block_size)
    quantize = BlockQuantize(input, global_scale, swizzle=swizzle_block_scales, block_size=block_size)
    m, nb = input.shape[0], input.shape[1] // block_size

    def run(node, input, global_scale=None, swizzle_block_scales=False, block_size=16, dtype=None):
        if not quantize.accepts(input):  # (a load prologue's layout guard failed: x is a tensor this call)
            return _block_quantize_for(node, input, global_scale, swizzle_block_scales, block_size, dtype)
        data, scales = quantize(input, global_scale)
        return data, ops.logical_view(scales, m, nb) if swizzle_block_scales else scales

    return run


def _grouped_block_quantize_for(node, input, input_offsets, output_offsets, global_scale=None, block_size=16,
                                dtype=None):
    ops.check_k(node.op.name, input.shape[1], block_size)
    ops.check_offsets(node.op.name, input.shape[0], input_offsets, output_offsets)
    return grouped_block_quantize(input, input_offsets, output_offsets, global_scale, block_size=block_size)


def _prepare_grouped_block_quantize(node, input, input_offsets, output_offsets, global_scale=None, block_size=16,
                                    dtype=None):
    ops.check_k(node.op.name, input.shape[1], block_size)
    check = ops.offsets_check(node.op.name, input.shape[0], input_offsets, output_offsets)
    offsets = PreparedGroupCheck(check)
    quantize = BlockQuantize(input, global_scale, input_offsets, output_offsets, block_size=block_size, check=check)
    fused_check = quantize.fuses_check  # (decided once: False only when there is no launch to carry it, K = 0)

    def run(node, input, input_offsets, output_offsets, global_scale=None, block_size=16, dtype=None):
        if not quantize.accepts(input):  # (a load prologue's layout guard failed: x is a tensor this call)
            return _grouped_block_quantize_for(node, input, input_offsets, output_offsets, global_scale, block_size,
                                               dtype)
        if not fused_check:
            offsets(input_offsets, output_offsets)
            return quantize(input, global_scale, input_offsets, output_offsets)
        # The device check runs inside the quantize launch (program 0), one launch fewer per call.
        flag = offsets.device_flag(input_offsets, output_offsets)
        return quantize(input, global_scale, input_offsets, output_offsets, flag)

    return run


attach("preprocess_grouped_matmul_input_sf", kernel=_layout_op_for, prepare=_prepare_layout_op)
attach("nv_block_quantize", kernel=_block_quantize_for, prepare=_prepare_block_quantize)
attach("nv_grouped_block_quantize", kernel=_grouped_block_quantize_for, prepare=_prepare_grouped_block_quantize)
