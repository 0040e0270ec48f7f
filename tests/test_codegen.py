"""Generated kernels end to end: the #4888 pattern, alignment claims, modes, introspection, kernel sharing.

On CPU the kernels run under the Triton interpreter (tests/conftest.py); on CUDA they run for real."""

import os

import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.codegen.launcher import triton_usable

from harness import DEVICE, assert_same, check_fusion, define, make
from test_codegen_views import bits_equal

pytestmark = pytest.mark.skipif(not triton_usable(DEVICE), reason="generated kernels need CUDA or TRITON_INTERPRET=1")

S, H = 64, 4


def issue4888(fd):
    """tests/python/direct/test_python_frontend.py::test_issue4888 at [64, 65] with 4 heads."""
    t0 = fd.define_tensor([S, S + 1], contiguity=[True, True], dtype=DataType.BFloat16)
    t1 = fd.define_tensor([S, S + 1], contiguity=[True, True], dtype=DataType.Bool)
    t2 = fd.define_tensor([S, S + 1], contiguity=[True, True], dtype=DataType.Bool)
    t3 = fd.define_tensor([1, H, S, S], contiguity=[None, True, True, True], dtype=DataType.BFloat16)
    t6 = fd.ops.set(fd.ops.bitwise_or(t1, t2))
    fd.add_output(t6, t1)
    t10 = fd.ops.cast(fd.ops.mul(fd.ops.cast(t0, DataType.Float), fd.ops.cast(t6, DataType.Float)), DataType.BFloat16)
    fd.add_output(t10, t0)
    t27 = fd.ops.broadcast_in_dim(t10, shape=[1, 1, S, S + 1], broadcast_dims=[2, 3])
    t43 = fd.ops.slice(t27, [0, 0, 0, 0], [1, 1, S, S])
    t49 = fd.ops.broadcast_in_dim(t43, shape=[1, H, S, S], broadcast_dims=[0, 1, 2, 3])
    t54 = fd.ops.add(fd.ops.mul(fd.ops.cast(t3, DataType.Float), 0.0883883), fd.ops.cast(t49, DataType.Float))
    m = fd.ops.max(t54, dims=[3], keepdim=True)
    e = fd.ops.exp(fd.ops.sub(t54, m))
    t84 = fd.ops.div(e, fd.ops.sum(e, dims=[3], keepdim=True))
    fd.add_output(t49)
    fd.add_output(t84)
    fd.add_output(fd.ops.cast(t84, DataType.BFloat16))


def issue4888_inputs():
    return [make((S, S + 1), torch.bfloat16), make((S, S + 1), torch.bool), make((S, S + 1), torch.bool),
            make((1, H, S, S), torch.bfloat16)]


def issue4888_eager(t0, t1, t2, t3):
    t6 = t1 | t2
    t10 = (t0.float() * t6.float()).to(torch.bfloat16)
    t0.copy_(t10)
    t1.copy_(t6)
    t49 = t10[None, None, :, :S].expand(1, H, S, S)
    t84 = torch.softmax(t3.float() * 0.0883883 + t49.float(), dim=-1)
    return t49, t84, t84.to(torch.bfloat16)


def test_issue4888_end_to_end():
    outs = check_fusion(issue4888, issue4888_inputs(), issue4888_eager)
    with FusionDefinition() as fd:
        issue4888(fd)
    inputs = issue4888_inputs()
    fd.execute(inputs)
    reports = fd.last_execution()
    assert [r.kind for r in reports] == ["PointWise", "ExprEval", "InnerPersistent"]
    assert [r.runs_as for r in reports] == ["triton", "aten", "triton"]
    view_name = fd.fusion.outputs[0].name
    assert list(reports[1].outputs[view_name].contiguity) == [None, None, False, True]
    assert outs[0].stride() == (S * (S + 1), 0, S + 1, 1)
    # The softmax kernel reads the view with a row pitch of 65 bf16 (130 bytes): nothing may claim alignment.
    plan = fd.last_runtime().kernel_step(2).plan
    view_param = f"t{plan.inputs.index(fd.fusion.outputs[0])}"
    (roff,) = [line for line in plan.source.splitlines() if f"{view_param}_roff =" in line]
    assert "* (" not in roff, roff
    # The contiguous [1,4,64,64] scores input has 16-byte aligned rows, and the kernel may say so.
    scores_param = f"t{plan.inputs.index(fd.fusion.inputs[3])}"
    (roff,) = [line for line in plan.source.splitlines() if f"{scores_param}_roff =" in line]
    assert "* 8)" in roff, roff
    # So has the fp32 output beside it (pitch 64: the row coordinate's one constant, 8 elements, divides it),
    # which the GPU then stores 16 bytes at a time.
    p_param = f"t{len(plan.inputs) + plan.outputs.index(fd.fusion.outputs[1])}"
    (roff,) = [line for line in plan.source.splitlines() if f"{p_param}_roff =" in line]
    assert "* 8)" in roff, roff


