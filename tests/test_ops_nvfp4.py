"""NVFP4 ops through the frontend: the layout op, block quantization, the NVFP4 grouped GEMM, packed FP4 dtypes.

Values are compared with pyfuser.nvfp4.reference (tested on its own against the specs' worked values in
test_nvfp4_reference.py) and, for the kernels, bit for bit. Every fusion also runs with kernel_codegen disabled
(the pure-torch reference path) and through its printed repr.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from harness import DEVICE, rebuild_from_repr, with_layout
from nvfp4_inputs import gemm_inputs, round_up, start_offsets
from pyfuser import DataType, FusionDefinition
from pyfuser.errors import (FusionDefinitionError, FusionDtypeError, FusionExecutionError, InputValidationError,
                            UnsupportedOpError)
from pyfuser.nvfp4 import reference as ref
from pyfuser.segment.segmenter import SchedulerKind

I32 = torch.int32

# Offset values checked on the host at once, on every device (the default defers them on CUDA).
SYNC_CHECKS = ["sync_offset_checks"]


def _i32(v):
    return torch.tensor(v, dtype=I32, device=DEVICE)


def _run_all_ways(fd, inputs):
    """Outputs of execute (Triton kernels where they run), of the torch reference path and of the repr."""
    out = fd.execute(inputs, _enable_options=["check_layouts"])
    ref_path = fd.execute(inputs, _disable_options=["kernel_codegen"])
    again = rebuild_from_repr(fd).execute(inputs)
    return out, ref_path, again


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t


def _buffer(t: torch.Tensor, rows: int, pk: int) -> torch.Tensor:
    """The storage behind a swizzled-scales result, as [rows, pk]."""
    return torch.as_strided(t, (rows, pk), (pk, 1))


def _layout_fusion(dtype=DataType.Float):
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=dtype)
        a = fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.Int32)
        b = fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.Int32)
        fd.add_output(fd.ops.preprocess_grouped_matmul_input_sf(x, a, b))
    return fd


# --------------------------------------------------------------------------------------------------------------
# layout op


def test_layout_op_worked_example():
    """layout_op.md: tokens [2,3,5], k=3 -> buffer [391, 4]; the listed positions; padding zero-filled."""
    x = torch.arange(1, 31, dtype=torch.float32, device=DEVICE).reshape(10, 3)
    inputs = [x, _i32([0, 2, 5]), _i32([0, 128, 256])]
    fd = _layout_fusion()
    for out in _run_all_ways(fd, inputs):
        assert out[0].shape == (10, 3) and out[0].stride() == (3, 1)
        assert out[0].untyped_storage().nbytes() == 1564 * 4
        flat = torch.as_strided(out[0], (1564,), (1,))
        expect = {0: (0, 0), 2: (0, 2), 16: (1, 0), 18: (1, 2), 512: (2, 0), 529: (3, 1), 546: (4, 2), 1024: (5, 0),
                  1042: (6, 2), 1089: (9, 1)}
        for pos, (r, c) in expect.items():
            assert flat[pos].item() == x[r, c].item(), (pos, r, c)
        assert int((flat != 0).sum()) == 30  # every other element is padding, and zero


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn])
def test_layout_op_ported_case(dtype):
    """The upstream test's sizes: m=512, k=9 (pk=12), input offsets [0,100,250], output offsets [0,128,384]."""
    x = torch.randn(512, 9, device=DEVICE).to(dtype)
    inputs = [x, _i32([0, 100, 250]), _i32([0, 128, 384])]
    fd = _layout_fusion(DataType.Float if dtype == torch.float32 else
                        {torch.bfloat16: DataType.BFloat16, torch.float8_e4m3fn: DataType.Float8_e4m3fn}[dtype])
    outs = _run_all_ways(fd, inputs)
    expected = ref.preprocess_grouped_matmul_input_sf(*inputs)
    rows = 512 + 127 * 3
    for out in outs:
        assert out[0].dtype == dtype
        assert torch.equal(_bits(_buffer(out[0], rows, 12)), _bits(_buffer(expected, rows, 12)))
        back = ref.grouped_scales_to_linear(out[0], inputs[1], inputs[2])
        assert torch.equal(_bits(back), _bits(x))


def test_layout_op_transposed_input():
    x = torch.randn(9, 40, device=DEVICE).t()
    inputs = [x, _i32([0, 7, 7]), _i32([0, 128, 256])]
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        a, b = fd.from_pytorch(inputs[1]), fd.from_pytorch(inputs[2])
        fd.add_output(fd.ops.preprocess_grouped_matmul_input_sf(t, a, b))
    for out in _run_all_ways(fd, inputs):
        assert torch.equal(ref.grouped_scales_to_linear(out[0], inputs[1], inputs[2]), x)


