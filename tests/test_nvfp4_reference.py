"""Tests of pyfuser.nvfp4.reference, the pure-torch NVFP4 oracle the kernels are checked against.

The expected values come from the specs' worked examples (spec/nvfp4.md, spec/layout_op.md) or from oracles
written here independently (per-element Python rounding, explicit index loops), never from the module itself.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import DEVICE
from pyfuser import nvfp4
from pyfuser.nvfp4 import (
    dequantize_nvfp4,
    fp4_decode,
    fp4_encode,
    from_fp4,
    grouped_quantize_nvfp4,
    grouped_scale_index,
    grouped_scales_to_linear,
    linear_to_swizzled_128_4,
    nvfp4_grouped_mm,
    pack_fp4,
    preprocess_grouped_matmul_input_sf,
    quantize_nvfp4,
    quantize_nvfp4_fused,
    swizzled_to_linear_128_4,
    to_fp4,
    unpack_fp4,
)

E4M3 = torch.float8_e4m3fn


# ---------------------------------------------------------------- independent oracles


def fp4_value(code: int) -> float:
    """E2M1 bit layout s|ee|m: exponent 0 is subnormal (m * 0.5), else 2^(e-1) * (1 + m/2)."""
    sign = -1.0 if code & 8 else 1.0
    e, m = (code >> 1) & 3, code & 1
    return sign * (0.5 * m if e == 0 else 2.0 ** (e - 1) * (1 + 0.5 * m))


def nearest_code(x: float) -> int:
    """Brute-force round to nearest, ties to the even code, saturating; the sign bit of x is kept (NaN -> 0|sign)."""
    sign = 8 if math.copysign(1.0, x) < 0 else 0
    if math.isnan(x):
        return sign
    a = min(abs(x), 6.0)
    best = min(range(8), key=lambda c: (abs(fp4_value(c) - a), c & 1))
    return best | sign


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t


def assert_bits_equal(a: torch.Tensor, b: torch.Tensor):
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    assert torch.equal(bits(a.contiguous()), bits(b.contiguous()))


def spec_index(r_local: int, c: int, pk: int, base_row: int = 0) -> int:
    """layout_op.md's formula for one element, written out with the spec's names."""
    tile_r, rb = divmod(r_local, 128)
    a, b = divmod(rb, 32)
    tile_c, d = divmod(c, 4)
    return base_row * pk + tile_r * 128 * pk + tile_c * 512 + b * 16 + a * 4 + d


def i32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


def round_up(a, b):
    return (a + b - 1) // b * b


# ---------------------------------------------------------------- FP4 codes


def test_constants():
    assert nvfp4.FLOAT4_E2M1_MAX == 6.0
    assert nvfp4.FLOAT8_E4M3_MAX == torch.finfo(E4M3).max == 448.0
    assert nvfp4.FLOAT8_E4M3_EPS == torch.finfo(E4M3).smallest_normal == 2.0**-6


def test_every_code_round_trips():
    codes = torch.arange(16, dtype=torch.uint8, device=DEVICE)
    values = fp4_decode(codes)
    assert values.dtype == torch.float32
    assert values.tolist() == [fp4_value(c) for c in range(16)]
    assert torch.equal(fp4_encode(values), codes)  # code 8 is -0.0 and keeps its sign
    assert torch.signbit(values[8])


@pytest.mark.parametrize(
    "tie,code",
    [(0.25, 0), (0.75, 2), (1.25, 2), (1.75, 4), (2.5, 4), (3.5, 6), (5.0, 6)],
)
def test_ties_round_to_even_code(tie, code):
    x = torch.tensor([tie, -tie], device=DEVICE)
    assert fp4_encode(x).tolist() == [code, code | 8]
    above = torch.nextafter(x, x * 2)
    below = torch.nextafter(x, torch.zeros_like(x))
    # Just off the midpoint the tie is broken by distance: the codes on either side are consecutive.
    assert fp4_encode(above).tolist() == [nearest_code(v) for v in above.tolist()]
    assert fp4_encode(below).tolist() == [nearest_code(v) for v in below.tolist()]
    assert fp4_encode(above)[0] - fp4_encode(below)[0] == 1


def test_saturation_sign_and_nan():
    x = torch.tensor([6.0, 6.5, 100.0, 1e30, math.inf, -7.0, -math.inf, -0.1, -0.0, 0.0], device=DEVICE)
    assert fp4_encode(x).tolist() == [7, 7, 7, 7, 7, 15, 15, 8, 8, 0]
    # NaN encodes as zero with NaN's sign bit; which sign bit a NaN carries is platform-dependent (CUDA's negation
    # returns a canonical NaN), so the code is compared with the tensor's own sign bit.
    for nan in (torch.tensor([math.nan], device=DEVICE), -torch.tensor([math.nan], device=DEVICE)):
        assert fp4_encode(nan).item() == (8 if torch.signbit(nan).item() else 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_encode_dtypes(dtype):
    x = torch.tensor([0.25, 0.3, -0.75, 1.3, 2.6, -3.4, 5.0, 5.1], dtype=dtype, device=DEVICE)
    assert fp4_encode(x).tolist() == [nearest_code(v) for v in x.tolist()]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=False), min_size=1, max_size=64))
def test_encode_matches_bruteforce_rne(values):
    x = torch.tensor(values, dtype=torch.float32, device=DEVICE)
    codes = fp4_encode(x)
    assert codes.tolist() == [nearest_code(v) for v in values]
    # Decoding gives a value no farther from the clamped input than any other FP4 value.
    dec = fp4_decode(codes).tolist()
    for v, d in zip(values, dec):
        a = max(-6.0, min(6.0, v))
        assert abs(d - a) <= min(abs(fp4_value(c) - a) for c in range(16))


def test_decode_rejects_non_uint8():
    with pytest.raises(TypeError, match="fp4_decode"):
        fp4_decode(torch.zeros(2, dtype=torch.int32))


# ---------------------------------------------------------------- packing


@pytest.mark.parametrize("pair,byte", [((0.0, -0.5), 0x90), ((0.5, 1.0), 0x21), ((3.0, -3.0), 0xD5)])
def test_packing_examples(pair, byte):
    p = to_fp4(torch.tensor(pair, device=DEVICE))
    assert p.dtype == torch.float4_e2m1fn_x2 and p.shape == (1,)
    assert p.view(torch.uint8).item() == byte
    assert from_fp4(p).tolist() == list(pair)


def test_pack_non_contiguous_and_batched():
    codes = torch.randint(0, 16, (3, 8, 6), dtype=torch.uint8, device=DEVICE)
    t = codes.transpose(1, 2)  # [3, 6, 8], last dim strided
    packed = pack_fp4(t)
    assert packed.shape == (3, 6, 4) and packed.is_contiguous()
    tc = t.contiguous()
    expected = tc[..., 0::2] | (tc[..., 1::2] << 4)
    assert torch.equal(packed.view(torch.uint8), expected)
    assert torch.equal(unpack_fp4(packed), tc)
    # unpack accepts a non-contiguous packed tensor too.
    assert torch.equal(unpack_fp4(packed.transpose(0, 1)), tc.transpose(0, 1))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 255), min_size=1, max_size=32))
def test_unpack_pack_round_trip(byte_values):
    b = torch.tensor(byte_values, dtype=torch.uint8, device=DEVICE)
    codes = unpack_fp4(b.view(torch.float4_e2m1fn_x2))
    assert codes.tolist() == [n for v in byte_values for n in (v & 15, v >> 4)]
    assert torch.equal(pack_fp4(codes).view(torch.uint8), b)


def test_pack_errors():
    with pytest.raises(ValueError, match="even"):
        pack_fp4(torch.zeros(3, dtype=torch.uint8))
    with pytest.raises(TypeError, match="uint8"):
        pack_fp4(torch.zeros(4, dtype=torch.int64))
    with pytest.raises(TypeError, match="unpack_fp4"):
        unpack_fp4(torch.zeros(4))


# ---------------------------------------------------------------- quantize / dequantize

WORKED = [0.1, -0.25, 0.5, 1, 3, -2.2, 0, 4.4, 0.7, -0.9, 1.3, 2.6, -3.9, 0.05, 5.2, -1.1]
WORKED_FP4 = [0, -0.5, 0.5, 1, 3, -3, 0, 6, 1, -1, 1.5, 3, -4, 0, 6, -1.5]


@pytest.mark.parametrize("quantize", [quantize_nvfp4, quantize_nvfp4_fused])
def test_worked_block(quantize):
    x = torch.tensor([WORKED], device=DEVICE)
    packed, scales = quantize(x)
    assert packed.dtype == torch.float4_e2m1fn_x2 and packed.shape == (1, 8)
    assert scales.dtype == E4M3 and scales.shape == (1, 1)
    assert scales.float().item() == 0.875  # e4m3 of 5.2/6 = 0.8667: neighbours 0.8125 and 0.875
    assert from_fp4(packed)[0].tolist() == WORKED_FP4  # -3.9/0.8667 = -4.5 -> -4
    deq = dequantize_nvfp4(packed, scales)
    assert deq[0].tolist() == [v * 0.875 for v in WORKED_FP4]
    assert deq[0, 1].item() == -0.4375 and deq[0, 14].item() == 5.25 and deq[0, 15].item() == -1.3125


@pytest.mark.parametrize("quantize", [quantize_nvfp4, quantize_nvfp4_fused])
def test_worked_block_with_global_scale(quantize):
    x = torch.tensor([WORKED], device=DEVICE)
    gs = torch.tensor(2688 / 10.4, dtype=torch.float32, device=DEVICE)  # 448*6 / amax with amax 10.4
    packed, scales = quantize(x, gs)
    assert scales.float().item() == 224.0
    assert from_fp4(packed)[0].tolist() == WORKED_FP4
    deq = dequantize_nvfp4(packed, scales, gs)
    f32 = lambda v: torch.tensor(v, dtype=torch.float32).item()  # noqa: E731
    assert deq[0, 14].item() == f32(5.2) and deq[0, 15].item() == f32(-1.3)
    # A Python float global scale means the same thing.
    assert_bits_equal(quantize(x, 2688 / 10.4)[0], packed)


def test_reference_and_fused_orders_differ_by_one_ulp():
    # amax 5.2 gives an unrounded block scale 0.8667 but an e4m3 scale 0.875. 2.18/0.8667 = 2.515 rounds up to 3;
    # 2.18 * (1/0.875) = 2.491 rounds down to 2: the adjacent FP4 value, one ulp apart.
    block = [5.2, 2.18] + [0.0] * 14
    x = torch.tensor([block], device=DEVICE)
    p_ref, s_ref = quantize_nvfp4(x)
    p_fused, s_fused = quantize_nvfp4_fused(x)
    assert_bits_equal(s_ref, s_fused)
    c_ref, c_fused = unpack_fp4(p_ref)[0], unpack_fp4(p_fused)[0]
    assert fp4_decode(c_ref)[:2].tolist() == [6.0, 3.0]
    assert fp4_decode(c_fused)[:2].tolist() == [6.0, 2.0]
    assert c_ref[1].item() - c_fused[1].item() == 1
    assert torch.equal(c_ref[2:], c_fused[2:]) and c_ref[0] == c_fused[0]


def test_fused_multiplier_is_gs_over_scale():
    # The fused order's multiplier is r = gs / scale (one fp32 division), then v * r. Kernels must use this exact
    # form: with gs=3 and scale 13/512, v * (gs/scale) is exactly the tie 0.75 (-> code 2, value 1.0) while
    # v * (1 / (scale/gs)) is 0.74999994 (-> 0.5).
    x = torch.zeros(1, 16, device=DEVICE)
    x[0, 0], x[0, 1] = 0.05078125, 0.00634765625
    packed, scales = quantize_nvfp4_fused(x, 3.0)
    assert scales.float().item() == 13 / 512
    assert from_fp4(packed)[0, :2].tolist() == [6.0, 1.0]
    s, g = scales.float()[0, 0].cpu(), torch.tensor(3.0)
    assert (x[0, 1].cpu() * (1 / (s / g))).item() < 0.75  # the other rounding would land below the tie


def spec_quantize(x: torch.Tensor, gs: float, fused: bool, bs: int = 16):
    """Per-block loops with 0-dim fp32 tensors following the spec's steps, rounding by `nearest_code`."""
    rows, k = x.shape
    codes = torch.zeros(rows, k, dtype=torch.uint8)
    scales = torch.zeros(rows, k // bs, dtype=torch.float32)
    g = torch.tensor(gs, dtype=torch.float32)
    for r in range(rows):
        for blk in range(k // bs):
            v = x[r, blk * bs:(blk + 1) * bs].float().cpu()
            s_g = v.abs().max() / 6 * g
            if fused:
                s8 = torch.clamp(torch.clamp_max(s_g, torch.finfo(torch.float32).max), -448, 448).to(E4M3).float()
                mult = torch.tensor(0.0) if s8 == 0 else g / s8
                q = v * mult
            else:
                s_g = s_g.clamp(2.0**-6, 448.0)
                s8 = s_g.to(E4M3).float()
                q = v / (s_g / g)
            scales[r, blk] = s8
            codes[r, blk * bs:(blk + 1) * bs] = torch.tensor([nearest_code(t) for t in q.tolist()], dtype=torch.uint8)
    return codes, scales


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("gs", [1.0, 37.5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_quantize_matches_per_block_oracle(fused, gs, dtype):
    torch.manual_seed(0)
    x = (torch.randn(4, 64) * torch.logspace(-3, 2, 4).unsqueeze(1)).to(dtype).to(DEVICE)
    x[1, 16:32] = 0.0  # an all-zero block: the orders differ in the scale (2^-6 vs 0), both give zero data
    x[2, :16] *= 1e-5  # a block whose fused scale underflows e4m3
    quantize = quantize_nvfp4_fused if fused else quantize_nvfp4
    packed, scales = quantize(x, gs)
    codes, ref_scales = spec_quantize(x, gs, fused)
    assert torch.equal(unpack_fp4(packed).cpu(), codes)
    assert torch.equal(scales.float().cpu(), ref_scales)


def test_zero_and_underflowing_scales():
    x = torch.zeros(2, 32, device=DEVICE)
    x[0, :16] = -0.0
    x[1, 16:] = torch.linspace(-1e-9, 1e-9, 16)
    p_ref, s_ref = quantize_nvfp4(x)
    p_fused, s_fused = quantize_nvfp4_fused(x)
    assert s_ref.float().eq(2.0**-6).all()  # the reference's lower clamp
    assert s_fused.float().eq(0).all()  # fused: no lower clamp, the scale underflows to 0 ...
    assert fp4_decode(unpack_fp4(p_fused)).eq(0).all()  # ... and the data become 0, not NaN
    assert unpack_fp4(p_fused)[0, :16].eq(8).all()  # -0.0 * 0 keeps the sign bit
    assert fp4_decode(unpack_fp4(p_ref)).eq(0).all()
    assert not dequantize_nvfp4(p_fused, s_fused).isnan().any()


def test_scale_saturates_instead_of_nan():
    x = torch.full((1, 16), 3e30, device=DEVICE)
    for quantize in (quantize_nvfp4, quantize_nvfp4_fused):
        packed, scales = quantize(x, 1e20)  # s_g overflows fp32
        assert scales.float().item() == 448.0
        assert unpack_fp4(packed).eq(7).all()


def block_amax(x, bs=16):
    return x.float().reshape(*x.shape[:-1], -1, bs).abs().amax(-1)


@pytest.mark.parametrize("fused", [False, True])
def test_dequantize_error_bounds(fused):
    torch.manual_seed(1)
    x = torch.randn(64, 128, device=DEVICE) * torch.logspace(-1, 1, 64, device=DEVICE).unsqueeze(1)
    gs = 448 * 6 / x.abs().max()
    packed, scales = (quantize_nvfp4_fused if fused else quantize_nvfp4)(x, gs)
    deq = dequantize_nvfp4(packed, scales, gs)
    err = (deq - x).abs().reshape(64, 8, 16).amax(-1)
    if fused:
        # deq = q * S/gs with q = RNE(x * gs/S): at most one FP4 half-gap (<= 1) of S/gs, and |x*gs/S| <= 6.4
        # so saturation costs less than that.
        bound = scales.float() / gs
    else:
        # q = RNE(x/t) with t = amax/6 unrounded (half-gap <= 1), then the e4m3 scale is off by <= 2^-4 relative.
        bound = block_amax(x) / 6 * (1 + 6 * 2.0**-4)
    assert (err <= bound * (1 + 1e-5)).all()
    # Overall: NVFP4 keeps roughly 1-2 significant bits per element relative to the block maximum.
    assert (err <= 0.25 * block_amax(x)).all()


def test_dequantize_swizzled_scales_and_errors():
    torch.manual_seed(2)
    x = torch.randn(130, 48, device=DEVICE)
    packed, scales = quantize_nvfp4(x)
    sw = linear_to_swizzled_128_4(scales)
    assert sw.shape == (256, 4)
    assert torch.equal(dequantize_nvfp4(packed, sw, swizzled=True), dequantize_nvfp4(packed, scales))
    with pytest.raises(ValueError, match="scales have shape"):
        dequantize_nvfp4(packed, sw)
    with pytest.raises(ValueError, match="multiple of block_size"):
        quantize_nvfp4(torch.randn(2, 24))
    with pytest.raises(TypeError, match="quantize_nvfp4"):
        quantize_nvfp4(torch.randn(2, 16).to(E4M3))
    with pytest.raises(ValueError, match="global_scale"):
        quantize_nvfp4(torch.randn(2, 16), torch.ones(2))


def test_quantize_batched_and_strided():
    torch.manual_seed(3)
    x = torch.randn(2, 32, 3, device=DEVICE).transpose(1, 2)  # [2, 3, 32], K strided
    packed, scales = quantize_nvfp4_fused(x)
    assert packed.shape == (2, 3, 16) and scales.shape == (2, 3, 2)
    p2, s2 = quantize_nvfp4_fused(x.contiguous().reshape(6, 32))
    assert_bits_equal(packed.reshape(6, 16), p2)
    assert_bits_equal(scales.reshape(6, 2), s2)


# ---------------------------------------------------------------- single-group swizzle


@pytest.mark.parametrize("shape", [(1, 1), (5, 3), (128, 4), (130, 9), (256, 8), (300, 13)])
@pytest.mark.parametrize("dtype", [torch.float32, E4M3])
def test_swizzle_round_trip(shape, dtype):
    m, k = shape
    s = (torch.rand(m, k, device=DEVICE) * 100 + 1).to(dtype)
    sw = linear_to_swizzled_128_4(s)
    rows, pk = round_up(m, 128), round_up(k, 4)
    assert sw.shape == (rows, pk) and sw.dtype == dtype and sw.is_contiguous()
    back = swizzled_to_linear_128_4(sw, m, k)
    assert back.is_contiguous()
    assert_bits_equal(back, s)
    # Every element sits where the spec's formula says; everything else is zero padding.
    flat = sw.reshape(-1).float().cpu()
    sf = s.float().cpu()
    seen = torch.zeros(rows * pk, dtype=torch.bool)
    for r in range(0, m, 7):
        for c in range(k):
            assert flat[spec_index(r, c, pk)] == sf[r, c]
    idx = grouped_scale_index(i32([0]), i32([0]), m, k).cpu()
    seen[idx.reshape(-1)] = True
    assert seen.sum() == m * k
    assert flat[~seen].eq(0).all()


def test_swizzle_hand_terms():
    # layout_op.md "Other terms": pk=8, local (33,5) -> 512 + 16 + 4 + 1 = 533; pk=4, (130,2) -> 512 + 32 + 2.
    assert grouped_scale_index(i32([0]), i32([0]), 34, 8)[33, 5].item() == 533
    assert grouped_scale_index(i32([0]), i32([0]), 131, 4)[130, 2].item() == 546
    s = torch.zeros(34, 8, device=DEVICE)
    s[33, 5] = 1.0
    assert linear_to_swizzled_128_4(s).reshape(-1).nonzero().item() == 533


def test_swizzle_errors():
    with pytest.raises(ValueError, match="2-D"):
        linear_to_swizzled_128_4(torch.zeros(4))
    with pytest.raises(ValueError, match="multiple of 128"):
        swizzled_to_linear_128_4(torch.zeros(100, 4), 100, 4)
    with pytest.raises(ValueError, match="does not fit"):
        swizzled_to_linear_128_4(torch.zeros(128, 4), 129, 4)


# ---------------------------------------------------------------- grouped layout (the layout op)

WORKED_POSITIONS = {
    (0, 0): 0, (0, 2): 2, (1, 0): 16, (1, 2): 18,  # group 0, base 0
    (2, 0): 512, (3, 1): 529, (4, 2): 546,  # group 1, base 512
    (5, 0): 1024, (6, 2): 1042, (9, 1): 1089,  # group 2, base 1024 (lr=4: b=4 -> 64, plus d=1)
}


def test_layout_worked_example():
    # Tokens [2,3,5]: m=10, g=3, k=3 (pk=4), offsets [0,2,5] and [0,128,256].
    inp, outp = i32([0, 2, 5]), i32([0, 128, 256])
    idx = grouped_scale_index(inp, outp, 10, 3)
    assert idx.dtype == torch.int64 and idx.shape == (10, 3)
    for (r, c), pos in WORKED_POSITIONS.items():
        assert idx[r, c].item() == pos, (r, c)

    x = torch.arange(1, 31, dtype=torch.float32, device=DEVICE).reshape(10, 3)
    out = preprocess_grouped_matmul_input_sf(x, inp, outp)
    assert out.shape == (10, 3) and out.stride() == (3, 1) and out.dtype == torch.float32
    assert out.untyped_storage().nbytes() // 4 == 1564  # [391, 4]
    buf = torch.as_strided(out, (391, 4), (4, 1)).reshape(-1)
    for (r, c), pos in WORKED_POSITIONS.items():
        assert buf[pos].item() == x[r, c].item()
    assert buf.count_nonzero().item() == 30  # only the m*k elements are written; the padding is zero
    assert sorted(buf.nonzero().reshape(-1).tolist()) == sorted(idx.reshape(-1).tolist())
    assert torch.equal(grouped_scales_to_linear(out, inp, outp), x)


@pytest.mark.parametrize("dtype", [E4M3, torch.float32, torch.bfloat16])
def test_layout_ported_upstream(dtype):
    # tests/cpp/test_layout_op.cpp: m=512, k=9 (pk=12), groups of 100, 150, 262 rows -> slabs 128+256+384 = 768.
    torch.manual_seed(4)
    m, k = 512, 9
    inp, outp = i32([0, 100, 250]), i32([0, 128, 384])
    x = (torch.rand(m, k, device=DEVICE) * 10 + 0.5).to(dtype)
    out = preprocess_grouped_matmul_input_sf(x, inp, outp)
    assert out.dtype == dtype and out.shape == (m, k)
    assert out.untyped_storage().nbytes() == (m + 127 * 3) * 12 * x.element_size()
    assert_bits_equal(grouped_scales_to_linear(out, inp, outp), x)
    # Undo the swizzle group by group, as the upstream test validates the buffer.
    buf = torch.as_strided(out, (768, 12), (12, 1))
    for start, end, sf in [(0, 100, 0), (100, 250, 128), (250, 512, 384)]:
        rows = round_up(end - start, 128)
        slab = buf[sf:sf + rows]
        assert_bits_equal(swizzled_to_linear_128_4(slab, end - start, k), x[start:end])
        # The slab is exactly the single-group swizzle of the group's rows, zero padding included.
        assert_bits_equal(slab, linear_to_swizzled_128_4(x[start:end]))


def test_layout_empty_group_and_strided_input():
    # Tokens [2, 0, 3, 5]: the empty group 1 shares its start with group 2; row 2 belongs to group 2.
    inp, outp = i32([0, 2, 2, 5]), i32([0, 128, 128, 256])
    idx = grouped_scale_index(inp, outp, 10, 3)
    assert idx[2, 0].item() == 128 * 4 and idx[5, 0].item() == 256 * 4 and idx[1, 2].item() == 18
    x = torch.randn(3, 10, device=DEVICE).t()  # transposed input
    out = preprocess_grouped_matmul_input_sf(x, inp, outp)
    assert torch.equal(grouped_scales_to_linear(out, inp, outp), x)
    assert torch.equal(
        torch.as_strided(out, (10 + 127 * 4, 4), (4, 1)), torch.as_strided(
            preprocess_grouped_matmul_input_sf(x.contiguous(), inp, outp), (10 + 127 * 4, 4), (4, 1))
    )


def test_layout_matches_formula_loops():
    torch.manual_seed(5)
    sizes = [3, 0, 140, 7]
    starts = [sum(sizes[:i]) for i in range(4)]
    sf = [sum(round_up(s, 128) for s in sizes[:i]) for i in range(4)]
    m, k = sum(sizes), 6
    idx = grouped_scale_index(i32(starts), i32(sf), m, k).cpu()
    for e, (start, size) in enumerate(zip(starts, sizes)):
        for lr in range(size):
            for c in range(k):
                assert idx[start + lr, c].item() == spec_index(lr, c, 8, sf[e])


def test_layout_errors():
    x = torch.zeros(4, 2)
    with pytest.raises(ValueError, match="2-D"):
        preprocess_grouped_matmul_input_sf(torch.zeros(4), i32([0]), i32([0]))
    with pytest.raises(ValueError, match="as many output_offsets"):
        preprocess_grouped_matmul_input_sf(x, i32([0, 2]), i32([0]))
    with pytest.raises(TypeError, match="integer"):
        preprocess_grouped_matmul_input_sf(x, torch.zeros(1), i32([0]))
    with pytest.raises(ValueError, match="not a plain"):
        grouped_scales_to_linear(x, i32([0]), i32([0]))


# ---------------------------------------------------------------- grouped quantize


@pytest.mark.parametrize("fused", [True, False])
def test_grouped_quantize(fused):
    torch.manual_seed(6)
    tokens = [20, 33, 0, 43]
    inp = i32([0, 20, 53, 53])
    outp = i32([0, 128, 256, 256])
    x = torch.randn(96, 64, device=DEVICE, dtype=torch.bfloat16)
    gs = torch.tensor(448 * 6 / x.float().abs().max().item(), device=DEVICE)
    packed, sf = grouped_quantize_nvfp4(x, inp, outp, gs, fused=fused)
    p_ref, s_ref = (quantize_nvfp4_fused if fused else quantize_nvfp4)(x, gs)
    assert_bits_equal(packed, p_ref)
    assert sf.dtype == E4M3 and sf.shape == (96, 4) and sf.stride() == (4, 1)
    assert sf.untyped_storage().nbytes() == (96 + 127 * 4) * 4
    assert_bits_equal(grouped_scales_to_linear(sf, inp, outp), s_ref)
    # Per group, the slab is the group's own quantization swizzled (rows are quantized independently).
    buf = torch.as_strided(sf, (384, 4), (4, 1))
    for start, size, base in zip([0, 20, 53, 53], tokens, [0, 128, 256, 256]):
        if size:
            _, s_group = (quantize_nvfp4_fused if fused else quantize_nvfp4)(x[start:start + size], gs)
            assert_bits_equal(buf[base:base + round_up(size, 128)], linear_to_swizzled_128_4(s_group))


# ---------------------------------------------------------------- NVFP4 grouped GEMM


def decode_bytes(packed: torch.Tensor) -> torch.Tensor:
    """Unpack [..., K/2] bytes with its own code table (from the bit layout) to float64 [..., K]."""
    table = torch.tensor([fp4_value(c) for c in range(16)], dtype=torch.float64)
    b = packed.view(torch.uint8).cpu().long()
    return torch.stack((table[b & 15], table[b >> 4]), -1).reshape(*b.shape[:-1], -1)


def unswizzle_loops(buf_flat: torch.Tensor, base_row: int, rows: int, k: int) -> torch.Tensor:
    """Read [rows, k] scales of one group out of a flat swizzled buffer with the spec's formula, element by element."""
    pk = round_up(k, 4)
    out = torch.empty(rows, k, dtype=torch.float64)
    for r in range(rows):
        for c in range(k):
            out[r, c] = buf_flat[spec_index(r, c, pk, base_row)]
    return out


def make_grouped_mm_case(tokens, m_total, n, k, seed=7):
    torch.manual_seed(seed)
    g = len(tokens)
    starts = [sum(tokens[:i]) for i in range(g)]
    sf_starts = [sum(round_up(t, 128) for t in tokens[:i]) for i in range(g)]
    x = torch.randn(m_total, k, device=DEVICE)
    w = torch.randn(g, n, k, device=DEVICE)
    gs_w = 2688 / w.amax(dim=(1, 2))  # upstream quirk: max, not abs-max
    w_packed, w_sf = [], []
    for i in range(g):
        p, s = quantize_nvfp4(w[i], gs_w[i])
        w_packed.append(p.view(torch.uint8))
        w_sf.append(linear_to_swizzled_128_4(s))
    mat2 = torch.stack(w_packed).view(torch.float4_e2m1fn_x2).transpose(-1, -2)  # [G, K/2, N], strides [NK/2,1,K/2]
    scale2 = torch.stack([s.view(torch.uint8) for s in w_sf]).view(E4M3)
    mat1, scale1 = grouped_quantize_nvfp4(x, i32(starts), i32(sf_starts))
    alpha = (1 / gs_w).to(torch.float32)
    problem_sizes = i32([[t, n, k] for t in tokens])
    args = (mat1, mat2, scale1, scale2, alpha, problem_sizes, i32(starts), i32(sf_starts))
    return args, x, w


def independent_grouped_mm(mat1, mat2, scale1, scale2, alpha, problem_sizes, starts, sf_starts):
    """Dequantize with a separate code table and per-element un-swizzle loops; float64 matmul per group."""
    m_total, k = mat1.shape[0], mat1.shape[1] * 2
    g, n = mat2.shape[0], mat2.shape[2]
    a = decode_bytes(mat1)
    b = decode_bytes(mat2.transpose(-1, -2))  # [G, N, K]
    s1_flat = torch.as_strided(scale1, (scale1.untyped_storage().nbytes(),), (1,)).float().cpu().double()
    out = torch.zeros(m_total, n, dtype=torch.float64)
    for i in range(g):
        m_i, e_i, sf_i = problem_sizes[i, 0].item(), starts[i].item(), sf_starts[i].item()
        if m_i == 0:
            continue
        s1 = unswizzle_loops(s1_flat, sf_i, m_i, k // 16)
        s2 = unswizzle_loops(scale2[i].reshape(-1).float().cpu().double(), 0, n, k // 16)
        a_i = a[e_i:e_i + m_i] * s1.repeat_interleave(16, 1)
        b_i = b[i] * s2.repeat_interleave(16, 1)
        out[e_i:e_i + m_i] = alpha[i].item() * (a_i @ b_i.T)
    return out


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_grouped_mm_matches_independent_computation(out_dtype):
    args, x, w = make_grouped_mm_case([20, 33, 0, 43], 96, 32, 64)
    out = nvfp4_grouped_mm(*args, out_dtype)
    assert out.shape == (96, 32) and out.dtype == out_dtype and out.is_contiguous()
    expected = independent_grouped_mm(*args)
    torch.testing.assert_close(out.double().cpu(), expected, atol=1e-2, rtol=1e-2)
    # The result is one rounding of the fp32 product: it equals the float64 result rounded, up to fp32 error.
    assert (out.double().cpu() - expected.to(out_dtype).double()).abs().max() <= expected.abs().max() * 2**-7
    # And NVFP4 is close enough to the unquantized product to be useful.
    exact = torch.cat([x[s:e] @ w[i].T for i, (s, e) in enumerate([(0, 20), (20, 53), (53, 53), (53, 96)])])
    rel = (out.float() - exact).norm() / exact.norm()
    assert rel < 0.2


def test_grouped_mm_plain_scale1_and_uncovered_rows():
    args, _, _ = make_grouped_mm_case([20, 33, 0, 43], 100, 32, 64, seed=8)  # rows 96..99 belong to no group
    mat1, mat2, scale1, *rest = args
    out = nvfp4_grouped_mm(*args, torch.bfloat16)
    assert out[96:].eq(0).all()
    torch.testing.assert_close(out.double().cpu(), independent_grouped_mm(*args), atol=1e-2, rtol=1e-2)
    # scale1 as a plain [sum R_i, K/16] tensor holding the same buffer gives the same result.
    plain = torch.as_strided(scale1, (384, 4), (4, 1)).clone()
    assert plain.shape == (384, 4) and plain.untyped_storage().nbytes() == 384 * 4
    assert torch.equal(nvfp4_grouped_mm(mat1, mat2, plain, *rest, torch.bfloat16), out)


def test_grouped_mm_errors():
    args, _, _ = make_grouped_mm_case([20, 33, 0, 43], 96, 32, 64, seed=9)
    mat1, mat2, scale1, scale2, alpha, sizes, starts, sf_starts = args
    with pytest.raises(ValueError, match="scale2"):
        nvfp4_grouped_mm(mat1, mat2, scale1, scale2[:, :32], alpha, sizes, starts, sf_starts, torch.bfloat16)
    bad_sizes = sizes.clone()
    bad_sizes[1, 2] = 128
    with pytest.raises(ValueError, match="problem_sizes"):
        nvfp4_grouped_mm(mat1, mat2, scale1, scale2, alpha, bad_sizes, starts, sf_starts, torch.bfloat16)
    with pytest.raises(ValueError, match="out of bounds"):
        nvfp4_grouped_mm(mat1, mat2, scale1, scale2, alpha, sizes, starts, i32([0, 128, 256, 4096]), torch.bfloat16)