def test_issue4888_without_infer_contiguity_takes_the_safe_path():
    inputs = issue4888_inputs()
    refs = issue4888_eager(*[t.clone() for t in inputs])
    with FusionDefinition() as fd:
        issue4888(fd)
    outs = fd.execute(inputs, _disable_options=["infer_contiguity"])
    for o, r in zip(outs, refs):
        assert_same(o, r)  # torch's default tolerances for each dtype (bf16: one rounding step)
    rt = fd.last_runtime()
    view = fd.fusion.outputs[0]
    assert list(rt.layout(view).contiguity) == [None, None, True, True]  # the old, wrong assumption
    # The softmax kernel was planned for that assumption; the guard sees the real strides and uses ATen.
    assert rt.kernel_step(2).last_path == "aten (layout guard)"


def test_aligned_pitch_is_claimed():
    x = make((16, 72), torch.bfloat16)[:, :64]  # pitch 72 bf16 = 144 bytes: 16-byte aligned rows

    def fn(fd):
        t = fd.ops.cast(fd.from_pytorch(x), DataType.Float)
        fd.add_output(fd.ops.sum(fd.ops.mul(t, t), dims=[1]))

    check_fusion(fn, [x], lambda x: (x.float() * x.float()).sum(1))
    with FusionDefinition() as fd:
        fn(fd)
    fd.execute([x])
    assert "* (t0_s0 * 8)" in fd.last_execution()[0].kernel_source


@pytest.mark.parametrize("cols", [50, 20000])  # persistent and looped kernels (rows over 16384)
def test_softmax_modes(cols):
    x = make((3, cols), torch.bfloat16)

    def fn(fd):
        t = fd.ops.cast(fd.from_pytorch(x), DataType.Float)
        e = fd.ops.exp(fd.ops.sub(t, fd.ops.max(t, dims=[1], keepdim=True)))
        fd.add_output(fd.ops.div(e, fd.ops.sum(e, dims=[1], keepdim=True)))

    check_fusion(fn, [x], lambda x: torch.softmax(x.float(), -1), atol=1e-6, rtol=1e-5)
    with FusionDefinition() as fd:
        fn(fd)
    fd.execute([x])
    assert fd.last_execution()[0].kernel_name.split("_")[1] == ("persistent" if cols == 50 else "looped")


def _row_reductions(fd, x):
    """softmax, a LayerNorm-style normalization and a min over the rows of ``x`` (cast to Float); returns the cast.
    Float outputs: the reduction order differs from eager's, so a BFloat16 rounding could flip by one ulp."""
    t = fd.ops.cast(fd.from_pytorch(x), DataType.Float)
    e = fd.ops.exp(fd.ops.sub(t, fd.ops.max(t, dims=[1], keepdim=True)))
    fd.add_output(fd.ops.div(e, fd.ops.sum(e, dims=[1], keepdim=True)))
    var, mean = fd.ops.var_mean(t, dims=[1], correction=0, keepdim=True)
    fd.add_output(fd.ops.mul(fd.ops.sub(t, mean), fd.ops.rsqrt(fd.ops.add(var, 1e-5))))
    fd.add_output(fd.ops.min(t, dims=[1]))
    return t


def _row_reductions_eager(x):
    """``_row_reductions`` op by op (torch.softmax would return a contiguous tensor for a transposed x)."""
    t = x.float()
    e = torch.exp(t - t.amax(1, keepdim=True))
    var, mean = torch.var_mean(t, dim=1, correction=0, keepdim=True)
    return [e / e.sum(1, keepdim=True), (t - mean) * torch.rsqrt(var + 1e-5), t.amin(1)]


@pytest.mark.parametrize("cols", [20000, 24576])
def test_wide_rows(monkeypatch, cols):
    # Rows over 16384 columns (plan.wide_rows): a grid of a few programs per SM walks the rows in turn (the CPU
    # plan assumes 4 SMs: 8 programs for 9 rows, so one walks two; the H200's 264 take one each), 4 tiles per
    # step of the column loops. Tiles of 2048 here (8192 by default; test_softmax_modes runs those), so that
    # 20000 columns take 3 steps, the last one's tiles partly and wholly masked; 24576 columns take 3 whole
    # steps, with no column mask (Emitter.full_col_tiles). Special values sit in every tile, the last row's
    # last element included; the output keeps eager's strides.
    # Transposed (column-major rows): the kernel's column loop walks stride-9 elements (test_softmax_modes has
    # contiguous wide rows). The tiles of wide_tiles' forms are off, so that wide_block_c holds.
    from pyfuser.codegen import plan

    monkeypatch.setitem(plan.TUNING, "wide_block_c", 2048)
    monkeypatch.setitem(plan.TUNING, "wide_tiles", {})
    rows = 9
    x = make((cols, rows), torch.bfloat16).t()
    x[1, cols - 1] = float("nan")
    x[2, 10239] = float("inf")
    x[3, 0] = float("-inf")
    x[4, :] = -0.0
    x[5, 16384] = 1e30
    x[rows - 1, cols - 1] = -3e38

    def fn(fd):
        t = _row_reductions(fd, x)
        fd.add_output(fd.ops.cast(fd.ops.neg(t), DataType.BFloat16))  # no reduction: bit for bit

    check_fusion(fn, [x], lambda x: _row_reductions_eager(x) + [(-x.float()).to(torch.bfloat16)], atol=1e-5,
                 rtol=1e-4)
    with FusionDefinition() as fd:
        fn(fd)
    fd.execute([x])
    (run,) = fd.last_execution()
    step = fd.last_runtime().kernel_step(0)
    assert run.kernel_name.split("_")[1] == "looped" and step.plan.block_c == 2048
    assert "for pid_r in tl.range(tl.program_id(0)" in run.kernel_source
    assert "tl.static_range(4)" in run.kernel_source and "eviction_policy='evict_last'" in run.kernel_source
    assert step.plan.grid[0] == min(rows, plan.TUNING["wide_programs_per_sm"] * plan.sm_count())
    assert ("< n_cols" in run.kernel_source) == (cols % (4 * 2048) != 0)