def test_layout_op_is_its_own_pointwise_segment():
    fd = _layout_fusion()
    fd.execute([torch.randn(10, 3, device=DEVICE), _i32([0, 2, 5]), _i32([0, 128, 256])])
    kinds = [s.kind for s in fd.last_runtime().segments]
    assert kinds == [SchedulerKind.POINTWISE]
    (report,) = fd.last_execution()
    assert report.runs_as == "op kernel" and "preprocess_grouped_matmul_input_sf" in str(report)
    fd.execute([torch.randn(10, 3, device=DEVICE), _i32([0, 2, 5]), _i32([0, 128, 256])],
               _disable_options=["kernel_codegen"])
    (report,) = fd.last_execution()
    assert report.runs_as == "aten" and "kernel_codegen is disabled" in report.reason


def test_layout_op_offsets_computed_in_fusion_split_segments():
    """Offsets produced inside the fusion are computed by an earlier segment (the op reads them from global
    memory); values stay right (upstream SchedulerKernelWithOffsetsProducer)."""
    x = torch.randn(10, 3, device=DEVICE)
    starts = torch.tensor([0, 2, 5], dtype=torch.int64, device=DEVICE)
    group = torch.tensor([0, 1, 2], dtype=torch.int64, device=DEVICE)
    with FusionDefinition() as fd:
        t, s, e = fd.from_pytorch(x), fd.from_pytorch(starts), fd.from_pytorch(group)
        a = fd.ops.cast(s, DataType.Int32)
        b = fd.ops.cast(fd.ops.mul(e, 128), DataType.Int32)
        y = fd.ops.relu(t)
        fd.add_output(fd.ops.preprocess_grouped_matmul_input_sf(y, a, b))
    out = fd.execute([x, starts, group])
    segs = fd.last_runtime().segments
    layout_seg = next(s for s in segs if s.exprs[-1].op.name == "preprocess_grouped_matmul_input_sf")
    assert len(layout_seg.exprs) == 1 and len(segs) >= 2
    expected = ref.preprocess_grouped_matmul_input_sf(x.relu(), _i32([0, 2, 5]), _i32([0, 128, 256]))
    assert torch.equal(_buffer(out[0], 10 + 3 * 127, 4), _buffer(expected, 10 + 3 * 127, 4))


def test_layout_op_output_consumers_are_restricted():
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], dtype=DataType.Float8_e4m3fn)
        a = fd.define_tensor(shape=[-1], dtype=DataType.Int32)
        b = fd.define_tensor(shape=[-1], dtype=DataType.Int32)
        y = fd.ops.preprocess_grouped_matmul_input_sf(x, a, b)
        with pytest.raises(FusionDefinitionError, match=r"fd\.ops\.relu: .*preprocess_grouped_matmul_input_sf.*scale1/scale2"):
            fd.ops.relu(y)
        with pytest.raises(FusionDefinitionError, match=r"fd\.ops\.cast"):
            fd.ops.cast(y, DataType.Float)
        with pytest.raises(FusionDefinitionError, match=r"mat1.*only be scale1 or scale2|Float4"):
            fd.ops.cutlass_nvfp4_grouped_mm(y, y, y, y, a, a, a, b)


