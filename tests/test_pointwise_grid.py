"""Pointwise kernels on a (column blocks, row blocks) grid (plan.TUNING["pointwise_grid_2d"], Emitter.grid_2d).

Each program then reads its tile's coordinates from the two program ids instead of dividing a one-dimensional id by
the column blocks, a count known only at run time. By default only kernels whose registers the plan caps (the bf16
tanh-GELU tail's, bound by instruction issue on the H200) take it; the tests here turn it on for every pointwise
kernel, so that the interpreter runs the form against eager: tiles of several column blocks, ragged rows and
columns, a sliced (unaligned) input, a transposed one, special values, a per-row output written by the first column
block, and the fall-back to one dimension where the row blocks pass CUDA's limit for the grid's y dimension.
"""

import pytest
import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.codegen import plan
from harness import check_fusion, make, transposed
from sm90 import compile_cubin, cuobjdump, gpu_plans, kernel_spec, opcodes, plans_of

triton = pytest.importorskip("triton")


@pytest.fixture
def grid_2d(monkeypatch):
    monkeypatch.setitem(plan.TUNING, "pointwise_grid_2d", True)


def _bias_gelu(fd, x, w, b):
    """gelu_tanh(x * w + b) in fp32, stored as x's dtype: the bench's GELU case, w and b broadcast along rows."""
    dt = DataType.BFloat16 if x.dtype == torch.bfloat16 else DataType.Float
    tx, tw, tb = (fd.ops.cast(fd.from_pytorch(t), DataType.Float) for t in (x, w, b))
    y = fd.ops.add(fd.ops.mul(tx, fd.ops.broadcast_in_dim(tw, x.shape, [1])), fd.ops.broadcast_in_dim(tb, x.shape, [1]))
    inner = fd.ops.mul(fd.ops.add(y, fd.ops.mul(fd.ops.mul(fd.ops.mul(y, y), y), 0.044715)), 0.7978845608028654)
    fd.add_output(fd.ops.cast(fd.ops.mul(fd.ops.mul(y, 0.5), fd.ops.add(fd.ops.tanh(inner), 1.0)), dt))


def _bias_gelu_eager(x, w, b):
    y = x.float() * w.float() + b.float()
    return ((y * 0.5) * (torch.tanh((y + y * y * y * 0.044715) * 0.7978845608028654) + 1.0)).to(x.dtype)


def _grids(fd) -> list:
    return [p.grid for p in plans_of(fd) if p.mode == "pointwise"]


def _only_plan(fn, inputs):
    """The plan of the one generated kernel ``fn``'s fusion runs on ``inputs``: a pointwise kernel on a 2-D grid."""
    with FusionDefinition() as fd:
        fn(fd)
    fd.execute(inputs)
    (p,) = plans_of(fd)
    assert p.mode == "pointwise" and len(p.grid) == 2, (p.mode, p.grid)
    return p


def _run(x, w, b):
    with FusionDefinition() as fd:
        _bias_gelu(fd, x, w, b)
    (out,) = fd.execute([x, w, b])
    return fd, out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(37, 5000), (3, 4096), (130, 24)])