@pytest.mark.parametrize("dtype, passes, weighted", [(torch.float32, 2, True), (torch.float32, 2, False),
                                                     (torch.float32, 1, True), (torch.bfloat16, 2, True)])
def test_wide_rows_of_registers(monkeypatch, dtype, passes, weighted):
    # Rows that fit in registers are planned wide when their elements are 4 bytes, they take two or more passes
    # and read two or more row-sized tensors (x and a weight w here; plan.wide_fp32_min_cols: 16384 on the GPU,
    # 1000 here with tiles of 512), else persistent.
    from pyfuser.codegen import plan

    monkeypatch.setitem(plan.TUNING, "wide_fp32_min_cols", 1000)
    monkeypatch.setitem(plan.TUNING, "wide_fp32_block_c", 512)
    x = make((9, 1500), dtype)
    x[2, 1499] = float("nan")
    x[3, 700] = float("-inf")
    w = make((1500,), dtype) if weighted else torch.ones(1500, dtype=dtype, device=DEVICE)

    def fn(fd):
        t = fd.ops.cast(fd.from_pytorch(x), DataType.Float)
        if passes == 2:
            var, mean = fd.ops.var_mean(t, dims=[1], correction=0, keepdim=True)
            y = fd.ops.mul(fd.ops.sub(t, mean), fd.ops.rsqrt(fd.ops.add(var, 1e-5)))
        else:
            y = fd.ops.mul(t, fd.ops.rsqrt(fd.ops.sum(fd.ops.mul(t, t), dims=[1], keepdim=True)))
        if weighted:
            y = fd.ops.mul(y, fd.ops.cast(fd.from_pytorch(w), DataType.Float))
        fd.add_output(fd.ops.cast(y, DataType.BFloat16) if dtype is torch.bfloat16 else y)

    def eager(x, w):
        t = x.float()
        if passes == 2:
            var, mean = torch.var_mean(t, dim=1, correction=0, keepdim=True)
            y = (t - mean) * torch.rsqrt(var + 1e-5)
        else:
            y = t * torch.rsqrt((t * t).sum(1, keepdim=True))
        return (y * w.float() if weighted else y).to(x.dtype)

    inputs = [x, w] if weighted else [x]
    # (bf16: another reduction order may round an output one ulp apart)
    tol = dict(atol=1e-5, rtol=1e-4) if dtype is torch.float32 else dict(atol=1e-2, rtol=1e-2)
    check_fusion(fn, inputs, lambda *a: eager(x, w), **tol)
    with FusionDefinition() as fd:
        fn(fd)
    fd.execute(inputs)
    (run,) = fd.last_execution()
    wide = dtype is torch.float32 and passes == 2 and weighted
    assert run.kernel_name.split("_")[1] == ("looped" if wide else "persistent")
    assert ("tl.num_programs(0)" in run.kernel_source) == wide


def _checked_row_reductions(x):
    """_row_reductions of ``x`` checked against eager; the plan of its one kernel."""
    def fn(fd):
        _row_reductions(fd, x)

    check_fusion(fn, [x], _row_reductions_eager, atol=1e-5, rtol=1e-4)
    fd = define(fn)
    fd.execute([x])
    assert len(fd.last_execution()) == 1
    return fd.last_runtime().kernel_step(0).plan


@pytest.mark.parametrize("layout", ["contiguous", "sliced"])
@pytest.mark.parametrize("cols, tiles", [(3000, 3), (5000, 5)])  # tiles of 1024 (plan.row_tiles, two passes)
def test_rows_in_tiles(cols, tiles, layout):
    # A width a power-of-two tile would mostly mask off is walked in a few tiles by an unrolled looped kernel:
    # the last tile's masked lanes must take no part (NaN, inf and -0.0 placed in it, and in the first tile).
    # "sliced": a column window of a wider tensor (row pitch cols + 7, offset 3).
    x = make((6, cols), torch.bfloat16) if layout == "contiguous" else make((6, cols + 7), torch.bfloat16)[:, 3:cols + 3]
    x[1, cols - 1] = float("nan")
    x[2, cols - 2] = float("inf")
    x[3, 0] = float("-inf")
    x[4, :] = -0.0
    x[5, cols - 1] = 1e30

    plan = _checked_row_reductions(x)
    src = plan.source
    assert plan.mode == "looped"
    # One straight-line block per tile, written once per pass: every pass after the first reads the tile loaded
    # for the first (one load per tile in all), and only the last tile masks its columns.
    assert f"c_{tiles - 1} = {tiles - 1} * BLOCK_C" in src and f"c_{tiles} =" not in src
    assert src.count("tl.load(") == tiles and src.count("< n_cols") == 1