def test_explicit_quantization_pattern_k144():
    """The decomposed quantization of test_with_id_model_indexer: block maxima -> e4m3 scales -> layout op."""
    m, k = 40, 144
    x = torch.randn(m, k, device=DEVICE)
    offs, sf = start_offsets([15, 0, 25], DEVICE)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        a, b = fd.from_pytorch(offs), fd.from_pytorch(sf)
        blocks = fd.ops.reshape(t, [m, k // 16, 16])
        amax = fd.ops.max(fd.ops.abs(blocks), [2])
        scale = fd.ops.clamp(fd.ops.div(amax, 6.0), ref.FLOAT8_E4M3_EPS, ref.FLOAT8_E4M3_MAX)
        fp8 = fd.ops.cast(scale, DataType.Float8_e4m3fn)
        fd.add_output(fd.ops.preprocess_grouped_matmul_input_sf(fp8, a, b))
    for out in _run_all_ways(fd, [x, offs, sf]):
        expected_scales = ref.quantize_nvfp4(x)[1]
        back = ref.grouped_scales_to_linear(out[0], offs, sf)
        assert torch.equal(back.view(torch.uint8), expected_scales.view(torch.uint8))


# --------------------------------------------------------------------------------------------------------------
# block quantization


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("swizzle", [False, True])
@pytest.mark.parametrize("with_gs", [False, True])
def test_nv_block_quantize(dtype, swizzle, with_gs):
    m, k = 48, 64
    x = (torch.randn(m, k, device=DEVICE) * 3).to(dtype)
    gs = torch.tensor(2688.0 / 9.0, device=DEVICE)
    inputs = [x] + ([gs] if with_gs else [])
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        g = fd.from_pytorch(gs) if with_gs else None
        q, s = fd.ops.nv_block_quantize(t, g, swizzle_block_scales=swizzle)
        fd.add_output(q)
        fd.add_output(s)
    data, scales = ref.quantize_nvfp4_fused(x, gs if with_gs else None)
    for out in _run_all_ways(fd, inputs):
        assert out[0].dtype == torch.float4_e2m1fn_x2 and out[0].shape == (m, k // 2)
        assert torch.equal(out[0].view(torch.uint8), data.view(torch.uint8))
        assert out[1].dtype == torch.float8_e4m3fn and out[1].shape == (m, k // 16)
        if swizzle:
            got = _buffer(out[1], round_up(m, 128), 4)
            assert torch.equal(got.view(torch.uint8), ref.linear_to_swizzled_128_4(scales).view(torch.uint8))
        else:
            assert torch.equal(out[1].view(torch.uint8), scales.view(torch.uint8))


@pytest.mark.parametrize("layout", ["transposed", "sliced", "expanded", "stride_order"])
def test_quantize_ops_non_contiguous_inputs(layout):
    """Both quantize ops read any input strides (the kernels' element-wise path) with the same bits."""
    m, k = 48, 32
    x = with_layout(layout, (m, k), torch.bfloat16) * 3
    offs, sf = start_offsets([20, 28], DEVICE)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        a, b = fd.from_pytorch(offs), fd.from_pytorch(sf)
        for o in (*fd.ops.nv_block_quantize(t, swizzle_block_scales=True), *fd.ops.nv_grouped_block_quantize(t, a, b)):
            fd.add_output(o)
    data, scales = ref.quantize_nvfp4_fused(x)
    gdata, gscales = ref.grouped_quantize_nvfp4(x, offs, sf, None, 16, fused=True)
    for out in _run_all_ways(fd, [x, offs, sf]):
        assert out[0].shape == (m, k // 2) and out[0].stride() == (k // 2, 1)
        assert torch.equal(out[0].view(torch.uint8), data.view(torch.uint8))
        assert out[1].shape == (m, k // 16) and out[1].stride() == (k // 16, 1)
        assert torch.equal(_buffer(out[1], 128, 4).view(torch.uint8),
                           ref.linear_to_swizzled_128_4(scales).view(torch.uint8))
        assert torch.equal(out[2].view(torch.uint8), gdata.view(torch.uint8))
        rows = m + 127 * 2
        assert torch.equal(_buffer(out[3], rows, 4).view(torch.uint8), _buffer(gscales, rows, 4).view(torch.uint8))


def test_nv_grouped_block_quantize_one_kernel():
    m, k = 60, 32
    x = torch.randn(m, k, device=DEVICE, dtype=torch.bfloat16)
    offs, sf = start_offsets([7, 0, 53], DEVICE)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        a, b = fd.from_pytorch(offs), fd.from_pytorch(sf)
        q, s = fd.ops.nv_grouped_block_quantize(t, a, b)
        fd.add_output(q)
        fd.add_output(s)
    data, scales = ref.grouped_quantize_nvfp4(x, offs, sf, None, 16, fused=True)
    for out in _run_all_ways(fd, [x, offs, sf]):
        assert torch.equal(out[0].view(torch.uint8), data.view(torch.uint8))
        rows = m + 127 * 3
        assert torch.equal(_buffer(out[1], rows, 4).view(torch.uint8), _buffer(scales, rows, 4).view(torch.uint8))
    assert [s.kind for s in fd.last_runtime().segments] == [SchedulerKind.POINTWISE]


# --------------------------------------------------------------------------------------------------------------
# packed FP4 dtype


def test_fp4_x2_input_becomes_fp4_with_doubled_packed_dim():
    w = torch.zeros(3, 8, 16, dtype=torch.uint8, device=DEVICE).view(torch.float4_e2m1fn_x2).transpose(-1, -2)
    with FusionDefinition() as fd:
        a = fd.from_pytorch(w, static_sizes=True)
        fd.add_output(fd.ops.size(a, 1))
    assert a.dtype is DataType.Float4_e2m1fn and a.static_shape() == [3, 32, 8]
    assert "dtype=DataType.Float4_e2m1fn," in repr(fd)
    assert fd.execute([w]) == [32]


def test_fp4_x2_define_tensor_with_one_packed_pair():
    """A [M, 1] fp4x2 tensor holds [M, 2] FP4 values: the size-1 packed dim becomes a (non-broadcast) extent 2."""
    w = ref.pack_fp4(torch.randint(0, 16, (3, 2), dtype=torch.uint8, device=DEVICE))
    with FusionDefinition() as fd:
        t = fd.define_tensor(shape=[-1, 1], contiguity=[True, None], dtype=DataType.Float4_e2m1fn_x2)
        fd.add_output(fd.ops.cast(t, DataType.Float))
    assert t.dtype is DataType.Float4_e2m1fn and t.static_shape() == [None, 2]
    out = fd.execute([w])[0]
    assert out.shape == (3, 2) and torch.equal(out, ref.from_fp4(w))


def test_fp4_cast_round_trip_and_unpack_along_packed_dim():
    codes = torch.randint(0, 16, (3, 8, 16), dtype=torch.uint8, device=DEVICE)
    w = ref.pack_fp4(codes.view(3, 8, 16))  # packed [3, 8, 8] = logical [3, 8, 16]
    wt = w.transpose(-1, -2)  # logical [3, 16, 8], packed along dim 1
    with FusionDefinition() as fd:
        b = fd.define_tensor(shape=[-1, -1, -1], contiguity=True, dtype=DataType.Float4_e2m1fn, stride_order=[2, 0, 1])
        f = fd.ops.cast(b, DataType.Float)
        back = fd.ops.cast(fd.ops.mul(f, 1.0), DataType.Float4_e2m1fn)
        fd.add_output(f)
        fd.add_output(back)
    for out in _run_all_ways(fd, [wt]):
        expect = ref.fp4_decode(codes).transpose(-1, -2)
        assert out[0].shape == (3, 16, 8) and torch.equal(out[0], expect)
        assert out[0].stride() == expect.stride()  # unpacking keeps the input's dim order
        assert out[1].dtype == torch.float4_e2m1fn_x2 and out[1].shape == (3, 16, 4)
        assert torch.equal(ref.from_fp4(out[1]), expect)  # -0.0 == 0.0: codes 0 and 8 both decode to zero


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced"])
def test_fp4_cast_matches_reference_rounding(layout):
    x = with_layout(layout, (4, 8)) * 4
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.cast(t, DataType.Float4_e2m1fn))
    for out in _run_all_ways(fd, [x]):
        assert out[0].dtype == torch.float4_e2m1fn_x2 and out[0].shape == (4, 4) and out[0].stride() == (4, 1)
        assert torch.equal(out[0].view(torch.uint8), ref.to_fp4(x).view(torch.uint8))


def test_fp4_errors():
    with FusionDefinition() as fd:
        a = fd.define_tensor(shape=[-1, -1], dtype=DataType.Float4_e2m1fn)
        with pytest.raises(FusionDtypeError, match=r"fd\.ops\.add: T0 is Float4_e2m1fn"):
            fd.ops.add(a, a)
        with pytest.raises(FusionDtypeError, match="storage type"):
            fd.ops.cast(a, DataType.Float4_e2m1fn_x2)
        fd.add_output(fd.ops.cast(a, DataType.Float))
    with FusionDefinition() as fd2:
        odd = fd2.define_tensor(shape=[4, 5], dtype=DataType.Float)
        with pytest.raises(FusionDefinitionError, match="odd"):
            fd2.ops.cast(odd, DataType.Float4_e2m1fn)
        with pytest.raises(FusionDefinitionError, match="0-dim tensor cannot be cast"):
            fd2.ops.cast(fd2.define_tensor(shape=[], dtype=DataType.Float), DataType.Float4_e2m1fn)
        with pytest.raises(FusionDtypeError, match="complex and cannot be cast"):
            fd2.ops.cast(fd2.define_tensor(shape=[-1, 2], dtype=DataType.ComplexFloat), DataType.Float4_e2m1fn)
    strided = torch.zeros(4, 8, dtype=torch.uint8, device=DEVICE).view(torch.float4_e2m1fn_x2)[:, ::2]
    with pytest.raises(InputValidationError, match="packed dim 1 must have stride 1"):
        fd.execute([strided])


# --------------------------------------------------------------------------------------------------------------
# NVFP4 grouped GEMM


def _gemm_fusion(out_dtype=DataType.BFloat16):
    """Exactly upstream's test_cutlass_nvfp4_grouped_mm definition."""
    with FusionDefinition() as fd:
        mat1 = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float4_e2m1fn, is_cpu=False)
        mat2 = fd.define_tensor(shape=[-1, -1, -1], contiguity=True, dtype=DataType.Float4_e2m1fn, is_cpu=False,
                                stride_order=[2, 0, 1])
        scale1 = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float8_e4m3fn, is_cpu=False)
        scale2 = fd.define_tensor(shape=[-1, -1, -1], contiguity=True, dtype=DataType.Float8_e4m3fn, is_cpu=False)
        alpha = fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.Float, is_cpu=False)
        problem_sizes = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Int32, is_cpu=False)
        offsets = fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.Int32, is_cpu=False)
        blockscale_offsets = fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.Int32, is_cpu=False)
        out = fd.ops.cutlass_nvfp4_grouped_mm(mat1, mat2, scale1, scale2, alpha, problem_sizes, offsets,
                                              blockscale_offsets, out_dtype)
        fd.add_output(out)
    return fd


