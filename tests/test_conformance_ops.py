"""Op forms nvFuser's direct frontend accepts that pyfuser lacked: squeeze of a symbolic-extent dim, sdpfa_bwd's
``logsumexp`` keyword, and scaled_mm (FP8 with per-tensor/per-row scales; NVFP4 with 128x4-swizzled e4m3 block
scales)."""

from __future__ import annotations

import math

import pytest
import torch

from harness import check_fusion, define, make
from pyfuser import DataType, FusionDefinition, UnsupportedOpError
from pyfuser.errors import FusionDefinitionError, FusionDtypeError, PyfuserError
from pyfuser.nvfp4 import reference as nvfp4

# --------------------------------------------------------------------------------------------------------------
# squeeze of a dim whose extent is symbolic


@pytest.mark.parametrize("dims", [[0], [-1], [0, 2]])
def test_squeeze_symbolic_extent_dims_of_extent_one(dims):
    shape = [1, 5, 1]
    x = make(shape)
    x[0, 0, 0], x[0, 1, 0], x[0, 2, 0] = float("nan"), float("-inf"), -0.0

    def fusion(fd):
        t = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.Float)
        fd.add_output(fd.ops.mul(fd.ops.squeeze(t, dims), -2.0))

    def ref(x):
        out = x
        for d in sorted((d % 3 for d in dims), reverse=True):
            out = out.squeeze(d)
        return out * -2.0

    check_fusion(fusion, [x], ref)


def test_squeeze_symbolic_extent_from_reshape_and_matmul():
    a, b = make((1, 4)), make((4, 6))

    def fusion(fd):
        ta, tb = fd.from_pytorch(a), fd.from_pytorch(b)
        rows = fd.define_scalar(None, dtype=DataType.Int)
        r = fd.ops.reshape(ta, [rows, 4])  # extent symbolic: only known at run time
        m = fd.ops.matmul(r, tb)
        fd.add_output(fd.ops.relu(fd.ops.squeeze(m, [0])))

    check_fusion(fusion, [a, b, 1], lambda a, b, rows: torch.relu((a.reshape(rows, 4) @ b).squeeze(0)))


def test_squeeze_symbolic_extent_not_one_at_run_time_is_an_error():
    fd = define(lambda fd: fd.add_output(fd.ops.squeeze(fd.define_tensor(shape=[-1, -1], contiguity=[True, True]), [0])))
    with pytest.raises(PyfuserError, match="extent 3 at run time"):
        fd.execute([make((3, 4))])
    out = fd.execute([make((1, 4))])[0]  # the failed call left the definition usable
    assert out.shape == (4,)


def test_squeeze_static_extent_other_than_one_is_refused():
    with pytest.raises(FusionDefinitionError, match="not a broadcast dim"):
        define(lambda fd: fd.add_output(fd.ops.squeeze(fd.define_tensor(shape=[2, -1]), [0])))


# --------------------------------------------------------------------------------------------------------------
# sdpfa_bwd's logsumexp keyword


def test_sdpfa_bwd_takes_logsumexp_keyword():
    torch.manual_seed(0)
    q, k, v = (make((1, 2, 8, 16)) for _ in range(3))
    g = make((1, 2, 8, 16))

    def fusion(fd):
        tq, tk, tv, tg = (fd.from_pytorch(t) for t in (q, k, v, g))
        out, lse, seed, offset = fd.ops.sdpfa_fwd(tq, tk, tv, dropout_p=0.0, is_causal=True)
        dq, dk, dv = fd.ops.sdpfa_bwd(tg, tq, tk, tv, out, logsumexp=lse, dropout_p=0.0, is_causal=True,
                                      philox_seed=seed, philox_offset=offset)
        for t in (dq, dk, dv):
            fd.add_output(t)

    def ref(q, k, v, g):
        q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(g)
        return [q.grad, k.grad, v.grad]

    check_fusion(fusion, [q, k, v, g], ref, atol=1e-5, rtol=1e-4)
    with pytest.raises(TypeError, match="log_sumexp"):
        define(lambda fd: fd.ops.sdpfa_bwd(*(fd.from_pytorch(t) for t in (g, q, k, v, g)), log_sumexp=None))


# --------------------------------------------------------------------------------------------------------------
# scaled_mm


