"""Load prologues (codegen/prologue.py): a pointwise producer merged into the NVFP4 grouped quantize kernel that
reads it, computed element by element inside that kernel instead of written to memory and read back.

Every case compares the quantized bytes (packed data and the whole zero-padded scale buffer) bit for bit with the
unfused run (the segmenter's prologue merge switched off: a generated kernel, then the quantize kernel) and, where
the producer's ops are exact IEEE operations, with the op-by-op ATen run (kernel_codegen disabled)."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from harness import DEVICE
from nvfp4_inputs import start_offsets

from pyfuser import DataType, FusionDefinition
from pyfuser.codegen.kernel_builder import COMPILE_OPTIONS
from pyfuser.demo import moe_nvfp4 as moe
from pyfuser.codegen.plan import _SIG_DTYPE
from pyfuser.codegen.prologue import LoadPrologue
from pyfuser.errors import FusionExecutionError
from pyfuser.ir.dtypes import to_torch_dtype
from pyfuser.kernels import nvfp4_layout as lk
from pyfuser.segment import segmenter

import sm90


def offsets(tokens):
    """(input_offsets, output_offsets): exclusive prefix sums of the group sizes and of the sizes padded to 128."""
    return start_offsets(tokens, DEVICE)


def quantized_bytes(outs):
    """(packed bytes, every byte of the scale buffer) of a quantize's two outputs."""
    packed, scales = outs
    storage = scales.view(torch.uint8)
    return packed.view(torch.uint8), torch.as_strided(storage, (storage.untyped_storage().nbytes(),), (1,), 0)


def assert_same_bytes(outs, ref):
    for a, b in zip(quantized_bytes(outs), quantized_bytes(ref)):
        assert a.shape == b.shape and torch.equal(a.cpu(), b.cpu())


def unfused(monkeypatch):
    """Run the next new fusions without prologue merges (undo with monkeypatch.undo())."""
    monkeypatch.setattr(segmenter, "_merge_prologues", lambda fusion, pieces: (pieces, {}))


def prologue_reports(fd):
    """Segments whose op kernel ran with a generated load prologue (not the producer on ATen)."""
    return [r for r in fd.last_execution() if r.runs_as == "op kernel" and "+ load prologue pf_" in r.reason]


@triton.jit
def _plain_load(row, col, valid, A):
    # A hand-written load prologue: x[row, col] of a strided 2-D tensor.
    return tl.load(A[0] + row * A[1] + col * A[2], mask=valid, other=0.0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("tiles", [None, 3])
def test_quantize_kernel_with_a_prologue_equals_the_plain_kernel(dtype, tiles):
    # The kernel form itself: computing x through a prologue gives the bytes of reading x (special values, rows
    # before the first group, an empty group, several tiles per program).
    x = (torch.randn(150, 96, generator=torch.Generator().manual_seed(3)) * 3).to(dtype)
    x[3, 5], x[7, 0], x[9, 1], x[11, 16:32] = float("nan"), float("inf"), -0.0, -0.0
    x = x.to(DEVICE)[:, 16:]  # strided rows
    in_off = torch.tensor([2, 50, 50, 120], dtype=torch.int32, device=DEVICE)
    # Groups of 48, 0, 70 and 30 rows, each padded to 128 in the output (overlapping output ranges would race)
    out_off = torch.tensor([0, 128, 128, 256], dtype=torch.int32, device=DEVICE)
    kw = dict(block_m=8, block_k=32, tiles=tiles) if tiles else {}
    plain = lk.grouped_block_quantize(x, in_off, out_off, **kw)
    prologue = LoadPrologue(_plain_load, (x, x.stride(0), x.stride(1)), x.shape, x.dtype, x.device)
    assert_same_bytes(lk.grouped_block_quantize(prologue, in_off, out_off, **kw), plain)


def gather_fusion(also_return_rows: bool = False) -> FusionDefinition:
    """Rows of x (a column slice of a wider tensor) gathered by index // 2, quantized by groups."""
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], contiguity=[False, True], dtype=DataType.BFloat16)
        idx = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Int)
        starts = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Int32)
        sf_starts = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Int32)
        rows = fd.ops.index_select(x, fd.ops.div(idx, 2), 0)
        packed, scales = fd.ops.nv_grouped_block_quantize(rows, starts, sf_starts)
        fd.add_output(packed)
        fd.add_output(scales)
        if also_return_rows:
            fd.add_output(rows)
    return fd