@pytest.mark.parametrize("layout", ["contiguous", "sliced"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_of_exactly_one_tile(dtype, layout):
    # Rows exactly one persistent tile wide fold every lane with no column mask (Emitter.full_col_tiles), and
    # reductions never mask rows: 7 rows in blocks of several leave rows past n_rows in the last block, computed
    # from masked loads' zeros, which must reach no real row and no store. Special values in the last row too.
    # "sliced": a column window of a wider tensor (row pitch 261, offset 2).
    x = make((7, 256), dtype) if layout == "contiguous" else make((7, 261), dtype)[:, 2:258]
    x[1, 255] = float("nan")
    x[2, 0] = float("inf")
    x[4, :] = -0.0
    x[6, 3] = float("-inf")

    plan = _checked_row_reductions(x)
    assert plan.mode == "persistent" and plan.block_c == 256 and plan.n_rows % plan.block_r != 0
    assert "< n_cols" not in plan.source and "tl.where(cmask" not in plan.source


def _one_or_two_levels(x, reduction):
    """x * sum(x) (one reduction level) or a softmax (two) over bf16 rows, stored as bf16 (the warps follow the
    element size); runs it, checks it against eager and returns the plan of its kernel."""
    with FusionDefinition() as fd:
        t = fd.ops.cast(fd.from_pytorch(x), DataType.Float)
        if reduction == "sum":
            y = fd.ops.mul(t, fd.ops.sum(t, dims=[1], keepdim=True))
        else:
            e = fd.ops.exp(fd.ops.sub(t, fd.ops.max(t, dims=[1], keepdim=True)))
            y = fd.ops.div(e, fd.ops.sum(e, dims=[1], keepdim=True))
        fd.add_output(fd.ops.cast(y, DataType.BFloat16))
    (out,) = fd.execute([x])
    t = x.float()
    e = torch.exp(t - t.amax(1, keepdim=True))
    ref = t * t.sum(1, keepdim=True) if reduction == "sum" else e / e.sum(1, keepdim=True)
    # (values, shape, dtype and strides; another reduction order may round a bf16 output one ulp apart)
    assert_same(out, ref.bfloat16(), atol=1e-2, rtol=1e-2)
    return fd.last_runtime().kernel_step(0).plan


def _bf16_rows(rows, cols, layout):
    """bf16 rows with NaN, inf and -0.0 in them; "sliced": a column window of a wider tensor (row pitch cols + 7)."""
    x = make((rows, cols), torch.bfloat16) if layout == "contiguous" else \
        make((rows, cols + 7), torch.bfloat16)[:, 3:cols + 3]
    x[0, cols - 1], x[1, 0], x[-1, :] = float("nan"), float("inf"), -0.0
    return x


@pytest.mark.parametrize("layout", ["contiguous", "sliced"])
@pytest.mark.parametrize("reduction, tiles, warps", [("sum", 3, 8), ("softmax", 5, 4)])
def test_rows_of_two_levels_take_narrower_tiles_and_fewer_warps(reduction, tiles, warps, layout):
    # A row of 5000 bf16: one reduction walks 3 tiles of 2048 with 8 warps; two dependent reductions (softmax)
    # 5 tiles of 1024 (less masked waste) with 4 warps (fewer cross-warp meetings per level).
    plan = _one_or_two_levels(_bf16_rows(4, 5000, layout), reduction)
    assert plan.mode == "looped" and plan.num_warps == warps
    assert f"c_{tiles - 1} = {tiles - 1} * BLOCK_C" in plan.source and f"c_{tiles} =" not in plan.source


@pytest.mark.parametrize("layout", ["contiguous", "sliced"])
@pytest.mark.parametrize("reduction, rows, warps", [("sum", 2, 4), ("softmax", 1, 1)])
def test_persistent_rows_of_two_levels_run_32_bf16_elements_per_thread(reduction, rows, warps, layout):
    # Rows of 1024 bf16: one reduction, 2 rows per program on 4 warps (plan.TUNING's table); two dependent
    # reductions, 1 row on 1 warp (32 elements per thread: one cross-warp meeting fewer per level).
    plan = _one_or_two_levels(_bf16_rows(8, 1024, layout), reduction)
    assert (plan.mode, plan.block_r, plan.num_warps) == ("persistent", rows, warps)


@pytest.mark.parametrize("layout", ["contiguous", "sliced"])
@pytest.mark.parametrize("dtype, cols, split", [
    (torch.bfloat16, 4096, True),  # rows of 4095: 15 tiles of 256 inside the row, one of 255
    (torch.bfloat16, 301, True),  # 300: one tile of 256, one of 44
    (torch.float32, 258, True),  # 257: a last tile of one column
    (torch.bfloat16, 1001, False),  # 1000 = 8 * 125: bf16 vectors of 8 end at the row's end
    (torch.bool, 1001, True),  # ... but a bool row's 16-byte vectors do not
    (torch.bfloat16, 101, False),  # narrower than pw_ragged_min_cols: one masked tile
])
def test_ragged_rows_split_off_their_interior_tiles(dtype, cols, split, layout):
    # x[:, 1:] op y[:, :-1] over rows of cols - 1 elements (slice+add+mul of bench_fusions): the tiles wholly
    # inside a row run without a column mask (Emitter.split_interior), the row's last tile with it. NaN, +-inf
    # and -0.0 sit in both kinds of tile; "sliced": y a column window of a wider tensor (row pitch cols + 5).
    rows = 5
    x = make((rows, cols), dtype)
    y = make((rows, cols), dtype) if layout == "contiguous" else make((rows, cols + 5), dtype)[:, 2:cols + 2]
    if dtype.is_floating_point:
        for t in (x, y):
            t[0, 1], t[1, cols - 1], t[2, cols - 2], t[3, 2] = float("nan"), float("inf"), float("-inf"), -0.0
            t[4, :] = -0.0
    dt = {torch.bfloat16: DataType.BFloat16, torch.float32: DataType.Float, torch.bool: DataType.Bool}[dtype]

    def fn(fd):
        a = fd.ops.slice(fd.define_tensor([-1, -1], dtype=dt), [0, 1], [rows, cols])
        b = fd.ops.slice(fd.define_tensor([-1, -1], dtype=dt, stride_order=[1, 0]), [0, 0], [rows, cols - 1])
        if dtype == torch.bool:
            fd.add_output(fd.ops.bitwise_xor(a, b))
        else:
            fd.add_output(fd.ops.cast(fd.ops.mul(fd.ops.add(a, b), 0.5), dt))

    def eager(x, y):
        if dtype == torch.bool:
            return x[:, 1:] ^ y[:, :-1]
        return ((x[:, 1:].float() + y[:, :-1].float()) * 0.5).to(dtype)

    fd = define(fn)
    (out,) = fd.execute([x, y])
    bits_equal(out, eager(x, y))
    check_fusion(fn, [x, y], eager, atol=0, rtol=0)
    plan = fd.last_runtime().kernel_step(0).plan
    assert plan.mode == "pointwise"
    assert ("if pid_c * BLOCK_C + BLOCK_C <= n_cols:" in plan.source) == split
    if split:  # at least one tile inside the row
        assert plan.block_c <= cols - 1


def test_bf16_widening_keeps_every_bit_pattern():
    # Every bf16 bit pattern (NaN payloads, subnormals, -0.0) widened to fp32 exactly as ATen widens it, in a
    # tile and in a per-row value, over rows of even and odd width; the widenings run as integer shifts
    # (_bf16_to_f32, the form the kernels use: fewer instructions than the conversion on sm_90).
    bits = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
    x = bits.view(torch.bfloat16).reshape(256, 256).to(DEVICE)
    for t in (x, x[:, :255]):
        def fn(fd):
            a = fd.from_pytorch(t)
            fd.add_output(fd.ops.cast(a, DataType.Float))
            fd.add_output(fd.ops.mul(fd.ops.cast(a, DataType.Float),
                                     fd.ops.cast(fd.ops.max(a, dims=[1], keepdim=True), DataType.Float)))

        fd = define(fn)
        wide, prod = fd.execute([t])
        bits_equal(wide, t.float())
        assert_same(prod, t.float() * t.amax(1, keepdim=True).float(), atol=0, rtol=0)
        assert " = _bf16_to_f32(" in fd.last_execution()[0].kernel_source


@pytest.mark.parametrize("layout", ["contiguous", "sliced"])
@pytest.mark.parametrize("reader", ["iota", "pad"])
def test_ragged_rows_read_their_column_coordinate_per_tile(reader, layout):
    # A ragged row (300 bf16) whose kernel reads its column coordinate (an iota along it; a pad's mask): the
    # row's last few columns are a narrower tile of their own (Emitter.split_interior), whose coordinate is its
    # own variable. The kernel once read the wide tile's there, and Triton failed on the shapes. "sliced": x a
    # column window of a wider tensor (row pitch width + 5, offset 3).
    rows, cols = 5, 300
    width = cols - 1 if reader == "pad" else cols
    x = make((rows, width), torch.bfloat16) if layout == "contiguous" else \
        make((rows, width + 5), torch.bfloat16)[:, 3:width + 3]
    x[0, 0], x[1, -1], x[4, :] = float("nan"), float("inf"), -0.0

    def fn(fd):
        t = fd.ops.cast(fd.from_pytorch(x), DataType.Float)
        if reader == "iota":
            i = fd.ops.broadcast_in_dim(fd.ops.iota(cols, 0.0, 0.5, dtype=DataType.Float), shape=[rows, cols],
                                        broadcast_dims=[1])
            fd.add_output(fd.ops.cast(fd.ops.add(t, i), DataType.BFloat16))
        else:
            fd.add_output(fd.ops.cast(fd.ops.pad(t, [0, 1], -2.0), DataType.BFloat16))

    def eager(x):
        if reader == "iota":
            return (x.float() + torch.arange(cols, device=x.device).float() * 0.5).bfloat16()
        return torch.nn.functional.pad(x.float(), [0, 1], value=-2.0).bfloat16()

    check_fusion(fn, [x], eager, atol=0, rtol=0)
    fd = define(fn)
    (out,) = fd.execute([x])
    # (pad: the NaN reaches the bf16 output through casts alone; the GPU kernel gives it eager's CUDA bits,
    # 0x7FFF, tests/test_bf16_nan_narrowing.py)
    bits_equal(out, eager(x))
    assert "if pid_c * BLOCK_C + BLOCK_C <= n_cols:" in fd.last_runtime().kernel_step(0).plan.source


def test_product_over_a_materialized_expanded_dim():
    # Fuzz seed 775: prod over an expanded dim is a squeeze and a power (nvFuser's form), but the permuted tensor
    # is also an output, so the kernel walks that dim; the squeezed value varies along the kernel's columns and
    # the segment runs on ATen (it raised an internal error while the kernel was written).
    x = torch.tensor([[2]], dtype=torch.int32, device=DEVICE).expand(1, 3)

    def fn(fd):
        t = fd.ops.permute(fd.ops.erf(fd.ops.cast(fd.from_pytorch(x), DataType.Float)), dims=[1, 0])
        fd.add_output(t)
        fd.add_output(fd.ops.prod(t, dims=[0], keepdim=True))

    check_fusion(fn, [x], lambda x: [torch.erf(x.float()).t(), torch.erf(x.float()).t().prod(0, keepdim=True)],
                 atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("dtype", [DataType.Float, DataType.Double])
def test_scalars_computed_from_constants_are_kernel_literals(dtype):
    # Thunder-style definitions compute Double scalars from constants (reciprocal(2560.0), 2.0 * 0.5): folded
    # while planning, they are literals of the dtype their consumer computes in (exact in Double arithmetic),
    # so the segment is a kernel. A Double scalar input still cannot be passed to Triton exactly: ATen.
    # The input is transposed: the output keeps eager's strides.
    torch_dt = torch.float32 if dtype == DataType.Float else torch.float64
    x = make((10, 6), torch_dt).t()
    x[0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0])

    def fn(fd):
        t = fd.from_pytorch(x)
        c = fd.ops.reciprocal(fd.define_scalar(2560.0, dtype=DataType.Double))
        d = fd.ops.mul(fd.define_scalar(3.0, dtype=DataType.Double), fd.define_scalar(0.1, dtype=DataType.Double))
        fd.add_output(fd.ops.add(fd.ops.mul(t, c), d))

    check_fusion(fn, [x], lambda x: x * (1 / 2560.0) + 3.0 * 0.1)
    with FusionDefinition() as fd:
        fn(fd)
    fd.execute([x])
    assert [r.runs_as for r in fd.last_execution()] == ["triton"], fd.last_execution()

    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        s = fd.define_scalar(dtype=DataType.Double)
        fd.add_output(fd.ops.mul(t, fd.ops.reciprocal(s)))
    out = fd.execute([x, 3.0])[0]
    assert_same(out, x * (1 / 3.0))
    assert "Double scalar" in fd.last_execution()[0].reason


def test_a_grid_over_cudas_limit_runs_on_aten(monkeypatch):
    # A plan whose rows include a dim no output walks can ask for more programs than a grid may have (nvFuser's
    # ws_tma_normalization5 did once: 1.1e11): that segment runs on ATen, it does not fail in Triton's launcher.
    from pyfuser.codegen import plan

    x = make((64, 4000))  # one row per program: a grid of 64
    monkeypatch.setattr(plan, "INT32_MAX", 16)  # the limit, scaled down to this test

    def fn(fd):
        fd.add_output(fd.ops.sum(fd.ops.exp(fd.from_pytorch(x)), dims=[1]))

    check_fusion(fn, [x], lambda x: torch.exp(x).sum(1), atol=1e-5, rtol=1e-5)
    with FusionDefinition() as fd:
        fn(fd)
    fd.execute([x])
    (run,) = fd.last_execution()
    assert run.runs_as == "aten" and "a kernel grid allows" in run.reason, run


def test_a_broadcast_row_dim_is_walked_as_the_reduced_dim():
    # A row reduction broadcast back to a shape read from another tensor left its broadcast dim a row dim of its
    # own when nothing in the segment linked the two: one kernel row per element of the broadcast output, each
    # re-reducing the row (seen in an RMSNorm-backward segment: 393,248 rows of 24,578). With equal extents and
    # no tensor on both, the row dim is walked as the reduced (column) dim; a tensor on both keeps them apart.
    from pyfuser.codegen.plan import _alias_row_dim_to_reduced
    from pyfuser.segment.loop_domain import LoopDomain

    def domain(dims_of):
        return LoopDomain(dims=[0, 1, 2], n_row=2, reduced=frozenset({2}), dims_of=dims_of)

    dom, sizes = domain({1: [0, 2], 2: [0, 1], 3: [0, 1]}), {0: 16, 1: 24, 2: 24}
    _alias_row_dim_to_reduced(dom, sizes)
    assert dom.dims == [0, 2] and dom.n_row == 1 and dom.dims_of == {1: [0, 2], 2: [0, 2], 3: [0, 2]}
    assert sizes == {0: 16, 2: 24}
    for dims_of, sizes in (({1: [0, 2], 2: [0, 1], 3: [1, 2]}, {0: 16, 1: 24, 2: 24}),  # a tensor on both
                           ({1: [0, 2], 2: [0, 1]}, {0: 16, 1: 25, 2: 24})):  # different extents
        dom = domain(dims_of)
        _alias_row_dim_to_reduced(dom, sizes)
        assert dom.dims == [0, 1, 2] and dom.n_row == 2


def test_outer_reduction_and_epilogue():
    x = make((9, 6))

    def fn(fd):
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.mul(fd.ops.sum(t, dims=[0]), 2.0))

    check_fusion(fn, [x], lambda x: x.sum(0) * 2.0, atol=1e-5, rtol=1e-5)
    with FusionDefinition() as fd:
        fn(fd)
    fd.execute([x])
    assert [(r.kind, r.runs_as) for r in fd.last_execution()] == [("Reduction", "triton")]


def test_equal_fusions_share_compiled_kernels():
    x = make((5, 7))

    def fn(fd):
        fd.add_output(fd.ops.relu(fd.ops.add(fd.from_pytorch(x), 1.0)))

    fds = []
    for _ in range(2):
        with FusionDefinition() as fd:
            fn(fd)
        fd.execute([x])
        fds.append(fd)
    k1, k2 = (f.last_runtime().kernel_step(0).launcher.fn for f in fds)
    assert k1 is k2


def test_dump_writes_reports_and_kernels(tmp_path, monkeypatch):
    monkeypatch.setenv("PYFUSER_DUMP", "segments,kernels")
    monkeypatch.setenv("PYFUSER_DUMP_DIR", str(tmp_path))
    x = make((4, 6))
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.exp(fd.from_pytorch(x)))
    fd.execute([x])
    names = sorted(os.listdir(tmp_path))
    assert any(n.endswith("_segments.txt") for n in names)
    kernel = fd.last_execution()[0].kernel_name
    assert f"{kernel}.py" in names
    assert "runs as triton kernel" in next(open(tmp_path / n).read() for n in names if n.endswith("_segments.txt"))