def _plain_scale1(g, tokens, k):
    """The same scales as a plain [sum R_i, K/16] tensor (upstream's activation_scale_to_nvfp4 output)."""
    rows = sum(round_up(t, 128) for t in tokens)
    return torch.as_strided(g.scale1, (rows, k // 16), (k // 16, 1)).clone()


@pytest.mark.parametrize("out_dtype", [DataType.BFloat16, DataType.Half])
@pytest.mark.parametrize("plain_scale1", [False, True])
def test_cutlass_nvfp4_grouped_mm(out_dtype, plain_scale1):
    m, n, k, tokens = 96, 128, 64, [20, 33, 0, 43]
    g = gemm_inputs(m, n, k, tokens, DEVICE)
    inputs = g.as_list()
    if plain_scale1:
        inputs[2] = _plain_scale1(g, tokens, k)
    tdt = torch.bfloat16 if out_dtype is DataType.BFloat16 else torch.float16
    expected = ref.nvfp4_grouped_mm(*inputs, tdt)
    fd = _gemm_fusion(out_dtype)
    for out in _run_all_ways(fd, inputs):
        assert out[0].dtype == tdt and out[0].shape == (m, n) and out[0].is_contiguous()
        torch.testing.assert_close(out[0].float(), expected.float(), atol=1e-2 * expected.abs().max().item(), rtol=1e-2)
    # and the quantized product is close to the unquantized one
    exact = torch.cat([g.a_ref[s:s + t] @ g.w_ref[i].T for i, (s, t) in
                       enumerate(zip(g.expert_offsets.tolist(), tokens))])
    rel = (out[0].float() - exact).norm() / exact.norm()
    assert rel < 0.2


def test_quantize_layout_and_gemm_in_one_fusion():
    """upstream test_block_quantize_op_and_layout_op: nv_block_quantize + layout op + grouped GEMM in one fusion,
    and the fused nv_grouped_block_quantize form of the same."""
    m, n, k, tokens = 64, 128, 64, [10, 0, 54]
    g = gemm_inputs(m, n, k, tokens, DEVICE, seed=3)
    x = g.a_ref
    for grouped in (False, True):
        with FusionDefinition() as fd:
            mat1 = fd.from_pytorch(x)
            mat2 = fd.define_tensor(shape=[-1, -1, -1], contiguity=True, dtype=DataType.Float4_e2m1fn,
                                    stride_order=[2, 0, 1])
            scale2 = fd.from_pytorch(g.scale2)
            alpha, ps, offs, sf = (fd.from_pytorch(t) for t in (g.alpha, g.problem_sizes, g.expert_offsets, g.sf_offsets))
            if grouped:
                fp4, scales = fd.ops.nv_grouped_block_quantize(mat1, offs, sf)
            else:
                fp4, raw = fd.ops.nv_block_quantize(mat1)
                scales = fd.ops.preprocess_grouped_matmul_input_sf(raw, offs, sf)
            fd.add_output(fd.ops.cutlass_nvfp4_grouped_mm(fp4, mat2, scales, scale2, alpha, ps, offs, sf,
                                                          DataType.BFloat16))
        inputs = [x, g.mat2, g.scale2, g.alpha, g.problem_sizes, g.expert_offsets, g.sf_offsets]
        q, s = ref.grouped_quantize_nvfp4(x, g.expert_offsets, g.sf_offsets, None, 16, fused=True)
        expected = ref.nvfp4_grouped_mm(q, g.mat2, s, g.scale2, g.alpha, g.problem_sizes, g.expert_offsets,
                                        g.sf_offsets, torch.bfloat16)
        for out in _run_all_ways(fd, inputs):
            torch.testing.assert_close(out[0].float(), expected.float(), atol=1e-2 * expected.abs().max().item(),
                                       rtol=1e-2)
        kinds = [s.kind for s in fd.last_runtime().segments]
        assert kinds[-1] is SchedulerKind.EXPR_EVAL and kinds.count(SchedulerKind.POINTWISE) == (1 if grouped else 2)


# --------------------------------------------------------------------------------------------------------------
# bad input


def test_offsets_definition_errors():
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], dtype=DataType.Float)
        a64 = fd.define_tensor(shape=[-1], dtype=DataType.Int)
        a = fd.define_tensor(shape=[3], dtype=DataType.Int32)
        b = fd.define_tensor(shape=[4], dtype=DataType.Int32)
        with pytest.raises(FusionDtypeError, match=r"input_offsets.*must be DataType.Int32, got DataType.Int"):
            fd.ops.preprocess_grouped_matmul_input_sf(x, a64, a)
        with pytest.raises(FusionDefinitionError, match="3 groups but output_offsets .* has 4"):
            fd.ops.preprocess_grouped_matmul_input_sf(x, a, b)
        k40 = fd.define_tensor(shape=[-1, 40], dtype=DataType.Float)
        with pytest.raises(FusionDefinitionError, match="40, not a multiple of block_size 16"):
            fd.ops.nv_block_quantize(k40)
        with pytest.raises(FusionDefinitionError, match="block_size"):
            fd.ops.nv_block_quantize(x, block_size=32)


