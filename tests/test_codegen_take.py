"""gather and take_along_axis in generated kernels (codegen/gather_lowerings.py): an indexed load whose index
varies per element, fused with its neighbours. Values bit for bit, shapes, dtypes and strides against eager on
special-valued, non-contiguous and offset inputs and indices; out-of-range indices (negative ones included: ATen
raises for both) set the call's error flags and the fusion raises (on CPU at once, on CUDA at its next call)."""

import pytest
import torch

from harness import DEVICE, define, make, transposed
from pyfuser.errors import FusionExecutionError

from test_codegen_gather import _source
from test_codegen_views import bits_equal, specials




def _index(shape, n, dtype, layout, seed=0):
    """Indices in [0, n) of ``shape``: contiguous, transposed (a permuted view) or expanded along dim 0."""
    g = torch.Generator().manual_seed(seed)
    if layout == "transposed":
        idx = torch.randint(0, n, shape[::-1], generator=g, dtype=dtype).t()
    elif layout == "expanded":
        idx = torch.randint(0, n, (1, *shape[1:]), generator=g, dtype=dtype).expand(shape)
    else:
        idx = torch.randint(0, n, shape, generator=g, dtype=dtype)
    return idx.to(DEVICE)


def gather_bits(aten, x, dim, idx):
    """ATen's gather (or take_along_dim) of ``x``'s bits: the kernel copies elements, NaN payloads included.
    ATen's own CPU gather of BFloat16 returns every NaN as 0xFFFF (torch 2.13, verified; Float and Half keep
    their bits), so values are compared with ATen's result and bits with the gather of the bit pattern."""
    ref = aten(x, dim, idx.long())
    if not x.dtype.is_floating_point:
        return ref
    iview = {2: torch.int16, 4: torch.int32}[x.element_size()]
    exact = aten(x.view(iview), dim, idx.long()).view(x.dtype)
    bits_equal(exact, ref, nan_bits=False)
    return exact


def take(x, dim, idx):
    return torch.take_along_dim(x, idx, dim)


def _kinds(fd):
    return [s.kind.value for s in fd.segments()]


def _ran_kernel(fd):
    assert all("triton kernel" in str(r) for r in fd.last_execution()), fd.last_execution()


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "offset"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32])
@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("index_layout", ["contiguous", "transposed", "expanded"])
def test_gather_fused_bitwise(layout, dtype, dim, index_layout):
    x = _source(layout, (9, 7), dtype)
    # The index is smaller than x along the other dim (gather reads the first elements) and longer along dim.
    shape = (12, 5) if dim == 0 else (6, 11)
    idx = _index(shape, x.shape[dim], torch.int32 if index_layout == "transposed" else torch.int64, index_layout)

    def fn(fd):
        t, i = fd.from_pytorch(x), fd.from_pytorch(idx)
        g = fd.ops.gather(t, i, dim)
        fd.add_output(g)
        fd.add_output(fd.ops.abs(g))

    fd = define(fn)
    out, absolute = fd.execute([x, idx])
    ref = gather_bits(torch.gather, x, dim, idx)
    bits_equal(out, ref)
    bits_equal(absolute, torch.abs(ref), nan_bits=False)
    assert _kinds(fd) == ["PointWise"]
    _ran_kernel(fd)


