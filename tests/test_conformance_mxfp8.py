"""MXFP8 block quantization: ``nv_block_quantize(x, None, False, 32, DataType.Float8_e4m3fn)`` gives e4m3 values and
one e8m0 power-of-two scale per 32 elements of the last dim.

The reference below is written element by element with Python floats (math.frexp for the exponent), independent of
pyfuser's torch implementation; only the final round-to-e4m3 uses ATen's cast."""

from __future__ import annotations

import math

import pytest
import torch

from harness import check_fusion, define, make, transposed
from pyfuser import DataType, UnsupportedOpError
from pyfuser.errors import FusionDefinitionError, FusionExecutionError

F32_RCP_448 = float(torch.tensor(1 / 448, dtype=torch.float32))


def _f32(x: float) -> float:
    return float(torch.tensor(x, dtype=torch.float32))


def _scale_exponent(amax: float) -> int:
    """Unbiased exponent of the block scale: amax*fp32(1/448) rounded up to a power of two, within [-127, 127]."""
    v = _f32(amax * F32_RCP_448)
    if v == 0:
        return -127
    if math.isinf(v):
        return 127
    m, e = math.frexp(v)  # v = m * 2**e, 0.5 <= m < 1
    exp = e - 1 if m == 0.5 else e
    return max(-127, min(127, exp))