@pytest.mark.parametrize("starts, outs, match", [
    ([0, 5, 2], [0, 128, 256], "non-decreasing"),
    ([1, 2, 5], [0, 128, 256], "must start at 0"),
    ([0, 2, 11], [0, 128, 256], r"in \[0, 10\]"),
    ([0, 2, 5], [0, 100, 256], "overlap: group 1 starts at row 100"),
    ([0, 2, 5], [0, 128, 300], "need 428 block-scale rows"),
    ([0, 2], [0, 128, 256], "input_offsets has 2 entries but output_offsets has 3"),
])
def test_offsets_runtime_errors(starts, outs, match):
    fd = _layout_fusion()
    inputs = [torch.randn(10, 3, device=DEVICE), _i32(starts), _i32(outs)]
    for opts in ([], ["kernel_codegen"]):
        # SYNC_CHECKS: the values are read at once (on CUDA the default checks on the device and reports from a
        # later call: tests/test_runtime_plan.py); on CPU both read them at once.
        with pytest.raises(FusionExecutionError, match=match):
            fd.execute(inputs, _disable_options=opts, _enable_options=SYNC_CHECKS)


def test_quantize_runtime_k_error():
    with FusionDefinition() as fd:
        t = fd.define_tensor(shape=[-1, -1], dtype=DataType.Float)
        q, s = fd.ops.nv_block_quantize(t)
        fd.add_output(q)
    with pytest.raises(FusionExecutionError, match="24, not a multiple of block_size 16"):
        fd.execute([torch.randn(4, 24, device=DEVICE)])