def _fp8_fusion(rowwise: bool, with_alpha_bias: bool, out_dtype=DataType.BFloat16):
    def fusion(fd):
        a = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float8_e4m3fn)
        b = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float8_e4m3fn, stride_order=[0, 1])
        s1 = fd.define_tensor(shape=[-1, 1] if rowwise else [], contiguity=[True, None] if rowwise else [],
                              dtype=DataType.Float)
        s2 = fd.define_tensor(shape=[1, -1] if rowwise else [], contiguity=[None, True] if rowwise else [],
                              dtype=DataType.Float)
        extra = {}
        if with_alpha_bias:
            extra["alpha"] = fd.define_tensor(shape=[], contiguity=[], dtype=DataType.Float)
            extra["bias"] = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.BFloat16)
        out, none1, none2 = fd.ops.scaled_mm(a, b, s1, s2, dtype=out_dtype, **extra)
        assert none1 is None and none2 is None
        fd.add_output(out)
    return fusion


@pytest.mark.parametrize("rowwise", [False, True], ids=["tensorwise", "rowwise"])
@pytest.mark.parametrize("with_alpha_bias", [False, True], ids=["plain", "alpha_bias"])
def test_scaled_mm_fp8(rowwise, with_alpha_bias):
    torch.manual_seed(1)
    m, k, n = 32, 64, 48
    a = (torch.randn(m, k) * 3).to(torch.float8_e4m3fn)
    b = (torch.randn(n, k) * 3).to(torch.float8_e4m3fn).t()  # [k, n], column-major
    s1 = torch.rand(m, 1) + 0.5 if rowwise else torch.tensor(0.75)
    s2 = torch.rand(1, n) + 0.5 if rowwise else torch.tensor(1.25)
    inputs = [a, b, s1, s2]
    alpha, bias = torch.tensor(-0.5), torch.randn(n).to(torch.bfloat16)
    if with_alpha_bias:
        inputs += [alpha, bias]

    def ref(a, b, s1, s2, *extra):
        out = (a.float() * s1) @ (b.float() * s2)
        if extra:
            out = out * extra[0] + extra[1].float()
        return out.to(torch.bfloat16)

    check_fusion(_fp8_fusion(rowwise, with_alpha_bias), inputs, ref, atol=1e-2, rtol=1e-2)


def test_scaled_mm_nvfp4_matches_dequantized_product():
    torch.manual_seed(2)
    m, k, n = 40, 64, 24
    xa, xb = torch.randn(m, k) * 4, torch.randn(n, k) * 4
    xa[0, :16] = 0.0  # an all-zero block: scale 0
    a, sa = nvfp4.quantize_nvfp4(xa, None, 16)
    b, sb = nvfp4.quantize_nvfp4(xb, None, 16)
    alpha = torch.tensor(0.25)
    inputs = [a, b.t(), nvfp4.linear_to_swizzled_128_4(sa), nvfp4.linear_to_swizzled_128_4(sb), alpha]

    def fusion(fd):
        t1 = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float4_e2m1fn)
        t2 = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float4_e2m1fn, stride_order=[0, 1])
        s1 = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float8_e4m3fn)
        s2 = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float8_e4m3fn)
        al = fd.define_tensor(shape=[], contiguity=True, dtype=DataType.Float)
        out, _, _ = fd.ops.scaled_mm(t1, t2, s1, s2, al, bias=None, beta=None, dtype=DataType.BFloat16)
        fd.add_output(out)

    deq_a = nvfp4.dequantize_nvfp4(a, sa, None, 16)
    deq_b = nvfp4.dequantize_nvfp4(b, sb, None, 16)
    expected = ((deq_a @ deq_b.t()) * 0.25).to(torch.bfloat16)
    check_fusion(fusion, inputs, lambda *args: expected, atol=1e-2, rtol=1e-2)
    # Products of FP4 values times e4m3 scales are exact in float32: the result equals the dequantized product
    # up to the order of float32 accumulation and the final bf16 rounding.
    assert math.isfinite(float(expected.float().abs().max()))