def test_cached_call_does_not_replan():
    x = make((4, 6))
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.exp(fd.from_pytorch(x)))
    fd.execute([x])
    plan = fd.last_runtime().plan
    fd.execute([x])
    assert fd.last_runtime().plan is plan and fd._executor.stats["hits"] == 1


@pytest.mark.parametrize("cols", [9, 9000])  # persistent and looped
def test_bool_max_min_reductions(cols):
    # Found by the fuzzer on the H200: a looped Bool reduction changed its accumulator's type inside the loop.
    x = make((3, cols), torch.bool)

    def fn(fd):
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.max(t, dims=[1]))
        fd.add_output(fd.ops.min(t, dims=[1]))

    check_fusion(fn, [x], lambda x: [x.amax(1), x.amin(1)])


def test_kernel_codegen_disabled_runs_every_segment_on_aten():
    x = make((6, 9), torch.bfloat16).t()  # transposed input

    def fn(fd):
        t = fd.ops.cast(fd.from_pytorch(x), DataType.Float)
        fd.add_output(fd.ops.sum(fd.ops.exp(t), dims=[1]))

    with FusionDefinition() as fd:
        fn(fd)
    kernel_out = fd.execute([x])[0]
    aten_out = fd.execute([x], _disable_options=["kernel_codegen"])[0]
    assert [r.runs_as for r in fd.last_execution()] == ["aten"]
    assert_same(kernel_out, aten_out, atol=1e-5, rtol=1e-5)
    assert_same(aten_out, torch.exp(x.float()).sum(1), atol=1e-5, rtol=1e-5)