def test_gemm_shape_errors():
    m, n, k, tokens = 32, 128, 64, [12, 20]
    g = gemm_inputs(m, n, k, tokens, DEVICE)
    fd = _gemm_fusion()
    bad_scale2 = g.as_list()
    bad_scale2[3] = g.scale2[:, :, :2].contiguous()
    with pytest.raises(FusionExecutionError, match=r"scale2 must be a contiguous .* = \(2, 128, 4\)"):
        fd.execute(bad_scale2)
    bad_ps = g.as_list()
    bad_ps[5] = g.problem_sizes.flip(0).contiguous()
    with pytest.raises(FusionExecutionError, match="problem_sizes must be"):
        fd.execute(bad_ps, _enable_options=SYNC_CHECKS)
    short_scale1 = g.as_list()
    short_scale1[2] = g.scale1.clone()  # a compact [M, K/16] copy: too few rows for the padded groups
    with pytest.raises(FusionExecutionError, match="scale1 holds 32 block-scale rows"):
        fd.execute(short_scale1, _enable_options=SYNC_CHECKS)
    with FusionDefinition() as fd2:
        a = fd2.define_tensor(shape=[-1, 48], dtype=DataType.Float4_e2m1fn)
        b = fd2.define_tensor(shape=[-1, 48, -1], dtype=DataType.Float4_e2m1fn, stride_order=[2, 0, 1])
        s1 = fd2.define_tensor(shape=[-1, -1], dtype=DataType.Float8_e4m3fn)
        s2 = fd2.define_tensor(shape=[-1, -1, -1], dtype=DataType.Float8_e4m3fn)
        al = fd2.define_tensor(shape=[-1], dtype=DataType.Float)
        ps = fd2.define_tensor(shape=[-1, -1], dtype=DataType.Int32)
        o = fd2.define_tensor(shape=[-1], dtype=DataType.Int32)
        with pytest.raises(FusionDefinitionError, match="K=48 must be a multiple of 64"):
            fd2.ops.cutlass_nvfp4_grouped_mm(a, b, s1, s2, al, ps, o, o)
        with pytest.raises(FusionDtypeError, match="'dtype' must be DataType.BFloat16 or DataType.Half"):
            fd2.ops.cutlass_nvfp4_grouped_mm(a, b, s1, s2, al, ps, o, o, DataType.Float)
        with pytest.raises(FusionDtypeError, match=r"'mat1' .* must be DataType.Float4_e2m1fn"):
            fd2.ops.cutlass_nvfp4_grouped_mm(s1, b, s1, s2, al, ps, o, o)