def test_bias_gelu_on_a_2d_grid_has_the_one_dimensional_grids_bits(monkeypatch, dtype, shape):
    x, w, b = make(shape, dtype), make(shape[1:], dtype), make(shape[1:], dtype)
    x[0, :5] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0])
    monkeypatch.setitem(plan.TUNING, "pointwise_grid_2d", False)
    fd1, out1 = _run(x, w, b)
    monkeypatch.setitem(plan.TUNING, "pointwise_grid_2d", True)
    fd2, out2 = _run(x, w, b)
    ((n,),), ((n_c, n_r),) = _grids(fd1), _grids(fd2)
    (p,) = plans_of(fd2)
    assert n_c == -(-shape[1] // p.block_c) and n_r == -(-shape[0] // p.block_r) and n == n_c * n_r
    assert "tl.program_id(1)" in p.source and "pid // nb_c" not in p.source
    bits = torch.int16 if dtype == torch.bfloat16 else torch.int32
    assert out2.stride() == out1.stride() and torch.equal(out2.view(bits), out1.view(bits))
    ref = _bias_gelu_eager(x, w, b)
    assert out2.shape == ref.shape and out2.dtype == ref.dtype and out2.stride() == ref.stride()
    if x.is_cuda:
        assert torch.equal(out2.view(bits), ref.view(bits))
    else:  # the interpreter's tanh and eager's CPU tanh differ at times by an ulp of the result
        torch.testing.assert_close(out2.float(), ref.float(), atol=2 ** -20, rtol=2 ** -7, equal_nan=True)


@pytest.mark.parametrize("layout", ["sliced", "transposed"])
def test_unaligned_and_transposed_inputs_on_a_2d_grid(grid_2d, layout):
    # sliced: rows of 3001 columns starting 3 elements into rows of 3004: no 16-byte vector is aligned, so the kernel
    # splits its tiles into the row's interior and a narrow last tile (Emitter.split_interior), both reading pid_c.
    # transposed: [5000, 64] with dim 0 contiguous, so the kernel's columns are the 5000 (several column blocks).
    if layout == "sliced":
        x = make((50, 3004), torch.bfloat16)[:, 3:]
    else:
        x = transposed((5000, 64), torch.bfloat16)
    y = make(tuple(x.shape), torch.bfloat16)

    def fn(fd):
        tx, ty = fd.from_pytorch(x), fd.from_pytorch(y)
        s = fd.ops.add(fd.ops.cast(tx, DataType.Float), fd.ops.cast(ty, DataType.Float))
        fd.add_output(fd.ops.cast(fd.ops.mul(s, 0.5), DataType.BFloat16))

    check_fusion(fn, [x, y], lambda x, y: ((x.float() + y.float()) * 0.5).bfloat16(), atol=0, rtol=0)
    p = _only_plan(fn, [x, y])
    n_c = p.grid[0]
    assert n_c > 1 and "tl.program_id(1)" in p.source
    assert ("if pid_c * BLOCK_C + BLOCK_C <= n_cols:" in p.source) == (layout == "sliced")  # the split interior


def test_a_per_row_output_is_written_once_on_a_2d_grid(grid_2d):
    # v * 2 has no column dims: in a pointwise kernel of several column blocks only the first writes it.
    x, v = make((20, 5000)), make((20,))

    def fn(fd):
        tx, tv = fd.from_pytorch(x), fd.from_pytorch(v)
        t = fd.ops.mul(tv, 2.0)
        fd.add_output(fd.ops.add(tx, fd.ops.broadcast_in_dim(t, [20, 5000], [0])))
        fd.add_output(t)

    check_fusion(fn, [x, v], lambda x, v: [x + (v * 2.0)[:, None], v * 2.0], atol=0, rtol=0)
    p = _only_plan(fn, [x, v])
    n_c = p.grid[0]
    assert n_c > 1 and "(pid_c == 0)" in p.source


def test_row_blocks_past_the_y_limit_keep_one_dimension(grid_2d, monkeypatch):
    x, w, b = make((9, 300)), make((300,)), make((300,))
    _fd, out2 = _run(x, w, b)
    monkeypatch.setattr(plan, "GRID_Y_MAX", 1)
    fd, out1 = _run(x, w, b)
    ((n,),) = _grids(fd)
    (p,) = plans_of(fd)
    assert n == -(-9 // p.block_r) * -(-300 // p.block_c) and "pid // nb_c" in p.source
    assert torch.equal(out1.view(torch.int32), out2.view(torch.int32))


@pytest.mark.parametrize("choice, capped, expected", [
    ("capped", 40, True), ("capped", None, False), (True, None, True), (False, 40, False)])
def test_the_tuning_choice(monkeypatch, choice, capped, expected):
    monkeypatch.setitem(plan.TUNING, "pointwise_grid_2d", choice)
    assert plan._pointwise_grid_2d(capped) is expected


def _sass_count(p) -> int:
    (cubin,) = compile_cubin([kernel_spec(p, specialized=True)])
    return len(opcodes(cuobjdump(cubin, "-sass")))


def test_by_default_the_capped_gelu_kernel_takes_it_and_drops_the_division(monkeypatch):
    # As the GPU plans it: the bf16 GELU tail, capped registers, so a 2-D grid; without the choice, one dimension
    # and the division back (I2F / MUFU.RCP / F2I of the signed division in the sm_90 SASS).
    x, w, b = make((64, 4096), torch.bfloat16), make((4096,), torch.bfloat16), make((4096,), torch.bfloat16)
    with FusionDefinition() as fd:
        _bias_gelu(fd, x, w, b)
    (p2,) = gpu_plans(monkeypatch, fd, [x, w, b])
    assert p2.max_registers is not None and len(p2.grid) == 2 and "tl.program_id(1)" in p2.source
    monkeypatch.setitem(plan.TUNING, "pointwise_grid_2d", False)
    with FusionDefinition() as fd:
        _bias_gelu(fd, x, w, b)
    (p1,) = gpu_plans(monkeypatch, fd, [x, w, b])
    assert len(p1.grid) == 1 and p1.grid[0] == p2.grid[0] * p2.grid[1]
    assert _sass_count(p2) <= _sass_count(p1) - 16


def test_by_default_an_uncapped_pointwise_kernel_keeps_one_dimension(monkeypatch):
    x, y = make((64, 4096), torch.bfloat16), make((64, 4096), torch.bfloat16)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.add(fd.from_pytorch(x), fd.from_pytorch(y)))
    (p,) = gpu_plans(monkeypatch, fd, [x, y])
    assert p.max_registers is None and len(p.grid) == 1