def gather_inputs(index_values=None):
    g = torch.Generator().manual_seed(11)
    wide = (torch.randn(7, 96, generator=g) * 4).to(torch.bfloat16)
    wide[1, 3], wide[2, 17], wide[4, 40], wide[5, 0] = float("nan"), float("inf"), float("-inf"), -0.0
    wide[6, :16] = -0.0  # a block of negative zeros: a zero scale
    x = wide.to(DEVICE)[:, :64]
    idx = torch.tensor(index_values if index_values is not None else [13, 0, 5, 9, 2, 2, 11, 7, 12, 1, 4],
                       device=DEVICE)
    starts, sf_starts = offsets([4, 0, 7])
    return [x, idx, starts, sf_starts]


def test_gather_prologue_matches_unfused_and_aten(monkeypatch):
    inputs = gather_inputs()
    fd = gather_fusion()
    outs = fd.execute(inputs)
    assert [s.kind.value for s in fd.segments()] == ["PointWise"]  # gather, division and quantize: one segment
    assert len(prologue_reports(fd)) == 1, fd.last_execution()
    assert_same_bytes(outs, gather_fusion().execute(inputs, _disable_options=["kernel_codegen"]))
    unfused(monkeypatch)
    ref_fd = gather_fusion()
    ref = ref_fd.execute(inputs)
    assert len(ref_fd.segments()) == 2 and not prologue_reports(ref_fd)
    assert_same_bytes(outs, ref)


@pytest.mark.parametrize("bad", [14, 200, -3])  # (Int division truncates: -1 // 2 is row 0)
def test_gather_prologue_out_of_range_index_raises(bad):
    fd = gather_fusion()
    good = gather_inputs()
    wrong = gather_inputs([13, 0, 5, bad, 2, 2, 11, 7, 12, 1, 4])
    expected = fd.execute(good)
    message = r"fd.ops.index_select: index T\d+ holds a value outside \[0, 7\)"
    if DEVICE.type == "cuda":
        fd.execute(wrong)  # no host synchronization: the flag is read by the next call
        torch.cuda.synchronize()
        with pytest.raises(FusionExecutionError, match=message + r".*found on the device by an earlier call"):
            fd.execute(good)
    else:
        with pytest.raises(FusionExecutionError, match=message):
            fd.execute(wrong)
    assert_same_bytes(fd.execute(good), expected)  # the flag was cleared
    with pytest.raises(FusionExecutionError, match=message):
        fd.execute(wrong, _enable_options=["sync_offset_checks"])


def test_producer_returned_as_output_is_not_merged():
    inputs = gather_inputs()
    fd = gather_fusion(also_return_rows=True)
    packed, scales, rows = fd.execute(inputs)
    assert [s.kind.value for s in fd.segments()] == ["PointWise", "PointWise"]
    assert not prologue_reports(fd)
    x, idx = inputs[0], inputs[1]
    assert torch.equal(rows.view(torch.int16), x[idx // 2].view(torch.int16))
    assert_same_bytes((packed, scales), gather_fusion().execute(inputs))


def elementwise_fusion() -> FusionDefinition:
    """bf16(a * s + b) from fp32 a (transposed in memory), b and a scalar s: rounded to bf16 before quantizing."""
    with FusionDefinition() as fd:
        a = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float, stride_order=[0, 1])
        b = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        s = fd.define_scalar(dtype=DataType.Float)
        starts = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Int32)
        sf_starts = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Int32)
        h = fd.ops.cast(fd.ops.add(fd.ops.mul(a, s), b), DataType.BFloat16)
        packed, scales = fd.ops.nv_grouped_block_quantize(h, starts, sf_starts)
        fd.add_output(packed)
        fd.add_output(scales)
    return fd


def elementwise_inputs():
    g = torch.Generator().manual_seed(5)
    a = torch.randn(48, 20, generator=g) * 3
    b = torch.randn(20, 48, generator=g)
    a[0, 0], a[3, 1], a[5, 2], a[7, 3] = float("nan"), float("inf"), float("-inf"), -0.0
    b[2, :16] = -0.0
    a[:16, 2] = 0.0  # -0.0 + (0 * s) rows: -0 and +0 sums
    b[4, 16:32] = 1e38  # overflows to inf in a * s + b for some lanes, then rounds in bf16
    a[16:32, 4] = 1e-40  # fp32 subnormals (not flushed)
    starts, sf_starts = offsets([9, 11])
    return [a.to(DEVICE).t(), b.to(DEVICE), 1.7, starts, sf_starts]