# --------------------------------------------------------------------------------------------------------------
# grouped_mm (torch._grouped_mm, cumulative END offsets)


@pytest.mark.parametrize("case", ["rows", "rows_n20", "cols", "k"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_grouped_mm(case, dtype):
    if case == "rows":
        a, b, offs = torch.randn(10, 32), torch.randn(3, 24, 32).transpose(-1, -2), [2, 5, 10]
    elif case == "rows_n20":  # the output's row pitch is padded to 16 bytes
        a, b, offs = torch.randn(10, 32), torch.randn(3, 20, 32).transpose(-1, -2), [2, 5, 10]
    elif case == "cols":
        a, b, offs = torch.randn(3, 10, 32), torch.randn(24, 32).t(), [8, 16, 24]
    else:
        a, b, offs = torch.randn(32, 16).t(), torch.randn(32, 24), [8, 16, 32]
    a, b = a.to(DEVICE, dtype), b.to(DEVICE, dtype)
    inputs = [a, b, _i32(offs)]
    with FusionDefinition() as fd:
        ta, tb, to = (fd.from_pytorch(t) for t in inputs)
        fd.add_output(fd.ops.grouped_mm(ta, tb, to))
    expected = torch._grouped_mm(a, b, inputs[2])
    for out in _run_all_ways(fd, inputs):
        assert out[0].shape == expected.shape and out[0].stride() == expected.stride()
        torch.testing.assert_close(out[0], expected)


def test_grouped_mm_errors():
    with FusionDefinition() as fd:
        a = fd.define_tensor(shape=[-1, -1], dtype=DataType.BFloat16)
        b = fd.define_tensor(shape=[3, -1, -1], dtype=DataType.BFloat16)
        off = fd.define_tensor(shape=[4], dtype=DataType.Int32)
        with pytest.raises(FusionDefinitionError, match="offsets has 4 groups but the batch dim"):
            fd.ops.grouped_mm(a, b, off)
        with pytest.raises(UnsupportedOpError, match="scaled form"):
            fd.ops.grouped_mm(a, b, off, a, a)
        fd.add_output(fd.ops.grouped_mm(a, b, fd.define_tensor(shape=[-1], dtype=DataType.Int32)))
    with FusionDefinition() as fd2:
        f = fd2.define_tensor(shape=[-1, -1], dtype=DataType.Float)
        with pytest.raises(FusionDtypeError, match="must be BFloat16 or Half"):
            fd2.ops.grouped_mm(f, f, f)
    a_t = torch.randn(10, 32, dtype=torch.bfloat16, device=DEVICE)
    b_t = torch.randn(3, 32, 24, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(FusionExecutionError, match="non-decreasing cumulative group ends"):
        fd.execute([a_t, b_t, torch.zeros(4, dtype=I32, device=DEVICE), _i32([5, 2, 10])],
                    _enable_options=SYNC_CHECKS)


def test_offset_checks_can_be_disabled(monkeypatch):
    """_disable_options=["offset_checks"] trusts the offsets (no host read of their values, no sync); bad offsets
    then give wrong placements but never a write outside the buffer."""
    fd = _layout_fusion()
    good = [torch.randn(10, 3, device=DEVICE), _i32([0, 2, 5]), _i32([0, 128, 256])]
    fd.execute(good, _disable_options=["offset_checks"])  # build the runtime first

    def no_host_reads(*a, **k):
        raise AssertionError("offset values were read on the host")

    monkeypatch.setattr(torch.Tensor, "tolist", no_host_reads)
    out = fd.execute(good, _disable_options=["offset_checks"])
    monkeypatch.undo()
    expected = ref.preprocess_grouped_matmul_input_sf(*good)
    assert torch.equal(_buffer(out[0], 391, 4), _buffer(expected, 391, 4))
    bad = [good[0], _i32([0, 5, 2]), _i32([0, 100, 380])]
    out = fd.execute(bad, _disable_options=["offset_checks"])
    assert out[0].untyped_storage().nbytes() == 1564 * 4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="direct launches are CUDA-only")
def test_direct_launch_matches_jit_launch(monkeypatch):
    """pyfuser/codegen/launcher.py: repeated launches of a cached specialization skip Triton's argument binding; they
    must compute exactly what the JIT path computes, for every kernel family (new pointers, same shapes)."""
    from pyfuser.codegen import launcher as launch
    from pyfuser.kernels import nvfp4_grouped_gemm as grouped_gemm, nvfp4_layout as layout_kernels

    g = gemm_inputs(96, 128, 64, [20, 33, 0, 43], DEVICE)
    x = torch.randn(96, 64, device=DEVICE, dtype=torch.bfloat16)

    def run_all():
        lay = layout_kernels.layout_op(g.scale1[:, :4].contiguous(), g.expert_offsets, g.sf_offsets)
        q, s = layout_kernels.grouped_block_quantize(x.clone(), g.expert_offsets, g.sf_offsets)
        out = grouped_gemm.nvfp4_grouped_mm(*g.as_list(), torch.bfloat16)
        return [_buffer(lay, 96 + 127 * 4, 4).view(torch.uint8), q.view(torch.uint8),
                _buffer(s, 96 + 127 * 4, 4).view(torch.uint8), out]

    first, second = run_all(), run_all()  # the second call takes the direct path
    monkeypatch.setattr(launch, "_direct_enabled", False)
    jit = run_all()
    for a, b, c in zip(first, second, jit):
        assert torch.equal(a, b) and torch.equal(b, c)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs")
def test_cuda_graph_capture_of_nvfp4_fusions():
    """A fusion with the NVFP4 ops (offset checks off: no host syncs) can be captured in a CUDA graph; replaying
    it after writing new inputs into the captured buffers gives exactly what execute gives (docs/nvfp4.md)."""
    from pyfuser.demo import moe_nvfp4 as moe

    cfg = moe.MoEConfig(hidden=256, intermediate=128, experts=4, top_k=2)
    layer = moe.MoENVFP4(cfg, moe.quantize_weights(moe.make_weights(cfg, DEVICE)))
    x = torch.randn(16, 256, device=DEVICE, dtype=torch.bfloat16)
    static = x.clone()
    run = lambda: layer(static, ["offset_checks"])  # noqa: E731
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    for _ in range(2):
        new = torch.randn_like(x)
        static.copy_(new)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, layer(new))


def _layout_by_formula(x: torch.Tensor, tokens: list, out_starts: list) -> torch.Tensor:
    """layout_op.md's index formula, element by element: an oracle independent of pyfuser.nvfp4."""
    m, k = x.shape
    g = len(tokens)
    pk = (k + 3) // 4 * 4
    buf = torch.zeros((m + 127 * g) * pk, dtype=torch.float64)
    r = 0
    for e, t in enumerate(tokens):
        for lr in range(t):
            for c in range(k):
                pos = (out_starts[e] * pk + (lr // 128) * 128 * pk + (c // 4) * 512 + (lr % 32) * 16
                       + ((lr % 128) // 32) * 4 + c % 4)
                buf[pos] = float(x[r + lr, c])
        r += t
    return buf


@settings(max_examples=25, deadline=None)
@given(tokens=st.lists(st.integers(0, 140), min_size=1, max_size=4), k=st.integers(1, 9),
       gaps=st.lists(st.integers(0, 2), min_size=4, max_size=4))
def test_layout_op_matches_the_index_formula(tokens, k, gaps):
    """Random group sizes (empty groups, groups over 128 rows), k not a multiple of 4, output slabs with gaps
    between them (any disjoint 128-row-padded slabs are valid output offsets)."""
    m = sum(tokens)
    assume(m > 0)
    starts, outs, row, out = [], [], 0, 0
    for t, gap in zip(tokens, gaps):
        starts.append(row)
        out += gap * 8  # slabs need not start on multiples of 128
        outs.append(out)
        row += t
        out += round_up(t, 128)
    # Slabs that overflow the op's (m + 127*g)-row buffer are rejected (test_offsets_runtime_errors).
    assume(out <= m + 127 * len(tokens))
    x = torch.arange(1, m * k + 1, dtype=torch.float32).reshape(m, k).to(DEVICE)
    fd = _layout_fusion()
    got = fd.execute([x, _i32(starts), _i32(outs)])[0]
    n = (m + 127 * len(tokens)) * ((k + 3) // 4 * 4)
    assert torch.equal(torch.as_strided(got, (n,), (1,)).cpu().double(), _layout_by_formula(x.cpu(), tokens, outs))


def test_grouped_mm_offset_checks_off_reads_no_offsets(monkeypatch):
    a = torch.randn(10, 32, dtype=torch.bfloat16, device=DEVICE)
    b = torch.randn(3, 24, 32, dtype=torch.bfloat16, device=DEVICE).transpose(-1, -2)
    offs = _i32([2, 5, 10])
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.grouped_mm(*(fd.from_pytorch(t) for t in (a, b, offs))))
    fd.execute([a, b, offs], _disable_options=["offset_checks"])

    def no_host_reads(*args, **kwargs):
        raise AssertionError("offset values were read on the host")

    monkeypatch.setattr(torch.Tensor, "tolist", no_host_reads)
    out = fd.execute([a, b, offs], _disable_options=["offset_checks"])[0]
    monkeypatch.undo()
    expected = torch._grouped_mm(a, b, offs)
    assert out.stride() == expected.stride() and torch.equal(out, expected)
