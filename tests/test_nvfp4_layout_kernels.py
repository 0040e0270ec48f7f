"""Triton kernels of pyfuser.kernels.nvfp4_layout, checked BIT-EXACTLY against the pure-torch reference.

- layout_op == reference.preprocess_grouped_matmul_input_sf (whole zero-filled buffer, raw bits);
- block_quantize == reference.quantize_nvfp4_fused (+ reference.linear_to_swizzled_128_4 with swizzle=True);
- grouped_block_quantize == reference.grouped_quantize_nvfp4(fused=True).
Plus hand-derived checks that need no reference (the specs' worked examples, FP4 ties), the launchers' argument
errors, and an ahead-of-time sm_90 compile of every kernel variant (the interpreter accepts code the GPU compiler
rejects). On CPU the kernels run under the Triton interpreter: shapes stay small (<= ~32 programs per launch).
"""

import json
import os
import subprocess
import sys
import textwrap

from unittest import mock

import pytest
import torch

from harness import DEVICE, make, sliced, transposed
from nvfp4_inputs import start_offsets
from ptx_model import run_ptx

from pyfuser.kernels import nvfp4_layout as lk
from pyfuser.nvfp4 import reference as ref

FP8 = torch.float8_e4m3fn
_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def offsets(tokens):
    """(input_offsets, output_offsets): exclusive prefix sums of the group sizes and of the sizes padded to 128."""
    return start_offsets(tokens, DEVICE)