def test_elementwise_prologue_special_values(monkeypatch):
    inputs = elementwise_inputs()
    assert inputs[0].stride() == (1, 20)
    fd = elementwise_fusion()
    outs = fd.execute(inputs)
    assert len(fd.segments()) == 1 and len(prologue_reports(fd)) == 1, fd.last_execution()
    # mul, add and the bf16 rounding are exact IEEE operations: ATen gives the same bits, up to the sign of a NaN
    # (no value: ATen's CPU arithmetic gives this NaN its sign bit, the kernels not), which FP4 codes keep.
    aten = elementwise_fusion().execute(inputs, _disable_options=["kernel_codegen"])
    a, b, s = inputs[:3]
    nan = (a * s + b).to(torch.bfloat16).isnan().cpu()
    assert nan.any()
    nan_signs = nan[:, 0::2].to(torch.uint8) * 0x08 | nan[:, 1::2].to(torch.uint8) * 0x80
    (packed, scales), (ref_packed, ref_scales) = quantized_bytes(outs), quantized_bytes(aten)
    assert torch.equal(scales.cpu(), ref_scales.cpu())
    assert torch.equal(packed.cpu() & ~nan_signs, ref_packed.cpu() & ~nan_signs)
    unfused(monkeypatch)
    ref_fd = elementwise_fusion()
    assert_same_bytes(outs, ref_fd.execute(inputs))
    assert len(ref_fd.segments()) == 2


@pytest.mark.parametrize("swizzle", [False, True])
def test_block_quantize_takes_a_prologue_too(monkeypatch, swizzle):
    # nv_block_quantize (plain or single-group swizzled scales) runs the same kernel: a gathered, scaled input.
    g = torch.Generator().manual_seed(6)
    x = (torch.randn(9, 48, generator=g) * 2).to(torch.bfloat16).to(DEVICE)
    x[2, 3], x[4, 20] = float("nan"), -0.0
    idx = torch.tensor([3, 8, 0, 0, 2, 4, 7, 1, 5, 6, 2], device=DEVICE)

    def define():
        with FusionDefinition() as fd:
            xt = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
            it = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Int)
            rows = fd.ops.cast(fd.ops.mul(fd.ops.index_select(xt, it, 0), 0.5), DataType.BFloat16)
            packed, scales = fd.ops.nv_block_quantize(rows, swizzle_block_scales=swizzle)
            fd.add_output(packed)
            fd.add_output(scales)
        return fd

    fd = define()
    outs = fd.execute([x, idx])
    assert len(fd.segments()) == 1 and len(prologue_reports(fd)) == 1, fd.last_execution()
    unfused(monkeypatch)
    ref_fd = define()
    assert_same_bytes(outs, ref_fd.execute([x, idx]))
    assert len(ref_fd.segments()) == 2


def test_moe_layer_split_quantization_fuses_too(monkeypatch):
    # quant="split": nv_block_quantize then the layout op; both quantizes take their producers as prologues.
    cfg = moe.MoEConfig(hidden=128, intermediate=64, experts=4, top_k=2)
    weights = moe.quantize_weights(moe.make_weights(cfg, DEVICE, seed=1))
    x = torch.randn(10, cfg.hidden, generator=torch.Generator().manual_seed(2)).to(DEVICE, torch.bfloat16)
    layer = moe.MoENVFP4(cfg, weights, quant="split")
    out = layer(x)
    assert len(prologue_reports(layer.fusion(10))) == 2
    unfused(monkeypatch)
    alone = moe.MoENVFP4(cfg, weights, quant="split")
    assert torch.equal(out.view(torch.int16), alone(x).view(torch.int16))
    assert len(alone.fusion(10).segments()) == len(layer.fusion(10).segments()) + 2


def test_per_row_prologue(monkeypatch):
    # A value that varies only along the rows (a broadcast column, bf16-rounded), -0 and inf among them: the
    # prologue's result still has the quantize tile's shape.
    r = torch.randn(24, generator=torch.Generator().manual_seed(8)).to(DEVICE) * 5
    r[3], r[4], r[5] = -0.0, float("inf"), 1e-30
    starts, sf_starts = offsets([24])

    def define():
        with FusionDefinition() as fd:
            rows = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
            a = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Int32)
            b = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Int32)
            h = fd.ops.broadcast_in_dim(fd.ops.cast(rows, DataType.BFloat16), shape=[24, 32], broadcast_dims=[0])
            packed, scales = fd.ops.nv_grouped_block_quantize(h, a, b)
            fd.add_output(packed)
            fd.add_output(scales)
        return fd

    inputs = [r, starts, sf_starts]
    fd = define()
    outs = fd.execute(inputs)
    assert len(fd.segments()) == 1 and len(prologue_reports(fd)) == 1, fd.last_execution()
    assert_same_bytes(outs, define().execute(inputs, _disable_options=["kernel_codegen"]))
    unfused(monkeypatch)
    assert_same_bytes(outs, define().execute(inputs))


