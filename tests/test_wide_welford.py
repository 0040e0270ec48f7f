"""A variance over rows too long for registers (a wide looped kernel) whose tiles all lie inside the row, of 4-byte
elements (plan.TUNING["wide_welford_min_itemsize"]; the tests here lower it to 1 for bf16 rows), takes its
sum of squared deviations in the pass of its mean's sum, by Welford's update per lane and Chan's merge of the
lanes (``kernel_builder.welford_moments``, ``Emitter._welford_step``): a LayerNorm reads its row twice instead
of three times. Eager's CUDA var_mean and layer_norm compute their moments the same way; the mean is still the
row's sum over its count. The results are compared with eager's, special rows included; rows with a masked
last tile keep the two-pass moments.
"""

import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.codegen import plan
from harness import DEVICE

DEFAULT_TUNING = dict(plan.TUNING)  # (before any fixture's overrides)
COLS = 32768  # > plan.TUNING["wide_min_cols"], and a whole number of steps of 4 tiles of 8192


@pytest.fixture(autouse=True, params=[False, True], ids=["lanes of one column", "lanes of one vector"])
def welford_for_every_element_size(monkeypatch, request):
    """Every test in both forms of the lanes, for every element size
    (plan.TUNING["wide_welford_grouped_max_itemsize"]), the grouped one in tiles of 4096 (its wide_tiles entries)."""
    monkeypatch.setitem(plan.TUNING, "wide_welford_min_itemsize", 1)
    monkeypatch.setitem(plan.TUNING, "wide_welford_grouped_max_itemsize", 8 if request.param else 0)
    if request.param:
        grouped = {f"2 passes welford vector:{b}": (4096, 4) for b in (2, 4, 8)}
        monkeypatch.setitem(plan.TUNING, "wide_tiles", {**plan.TUNING["wide_tiles"], **grouped})