def test_where_over_bools_cast_to_float():
    # Fuzz seed 41846 (CPU): where(cmp, bool, cmp) cast to Float gave 1.4e-45 for True under the Triton
    # interpreter: the where's data held the Bool values as integers under a Float handle dtype, and pyfuser's
    # interpreter cast read them as Float bits (codegen/interpreter_compat.py).
    x = torch.tensor([1.5, 0.0, -2.0, float("nan")], device=DEVICE)
    flag = torch.tensor(True, device=DEVICE)

    def fn(fd):
        t, f = fd.from_pytorch(x), fd.from_pytorch(flag)
        nonzero = fd.ops.cast(t, DataType.Bool)
        fd.add_output(fd.ops.cast(fd.ops.where(nonzero, f, nonzero), DataType.Float))

    with FusionDefinition() as fd:
        fn(fd)
    (out,) = fd.execute([x, flag])
    assert_same(out, torch.where(x.bool(), flag, x.bool()).float(), atol=0, rtol=0)
    assert [r.runs_as for r in fd.last_execution()] == ["triton"]


def test_bool_of_a_scalar_argument_and_a_bool_tile():
    # Fuzz seed 45087 (CPU): (s != 0) & (x != 0) with s passed by value (a 0-dim tensor) failed under the Triton
    # interpreter (numpy's bitwise_and of Float and Bool): splatting the 0-dim comparison converted its Bool data
    # to its operands' dtype (codegen/interpreter_compat.py keeps it Bool).
    x = torch.tensor([[1.5, 0.0, -0.0], [float("nan"), 2.0, 0.0]], device=DEVICE)

    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        s = fd.from_pytorch(torch.tensor(1.0, device=DEVICE))  # a 0-dim tensor: passed to the kernel by value
        both = fd.ops.logical_and(fd.ops.ne(s, 0.0), fd.ops.ne(t, 0.0))
        fd.add_output(fd.ops.cast(both, DataType.Float))
    for value in (2.5, 0.0):
        scalar = torch.tensor(value, device=DEVICE)
        (out,) = fd.execute([x, scalar])
        assert_same(out, ((scalar != 0) & (x != 0)).float(), atol=0, rtol=0)
    assert [r.runs_as for r in fd.last_execution()] == ["triton"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_float_pow_is_computed_in_double_and_rounded_once(dtype):
    # codegen/elementwise_lowerings._pow: Float pow (and Half/BFloat16, which compute in Float) is Double pow
    # rounded to Float, closer to eager's CUDA and CPU pows than libdevice's powf (docs/codegen.md has the
    # H200 measurements). Non-contiguous base, special values, a scalar and a tensor exponent.
    g = torch.Generator().manual_seed(5)
    base = (torch.rand(40, 12, generator=g) * 4).to(dtype).to(DEVICE).t()  # [12, 40], strides (1, 12)
    base[0, :6] = torch.tensor([0.0, -0.0, float("inf"), float("nan"), -1.5, 1.1], dtype=dtype)
    expo = ((torch.rand(12, 40, generator=g) - 0.5) * 16).to(DEVICE)

    with FusionDefinition() as fd:
        b, e = fd.from_pytorch(base), fd.from_pytorch(expo)
        fd.add_output(fd.ops.pow(b, e))
        fd.add_output(fd.ops.pow(b, 6.0))
    out_t, out_s = fd.execute([base, expo])
    assert {r.runs_as for r in fd.last_execution()} == {"triton"}
    b64 = base.double()
    ref_t = torch.pow(b64, expo.double()).float()
    ref_s = torch.pow(b64, 6.0).float()  # (a reduced-precision base computes, and returns, Float: nvFuser's rule)
    bits_equal(out_t, ref_t, nan_bits=False)  # (NaN payloads: the device's own)
    bits_equal(out_s, ref_s, nan_bits=False)


def _max_then_shift(fd, store_max):
    x = fd.define_tensor([-1, -1], contiguity=[True, True], dtype=DataType.Float, stride_order=[0, 1])
    m = fd.ops.max(x, dims=[1], keepdim=True)
    n = fd.ops.min(x, dims=[1], keepdim=True)
    fd.add_output(fd.ops.sub(x, m))
    fd.add_output(fd.ops.mul(x, n))
    if store_max:
        fd.add_output(m)
        fd.add_output(n)


@pytest.mark.parametrize("store_max", [False, True], ids=["read-by-arithmetic", "stored"])
def test_max_min_read_only_by_arithmetic(store_max):
    # A max/min that only arithmetic reads reduces with the one-instruction NaN-propagating combine; a stored one
    # keeps the combine that returns an operand's NaN. Both against op-by-op eager, bit for bit but for NaN
    # payloads (the device's own), on a transposed input with NaN of both signs, infs, signed zeros and whole
    # rows of them.
    x = torch.randn(48, 40) * 10
    x[1, 3] = float("nan")
    x[2, 5] = -float("nan")
    x[3, 7], x[4, 9] = float("inf"), float("-inf")
    x[5, :], x[6, :] = 0.0, -0.0
    x[7, ::2] = -0.0
    x[8, :] = float("-inf")
    xt = x.t().contiguous().t().to(DEVICE)

    def eager(t):
        m, n = t.amax(1, keepdim=True), t.amin(1, keepdim=True)
        return [t - m, t * n] + ([m, n] if store_max else [])

    with FusionDefinition() as fd:
        _max_then_shift(fd, store_max)
    outs = fd.execute([xt])
    for o, r in zip(outs, eager(xt)):
        bits_equal(o, r, nan_bits=False)
    if triton_usable(xt):
        sources = "\n".join(r.kernel_source for r in fd.last_execution() if r.kernel_source)
        assert ("_max_canonical_nan, keep_dims" in sources) != store_max
        assert ("_min_canonical_nan, keep_dims" in sources) != store_max
    check_fusion(lambda fd: _max_then_shift(fd, store_max), [xt], eager)


@pytest.mark.parametrize("op", ["var", "var_mean"])
def test_variance_moments_accumulate_as_eager_does_on_the_device(op):
    # Values of +-1.5e19: the sum of squared deviations (512 x 2.25e38) overflows Float, the variance (2.25e38)
    # does not. ATen's CPU var accumulates in Double (finite), its CUDA var in Float (inf); a kernel does as the
    # device's eager does (fuzz seed 1200655 at PYFUSER_FUZZ_MAX_DIM=48). Sliced, so the rows are strided.
    x = make((8, 70))[:, 3:67]
    x.fill_(1.5e19)
    x[:, ::2] = -1.5e19

    def fn(fd):
        t = fd.from_pytorch(x)
        if op == "var":
            fd.add_output(fd.ops.var(t, dims=[0, 1], correction=0, keepdim=False))
        else:
            var, mean = fd.ops.var_mean(t, dims=[1], correction=0, keepdim=False)
            fd.add_output(var)
            fd.add_output(mean)

    def eager(x):
        if op == "var":
            return torch.var(x, dim=[0, 1], correction=0)
        return list(torch.var_mean(x, dim=1, correction=0))

    # (the mean of +-1.5e19 is 0 exactly; eager's Welford update leaves a few hundred of rounding: an absolute
    # tolerance of 1e-12 of the values)
    check_fusion(fn, [x], eager, atol=1.5e7, rtol=1e-6)