def reference_mxfp8(x: torch.Tensor):
    rows = x.float().reshape(-1, x.shape[-1]).tolist()
    values, scales = [], []
    for row in rows:
        qrow, srow = [], []
        for b in range(0, len(row), 32):
            block = row[b:b + 32]
            amax = max([abs(v) for v in block if not math.isnan(v)], default=0.0)
            e = _scale_exponent(amax)
            srow.append(e + 127)
            # the reciprocal as upstream takes it: 1.0 for the smallest scale, 0.0 for the largest
            rcp = 1.0 if e == -127 else (0.0 if e == 127 else 2.0 ** -e)
            qrow += [v * rcp for v in block]
        values.append(qrow)
        scales.append(srow)
    q = torch.tensor(values, dtype=torch.float32).clamp(-448, 448).to(torch.float8_e4m3fn)
    s = torch.tensor(scales, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    k = x.shape[-1]
    return q.reshape(x.shape).to(x.device), s.reshape(*x.shape[:-1], k // 32).to(x.device)


def _quantize(fd, t):
    return fd.ops.nv_block_quantize(t, None, False, 32, DataType.Float8_e4m3fn)


def _fusion(rank, dtype):
    def fusion(fd):
        t = fd.define_tensor(shape=[-1] * rank, contiguity=True, dtype=dtype)
        vals, scales = _quantize(fd, t)
        fd.add_output(vals)
        fd.add_output(scales)

    return fusion


def _special(x: torch.Tensor) -> torch.Tensor:
    x = x.clone()
    flat = x.view(-1, x.shape[-1])
    flat[0, 0], flat[0, 1], flat[0, 2] = float("nan"), -0.0, -3.0  # NaN in a block: ignored by the amax
    flat[0, 32:64] = 0.0  # all-zero block: smallest scale
    flat[1, 0:32] = 1e-39  # amax/448 subnormal
    flat[1, 40] = float("inf")  # infinite amax: largest scale, finite values -> 0, inf -> NaN
    flat[2, 0:32] = torch.linspace(-448.0, 448.0, 32)  # scale exactly 1
    flat[2, 32:64] = 3e38  # near fp32 max
    flat[3, 0:32] = float("nan")  # all-NaN block
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_mxfp8_values_and_scales_match_reference(dtype):
    x = _special(make((4, 96), torch.float32) * 50)
    if dtype is torch.float16:  # in fp16's range: largest finite block, fp16-subnormal block
        x[2, 32:64] = 60000.0
        x[1, 0:32] = 1e-7
    x = x.to(dtype)
    nv_dtype = {torch.float32: DataType.Float, torch.bfloat16: DataType.BFloat16, torch.float16: DataType.Half}[dtype]
    outs = check_fusion(_fusion(2, nv_dtype), [x], reference_mxfp8)
    assert outs[0].dtype == torch.float8_e4m3fn and outs[1].dtype == torch.float8_e8m0fnu
    # a spot check of the special blocks, spelled out
    s = outs[1].view(torch.uint8)
    assert s[0, 1] == 0 and s[1, 1] == 254  # all-zero block; block holding inf
    if dtype is not torch.float16:
        assert s[2, 0] == 127  # amax 448: scale 2^0
    v = outs[0].float()
    assert math.isnan(v[0, 0]) and v[0, 1] == 0 and math.copysign(1, v[0, 1]) < 0
    assert math.isnan(v[1, 40]) and (v[1, 32:40] == 0).all()


def test_mxfp8_scale_is_smallest_power_of_two_covering_amax():
    """Scales round up (nvFuser and Transformer Engine; note torch's cast to e8m0 rounds to nearest instead), so no
    value saturates, and dequantizing gives x back to e4m3's precision: half an ulp, 2**-4 relative for normal
    e4m3 values, and for values below e4m3's normal range (x / scale < 2**-6) half the subnormal step, 2**-10 times
    the scale (a random block has such a value now and then: the H200's data had one, off by 10% relative)."""
    x = make((8, 256))
    x = x * torch.logspace(-20, 20, 8, device=x.device).unsqueeze(1)
    outs = define(_fusion(2, DataType.Float)).execute([x])
    amax = x.reshape(8, 8, 32).abs().amax(-1).double()
    scale = outs[1].float().double()
    assert (scale >= amax / 448).all() and (scale / 2 < amax * F32_RCP_448).all()
    deq = outs[0].double().reshape(8, 8, 32) * scale.unsqueeze(-1)
    xb = x.double().reshape(8, 8, 32)
    bound = torch.maximum(xb.abs() * 2 ** -4, scale.unsqueeze(-1) * 2 ** -10)
    assert ((deq - xb).abs() <= bound).all()


def test_mxfp8_rank3_non_contiguous_input():
    x = transposed((3, 5, 64))  # last dim strided
    x.copy_(_special(make((3, 5, 64)) * 7))
    assert x.stride(-1) != 1

    def fusion(fd):
        vals, scales = _quantize(fd, fd.from_pytorch(x))
        fd.add_output(vals)
        fd.add_output(scales)

    check_fusion(fusion, [x], reference_mxfp8)


def test_mxfp8_feeds_later_ops():
    x = make((2, 64)) * 100

    def fusion(fd):
        t = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
        vals, scales = _quantize(fd, fd.ops.neg(t))
        fd.add_output(fd.ops.cast(vals, DataType.Float))
        fd.add_output(scales)

    def ref(x):
        q, s = reference_mxfp8(-x)
        return q.float(), s

    check_fusion(fusion, [x], ref)


def test_mxfp8_printed_as_upstream_call():
    fd = define(_fusion(2, DataType.BFloat16))
    assert "fd.ops.nv_block_quantize(tv0, block_size=32, dtype=DataType.Float8_e4m3fn)" in repr(fd)


@pytest.mark.parametrize("kwargs, match", [
    ({"block_size": 16}, "block_size' must be 32"),
    ({"block_size": 32, "swizzle_block_scales": True}, "swizzle_block_scales' must be False"),
])
def test_mxfp8_argument_rules(kwargs, match):
    def fusion(fd):
        t = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
        fd.ops.nv_block_quantize(t, dtype=DataType.Float8_e4m3fn, **kwargs)

    with pytest.raises(FusionDefinitionError, match=match):
        define(fusion)


def test_mxfp8_global_scale_refused():
    def fusion(fd):
        t = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
        g = fd.define_tensor(shape=[], dtype=DataType.Float)
        fd.ops.nv_block_quantize(t, g, False, 32, DataType.Float8_e4m3fn)

    with pytest.raises(FusionDefinitionError, match="global_scale' must be None"):
        define(fusion)


def test_mxfp8_last_dim_not_multiple_of_32():
    def static(fd):
        t = fd.define_tensor(shape=[2, 48], contiguity=True, dtype=DataType.Float)
        _quantize(fd, t)

    with pytest.raises(FusionDefinitionError, match="48, not a multiple of block_size 32"):
        define(static)
    fd = define(_fusion(2, DataType.Float))
    with pytest.raises(FusionExecutionError, match="48, not a multiple of block_size 32"):
        fd.execute([make((2, 48))])


def test_mxfp8_grouped_variant_is_unsupported():
    def fusion(fd):
        t = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
        o = fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.Int32)
        fd.ops.nv_grouped_block_quantize(t, o, o, None, 32, DataType.Float8_e4m3fn)

    with pytest.raises(UnsupportedOpError, match="nv_grouped_block_quantize"):
        define(fusion)