def buffer_bits(out, g):
    """The whole layout-op buffer behind a returned [m, k] tensor, as integer bits."""
    m, k = out.shape
    numel = (m + 127 * g) * ((k + 3) // 4 * 4)
    assert out.untyped_storage().nbytes() == numel * out.element_size()
    return torch.as_strided(out, (numel,), (1,)).view(_INT[out.element_size()])


def assert_layout_equal(out, expected, g):
    assert out.dtype == expected.dtype and out.shape == expected.shape
    assert out.stride() == expected.stride() == (out.shape[1], 1)
    assert torch.equal(buffer_bits(out, g), buffer_bits(expected, g))


def on_cpu(*args):
    return [a.cpu() if isinstance(a, torch.Tensor) else a for a in args]


def fused_reference(x, global_scale=None, block_size=16):
    """reference.quantize_nvfp4_fused evaluated on the CPU, results moved back to x's device.

    The fused ops' scale is RN(RN(amax / 6) * gs): an IEEE division. The reference writes ``amax / 6.0`` (a Python
    float), and torch's CUDA kernel for ``tensor / python_scalar`` multiplies by the fp32 reciprocal instead, which
    differs by one ulp for some amax; at an e4m3 midpoint that changes the scale (with gs = 3 and bf16 data, in 39%
    of the runs of the non-contiguous test on the H200). On the CPU the division is exact, so the oracle computes
    what it documents on every machine (test_block_scale_is_an_ieee_division_by_6 pins the kernel's side by hand).
    No data here has NaN values, whose sign after arithmetic differs between CPU and GPU."""
    packed, scales = ref.quantize_nvfp4_fused(*on_cpu(x, global_scale), block_size)
    return packed.to(x.device), scales.to(x.device)


def grouped_reference(x, input_offsets, output_offsets, global_scale=None, block_size=16):
    """reference.grouped_quantize_nvfp4(fused=True) evaluated on the CPU (see fused_reference)."""
    packed, scales = ref.grouped_quantize_nvfp4(*on_cpu(x, input_offsets, output_offsets, global_scale), block_size,
                                                fused=True)
    m, nb = scales.shape
    storage = torch.as_strided(scales, (scales.untyped_storage().nbytes(),), (1,)).to(x.device)
    return packed.to(x.device), torch.as_strided(storage, (m, nb), (nb, 1))


def with_layout(layout, shape, dtype):
    if layout == "transposed":
        return transposed(shape, dtype)
    if layout == "sliced":
        return sliced(shape, dtype)
    return make(shape, dtype)


# ---------------------------------------------------------------------------------------------------------------
# layout_op
# ---------------------------------------------------------------------------------------------------------------

LAYOUT_CASES = {
    "spec-k3": ([2, 3, 5], 3),
    "g1": ([7], 5),
    "g1-130rows": ([130], 4),  # a second 128-row tile
    "empty-groups": ([0, 3, 0, 0, 140, 0], 9),  # empty first, middle and last groups
    "k9-spec-test": ([100, 150, 262], 9),  # the upstream test's shape: m=512, offsets [0,100,250]/[0,128,384]
    "k70": ([33, 40], 70),  # two column tiles with the default 64-wide tiles
    "k1": ([3, 129, 1], 1),
}


@pytest.mark.parametrize("case", list(LAYOUT_CASES))
@pytest.mark.parametrize("dtype", [FP8, torch.float32, torch.bfloat16], ids=["fp8", "f32", "bf16"])
def test_layout_op_matches_reference(case, dtype):
    tokens, k = LAYOUT_CASES[case]
    x = make((sum(tokens), k), dtype)
    in_off, out_off = offsets(tokens)
    out = lk.layout_op(x, in_off, out_off)
    assert_layout_equal(out, ref.preprocess_grouped_matmul_input_sf(x, in_off, out_off), len(tokens))


@pytest.mark.parametrize("layout", ["transposed", "sliced"])
@pytest.mark.parametrize("dtype", [FP8, torch.float32, torch.bfloat16], ids=["fp8", "f32", "bf16"])
def test_layout_op_non_contiguous_input(layout, dtype):
    tokens = [5, 0, 40]
    x = with_layout(layout, (sum(tokens), 6), dtype)
    assert not x.is_contiguous()
    in_off, out_off = offsets(tokens)
    out = lk.layout_op(x, in_off, out_off)
    assert_layout_equal(out, ref.preprocess_grouped_matmul_input_sf(x, in_off, out_off), len(tokens))


@pytest.mark.parametrize("block_rows,block_cols", [(32, 2), (128, 16), (256, 1)])
def test_layout_op_tile_sizes(block_rows, block_cols):
    # Buffer tiles that straddle group slabs and 32-row sub-tiles, tiles wider than the buffer rows, one unit.
    tokens, k = [37, 0, 90, 2], 11
    x = make((sum(tokens), k))
    in_off, out_off = offsets(tokens)
    out = lk.layout_op(x, in_off, out_off, block_rows=block_rows, block_cols=block_cols)
    assert_layout_equal(out, ref.preprocess_grouped_matmul_input_sf(x, in_off, out_off), len(tokens))


@pytest.mark.parametrize("dtype", [FP8, torch.bfloat16, torch.float32], ids=["fp8", "bf16", "f32"])
def test_layout_op_unaligned_output_offsets(dtype):
    # Slabs need not start on multiples of 128 (the ops layer only needs them disjoint, in order and inside the
    # buffer): the rows before the first slab, the gaps between slabs and the slack at the end are zeros, and the
    # buffer tiles of the kernel straddle slab boundaries.
    tokens = [5, 40, 3]
    x = make((sum(tokens), 8), dtype)
    in_off = offsets(tokens)[0]
    out_off = torch.tensor([3, 140, 300], dtype=torch.int32, device=DEVICE)
    out = lk.layout_op(x, in_off, out_off)
    assert_layout_equal(out, ref.preprocess_grouped_matmul_input_sf(x, in_off, out_off), len(tokens))
    buf = buffer_bits(out, 3)
    assert buf[140 * 8] == x.view(buf.dtype)[5, 0]  # group 1's first element: first byte of its slab


def test_layout_op_writes_every_padding_byte():
    # The buffer is not zero-filled before the kernel runs (torch.empty): the kernel writes the padding. Dirty the
    # allocator's free memory first, so that a skipped byte would show up as stale data.
    tokens = [3, 0, 60]
    x = make((sum(tokens), 8))
    numel = (sum(tokens) + 127 * len(tokens)) * 8
    junk = torch.full((numel,), -1, dtype=torch.int32, device=DEVICE)
    del junk
    in_off, out_off = offsets(tokens)
    out = lk.layout_op(x, in_off, out_off)
    assert_layout_equal(out, ref.preprocess_grouped_matmul_input_sf(x, in_off, out_off), len(tokens))


def test_wide_positions(monkeypatch):
    # Buffers or inputs of 2**31 units or more index with int64; force that path on small tensors.
    monkeypatch.setattr(lk, "_INT32_LIMIT", 0)
    tokens = [37, 0, 90]
    x = make((sum(tokens), 12), FP8)
    in_off, out_off = offsets(tokens)
    assert_layout_equal(lk.layout_op(x, in_off, out_off), ref.preprocess_grouped_matmul_input_sf(x, in_off, out_off),
                        len(tokens))
    xq = special_values(sum(tokens), 64, torch.bfloat16)
    packed, scales = lk.grouped_block_quantize(xq, in_off, out_off)
    ref_packed, ref_scales = grouped_reference(xq, in_off, out_off)
    assert torch.equal(packed.view(torch.uint8), ref_packed.view(torch.uint8))
    assert_layout_equal(scales, ref_scales, len(tokens))


def test_layout_op_worked_example():
    # layout_op.md "Worked example": tokens [2,3,5], k=3 (pk=4), buffer [391, 4].
    x = torch.arange(1, 31, dtype=torch.float32, device=DEVICE).reshape(10, 3)
    out = lk.layout_op(x, *offsets([2, 3, 5]))
    assert out.shape == (10, 3) and out.stride() == (3, 1) and out.dtype == torch.float32
    buf = buffer_bits(out, 3).view(torch.float32)
    assert buf.numel() == 1564
    placed = {0: (0, 0), 2: (0, 2), 16: (1, 0), 18: (1, 2), 512: (2, 0), 529: (3, 1), 546: (4, 2),
              1024: (5, 0), 1042: (6, 2), 1089: (9, 1)}
    for pos, (r, c) in placed.items():
        assert buf[pos].item() == x[r, c].item(), (pos, r, c)
    # Exactly the 30 inputs are written, each once; everything else is zero padding.
    nz = buf[buf != 0]
    assert sorted(nz.tolist()) == list(range(1, 31))


def test_layout_op_other_spec_positions():
    # layout_op.md: with pk=8 local (33,5) lands at 533; with pk=4 local (130,2) lands at 546.
    x = torch.zeros(131, 8, device=DEVICE)
    x[33, 5] = 7.0
    buf = buffer_bits(lk.layout_op(x, *offsets([131])), 1).view(torch.float32)
    assert buf.nonzero().flatten().tolist() == [533]
    x = torch.zeros(131, 3, device=DEVICE)
    x[130, 2] = 7.0
    buf = buffer_bits(lk.layout_op(x, *offsets([131])), 1).view(torch.float32)
    assert buf.nonzero().flatten().tolist() == [546]


def test_layout_op_single_group_is_the_single_swizzle():
    x = make((150, 6), FP8)
    out = lk.layout_op(x, *offsets([150]))
    sw = ref.linear_to_swizzled_128_4(x)  # [256, 8]
    assert torch.equal(buffer_bits(out, 1)[: sw.numel()], sw.view(torch.uint8).flatten())
    assert not buffer_bits(out, 1)[sw.numel():].any()


def test_layout_op_empty_input():
    x = torch.empty(0, 5, dtype=FP8, device=DEVICE)
    out = lk.layout_op(x, *offsets([0, 0]))
    assert out.shape == (0, 5) and out.dtype == FP8
    assert out.untyped_storage().nbytes() == 127 * 2 * 8 and not buffer_bits(out, 2).any()


def test_layout_op_never_writes_outside_the_buffer():
    # The op trusts the offsets; bad ones give wrong placements but the kernel masks every write that would
    # leave the buffer (here group 1's base row is far past the end) or precede input_offsets[0].
    x = torch.arange(1, 11, dtype=torch.float32, device=DEVICE).reshape(10, 1)
    in_off = torch.tensor([0, 4], dtype=torch.int32, device=DEVICE)
    out_off = torch.tensor([0, 10**6], dtype=torch.int32, device=DEVICE)
    buf = buffer_bits(lk.layout_op(x, in_off, out_off), 2).view(torch.float32)
    assert sorted(buf[buf != 0].tolist()) == [1, 2, 3, 4]
    late = torch.tensor([2, 4], dtype=torch.int32, device=DEVICE)
    buf = buffer_bits(lk.layout_op(x, late, torch.tensor([0, 128], dtype=torch.int32, device=DEVICE)), 2)
    assert sorted(buf.view(torch.float32)[buf != 0].tolist()) == list(range(3, 11))


@pytest.mark.parametrize(
    "args,exc,match",
    [
        (lambda: (make((6,)), *offsets([6])), ValueError, "2-D"),
        (lambda: (make((6, 2)), torch.zeros(1, 1, dtype=torch.int32, device=DEVICE), offsets([6])[1]),
         ValueError, "input_offsets must be a 1-D"),
        (lambda: (make((6, 2)), offsets([6])[0].float(), offsets([6])[1]), TypeError, "input_offsets must be int32"),
        (lambda: (make((6, 2)), offsets([3, 3])[0], offsets([6])[1]), ValueError, "2 entries but output_offsets has 1"),
        (lambda: (make((6, 2)), offsets([])[0], offsets([])[1]), ValueError, "at least one group"),
        (lambda: (make((6, 2), torch.complex128), *offsets([6])), TypeError, "dtype"),
    ],
    ids=["1d-input", "2d-offsets", "float-offsets", "length-mismatch", "no-groups", "complex128-bits"],
)
def test_layout_op_errors(args, exc, match):
    with pytest.raises(exc, match=match):
        lk.layout_op(*args())


def test_layout_op_tile_size_error():
    with pytest.raises(ValueError, match="block_rows must be a power of two"):
        lk.layout_op(make((6, 2)), *offsets([6]), block_rows=24)


# ---------------------------------------------------------------------------------------------------------------
# block_quantize / grouped_block_quantize
# ---------------------------------------------------------------------------------------------------------------

def special_values(m, k, dtype):
    """Random data with blocks that hit the edge cases of the fused scale: all zero (zero scale), tiny (the fp8
    scale underflows to 0 while data is nonzero), huge (scale saturates at 448), inf, negative zeros, exact
    FP4 ties, and a spread of magnitudes across blocks."""
    x = torch.randn(m, k, device=DEVICE) * torch.logspace(-3, 3, m, device=DEVICE)[:, None]
    x[0, :16] = 0.0
    x[1 % m, :16] = -0.0
    if m > 2:
        x[2, :16] = torch.linspace(-1, 1, 16, device=DEVICE) * 1e-6
    if m > 3:
        x[3, :16] = torch.linspace(-1, 1, 16, device=DEVICE) * 1e5
    if m > 4:
        x[4, :16] = torch.tensor([6, .25, .75, 1.25, 1.75, 2.5, 3.5, 5, -.25, -.75, -1.25, -1.75, -2.5, -3.5, -5, 0.],
                                 device=DEVICE)
    if m > 5:
        x[5, :16] = torch.randn(16, device=DEVICE)
        x[5, 3] = float("inf")
    return x.to(dtype)


QUANT_SHAPES = [(6, 16), (37, 48), (130, 32)]  # K=48: the 64-wide tile is masked; 130 rows: two 128-row tiles


@pytest.mark.parametrize("shape", QUANT_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["f32", "bf16", "f16"])
@pytest.mark.parametrize("gs", [None, 2688.0 / 7.5], ids=["no-gs", "gs"])
@pytest.mark.parametrize("swizzle", [False, True], ids=["plain", "swizzled"])
def test_block_quantize_matches_reference(shape, dtype, gs, swizzle):
    x = special_values(*shape, dtype)
    gs_t = None if gs is None else torch.tensor(gs, dtype=torch.float32, device=DEVICE)
    packed, scales = lk.block_quantize(x, gs_t, swizzle=swizzle)
    ref_packed, ref_scales = fused_reference(x, gs_t)
    if swizzle:
        ref_scales = ref.linear_to_swizzled_128_4(ref_scales)
    assert packed.dtype == torch.float4_e2m1fn_x2 and packed.shape == (shape[0], shape[1] // 2)
    assert packed.is_contiguous() and scales.is_contiguous()
    assert scales.dtype == FP8 and scales.shape == ref_scales.shape
    assert torch.equal(packed.view(torch.uint8), ref_packed.view(torch.uint8))
    assert torch.equal(scales.view(torch.uint8), ref_scales.view(torch.uint8))


@pytest.mark.parametrize("layout", ["transposed", "sliced"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["f32", "bf16", "f16"])
def test_block_quantize_non_contiguous(layout, dtype):
    x = with_layout(layout, (20, 64), dtype)
    assert not x.is_contiguous()
    gs = torch.tensor(3.0, device=DEVICE)
    packed, scales = lk.block_quantize(x, gs)
    ref_packed, ref_scales = fused_reference(x, gs)
    assert torch.equal(packed.view(torch.uint8), ref_packed.view(torch.uint8))
    assert torch.equal(scales.view(torch.uint8), ref_scales.view(torch.uint8))


@pytest.mark.parametrize("block_size,block_k,tiles", [(16, 16, 1), (16, 256, 2), (32, 64, 3), (2, 8, 2), (16, 32, 4)])
def test_block_quantize_block_and_tile_sizes(block_size, block_k, tiles):
    # tiles: consecutive tiles per program (the last program's may lie past the end: masked).
    x = special_values(9, 96, torch.float32)
    packed, scales = lk.block_quantize(x, None, block_size=block_size, block_m=4, block_k=block_k, tiles=tiles)
    ref_packed, ref_scales = fused_reference(x, None, block_size)
    assert torch.equal(packed.view(torch.uint8), ref_packed.view(torch.uint8))
    assert torch.equal(scales.view(torch.uint8), ref_scales.view(torch.uint8))


def test_block_quantize_nan_block_has_a_nan_scale():
    # NaN propagates through the block max like torch.amax (the kernel uses a NaN-propagating max; the GPU's
    # default max would drop it), so the block's scale is NaN and its values encode with magnitude 0.
    x = make((2, 32))
    x[1, 20] = float("nan")
    packed, scales = lk.block_quantize(x)
    ref_packed, ref_scales = fused_reference(x)
    assert torch.equal(scales.view(torch.uint8), ref_scales.view(torch.uint8))
    assert scales.float()[1, 1].isnan() and not scales.float()[1, 0].isnan()
    codes = ref.unpack_fp4(packed)
    assert torch.equal(codes[1, 16:] & 7, torch.zeros_like(codes[1, 16:]))
    assert torch.equal(packed.view(torch.uint8)[:, :8], ref_packed.view(torch.uint8)[:, :8])


WORKED_BLOCK = [0.1, -0.25, 0.5, 1, 3, -2.2, 0, 4.4, 0.7, -0.9, 1.3, 2.6, -3.9, 0.05, 5.2, -1.1]
WORKED_FP4 = [0, -.5, .5, 1, 3, -3, 0, 6, 1, -1, 1.5, 3, -4, 0, 6, -1.5]


@pytest.mark.parametrize("gs,scale", [(None, 0.875), (2688.0 / 10.4, 224.0)], ids=["no-gs", "gs"])
def test_block_quantize_worked_block(gs, scale):
    # nvfp4.md "Worked block": the e4m3 scale and the FP4 values, derived by hand (-4.5 is a tie -> -4).
    x = torch.tensor([WORKED_BLOCK], device=DEVICE)
    gs_t = None if gs is None else torch.tensor(gs, dtype=torch.float32, device=DEVICE)
    packed, scales = lk.block_quantize(x, gs_t)
    assert scales.float().item() == scale
    assert ref.from_fp4(packed).flatten().tolist() == WORKED_FP4


def test_fp4_ties_and_packing_by_hand():
    # amax 6 gives scale exactly 1: the data are encoded unscaled. Midpoints round to the even code, -0.0 keeps
    # its sign bit, and element 2j is the low nibble: (0, -0.5) -> 0x90, (0.5, 1) -> 0x21, (3, -3) -> 0xD5.
    x = torch.tensor([[6, .25, .75, 1.25, 1.75, 2.5, 3.5, 5, -0.0, -0.5, 0.5, 1, 3, -3, 6, -.3]], device=DEVICE)
    packed, scales = lk.block_quantize(x)
    assert scales.float().item() == 1.0
    assert packed.view(torch.uint8).flatten().tolist() == [0x07, 0x22, 0x44, 0x66, 0x98, 0x21, 0xD5, 0x97]


def test_zero_scale_block_encodes_zeros():
    # A block whose fp8 scale underflows to 0: the data become +-0 (codes 0 / 8), not x * inf (codes 7 / 15).
    x = torch.tensor([[1e-9, -1e-9] * 8], device=DEVICE)
    packed, scales = lk.block_quantize(x)
    assert scales.view(torch.uint8).item() == 0
    assert packed.view(torch.uint8).flatten().tolist() == [0x80] * 8


def test_block_scale_is_an_ieee_division_by_6():
    # s = RN(RN(amax / 6) * gs): the spec's two roundings. amax = 1.5625, gs = 3: RN(1.5625 / 6) = 8738133 * 2^-25,
    # times 3 = 26214399 * 2^-25 needs 25 bits: a tie that rounds (to even) to 0.78125 exactly, the midpoint of
    # e4m3 0.75 and 0.8125, so the scale is 0.75 (even mantissa) and the data are multiplied by 3 / 0.75 = 4:
    # 6.25 -> 6, 1.75 (tie) -> 2, 1.25 (tie) -> 1. Multiplying by the fp32 reciprocal of 6 instead (what torch's
    # CUDA kernel does for `tensor / 6.0`) gives s = 0.78125 + 2^-24, the scale 0.8125 and 0.4375 -> 1.5.
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.tensor([[1.5625, 0.4375, 0.3125, -0.4375] + [0.0] * 12], dtype=dtype, device=DEVICE)
        packed, scales = lk.block_quantize(x, torch.tensor(3.0, device=DEVICE))
        assert scales.float().item() == 0.75
        assert ref.from_fp4(packed).flatten().tolist() == [6, 2, 1, -2] + [0] * 12


def test_fast_fp4_encoding_matches_thresholds():
    # The kernels' short encoding (used for tiles whose every |v| < 7 and finite) against the reference encoder
    # on the E2M1 values, every midpoint and its fp32 neighbours, both signs and zeros, up to 7.
    import triton
    import triton.language as tl

    @triton.jit
    def encode(v_ptr, out_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        v = tl.load(v_ptr + i, mask=i < n, other=0.0)
        tl.store(out_ptr + i, lk._fp4_code_fast(v).to(tl.uint8), mask=i < n)

    grid_vals = torch.tensor([0, .25, .5, .75, 1, 1.25, 1.5, 1.75, 2, 2.5, 3, 3.5, 4, 5, 6, 6.5, 6.99])
    near = torch.cat([torch.nextafter(grid_vals, torch.tensor(-1.0)), grid_vals, torch.nextafter(grid_vals, torch.tensor(9.0))])
    gen = torch.Generator().manual_seed(0)
    v = torch.cat([near, -near, torch.rand(4000, generator=gen) * 14 - 7, torch.tensor([1e-30, -1e-45, 2e-38])])
    v = v.to(DEVICE)
    out = torch.empty(v.numel(), dtype=torch.uint8, device=DEVICE)
    encode[(triton.cdiv(v.numel(), 1024),)](v, out, v.numel(), BLOCK=1024)
    assert torch.equal(out, ref.fp4_encode(v))


def test_fp4_pack_ptx_matches_the_reference_encoding():
    # FP4_PACK_PTX (the fast encoding's packing on the GPU, 4 pairs per word) run through a model of its
    # instructions on the same inputs the kernel gives it (the fp32 sums of _fp4_lines and the values' bits):
    # the reference's packed bytes, for E2M1 values, every midpoint and its fp32 neighbours, both signs and zeros.
    import numpy as np

    grid_vals = torch.tensor([0, .25, .5, .75, 1, 1.25, 1.5, 1.75, 2, 2.5, 3, 3.5, 4, 5, 6, 6.5, 6.99])
    near = torch.cat([torch.nextafter(grid_vals, torch.tensor(-1.0)), grid_vals,
                      torch.nextafter(grid_vals, torch.tensor(9.0))])
    gen = torch.Generator().manual_seed(0)
    v = torch.cat([near, -near, torch.rand(4000, generator=gen) * 14 - 7, torch.tensor([1e-30, -1e-45, 2e-38])])
    v = v[torch.randperm(v.numel(), generator=gen)][: v.numel() // 8 * 8].reshape(-1, 4, 2)  # [words, pairs, 2]
    a = np.abs(v.numpy().astype(np.float32))
    magic = np.float32(lk.RNE_MAGIC.value)
    sums = np.minimum(np.minimum(a * np.float32(2) + magic, a + (magic + np.float32(2))),
                      a * np.float32(0.5) + (magic + np.float32(4))).view(np.uint32)
    bits = v.numpy().astype(np.float32).view(np.uint32)
    want = ref.pack_fp4(ref.fp4_encode(v.reshape(-1, 8))).view(torch.uint8).reshape(-1, 4)
    for w in range(v.shape[0]):
        operands = [int(x) for x in (*sums[w, :, 0], *sums[w, :, 1], *bits[w, :, 0], *bits[w, :, 1])]
        (word,) = run_ptx(lk.FP4_PACK_PTX.value, dict(enumerate(operands, start=1)))
        assert list(word.to_bytes(4, "little")) == want[w].tolist(), (w, v[w])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["f32", "bf16", "f16"])
def test_fast_and_exact_tiles(dtype):
    # A tile whose blocks all have normal unsaturated fp8 scales (or zero ones) takes the fast encoding; one block
    # with a subnormal scale sends its whole tile to the exact one. Same data both ways, with exact FP4 midpoints
    # (blocks of amax 6 have scale 1: their data are encoded unscaled), against the reference.
    ties = torch.tensor([6, .25, .75, 1.25, 1.75, 2.5, 3.5, 5, -.25, -.75, -1.25, -1.75, -2.5, -3.5, -5, -0.0])
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(8, 64, generator=gen) * 2
    for r in range(4):
        x[r, 16 * r:16 * r + 16] = ties[torch.randperm(16, generator=gen)]
    x[5, :16] = 0.0
    poisoned = x.clone()
    poisoned[7, 16:32] = torch.linspace(-0.05, 0.05, 16)  # amax / 6 < 2^-6: a subnormal e4m3 scale
    for data in (x, poisoned):
        data = data.to(dtype).to(DEVICE)
        packed, scales = lk.block_quantize(data, block_m=8, block_k=64)
        ref_packed, ref_scales = fused_reference(data)
        assert torch.equal(scales.view(torch.uint8), ref_scales.view(torch.uint8))
        assert torch.equal(packed.view(torch.uint8), ref_packed.view(torch.uint8))


GROUPED_CASES = {
    "g1": [10],
    "spec-tokens": [2, 3, 5],
    "empty-groups": [0, 9, 0, 131, 0],
}


@pytest.mark.parametrize("case", list(GROUPED_CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["f32", "bf16", "f16"])
@pytest.mark.parametrize("gs", [None, 448.0 * 6 / 9.0], ids=["no-gs", "gs"])
def test_grouped_block_quantize_matches_reference(case, dtype, gs):
    tokens = GROUPED_CASES[case]
    x = special_values(sum(tokens), 48, dtype)  # K/16 = 3 scale columns: pk = 4 has a padded column
    gs_t = None if gs is None else torch.tensor(gs, dtype=torch.float32, device=DEVICE)
    in_off, out_off = offsets(tokens)
    packed, scales = lk.grouped_block_quantize(x, in_off, out_off, gs_t)
    ref_packed, ref_scales = grouped_reference(x, in_off, out_off, gs_t)
    assert torch.equal(packed.view(torch.uint8), ref_packed.view(torch.uint8))
    assert_layout_equal(scales, ref_scales, len(tokens))


@pytest.mark.parametrize("k,tiles", [(64, 3), (128, 2)], ids=["tiles-cross-rows", "tiles-share-rows"])
def test_grouped_block_quantize_non_contiguous_and_small_tiles(k, tiles):
    # A program's tiles run along K: with 3 tiles over 2 per row band they cross into the next rows (each tile
    # looks its rows' groups up); with 2 over 4 they share their rows (looked up once per program).
    tokens = [40, 0, 29]
    x = transposed((sum(tokens), k), torch.bfloat16)
    in_off, out_off = offsets(tokens)
    packed, scales = lk.grouped_block_quantize(x, in_off, out_off, block_m=16, block_k=32, tiles=tiles)
    ref_packed, ref_scales = grouped_reference(x, in_off, out_off)
    assert torch.equal(packed.view(torch.uint8), ref_packed.view(torch.uint8))
    assert_layout_equal(scales, ref_scales, len(tokens))


@pytest.mark.parametrize("g", [2, 3, 4, 5, 8, 9, 16, 17])
@pytest.mark.parametrize("offsets_dtype", [torch.int32, torch.int64], ids=["i32", "i64"])
def test_grouped_block_quantize_group_counts_and_boundaries(g, offsets_dtype):
    """Every number of groups around the lookup's powers of two (G = 2**ceil(log2(g)) offsets scanned, those past
    G/2 masked by g; a binary search past 16), with empty groups (first, middle, last, and runs of them) and group
    boundaries inside the 4 rows of a program (the default tiling) and inside its 128-row blocks."""
    gen = torch.Generator().manual_seed(g)
    tokens = torch.randint(0, 11, (g,), generator=gen).tolist()
    tokens[0] = 0  # an empty first group
    tokens[1] = 6  # a boundary at row 6 (inside a program's 4 rows); the random sizes put the others anywhere
    if g > 2:
        tokens[-1] = tokens[(g + 1) // 2] = 0  # an empty last and (from 4 groups) middle group
    x = special_values(sum(tokens), 64, torch.bfloat16)
    in_off, out_off = (t.to(offsets_dtype) for t in offsets(tokens))
    for kw in ({}, dict(block_m=16, block_k=32, tiles=2)):
        packed, scales = lk.grouped_block_quantize(x, in_off, out_off, **kw)
        ref_packed, ref_scales = grouped_reference(x, in_off, out_off)
        assert torch.equal(packed.view(torch.uint8), ref_packed.view(torch.uint8)), (tokens, kw)
        assert_layout_equal(scales, ref_scales, g)


@pytest.mark.parametrize("k", [48, 64], ids=["nb3", "nb4"])
def test_grouped_block_quantize_unaligned_offsets_and_gaps(k):
    # Slabs at unaligned rows with gaps: the kernel's padding programs zero everything the quantize programs do
    # not write (4-byte units when K/16 is a multiple of 4, bytes otherwise).
    tokens = [5, 40, 3]
    x = special_values(sum(tokens), k, torch.bfloat16)
    in_off = offsets(tokens)[0]
    out_off = torch.tensor([3, 140, 300], dtype=torch.int32, device=DEVICE)
    packed, scales = lk.grouped_block_quantize(x, in_off, out_off)
    ref_packed, ref_scales = grouped_reference(x, in_off, out_off)
    assert torch.equal(packed.view(torch.uint8), ref_packed.view(torch.uint8))
    assert_layout_equal(scales, ref_scales, len(tokens))


@pytest.mark.parametrize("grouped", [False, True], ids=["swizzled", "grouped"])
def test_padding_programs_come_first(grouped, monkeypatch):
    """The grid's first programs zero the scale buffer's padding and the quantize programs follow, as many as the
    launch's quant_programs (its 9th integer): the padding programs are the grid's size less that, so a grid cut
    to quant_programs (benchmarks/ab_quantize_layouts.py's timing without them) still quantizes every tile. (Which
    programs come first is for the timing only: every order gives the same bits.)"""
    tokens = [5, 40, 3]
    x = special_values(sum(tokens), 64, torch.bfloat16)
    in_off, out_off = offsets(tokens)
    original, grids = lk.bound_launch, []

    def trimmed(kernel, grid, ints, *args, **kwargs):
        grids.append((grid[0], ints[8]))
        return original(kernel, (ints[8],), ints, *args, **kwargs)

    monkeypatch.setattr(lk, "bound_launch", trimmed)
    if grouped:
        packed, _ = lk.grouped_block_quantize(x, in_off, out_off)
        ref_packed, _ = grouped_reference(x, in_off, out_off)
    else:
        packed, _ = lk.block_quantize(x, swizzle=True)
        ref_packed, _ = fused_reference(x)
    assert grids and all(n > q > 0 for n, q in grids)  # (there are padding programs to leave out)
    assert torch.equal(packed.view(torch.uint8), ref_packed.view(torch.uint8))


@pytest.mark.parametrize("store, block_m, dtype", [
    (lk.SCALE_WORDS, 4, torch.bfloat16), (lk.SCALE_WORDS_INTERLEAVED, 4, torch.bfloat16),
    (lk.SCALE_WORDS_INTERLEAVED, 8, torch.float32), (lk.SCALE_WORDS_INTERLEAVED, 2, torch.bfloat16),
], ids=["words", "interleaved", "interleaved-8-rows-f32", "interleaved-2-rows"])
@pytest.mark.parametrize("k", [48, 128], ids=["nb3", "nb8"])
def test_quantize_scale_stores_match_the_reference(store, block_m, dtype, k):
    """The swizzled layouts' other scale stores (32-bit words; words from rows interleaved within 128-row blocks):
    the reference's bits, for groups that are empty, start mid-block or leave gaps, a padded scale column (K/16 =
    3, written by the word with the data), 130 rows (a partial 128-row block), and tiles that cannot interleave
    (2 rows: words) or cannot pack (block_k = 32: bytes, at K/16 = 3)."""
    gs = torch.tensor(448.0 * 6 / 9.0, dtype=torch.float32, device=DEVICE)
    tokens = [0, 9, 0, 117, 4]
    x = special_values(sum(tokens), k, dtype)
    in_off = offsets(tokens)[0]
    gappy = torch.tensor([0, 3, 140, 140, 300], dtype=torch.int32, device=DEVICE)
    # (block_k 32, the byte stores, with the gappy offsets and 3 blocks per row only: under the interpreter it is
    # the slowest run, 16 s of the suite's CPU time per parameter set at 8 blocks.)
    runs = ((offsets(tokens)[1], None), (gappy, None)) + (((gappy, 32),) if k == 48 else ())
    for out_off, block_k in runs:
        packed, scales = lk.grouped_block_quantize(x, in_off, out_off, gs, block_m=block_m, block_k=block_k,
                                                   scale_store=store)
        ref_packed, ref_scales = grouped_reference(x, in_off, out_off, gs)
        assert torch.equal(packed.view(torch.uint8), ref_packed.view(torch.uint8))
        assert_layout_equal(scales, ref_scales, len(tokens))
    packed, scales = lk.block_quantize(x, gs, swizzle=True, block_m=block_m, scale_store=store)
    ref_packed, ref_scales = fused_reference(x, gs)
    assert torch.equal(packed.view(torch.uint8), ref_packed.view(torch.uint8))
    assert torch.equal(scales.view(torch.uint8), ref.linear_to_swizzled_128_4(ref_scales).view(torch.uint8))
    # Non-contiguous x (element loads, not pairs): column-major and a row slice of a wider tensor.
    for x_nc in (transposed((sum(tokens), k), dtype), sliced((sum(tokens), k), dtype)):
        packed, scales = lk.grouped_block_quantize(x_nc, in_off, out_off, block_m=block_m, scale_store=store)
        ref_packed, ref_scales = grouped_reference(x_nc, in_off, out_off)
        assert packed.shape == ref_packed.shape and packed.is_contiguous()
        assert torch.equal(packed.view(torch.uint8), ref_packed.view(torch.uint8))
        assert_layout_equal(scales, ref_scales, len(tokens))


def test_quantize_scale_store_must_be_known():
    with pytest.raises(ValueError, match="scale_store must be SCALE_BYTES, SCALE_WORDS or SCALE_WORDS_INTERLEAVED"):
        lk.block_quantize(make((4, 16)), scale_store=3)


def test_fused_quantize_equals_quantize_then_layout_op():
    # The one-kernel grouped quantize is the two-kernel pipeline (block_quantize, then layout_op on its scales).
    tokens = [3, 0, 20]
    x = make((sum(tokens), 32))
    in_off, out_off = offsets(tokens)
    packed, scales = lk.grouped_block_quantize(x, in_off, out_off)
    packed2, plain = lk.block_quantize(x)
    assert torch.equal(packed.view(torch.uint8), packed2.view(torch.uint8))
    assert_layout_equal(scales, lk.layout_op(plain, in_off, out_off), len(tokens))


def test_quantize_empty_rows():
    x = torch.empty(0, 32, device=DEVICE)
    packed, scales = lk.block_quantize(x, swizzle=True)
    assert packed.shape == (0, 16) and scales.shape == (0, 4)
    packed, scales = lk.grouped_block_quantize(x, *offsets([0, 0]))
    assert packed.shape == (0, 16) and scales.shape == (0, 2) and not buffer_bits(scales, 2).any()


@pytest.mark.parametrize(
    "call,exc,match",
    [
        (lambda: lk.block_quantize(make((4, 24))), ValueError, r"K \(24\) must be a multiple of block_size \(16\)"),
        (lambda: lk.block_quantize(make((32,))), ValueError, "x must be 2-D"),
        (lambda: lk.block_quantize(make((4, 32), torch.int32)), TypeError, "float32, bfloat16 or float16"),
        (lambda: lk.block_quantize(make((4, 32), FP8)), TypeError, "float32, bfloat16 or float16"),
        (lambda: lk.block_quantize(make((4, 32)), torch.ones(1, device=DEVICE)), ValueError, "0-dim"),
        (lambda: lk.block_quantize(make((4, 32)), torch.tensor(1.0, dtype=torch.float64, device=DEVICE)),
         TypeError, "global_scale must be float32"),
        (lambda: lk.block_quantize(make((4, 48)), block_size=12), ValueError, "block_size must be a power of two"),
        (lambda: lk.block_quantize(make((4, 32)), block_k=48), ValueError, "block_k must be a power of two"),
        (lambda: lk.block_quantize(make((4, 32)), tiles=0), ValueError, "tiles must be a positive int"),
        (lambda: lk.grouped_block_quantize(make((4, 40)), *offsets([4])), ValueError, "multiple of block_size"),
        (lambda: lk.grouped_block_quantize(make((4, 32)), offsets([4])[0], offsets([2, 2])[1]),
         ValueError, "1 entries but output_offsets has 2"),
    ],
    ids=["k-not-multiple", "1d", "int", "fp8", "gs-1d", "gs-f64", "block-size", "block-k", "tiles", "grouped-k",
         "grouped-g"],
)
def test_quantize_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_launchers_never_read_tensor_values_on_the_host():
    # No host sync: launch shapes come from m, k and g only; offsets and global_scale are read by the kernels.
    # Every way Python reads a tensor's value is made to fail during the launches (on CUDA, torch's sync debug
    # mode also turns any synchronizing call into an error).
    x = make((10, 32))
    in_off, out_off = offsets([3, 7])
    gs = torch.tensor(2.0, device=DEVICE)
    calls = [lambda: lk.layout_op(x, in_off, out_off), lambda: lk.block_quantize(x, gs, swizzle=True),
             lambda: lk.grouped_block_quantize(x, in_off, out_off, gs)]
    for call in calls:  # compile first (the interpreter and the compiler may inspect arguments freely)
        call()

    def host_read(*args, **kwargs):
        raise AssertionError("a launcher read a tensor value on the host")

    reads = ["item", "tolist", "__bool__", "__int__", "__index__", "__float__"]
    with mock.patch.multiple(torch.Tensor, **{name: host_read for name in reads}):
        if DEVICE.type == "cuda":
            torch.cuda.set_sync_debug_mode("error")
        try:
            for call in calls:
                call()
        finally:
            if DEVICE.type == "cuda":
                torch.cuda.set_sync_debug_mode("default")


# ---------------------------------------------------------------------------------------------------------------
# The offsets' device check inside the layout and grouped quantize launches (CHECK: program 0 ORs its bits)
# ---------------------------------------------------------------------------------------------------------------

# tokens (7, 0, 33): m = 40, starts [0, 7, 7], outs [0, 128, 128], a buffer of 40 + 127*3 = 421 rows.
FUSED_CHECK_OFFSETS = {
    "good": ([0, 7, 7], [0, 128, 128]),
    "gaps": ([0, 7, 7], [3, 140, 280]),
    "decreasing": ([0, 30, 7], [0, 128, 256]),
    "first-not-0": ([1, 7, 7], [0, 128, 128]),
    "negative-start": ([-1, 7, 7], [0, 128, 256]),
    "last-past-m": ([0, 7, 41], [0, 128, 256]),
    "overlap": ([0, 7, 7], [0, 100, 256]),
    "capacity": ([0, 7, 7], [0, 128, 300]),
    "negative-out": ([0, 7, 7], [-1, 128, 256]),
    "both": ([0, 30, 7], [0, 0, 0]),
}


def _offsets_as(values, dtype, strided):
    t = torch.tensor([v for v in values for _ in range(2 if strided else 1)], dtype=dtype, device=DEVICE)
    return t[::2] if strided else t


@pytest.mark.parametrize("op", ["layout", "quantize"])
@pytest.mark.parametrize("case", list(FUSED_CHECK_OFFSETS))
@pytest.mark.parametrize("dtype, strided, wide", [(torch.int32, False, False), (torch.int64, False, False),
                                                  (torch.int32, True, False), (torch.int32, False, True)],
                         ids=["i32", "i64", "strided", "wide"])
def test_fused_offsets_check_bits_equal_the_check_kernel(op, case, dtype, strided, wide, monkeypatch):
    """The CHECK launch ORs into its flag exactly the bits the offsets' own check launch (and its torch form) gives,
    keeping bits already set, and touches no other flag; its results are the plain launch's, bit for bit (the
    grouped quantize's scale buffer only for good offsets: bad ones leave some of it unwritten)."""
    from pyfuser.kernels.group_offsets_check import prepare_group_offsets_flags
    from pyfuser.ops import offset_checks

    if wide:  # int64 positions (buffers or inputs of 2**31 units or more), forced on small tensors
        monkeypatch.setattr(lk, "_INT32_LIMIT", 0)
    starts, outs = (_offsets_as(v, dtype, strided) for v in FUSED_CHECK_OFFSETS[case])
    x = make((40, 6), FP8) if op == "layout" else special_values(40, 48, torch.bfloat16)
    c = offset_checks.GroupCheck("op", 40, capacity=40 + 127 * 3)  # (the ops' check: ops.offsets_check, int32 only)
    want = int(offset_checks.torch_flags(c, starts, outs, None))
    separate = torch.zeros(2, dtype=torch.int32, device=DEVICE)
    prepare_group_offsets_flags(c, starts, outs, None)(starts, outs, None, separate, 1)
    assert separate.tolist() == [0, want]
    assert (want != 0) == (case not in ("good", "gaps"))
    flags = torch.tensor([0, 8, 0], dtype=torch.int32, device=DEVICE)  # bit 8: set by an earlier call
    if op == "layout":
        prepared = lk.LayoutOp(x, starts, outs, check=c)
        assert prepared.fuses_check
        plain, got = prepared(x, starts, outs), prepared(x, starts, outs, flags[1:2])
        assert_layout_equal(got, plain, 3)
    else:
        prepared = lk.BlockQuantize(x, None, starts, outs, check=c)
        assert prepared.fuses_check
        plain, got = prepared(x, None, starts, outs), prepared(x, None, starts, outs, flags[1:2])
        assert torch.equal(got[0].view(torch.uint8), plain[0].view(torch.uint8))
        if not want:
            assert_layout_equal(got[1], plain[1], 3)
    assert flags.tolist() == [0, want | 8, 0]


def test_fused_offsets_check_without_quantize_programs():
    """A grouped quantize of no rows launches only the programs that zero the scale buffer: program 0 of those
    runs the check."""
    from pyfuser.ops import narrow_precision

    x = torch.empty(0, 32, device=DEVICE)
    starts, outs = _offsets_as([0, 1], torch.int32, False), _offsets_as([0, 128], torch.int32, False)
    prepared = lk.BlockQuantize(x, None, starts, outs, check=narrow_precision.offsets_check("op", 0, starts, outs))
    assert prepared.launch.bound.grid[0] > 0 and prepared.fuses_check
    flags = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    packed, scales = prepared(x, None, starts, outs, flags)
    assert flags.tolist() == [1] and packed.shape == (0, 16) and not buffer_bits(scales, 2).any()


def test_no_fused_check_without_a_launch_or_a_grouped_layout():
    """Nothing to launch (no columns) or no offsets (plain and swizzled quantize): no launch carries a check."""
    from pyfuser.ops import narrow_precision

    starts, outs = offsets([3, 1])
    c = narrow_precision.offsets_check("op", 4, starts, outs)
    assert not lk.LayoutOp(make((4, 0), FP8), starts, outs, check=c).fuses_check
    assert not lk.BlockQuantize(make((4, 0)), None, starts, outs, check=c).fuses_check
    assert lk.LayoutOp(make((4, 4), FP8), starts, outs, check=c).fuses_check
    assert not lk.LayoutOp(make((4, 4), FP8), starts, outs).fuses_check
    assert not lk.BlockQuantize(make((4, 32)), swizzle=True).fuses_check
    assert not lk.BlockQuantize(make((4, 32))).fuses_check


def test_layout_prefetch_only_for_one_wave_over_a_small_input():
    # The L2 prefetch pays where the grid is one wave (decode: two DRAM trips in a row are the launch's time) and
    # cost 12% at prefill (many waves, bandwidth-bound; benchmarks/ab_layout_prefetch.py).
    from pyfuser.kernels import nvfp4_layout as lk

    assert lk.layout_prefetch_pays(32 << 10, 36, 132)  # decode-sized scales
    assert not lk.layout_prefetch_pays(4 << 20, 544, 132)  # prefill: many waves
    assert not lk.layout_prefetch_pays(lk.LAYOUT_PREFETCH_MAX_BYTES + 1, 8, 132)
    assert not lk.layout_prefetch_pays(0, 1, 132)
    starts, outs = offsets([3, 1])
    x = make((4, 4), FP8)
    # the interpreter runs no PTX: never, whatever is asked
    assert lk.LayoutOp(x, starts, outs, prefetch=True).prefetch == (DEVICE.type == "cuda")
    assert not lk.LayoutOp(x, starts, outs, prefetch=False).prefetch


# ---------------------------------------------------------------------------------------------------------------
# Ahead-of-time compile for the H200 (sm_90)
# ---------------------------------------------------------------------------------------------------------------

COMPILE = textwrap.dedent(
    """
    import json, re, sys
    import triton
    from triton.backends.compiler import GPUTarget
    from pyfuser.kernels import nvfp4_layout as lk

    def compile_ptx(fn, signature, constexprs, num_warps=4):
        src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs)
        return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps}).asm["ptx"]

    # (CHECK: program 0 also runs the offsets' device check and ORs its bits into flags_ptr; the variants without
    # it give it False and any pointer)
    check_sig = {"flags_ptr": "*i32", "check_m": "i32", "check_capacity": "i32", "CHECK": "constexpr",
                 "CHECK_EVERY_ROW": "constexpr", "CHECK_BLOCK": "constexpr"}

    def check_consts(check):
        return {"CHECK": check, "CHECK_EVERY_ROW": check, "CHECK_BLOCK": 16}

    report, stores = {}, {}
    for unit_log2, wide, check in ((2, False, False), (0, True, False), (2, False, True), (0, True, True)):
        sig = {"in_ptr": "*i32" if unit_log2 else "*u8", "in_offsets_ptr": "*i32", "out_offsets_ptr": "*i32",
               "out_ptr": "*i32" if unit_log2 else "*u8", "m": "i32", "k_units": "i32", "g": "i32",
               "stride_m": "i64", "stride_k": "i32", "pk_units": "i32", "n_rows": "i32", "LOG2_G": "constexpr",
               "UNIT_LOG2": "constexpr", "BLOCK_R": "constexpr", "BLOCK_C": "constexpr", "WIDE": "constexpr",
               **check_sig, "span_units": "i32", "PREFETCH_LINES": "constexpr", "LINE_UNITS": "constexpr"}
        consts = {"LOG2_G": 3, "UNIT_LOG2": unit_log2, "BLOCK_R": 32, "BLOCK_C": 64, "WIDE": wide,
                  **check_consts(check), "PREFETCH_LINES": 128, "LINE_UNITS": 32 if unit_log2 else 128}
        ptx = compile_ptx(lk._layout_op_kernel, sig, consts)
        report[f"layout-{unit_log2}-{wide}-{check}"] = "st.global" in ptx
        stores[f"layout-{unit_log2}-{wide}-{check}"] = ptx.count("st.global")
        stores[f"layout-{unit_log2}-{wide}-{check}:prefetches"] = ptx.count("prefetch.global.L2")
    # (the last field, SCALE_STORE: the swizzled layouts' scales as bytes, words, or words from interleaved rows)
    variants = (("fp32", 0, 0, False, False, False, 0), ("i32", 1, 1, True, False, False, 0),
                ("i32", 2, 2, True, False, False, 0), ("i64", 2, 3, False, True, False, 0),
                ("i32", 2, 2, True, False, True, 0), ("i64", 2, 3, False, True, True, 0),
                ("i32", 1, 1, True, False, False, 1), ("i32", 2, 2, True, False, False, 1),
                ("i32", 2, 2, True, False, False, 2), ("i64", 2, 3, False, True, True, 2))
    for xdtype, layout, fmt, has_gs, wide, check, store in variants:
        sig = {"x_ptr": "*" + xdtype, "gs_ptr": "*fp32", "packed_ptr": "*u8", "scales_ptr": "*u8",
               "units_ptr": "*i32", "in_offsets_ptr": "*i32", "out_offsets_ptr": "*i32", "M": "i32", "K": "i32",
               "g": "i32", "stride_m": "i32", "stride_k": "i32", "pk": "i32", "scales_numel": "i64",
               "n_rows": "i32", "quant_programs": "i32", "k_tiles": "i32", "z_cols": "i32",
               "HAS_GS": "constexpr", "SCALE_LAYOUT": "constexpr", "X_FORMAT": "constexpr", "LOG2_G": "constexpr",
               "BLOCK_SIZE": "constexpr", "BLOCK_M": "constexpr", "BLOCK_K": "constexpr", "TILES": "constexpr",
               "WIDE": "constexpr", "UNIT_LOG2": "constexpr", "ZERO_R": "constexpr", "ZERO_C": "constexpr",
               **check_sig, "SCALE_STORE": "constexpr", "ASM": "constexpr"}
        consts = {"HAS_GS": has_gs, "SCALE_LAYOUT": layout, "X_FORMAT": fmt, "LOG2_G": 2, "BLOCK_SIZE": 16,
                  "BLOCK_M": 4, "BLOCK_K": 512, "TILES": 2, "WIDE": wide, "UNIT_LOG2": 2, "ZERO_R": 32, "ZERO_C": 64,
                  **check_consts(check), "SCALE_STORE": store, "ASM": True}
        ptx = compile_ptx(lk._block_quantize_kernel, sig, consts, num_warps=2)
        name = f"quantize-{xdtype}-{layout}-{fmt}" + ("-check" if check else "") + (f"-store{store}" if store else "")
        report[name] = sorted(set(re.findall(r"\\b(div\\.[a-z0-9.]+|max\\.[A-Za-z0-9.]+)", ptx)))
        stores[name] = ptx.count("st.global")
        stores[name + ":bytes"] = len(re.findall(r"st\\.global[.a-z0-9]*\\.[bu]8\\b", ptx))
        stores[name + ":packed-words"] = ptx.count("prmt.b32 l, a, b, 0x5410;")
    print(json.dumps({"report": report, "stores": stores}))
    """
)


def test_kernels_compile_for_sm90():
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", COMPILE], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    report, stores = out["report"], out["stores"]
    assert all(report.pop(f"layout-{v}-{c}") for v in ("2-False", "0-True") for c in (False, True))
    assert len(report) == 10
    # Scales stored as words: fewer byte stores than the same variant storing bytes (the packed FP4 data stays
    # bytes), and interleaved rows store the same way.
    for layout in ("quantize-i32-1-1", "quantize-i32-2-2"):
        assert stores[layout + "-store1:bytes"] < stores[layout + ":bytes"], stores
    assert stores["quantize-i32-2-2-store2:bytes"] == stores["quantize-i32-2-2-store1:bytes"], stores
    # The launches that run the offsets' check store one thing more (program 0's flag) than those without it.
    for without, with_check in (("layout-2-False-False", "layout-2-False-True"),
                                ("layout-0-True-False", "layout-0-True-True"),
                                ("quantize-i32-2-2", "quantize-i32-2-2-check"),
                                ("quantize-i64-2-3", "quantize-i64-2-3-check")):
        assert stores[with_check] > stores[without], (with_check, stores)
    # The layout op asks L2 for its input's lines with one prefetch per lane (PREFETCH_LINES = 128 on 4 warps).
    assert all(v >= 1 for k, v in stores.items() if k.endswith(":prefetches")), stores
    # The fast encoding packs 4 pairs per word with FP4_PACK_PTX: per tile, 2 halves of the 2 blocks a thread
    # holds (4 x 512 tiles on 2 warps), and 2 tiles.
    assert all(v == 8 for k, v in stores.items() if k.endswith(":packed-words")), stores
    for variant, instrs in report.items():
        # Bit-exactness on the GPU: IEEE divisions (Triton's plain "/" is the approximate div.full.f32) and a
        # NaN-propagating block max.
        assert "div.rn.f32" in instrs and not any(i.startswith("div.full") for i in instrs), (variant, instrs)
        assert any(i.startswith("max.NaN") for i in instrs), (variant, instrs)