def test_layout_guard_runs_the_producer_on_aten():
    # Without infer_contiguity an ExprEval output (a returned transpose view) is assumed contiguous; the prologue
    # was planned for that, so a call with the real strides computes the producer with ATen before the op.
    x = (torch.randn(64, 24, generator=torch.Generator().manual_seed(2)) * 2).to(DEVICE)
    starts, sf_starts = offsets([10, 14])

    def define():
        with FusionDefinition() as fd:
            t = fd.ops.permute(fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float),
                               [1, 0])
            a = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Int32)
            b = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Int32)
            h = fd.ops.cast(fd.ops.mul(t, 3.0), DataType.BFloat16)
            packed, scales = fd.ops.nv_grouped_block_quantize(h, a, b)
            fd.add_output(t)
            fd.add_output(packed)
            fd.add_output(scales)
        return fd

    inputs = [x, starts, sf_starts]
    fd = define()
    outs = fd.execute(inputs, _disable_options=["infer_contiguity"])
    (step,) = [s for steps in fd.last_runtime().plan.segment_steps for s in steps if type(s).__name__ == "PrologueStep"]
    assert step.guards and step.last_path == "aten (layout guard)"
    assert_same_bytes(outs[1:], define().execute(inputs, _disable_options=["kernel_codegen"])[1:])
    assert_same_bytes(outs[1:], fd.execute(inputs)[1:])  # with inferred layouts: the prologue itself
    (step,) = [s for steps in fd.last_runtime().plan.segment_steps for s in steps if type(s).__name__ == "PrologueStep"]
    assert step.last_path == "kernel"


def test_prologue_kernel_compiles_for_sm90():
    # The interpreter accepts code the GPU compiler rejects: the quantize kernel with each generated prologue of
    # the cases above (a gather with its index check; fp32 elementwise math with a scalar) for sm_90.
    pytest.importorskip("triton.backends.nvidia")
    specs = []
    for fd, inputs in ((gather_fusion(), gather_inputs()), (elementwise_fusion(), elementwise_inputs())):
        fd.execute(inputs)
        (step,) = [s for steps in fd.last_runtime().plan.segment_steps for s in steps
                   if type(s).__name__ == "PrologueStep"]
        plan = step.plan
        # The argument tuple's types, in PrologueStep's order: pointers, error flags, scalars, error slots, ints.
        types = ["*" + _SIG_DTYPE[to_torch_dtype(tv.dtype)] for tv in plan.inputs]
        types += ["*i32"] * bool(plan.checks) + ["fp32"] * len(plan.scalar_vals) + ["i32"] * len(plan.checks)
        types += ["i32" if abs(v) < 2**31 else "i64" for v in plan.fixed]
        names = ["gs_ptr", "packed_ptr", "scales_ptr", "units_ptr", "in_offsets_ptr", "out_offsets_ptr", "PARGS",
                 "M", "K", "g", "pk", "scales_numel", "n_rows", "quant_programs", "k_tiles", "z_cols"]
        signature = dict(zip(names, ["*fp32", "*u8", "*u8", "*i32", "*i32", "*i32", types] + ["i32"] * 9))
        consts = dict(HAS_GS=False, SCALE_LAYOUT=2, LOG2_G=2, BLOCK_SIZE=16, BLOCK_M=4, BLOCK_K=512, TILES=2,
                      WIDE=False, UNIT_LOG2=2, ZERO_R=32, ZERO_C=64, PROLOGUE="@" + plan.name)
        signature.update({k: "constexpr" for k in consts})
        source = plan.source + "\nfrom pyfuser.kernels.nvfp4_layout import _block_quantize_prologue_kernel\n"
        specs.append({"name": "_block_quantize_prologue_kernel", "source": source, "signature": signature,
                      "constexprs": consts, "options": {"num_warps": 2, **COMPILE_OPTIONS}})
    ptx = sm90.compile_ptx(specs)
    assert len(ptx) == 2
    assert "st.global" in ptx[0] and "div.rn.f32" in ptx[0]