@pytest.mark.parametrize("case", ["index broadcast", "arg broadcast", "same shape", "3d middle dim"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_take_along_axis_broadcasts(case, dtype):
    if case == "index broadcast":  # one index per row, taken along the columns of every row
        x, idx, dim = specials((6, 8), dtype).to(DEVICE), _index((6, 1), 8, torch.int64, "contiguous"), 1
    elif case == "arg broadcast":  # one row of x, each output row gathering it differently
        x, idx, dim = make((1, 8), dtype), _index((5, 4), 8, torch.int64, "contiguous"), 1
    elif case == "same shape":
        x, idx, dim = transposed((7, 5), dtype), _index((7, 5), 7, torch.int64, "transposed"), 0
    else:
        x, idx, dim = make((3, 6, 4), dtype), _index((3, 2, 1), 6, torch.int64, "contiguous"), 1

    def fn(fd):
        t, i = fd.from_pytorch(x), fd.from_pytorch(idx)
        fd.add_output(fd.ops.take_along_axis(t, i, dim))

    fd = define(fn)
    (out,) = fd.execute([x, idx])
    bits_equal(out, gather_bits(take, x, dim, idx))
    assert _kinds(fd) == ["PointWise"]
    _ran_kernel(fd)


def test_take_along_axis_int32_index_and_reduction():
    # torch.take_along_dim only takes Long indices (gather takes Int too, torch 2.13); the fusion takes Int32.
    x, idx = make((5, 9)), _index((5, 3), 9, torch.int32, "contiguous")
    with pytest.raises(RuntimeError, match="Long"):
        torch.take_along_dim(x.cpu(), idx.cpu(), 1)

    def fn(fd):
        g = fd.ops.take_along_axis(fd.from_pytorch(x), fd.from_pytorch(idx), 1)
        fd.add_output(fd.ops.sum(fd.ops.mul(g, g), dims=[1]))

    fd = define(fn)
    (out,) = fd.execute([x, idx])
    g = torch.take_along_dim(x, idx.long(), 1)
    bits_equal(out, (g * g).sum(1))  # three columns: ATen's and the kernel's order agree
    _ran_kernel(fd)


def test_index_computed_in_the_kernel():
    # The index is (k - 1 - i): computed in the kernel; the output leaves it, so its extents are known.
    x = specials((4, 6), torch.float32).to(DEVICE)
    idx = _index((4, 6), 6, torch.int64, "contiguous")

    def fn(fd):
        t, i = fd.from_pytorch(x), fd.from_pytorch(idx)
        fd.add_output(fd.ops.gather(t, fd.ops.sub(5, i), 1))

    fd = define(fn)
    (out,) = fd.execute([x, idx])
    bits_equal(out, torch.gather(x, 1, 5 - idx))
    assert _kinds(fd) == ["PointWise"]
    _ran_kernel(fd)


def test_extents_from_what_the_index_is_computed_from():
    # Index made in the kernel and gathered values only summed: the gathered extents are the index's, which are
    # those of the input it is computed from (elementwise ops broadcast extents; argsort keeps its input's).
    x, idx = make((4, 6)), _index((4, 3), 6, torch.int64, "contiguous")

    def fn(fd):
        t, i = fd.from_pytorch(x), fd.from_pytorch(idx)
        fd.add_output(fd.ops.sum(fd.ops.gather(t, fd.ops.sub(5, i), 1), dims=[1]))
        fd.add_output(fd.ops.sum(fd.ops.take_along_axis(t, fd.ops.argsort(t, 1, stable=True), 1), dims=[1]))

    fd = define(fn)
    out, total = fd.execute([x, idx])
    bits_equal(out, torch.gather(x, 1, 5 - idx).sum(1))
    torch.testing.assert_close(total, torch.sort(x, dim=1, stable=True)[0].sum(1))  # (summation orders differ)
    assert all(r.runs_as == "triton" for r in fd.last_execution()), fd.last_execution()


@pytest.mark.parametrize("op", ["gather", "take_along_axis"])
@pytest.mark.parametrize("bad", [6, 100, -1, -6])
def test_out_of_range_index_raises(op, bad):
    x = make((3, 6))
    good = torch.tensor([[0, 5], [3, 3], [1, 2]], device=DEVICE)
    wrong = good.clone()
    wrong[1, 1] = bad
    aten = {"gather": torch.gather, "take_along_axis": lambda a, d, i: torch.take_along_dim(a, i, d)}[op]
    if op == "gather":
        with pytest.raises(RuntimeError, match="out of bounds"):
            aten(x.cpu(), 1, wrong.cpu())  # what eager does with it
    else:
        # torch 2.13's take_along_dim wraps every index modulo the extent (no error; verified here); nvFuser leaves
        # out-of-range indices undefined. The kernel treats them as errors, as gather and index_select do.
        wrapped = aten(x.cpu(), 1, wrong.cpu().remainder(6))
        try:
            assert torch.equal(aten(x.cpu(), 1, wrong.cpu()), wrapped)
        except RuntimeError:
            pass  # (a torch that raises for them instead)

    def fn(fd):
        fd.add_output(fd.ops.neg(getattr(fd.ops, op)(fd.from_pytorch(x), fd.from_pytorch(good), 1)))

    fd = define(fn)
    (out,) = fd.execute([x, good])
    bits_equal(out, -aten(x, 1, good))
    message = rf"fd.ops.{op}: index T1 holds a value outside \[0, 6\), the extent of dim 1 of T0"
    if DEVICE.type == "cuda":
        fd.execute([x, wrong])
        torch.cuda.synchronize()
        with pytest.raises(FusionExecutionError, match=message + r".*found on the device by an earlier call"):
            fd.execute([x, good])
    else:
        with pytest.raises(FusionExecutionError, match=message):
            fd.execute([x, wrong])
    (out,) = fd.execute([x, good])
    bits_equal(out, -aten(x, 1, good))


def test_shapes_aten_refuses_raise_aten_errors():
    # gather with an index larger than arg along another dim, take_along_axis with extents that do not
    # broadcast: both only known at run time here; the kernel is not used and ATen raises its own error.
    x = make((3, 4))
    big = torch.zeros((4, 2), dtype=torch.int64, device=DEVICE)

    for op in ("gather", "take_along_axis"):
        def fn(fd, op=op):
            fd.add_output(getattr(fd.ops, op)(fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1], dtype=_int()), 1))

        fd = define(fn)
        with pytest.raises(Exception, match="size|Size"):
            fd.execute([x, big])


def _int():
    from pyfuser import DataType
    return DataType.Int