def test_scaled_mm_argument_errors():
    def fd8(**kw):
        def fusion(fd):
            a = fd.define_tensor(shape=[-1, -1], dtype=kw.get("a_dtype", DataType.Float8_e4m3fn))
            b = fd.define_tensor(shape=[-1, -1], dtype=DataType.Float8_e4m3fn)
            s = fd.define_tensor(shape=[], dtype=kw.get("s_dtype", DataType.Float))
            fd.ops.scaled_mm(a, b, s, s, **kw.get("op", {}))
        return define(fusion)

    with pytest.raises(FusionDtypeError, match="'mat1' and 'mat2' must both be"):
        fd8(a_dtype=DataType.BFloat16)
    with pytest.raises(FusionDtypeError, match="'scale1' must be DataType.Float"):
        fd8(s_dtype=DataType.Half)
    with pytest.raises(FusionDtypeError, match="'dtype'"):
        fd8(op={"dtype": DataType.Int})
    with pytest.raises(UnsupportedOpError, match="output quantization"):
        fd8(op={"output_block_scale_size": 16})
    with pytest.raises(FusionDefinitionError, match="K innermost"):
        define(lambda fd: fd.ops.scaled_mm(
            fd.define_tensor(shape=[-1, -1], dtype=DataType.Float4_e2m1fn),
            fd.define_tensor(shape=[-1, -1], dtype=DataType.Float4_e2m1fn),
            fd.define_tensor(shape=[-1, -1], dtype=DataType.Float8_e4m3fn),
            fd.define_tensor(shape=[-1, -1], dtype=DataType.Float8_e4m3fn)))


def test_scaled_mm_fp8_bad_scale_shape_is_a_run_time_error():
    fd = define(_fp8_fusion(rowwise=False, with_alpha_bias=False))
    a = torch.randn(8, 16).to(torch.float8_e4m3fn)
    b = torch.randn(16, 8).to(torch.float8_e4m3fn).t().contiguous().t()
    with pytest.raises(PyfuserError):
        fd.execute([a, b, torch.ones(8), torch.tensor(1.0)])  # scale1 must be 0-dim: the definition says so
    out = fd.execute([a, b, torch.tensor(2.0), torch.tensor(1.0)])[0]
    torch.testing.assert_close(out, ((a.float() * 2.0) @ b.float()).to(torch.bfloat16))
    _ = FusionDefinition


# --------------------------------------------------------------------------------------------------------------
# reshape of packed FP4


def _fp4_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


@pytest.mark.parametrize("new_shape", [[32], [2, 16], [8, 4], [-1, 2], [2, 2, 8]])
def test_reshape_of_packed_fp4_input(new_shape):
    x = make((4, 8)) * 3
    x[0, :3] = torch.tensor([-0.0, float("inf"), -7.0])
    packed = nvfp4.to_fp4(x)  # [4, 4] pairs
    with FusionDefinition() as fd:
        t = fd.from_pytorch(packed)  # Float4_e2m1fn [4, 8]
        fd.add_output(fd.ops.reshape(t, new_shape))
    out = fd.execute([packed])[0]
    logical = list(new_shape)
    if -1 in logical:
        logical[logical.index(-1)] = 32 // math.prod(s for s in logical if s != -1)
    expected = nvfp4.to_fp4(x.reshape(logical))  # the same reshape of the values, packed again
    assert out.dtype == torch.float4_e2m1fn_x2 and out.shape == expected.shape
    assert torch.equal(_fp4_bytes(out), _fp4_bytes(expected))


def test_cast_to_fp4_then_reshape():
    x, s = make((4, 8)), make((4,)).abs() + 0.5

    def fusion(fd):
        t0, t1 = fd.from_pytorch(x), fd.from_pytorch(s)
        t3 = fd.ops.div(t0, fd.ops.broadcast(t1, [False, True]))
        fd.add_output(fd.ops.reshape(fd.ops.cast(t3, DataType.Float4_e2m1fn), [32]))

    fd = define(fusion)
    out = fd.execute([x, s])[0]
    expected = nvfp4.to_fp4((x / s.unsqueeze(-1)).reshape(-1))
    assert torch.equal(_fp4_bytes(out), _fp4_bytes(expected))


def test_reshape_of_fp4_errors():
    with pytest.raises(FusionDefinitionError, match="even last extent"):
        define(lambda fd: fd.ops.reshape(fd.define_tensor(shape=[4, 6], dtype=DataType.Float4_e2m1fn), [8, 3]))
    with pytest.raises(FusionDefinitionError, match="row-major"):
        define(lambda fd: fd.ops.reshape(
            fd.define_tensor(shape=[4, 6], dtype=DataType.Float4_e2m1fn, stride_order=[0, 1]), [24]))
    fd = define(lambda fd: fd.add_output(fd.ops.reshape(
        fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float4_e2m1fn),
        [fd.define_scalar(DataType.Int), -1])))
    packed = nvfp4.to_fp4(make((4, 6)))
    with pytest.raises(PyfuserError, match="even last extent"):
        fd.execute([packed, 8])  # [8, 3]
    assert fd.execute([packed, 4])[0].shape == (4, 3)  # [4, 6] logical