def _rows(dtype, cols=COLS):
    g = torch.Generator().manual_seed(11)
    x = torch.randn(10, cols, generator=g) * 3 + 1
    x[0, 7] = float("nan")
    x[1, cols // 3] = float("inf")
    x[2, 5], x[2, -5] = float("inf"), float("-inf")
    # A constant row: variance 0. (0.5, whose sums are exact in fp32: the mean of a constant like 0.7, a sum over
    # its count, may be an ulp off, which the rsqrt of eps = 1e-5 then turns into output errors near 1e-4 in
    # fp32, in the two-pass form as in this one; eager's Welford keeps a constant's mean exact.)
    x[3, :] = 0.5
    # A mean 60 times the spread: a sum of squares not centred on the mean loses 12 bits of its variance in
    # fp32 (a larger ratio: even the mean's rounding moves fp32 outputs beyond the tolerances below).
    x[4, :] = 30 + torch.randn(cols, generator=g) * 0.5
    x[5, :] = torch.linspace(-1e15, 1e15, cols)  # squares near 1e30
    x[6, :] = -0.0
    even = cols // 2 * 2
    x[7, :even:2] = -x[7, 1:even:2]  # pairs of opposite values
    x[8, : cols // 2] = 50.0  # the spread lies between the lanes' means, not within them
    x[8, cols // 2:] = -50.0
    return x.to(dtype).to(DEVICE)


def _source(fd) -> str:
    src = fd.last_execution()[0].kernel_source
    return src[src.index("\ndef pf_"):]


def _layernorm(fd, x, w, b, io):
    t = fd.ops.cast(fd.from_pytorch(x), DataType.Float)
    var, mean = fd.ops.var_mean(t, dims=[1], correction=0, keepdim=True)
    y = fd.ops.mul(fd.ops.sub(t, mean), fd.ops.rsqrt(fd.ops.add(var, 1e-5)))
    y = fd.ops.add(fd.ops.mul(y, fd.ops.cast(fd.from_pytorch(w), DataType.Float)),
                   fd.ops.cast(fd.from_pytorch(b), DataType.Float))
    fd.add_output(y if io == torch.float32 else fd.ops.cast(y, DataType.BFloat16))


def _eager_layernorm(x, w, b):
    t = x.float()
    var, mean = torch.var_mean(t, dim=1, correction=0, keepdim=True)
    return ((t - mean) * torch.rsqrt(var + 1e-5) * w.float() + b.float()).to(x.dtype)


def _tolerance(io):
    # The moments' rounding is a reduction's (its order differs from eager's), and the mean's error, relative to
    # the spread, reaches the outputs (the row of mean 30 and spread 0.5: 1.6e-5 on the H100, both forms); bf16
    # outputs then round the same but near a rounding midpoint.
    return dict(atol=5e-5, rtol=2e-5) if io == torch.float32 else dict(atol=2 ** -14, rtol=2 ** -7)


def _layernorm_source(x) -> str:
    """A LayerNorm of ``x`` (random weight and bias of its dtype) run and compared with eager op by op (values,
    NaN positions, shape, strides, dtype); returns its kernel's source."""
    io, cols = x.dtype, x.shape[1]
    w, b = torch.randn(cols, dtype=io, device=DEVICE), torch.randn(cols, dtype=io, device=DEVICE)
    with FusionDefinition() as fd:
        _layernorm(fd, x, w, b, io)
    (out,) = fd.execute([x, w, b])
    ref = _eager_layernorm(x, w, b)
    assert out.shape == ref.shape and out.stride() == ref.stride() and out.dtype == ref.dtype
    assert torch.equal(out.isnan(), ref.isnan())
    torch.testing.assert_close(out.float(), ref.float(), equal_nan=True, **_tolerance(io))
    return _source(fd)


@pytest.mark.parametrize("io", [torch.float32, torch.bfloat16], ids=str)
def test_wide_layernorm_takes_two_passes_and_equals_eager(io):
    src = _layernorm_source(_rows(io))
    assert "pf_looped" in src and "wf_m" in src
    assert src.count("for c00 in range(") == 2  # the moments' pass, the output pass
    grouped = plan.TUNING["wide_welford_grouped_max_itemsize"] > 0
    assert ("tl.reshape(" in src) == grouped  # lanes of one vector: in-thread sums


def test_rows_wide_only_for_their_row_inputs_keep_the_two_pass_moments():
    """fp32 LayerNorm rows of 16384 columns run wide (plan.wide_rows: x, w and b would spill in registers), but
    not longer than wide_min_cols: the lanes would cost them their second program per SM."""
    assert "wf_m" not in _layernorm_source(_rows(torch.float32, 16384))


@pytest.mark.parametrize("correction", [0, 1])
def test_stored_var_and_mean_of_wide_rows_equal_eager(correction):
    x = _rows(torch.float32)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        var, mean = fd.ops.var_mean(t, dims=[1], correction=correction)
        fd.add_output(var)
        fd.add_output(mean)
        fd.add_output(fd.ops.var(t, dims=[1], correction=correction, keepdim=True))
    outs = fd.execute([x])
    assert "wf_m" in _source(fd)
    var_ref, mean_ref = torch.var_mean(x, dim=1, correction=correction)
    # Rows holding inf: eager's Welford and the two-pass form both give a NaN variance; their means may differ
    # (inf from the sum, NaN from Welford's running mean, in eager's order-dependent way): the mean here is
    # the sum's, as before this form.
    finite = torch.isfinite(x).all(1)
    for o, r in [(outs[0], var_ref), (outs[2], var_ref[:, None])]:
        assert o.shape == r.shape and o.stride() == r.stride() and o.dtype == r.dtype
        assert torch.equal(o.isnan(), r.isnan())
        torch.testing.assert_close(o[finite], r[finite], rtol=1e-5, atol=1e-6)
    # A mean's error is relative to the row's magnitude (the ±1e15 row sums to 0 exactly, eager's Welford to
    # 0.23 × its count).
    mean, scale = outs[1][finite], x[finite].abs().amax(1)
    assert mean.shape == (int(finite.sum()),) and mean.dtype == mean_ref.dtype
    assert ((mean - mean_ref[finite]).abs() <= 1e-6 * scale).all()


def test_a_masked_last_tile_keeps_the_two_pass_moments():
    src = _layernorm_source(_rows(torch.float32, 20000))
    assert "wf_m" not in src and src.count("for c00 in range(") == 3


@pytest.mark.parametrize("io", [torch.float32, torch.bfloat16], ids=str)
def test_by_default_bf16_rows_take_lanes_of_one_vector_and_fp32_rows_lanes_of_one_column(monkeypatch, io):
    for knob in ("wide_welford_min_itemsize", "wide_welford_grouped_max_itemsize", "wide_tiles"):
        monkeypatch.setitem(plan.TUNING, knob, DEFAULT_TUNING[knob])
    src = _layernorm_source(_rows(io))
    assert "wf_m" in src and src.count("for c00 in range(") == 2
    assert ("tl.reshape(" in src) == (io == torch.bfloat16)


@pytest.mark.parametrize("layout", ["sliced", "transposed"])
def test_wide_layernorm_of_a_non_contiguous_input(layout):
    if layout == "sliced":
        x = _rows(torch.float32, COLS + 3)[:, 2:COLS + 2]
    else:
        x = _rows(torch.float32).t().contiguous().t()
    assert "wf_m" in _layernorm_source(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_the_gpu_form_compiles_for_sm90(monkeypatch, dtype):
    """As the GPU plans it (moments in the input's own dtype, not the interpreter's Double), for fp32 and fp64
    rows: the Welford lanes and the per-tile reciprocal (tl.fdiv) compile for sm_90."""
    from sm90 import compile_ptx, gpu_plans, kernel_spec

    x = torch.randn(4, COLS, dtype=dtype, device=DEVICE)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        var, mean = fd.ops.var_mean(t, dims=[1], correction=0, keepdim=True)
        fd.add_output(fd.ops.mul(fd.ops.sub(t, mean), fd.ops.rsqrt(fd.ops.add(var, 1e-5))))
    (p,) = gpu_plans(monkeypatch, fd, [x])
    assert "wf_m" in p.source
    (ptx,) = compile_ptx([kernel_spec(p, specialized=True)])
    assert ptx
