"""Wide rows (longer than plan.TUNING["wide_min_cols"]) take their tile width and tiles per step by the kernel's
form and the row input's element size (plan.TUNING["wide_tiles"], plan.wide_form): RMSNorm, LayerNorm with
Welford lanes of one vector, a softmax with its sum online or in a pass of its own. Whatever the tiles, the
outputs are eager's, for whole steps and a masked last step, with NaN, +-inf and -0.0 in the rows."""

import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.codegen import plan
from harness import DEVICE

EPS = 1e-5


def _rows(dtype, cols, rows=6):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(max(rows, 4), cols, generator=g)[:rows] * 2 + 0.5
    specials = [(11, float("nan")), (cols // 2, float("inf")), (-3, float("-inf")), (slice(None), -0.0)]
    for row, (col, value) in zip(range(rows), specials):
        x[row, col] = value
    return x.to(dtype).to(DEVICE)


def _rmsnorm(fd, x, w):
    t = fd.ops.cast(fd.from_pytorch(x), DataType.Float)
    ms = fd.ops.div(fd.ops.sum(fd.ops.mul(t, t), dims=[1], keepdim=True), float(x.shape[1]))
    y = fd.ops.mul(fd.ops.mul(t, fd.ops.rsqrt(fd.ops.add(ms, EPS))), fd.ops.cast(fd.from_pytorch(w), DataType.Float))
    return fd.ops.cast(y, DataType.BFloat16) if x.dtype == torch.bfloat16 else y


def _rmsnorm_eager(x, w):
    t = x.float()
    y = t * torch.rsqrt((t * t).sum(1, keepdim=True) / x.shape[1] + EPS) * w.float()
    return y.to(x.dtype)


def _layernorm(fd, x, w):
    t = fd.ops.cast(fd.from_pytorch(x), DataType.Float)
    var, mean = fd.ops.var_mean(t, dims=[1], correction=0, keepdim=True)
    y = fd.ops.mul(fd.ops.mul(fd.ops.sub(t, mean), fd.ops.rsqrt(fd.ops.add(var, EPS))),
                   fd.ops.cast(fd.from_pytorch(w), DataType.Float))
    return fd.ops.cast(y, DataType.BFloat16) if x.dtype == torch.bfloat16 else y


def _layernorm_eager(x, w):
    t = x.float()
    var, mean = torch.var_mean(t, dim=1, correction=0, keepdim=True)
    return ((t - mean) * torch.rsqrt(var + EPS) * w.float()).to(x.dtype)


def _softmax(fd, x, w):
    t = fd.ops.cast(fd.from_pytorch(x), DataType.Float)
    e = fd.ops.exp(fd.ops.sub(t, fd.ops.max(t, dims=[1], keepdim=True)))
    y = fd.ops.div(e, fd.ops.sum(e, dims=[1], keepdim=True))
    return fd.ops.cast(y, DataType.BFloat16) if x.dtype == torch.bfloat16 else y


def _softmax_eager(x, w):
    t = x.float()
    e = torch.exp(t - t.amax(1, keepdim=True))
    return (e / e.sum(1, keepdim=True)).to(x.dtype)


# case -> (definition, eager op by op, element size -> its form)
CASES = {
    "rmsnorm": (_rmsnorm, _rmsnorm_eager, {2: "2 passes", 4: "2 passes"}),
    "layernorm": (_layernorm, _layernorm_eager, {2: "2 passes welford vector", 4: "2 passes welford column"}),
    "softmax": (_softmax, _softmax_eager, {2: "3 passes", 4: "2 passes online"}),
}


def _run(case, x):
    define, eager, _ = CASES[case]
    w = (torch.randn(x.shape[1], generator=torch.Generator().manual_seed(4)) + 1).to(x.dtype).to(DEVICE)
    with FusionDefinition() as fd:
        fd.add_output(define(fd, x, w))
    (out,) = fd.execute([x] if case == "softmax" else [x, w])  # (a softmax defines no weight)
    src = fd.last_execution()[0].kernel_source
    return out, eager(x, w), src[src.index("\ndef pf_"):]


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("io", [torch.bfloat16, torch.float32], ids=str)
def test_each_form_takes_the_tiles_of_its_table_entry(case, io):
    x = _rows(io, 65536, rows=2)
    *_, src = _run(case, x)
    itemsize = x.element_size()
    form = CASES[case][2][itemsize]
    block_c, unroll = plan.TUNING["wide_tiles"].get(f"{form}:{itemsize}",
                                                    (plan.TUNING["wide_block_c"], plan.TUNING["wide_unroll"]))[:2]
    assert f"range(0, n_cols, {unroll} * BLOCK_C)" in src
    assert plan.wide_rows(65536, itemsize, 2)[0] == plan.TUNING["wide_block_c"]  # (before the table)
    assert block_c * unroll <= 65536


def test_the_table_changes_only_the_forms_it_names(monkeypatch):
    wide = (8192, 4, 32, 264)
    monkeypatch.setitem(plan.TUNING, "wide_tiles", {"2 passes:2": (16384, 2), "2 passes online:4": (16384, 4, 3)})
    assert plan._wide_tiles_of_form(wide, 65536, "2 passes:2") == (16384, 2, 32, 264)
    assert plan._wide_tiles_of_form(wide, 65536, "2 passes:4") == wide  # fp32: no entry
    # an entry's third number: programs per SM
    assert plan._wide_tiles_of_form(wide, 65536, "2 passes online:4") == (16384, 4, 32, 3 * plan.sm_count())
    assert plan._wide_tiles_of_form(wide, 65536, "3 passes:2") == wide  # three passes: no entry
    # a row narrower than the entry's tiles takes the tiles it has
    assert plan._wide_tiles_of_form(wide, 20000, "2 passes:2") == (16384, 2, 32, 264)
    assert plan._wide_tiles_of_form(wide, 16385, "2 passes:2")[:2] == (16384, 2)
    assert plan.wide_form(2, True, {}, 0) == "2 passes online"
    assert plan.wide_form(2, False, {1: None}, 8) == "2 passes welford vector"
    assert plan.wide_form(2, False, {}, 0) == "3 passes"


@pytest.mark.parametrize("layout", ["contiguous", "column-major"])
@pytest.mark.parametrize("entry", [None, (2048, 2), (8192, 1, 3)], ids=["no entry", "tiles", "tiles and grid"])
def test_rows_wide_only_for_their_row_inputs_have_a_key_of_their_own(monkeypatch, entry, layout):
    """fp32 LayerNorm rows of 16384 (x and w: two row inputs, so wide though no longer than wide_min_cols) take the
    key "3 passes row inputs:4": its entry sets their tiles, no entry keeps wide_fp32_block_c x wide_unroll, and
    the entries of longer rows do not reach them."""
    monkeypatch.setitem(plan.TUNING, "wide_tiles", {"3 passes:4": (1024, 8)} if entry is None else
                        {"3 passes row inputs:4": entry, "3 passes:4": (1024, 8)})
    from sm90 import plans_of

    define, eager, _ = CASES["layernorm"]
    x = _rows(torch.float32, 16384, rows=13)  # (more rows than either grid: the grid's size shows)
    if layout == "column-major":
        x = x.t().contiguous().t()
    w = (torch.randn(16384, generator=torch.Generator().manual_seed(4)) + 1).to(DEVICE)
    with FusionDefinition() as fd:
        fd.add_output(define(fd, x, w))
    (out,) = fd.execute([x, w])
    ref = eager(x, w)
    (p,) = plans_of(fd)
    block_c, unroll = (plan.TUNING["wide_fp32_block_c"], plan.TUNING["wide_unroll"]) if entry is None else entry[:2]
    assert f"range(0, n_cols, {unroll} * BLOCK_C)" in p.source and p.block_c == block_c
    programs_per_sm = entry[2] if entry and len(entry) > 2 else plan.TUNING["wide_programs_per_sm"]
    assert p.grid[0] == min(x.shape[0], programs_per_sm * plan.sm_count())
    assert out.shape == ref.shape and out.stride() == ref.stride() and out.dtype == ref.dtype
    torch.testing.assert_close(out, ref, equal_nan=True, atol=1e-5, rtol=2e-6)


def test_per_form_settings_name_forms_or_all_of_them():
    assert plan._for_form(True, "3 passes:2") and plan._for_form(("3 passes:2",), "3 passes:2")
    assert not plan._for_form(("2 passes:2",), "3 passes:2") and not plan._for_form(False, "3 passes:2")
    assert not plan._for_form((), "3 passes:2") and not plan._for_form(True, None)  # None: not a wide kernel


@pytest.mark.parametrize("literal_cols", [False, True, None], ids=["n_cols an argument", "n_cols in the source",
                                                                 "per form (the default)"])
@pytest.mark.parametrize("cols", [32768, 40000], ids=["whole steps", "masked last step"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("io", [torch.bfloat16, torch.float32], ids=str)
def test_wide_rows_in_their_tiles_equal_eager(monkeypatch, case, io, cols, literal_cols):
    """With TUNING["wide_literal_cols"] (the row length a constant of the source) for every form, none, and the
    forms it names by default."""
    if literal_cols is not None:
        monkeypatch.setitem(plan.TUNING, "wide_literal_cols", literal_cols)
    itemsize = torch.tensor([], dtype=io).element_size()
    literal_cols = plan._for_form(plan.TUNING["wide_literal_cols"], f"{CASES[case][2][itemsize]}:{itemsize}")
    x = _rows(io, cols)
    if cols == 40000:  # a column-major input too
        x = x.t().contiguous().t()
    out, ref, src = _run(case, x)
    assert (f"n_cols = n_cols_q * {cols}" in src) == literal_cols
    assert out.shape == ref.shape and out.stride() == ref.stride() and out.dtype == ref.dtype
    assert torch.equal(out.isnan(), ref.isnan())
    # Reductions in another order than eager's (and Welford's lanes, the fast exp of a softmax's sum on the GPU):
    # a few fp32 ulps; bf16 outputs then round the same but near a rounding midpoint.
    tol = dict(atol=1e-5, rtol=2e-6) if io == torch.float32 else dict(atol=2 ** -14, rtol=2 ** -7)
    torch.testing.assert_close(out.float(), ref.float(), equal_nan=True, **tol)


@pytest.mark.parametrize("cvt", [True, (), None], ids=["every form", "none", "per form (the default)"])
@pytest.mark.parametrize("case", list(CASES))
def test_bf16_widenings_per_form_equal_eager(monkeypatch, case, cvt):
    """TUNING["wide_cvt_widenings"]: the forms it names widen bf16 with the conversion instruction, the others
    with integer shifts (_bf16_to_f32); the bits are the same either way."""
    if cvt is not None:
        monkeypatch.setitem(plan.TUNING, "wide_cvt_widenings", cvt)
    form = f"{CASES[case][2][2]}:2"
    x = _rows(torch.bfloat16, 32768)
    out, ref, src = _run(case, x)
    converted = plan._for_form(plan.TUNING["wide_cvt_widenings"], form)
    assert ("_bf16_to_f32(" in src) != converted
    assert out.shape == ref.shape and out.stride() == ref.stride() and out.dtype == ref.dtype
    torch.testing.assert_close(out.float(), ref.float(), equal_nan=True, atol=2 ** -14, rtol=2 ** -7)


def test_bf16_rmsnorm_widens_with_the_conversion_by_default():
    # (its 44 registers keep one 32-warp program per SM under a grid of 8 per SM; docs/codegen.md)
    assert plan._for_form(plan.TUNING["wide_cvt_widenings"], "2 passes:2")
    assert plan.TUNING["wide_tiles"]["2 passes:2"][2] > 1


# Programs of each tuned wide form that ran at once on an SM when its table entry was measured ([1024, 65536]):
# the fewer of the grid's programs per SM and what the kernel's sm_90 registers let fit. The registers decide as much
# as the grid: bf16 RMSNorm's entry was measured with one program resident (44 registers); when a codegen change
# took the kernel to 32, two ran at once and it lost 14% on an H100 (docs/codegen.md). Its entry now asks for 8
# programs per SM, and its widenings by the conversion instruction hold it at 44 registers, so one runs at a time
# and each takes about one row. A change that moves a
# form's residency must re-sweep its entry (benchmarks/sweep_tuning.py) and update this table.
MEASURED_RESIDENCY = {"2 passes:2": 1, "2 passes:4": 1, "2 passes welford vector:2": 1,
                      "2 passes welford column:4": 1, "2 passes online:4": 1, "3 passes:2": 2}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("io", [torch.bfloat16, torch.float32], ids=str)
def test_each_form_runs_as_many_programs_per_sm_as_its_entry_was_measured_with(monkeypatch, case, io):
    from sm90 import compile_cubin, gpu_plans, kernel_spec, programs_per_sm, resource_usage

    define, _, forms = CASES[case]
    x = _rows(io, 65536, rows=2)
    w = torch.ones(65536, dtype=io, device=DEVICE)
    with FusionDefinition() as fd:
        fd.add_output(define(fd, x, w))
    (p,) = gpu_plans(monkeypatch, fd, [x] if case == "softmax" else [x, w])
    itemsize = x.element_size()
    key = f"{forms[itemsize]}:{itemsize}"
    grid_per_sm = plan._wide_tiles_of_form(plan.wide_rows(65536, itemsize, 2), 65536, key)[3] // plan.sm_count()
    (cubin,) = compile_cubin([kernel_spec(p, specialized=True)])
    regs = resource_usage(cubin)["REG"]
    resident = min(grid_per_sm, programs_per_sm(regs, p.num_warps))
    assert resident == MEASURED_RESIDENCY[key], (key, grid_per_sm, regs, p.num_warps)
