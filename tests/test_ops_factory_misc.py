"""Factory ops (full, iota, uniform, normal) and misc ops (triu, topk, argsort).

Parity tests compare with eager torch (values, shapes, dtypes, strides). Random factories without a seed are
checked for shape, dtype, strides and value range, and for drawing from torch's default generator exactly as
eager does; with rng_seed/rng_offset they must repeat across runs.
"""

from __future__ import annotations

import pytest
import torch

from harness import kernel_kind, DEVICE, check_fusion, define, expanded, make, sliced, transposed
from pyfuser import DataType, FusionDefinitionError, FusionDtypeError
from pyfuser.ir.dtypes import from_torch_dtype
from pyfuser.runtime.evaluator import bind_inputs

STRIDE_ORDER_3D = [0, 2, 1]


def with_stride_order(shape, stride_order, dtype=torch.float32):
    """A dense tensor of ``shape`` allocated in nvFuser's ``stride_order`` (entry = rank of the dim's stride)."""
    rank = len(shape)
    alloc = sorted(range(rank), key=lambda d: -stride_order[d])
    base = make([shape[d] for d in alloc], dtype)
    return base.permute([alloc.index(d) for d in range(rank)])


def distinct(shape, dtype=torch.float32, layout="contiguous"):
    """Values without ties (so sort orders are unique) in the given layout; expanded copies dim 0."""
    if layout == "expanded":
        return distinct((1, *shape[1:]), dtype).expand(*shape)
    n = 1
    for s in shape:
        n *= s
    values = (torch.randperm(n, device=DEVICE) - n // 2).to(dtype)
    if layout == "transposed":
        return values.reshape(*shape[:-2], shape[-1], shape[-2]).transpose(-1, -2)
    if layout == "sliced":
        wide = (torch.randperm(n + n // shape[-1] * 3, device=DEVICE)).to(dtype)
        return wide.reshape(*shape[:-1], shape[-1] + 3)[..., : shape[-1]]
    if layout == "stride_order":
        alloc = sorted(range(3), key=lambda d: -STRIDE_ORDER_3D[d])
        return values.reshape([shape[d] for d in alloc]).permute([alloc.index(d) for d in range(3)])
    return values.reshape(shape)


def make_arg(layout, shape, dtype=torch.float32):
    return {
        "contiguous": lambda: make(shape, dtype),
        "transposed": lambda: transposed(shape, dtype),
        "sliced": lambda: sliced(shape, dtype),
        "expanded": lambda: expanded(shape, 0, dtype),
        "stride_order": lambda: with_stride_order(shape, STRIDE_ORDER_3D, dtype),
    }[layout]()


def define_input(fd, t, layout=None):
    if layout == "stride_order":
        return fd.define_tensor(
            shape=[-1] * t.dim(), contiguity=[True] * t.dim(), dtype=from_torch_dtype(t.dtype), stride_order=STRIDE_ORDER_3D
        )
    return fd.from_pytorch(t)


LAYOUTS = ["contiguous", "transposed", "sliced", "expanded", "stride_order"]


def shape_for(layout):
    return (3, 4, 5) if layout == "stride_order" else (4, 5)


# ==============================================================================================================
# full


@pytest.mark.parametrize(
    "dtype,value",
    [
        (DataType.Float, 1.5),
        (DataType.Double, -2.25),
        (DataType.Half, 3.0),
        (DataType.BFloat16, 0.5),
        (DataType.Int, 7),
        (DataType.Int32, -3),
        (DataType.Bool, True),
        (DataType.ComplexFloat, 1 + 2j),
        (DataType.Float, 2),  # an int fill converted to the float dtype
    ],
)
def test_full_dtypes(dtype, value):
    def fn(fd):
        fd.add_output(fd.ops.full([2, 3], value, dtype))

    tdt = {DataType.Float: torch.float32, DataType.Double: torch.float64, DataType.Half: torch.float16,
           DataType.BFloat16: torch.bfloat16, DataType.Int: torch.int64, DataType.Int32: torch.int32,
           DataType.Bool: torch.bool, DataType.ComplexFloat: torch.complex64}[dtype]
    outs = check_fusion(fn, [], lambda: torch.full((2, 3), value, dtype=tdt, device=DEVICE), expected_segments=[
        "ExprEval" if dtype is DataType.ComplexFloat else kernel_kind("full")])  # no complex Triton values
    assert outs[0].device.type == DEVICE.type


def test_full_symbolic_shape_and_fill():
    def fn(fd):
        n, m = fd.define_scalar(None, dtype=DataType.Int), fd.define_scalar(None, dtype=DataType.Int)
        v = fd.define_scalar(None, dtype=DataType.Double)
        fd.add_output(fd.ops.full([n, 4, m], v, DataType.Float))

    check_fusion(fn, [3, 2, 0.75], lambda n, m, v: torch.full((n, 4, m), v, device=DEVICE))


def test_full_vector_shape():
    def fn(fd):
        fd.add_output(fd.ops.full(fd.define_vector(2), 4, DataType.Int))

    check_fusion(fn, [[3, 5]], lambda shape: torch.full(tuple(shape), 4, dtype=torch.int64, device=DEVICE))


def test_full_zero_sized_and_0d():
    def fn(fd):
        fd.add_output(fd.ops.full([0, 3], 1.0, DataType.Float))
        fd.add_output(fd.ops.full([], 2.0, DataType.Float))

    check_fusion(fn, [], lambda: [torch.full((0, 3), 1.0, device=DEVICE), torch.full((), 2.0, device=DEVICE)])


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "expanded"])
def test_full_broadcasts_like_a_size_1_dim_and_follows_the_input_device(layout):
    # A constant extent of 1 is a broadcast, so full([1, 5]) + x[4, 5] broadcasts as in torch; the factory
    # allocates on the device of the fusion's tensor input.
    x = make_arg(layout, (4, 5))

    def fn(fd):
        t0 = fd.from_pytorch(x)
        fd.add_output(fd.ops.add(t0, fd.ops.full([1, 5], 2.0, DataType.Float)))

    check_fusion(fn, [x], lambda x: x + torch.full((1, 5), 2.0, device=x.device))


def test_full_errors():
    with pytest.raises(FusionDtypeError, match=r"fd.ops.full: argument 'dtype' must be a DataType other than Null"):
        define(lambda fd: fd.ops.full([2], 1.0, DataType.Null))
    with pytest.raises(FusionDtypeError, match=r"full: argument 'dtype'=DataType.Float4_e2m1fn is not supported"):
        define(lambda fd: fd.ops.full([2], 1.0, DataType.Float4_e2m1fn))
    with pytest.raises(FusionDefinitionError, match=r"full: argument 'shape'\[1\]=-2 is negative"):
        define(lambda fd: fd.ops.full([2, -2], 1.0, DataType.Float))
    with pytest.raises(FusionDtypeError, match=r"full: argument 'shape' must contain ints or Int scalars, got 2.0"):
        define(lambda fd: fd.ops.full([2.0], 1.0, DataType.Float))
    with pytest.raises(FusionDtypeError, match=r"full: argument 'shape' has a non-integer scalar"):
        define(lambda fd: fd.ops.full([fd.define_scalar(None, dtype=DataType.Double)], 1.0, DataType.Float))
    with pytest.raises(FusionDtypeError, match=r"full: argument 'fill_value' must be real"):
        define(lambda fd: fd.ops.full([2], 1j, DataType.Float))
    with pytest.raises(FusionDtypeError, match=r"full: argument 'fill_value' must be a number or a scalar, got TensorView"):
        define(lambda fd: fd.ops.full([2], fd.define_tensor([-1]), DataType.Float))


# ==============================================================================================================
# iota


@pytest.mark.parametrize(
    "dtype,start,step",
    [
        (DataType.Int, None, None),
        (DataType.Int, 3, -2),
        (DataType.Int32, 5, 3),
        (DataType.Float, None, None),
        (DataType.Float, 0.5, 0.25),
        (DataType.Double, -1.0, 0.1),
        (DataType.BFloat16, 1.0, 2.0),
        (DataType.Half, 2.0, -0.5),
    ],
)
def test_iota(dtype, start, step):
    tdt = {DataType.Int: torch.int64, DataType.Int32: torch.int32, DataType.Float: torch.float32,
           DataType.Double: torch.float64, DataType.BFloat16: torch.bfloat16, DataType.Half: torch.float16}[dtype]

    def fn(fd):
        fd.add_output(fd.ops.iota(6, start, step, dtype))

    def ref():
        s = 0 if start is None else start
        d = 1 if step is None else step
        # Eager: the values start + i*step in the dtype's compute precision.
        compute = torch.float32 if tdt in (torch.bfloat16, torch.float16) else tdt
        return torch.tensor([s + i * d for i in range(6)], dtype=torch.float64, device=DEVICE).to(compute).to(tdt)

    check_fusion(fn, [], ref, expected_segments=[kernel_kind("iota")])


def test_iota_symbolic_length_start_step():
    def fn(fd):
        n = fd.define_scalar(None, dtype=DataType.Int)
        a, b = fd.define_scalar(None, dtype=DataType.Int), fd.define_scalar(None, dtype=DataType.Int)
        fd.add_output(fd.ops.iota(n, a, b, DataType.Int))

    check_fusion(fn, [5, 10, 3], lambda n, a, b: torch.arange(a, a + n * b, b, device=DEVICE))


def test_iota_compared_with_a_tensor():
    # A typical use: positions compared against a tensor (masks and the like), on the tensor's device.
    x = make((6,), torch.int64, low=0, high=6)

    def fn(fd):
        fd.add_output(fd.ops.lt(fd.ops.iota(6), fd.from_pytorch(x)))

    check_fusion(fn, [x], lambda x: torch.arange(6, device=x.device) < x)


def test_iota_errors():
    with pytest.raises(FusionDtypeError, match=r"fd.ops.iota: argument 'length' must be an int or an Int scalar, got 2.0"):
        define(lambda fd: fd.ops.iota(2.0))
    with pytest.raises(FusionDefinitionError, match=r"iota: argument 'length'=-1 is negative"):
        define(lambda fd: fd.ops.iota(-1))
    with pytest.raises(FusionDtypeError, match=r"iota: argument 'start' must match dtype DataType.Int \(integer vs floating\), got DataType.Double"):
        define(lambda fd: fd.ops.iota(4, 1.0, 1, DataType.Int))
    with pytest.raises(FusionDtypeError, match=r"iota: argument 'step' must match dtype DataType.Float"):
        define(lambda fd: fd.ops.iota(4, 0.0, 1, DataType.Float))
    with pytest.raises(FusionDtypeError, match=r"iota: argument 'start' must match dtype"):
        define(lambda fd: fd.ops.iota(4, True, None, DataType.Int))
    with pytest.raises(FusionDefinitionError, match=r"iota: argument 'step' must not be zero"):
        define(lambda fd: fd.ops.iota(4, 0, 0))
    with pytest.raises(FusionDefinitionError, match=r"iota: argument 'start' must be finite"):
        define(lambda fd: fd.ops.iota(4, float("inf"), 1.0, DataType.Float))
    with pytest.raises(FusionDtypeError, match=r"iota: argument 'dtype' must be one of"):
        define(lambda fd: fd.ops.iota(4, dtype=DataType.Bool))


# ==============================================================================================================
# uniform, normal

RANDOM_DTYPES = [(DataType.Float, torch.float32), (DataType.Double, torch.float64),
                 (DataType.BFloat16, torch.bfloat16), (DataType.Half, torch.float16)]


@pytest.mark.parametrize("dtype,tdt", RANDOM_DTYPES)
def test_uniform_shape_dtype_range(dtype, tdt):
    def fn(fd):
        fd.add_output(fd.ops.uniform(-2.0, 3.0, [16, 8], dtype=dtype))

    (out,) = check_fusion(fn, [])
    assert out.dtype == tdt and out.shape == (16, 8) and out.stride() == (8, 1)
    assert out.device.type == DEVICE.type
    assert out.min() >= -2.0 and out.max() < 3.0  # [min, max), in every dtype
    assert out.float().std() > 0.5  # not constant


@pytest.mark.parametrize("dtype,tdt", RANDOM_DTYPES)
def test_normal_shape_dtype_moments(dtype, tdt):
    def fn(fd):
        fd.add_output(fd.ops.normal(1.0, 0.5, [64, 64], dtype=dtype))

    (out,) = check_fusion(fn, [])
    assert out.dtype == tdt and out.shape == (64, 64) and out.stride() == (64, 1)
    assert abs(out.float().mean().item() - 1.0) < 0.05
    assert abs(out.float().std().item() - 0.5) < 0.05


def test_random_with_seed_and_offset_is_deterministic():
    def fn(fd):
        seed, offset = fd.define_scalar(None, dtype=DataType.Int), fd.define_scalar(None, dtype=DataType.Int)
        fd.add_output(fd.ops.uniform(0.0, 1.0, [8, 8], rng_seed=seed, rng_offset=offset))
        fd.add_output(fd.ops.normal(0.0, 1.0, [8, 8], rng_seed=seed, rng_offset=offset))

    fd, fd_other = define(fn), define(fn)
    a = fd.execute([11, 3])
    torch.rand(100, device=DEVICE)  # unrelated draws from the default generator change nothing
    b = fd.execute([11, 3])
    c = fd_other.execute([11, 3])  # another fusion, another executor
    for x, y, z in zip(a, b, c):
        assert torch.equal(x, y) and torch.equal(x, z)
    for other in ([11, 4], [12, 3]):
        d = fd.execute(other)
        assert not torch.equal(a[0], d[0]) and not torch.equal(a[1], d[1])


def test_random_with_constant_seed_round_trips_through_repr():
    def fn(fd):
        fd.add_output(fd.ops.uniform(1.0, 2.0, [4, 4], rng_seed=5, rng_offset=0, dtype=DataType.Double))

    fd = define(fn)
    assert "rng_seed=5, rng_offset=0" in repr(fd)
    a = fd.execute([])[0]
    scope = {"DataType": DataType}
    exec(repr(fd), scope)
    fd2 = define(scope["nvfuser_fusion"])
    assert torch.equal(a, fd2.execute([])[0])


def test_unseeded_random_draws_from_the_default_generator_like_eager():
    # Meta inference must not draw numbers (it runs on meta tensors), so with the same global seed the fusion
    # gives exactly eager torch.rand's values; and two calls give different values.
    x = make((4, 4))

    def fn(fd):
        t0 = fd.from_pytorch(x)
        fd.add_output(fd.ops.add(t0, fd.ops.uniform(0.0, 1.0, [4, 4])))

    fd = define(fn)
    torch.manual_seed(1234)
    out = fd.execute([x])[0]
    torch.manual_seed(1234)
    ref = x + torch.rand(4, 4, device=x.device)
    torch.testing.assert_close(out, ref)
    assert not torch.equal(fd.execute([x])[0], out)


def test_uniform_stays_below_maxval_in_narrow_dtypes():
    # A draw that rounds to maxval in the result's dtype becomes minval (nvFuser's kernels do the same): in
    # BFloat16 about one draw in 2**9 of uniform(0, 1) would otherwise be 1.0. Both ends are reached.
    def fn(dtype, lo, hi):
        def build(fd):
            fd.add_output(fd.ops.uniform(fd.define_scalar(lo, dtype=DataType.Double),
                                         fd.define_scalar(hi, dtype=DataType.Double), [1 << 18], dtype=dtype))
        return build

    for dtype, tdt in ((DataType.BFloat16, torch.bfloat16), (DataType.Half, torch.float16)):
        for lo, hi in ((0.0, 1.0), (-1.5, 3.7)):
            out = define(fn(dtype, lo, hi)).execute([])[0]
            hi_t, lo_t = torch.tensor(hi, dtype=tdt), torch.tensor(lo, dtype=tdt)
            below = torch.nextafter(hi_t, lo_t)
            assert out.dtype == tdt and out.device.type == DEVICE.type
            assert out.min().item() == lo_t.item() and out.max().item() == below.item()
            assert not (out == hi_t.item()).any()


def test_random_symbolic_shape():
    def fn(fd):
        n = fd.define_scalar(None, dtype=DataType.Int)
        fd.add_output(fd.ops.normal(0.0, 1.0, [n, 3]))

    out = define(fn).execute([5])[0]
    assert out.shape == (5, 3) and out.dtype == torch.float32


def test_bind_inputs_device_selection():
    fd = define(lambda fd: (fd.define_tensor([], is_cpu=True), fd.define_tensor([-1])))
    cpu_scalar, meta = torch.tensor(1.0), torch.empty(3, device="meta")
    # A CPU scalar never decides the device; a regular tensor input does.
    assert bind_inputs(fd.fusion, [cpu_scalar, meta]).device.type == "meta"
    assert bind_inputs(fd.fusion, [cpu_scalar, torch.empty(3)]).device.type == "cpu"
    assert bind_inputs(fd.fusion, [cpu_scalar, torch.empty(3)], device="meta").device.type == "meta"
    only_scalar = define(lambda fd: fd.define_tensor([], is_cpu=True))
    # Meta inference converts every tensor to meta, CPU scalars included.
    assert bind_inputs(only_scalar.fusion, [torch.empty((), device="meta")]).device.type == "meta"


def test_random_errors():
    with pytest.raises(FusionDtypeError, match=r"fd.ops.uniform: argument 'dtype' must be one of"):
        define(lambda fd: fd.ops.uniform(0.0, 1.0, [2], dtype=DataType.Int))
    with pytest.raises(FusionDefinitionError, match=r"normal: arguments 'rng_seed' and 'rng_offset' must be given together"):
        define(lambda fd: fd.ops.normal(0.0, 1.0, [2], rng_seed=1))
    with pytest.raises(FusionDtypeError, match=r"uniform: argument 'rng_seed' must be an Int scalar"):
        define(lambda fd: fd.ops.uniform(0.0, 1.0, [2], rng_seed=fd.define_scalar(1.0), rng_offset=0))
    with pytest.raises(FusionDefinitionError, match=r"uniform: argument 'rng_offset'=-1 must not be negative"):
        define(lambda fd: fd.ops.uniform(0.0, 1.0, [2], rng_seed=1, rng_offset=-1))
    with pytest.raises(FusionDtypeError, match=r"normal: argument 'std' must be real"):
        define(lambda fd: fd.ops.normal(0.0, 1j, [2]))
    with pytest.raises(FusionDtypeError, match=r"uniform: argument 'minval' must be a number or a scalar"):
        define(lambda fd: fd.ops.uniform(fd.define_tensor([-1]), 1.0, [2]))
    with pytest.raises(FusionDefinitionError, match=r"normal: argument 'shape'\[0\]=-3 is negative"):
        define(lambda fd: fd.ops.normal(0.0, 1.0, [-3]))
    with pytest.raises(FusionDtypeError, match=r"uniform: argument 'shape' must be a list"):
        define(lambda fd: fd.ops.uniform(0.0, 1.0, 4))


# ==============================================================================================================
# triu


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_triu_dtypes_layouts(dtype, layout):
    x = make_arg(layout, shape_for(layout), dtype)

    def fn(fd):
        fd.add_output(fd.ops.triu(define_input(fd, x, layout)))

    check_fusion(fn, [x], lambda x: torch.triu(x), expected_segments=[kernel_kind("triu")])


@pytest.mark.parametrize("diagonal", [-2, -1, 1, 3, 9])
def test_triu_diagonals(diagonal):
    x = make((2, 4, 6))

    def fn(fd):
        fd.add_output(fd.ops.triu(fd.from_pytorch(x), diagonal))

    check_fusion(fn, [x], lambda x: torch.triu(x, diagonal))


def test_triu_symbolic_diagonal_and_expanded_matrix_dims():
    # Rows of x are equal (expanded), but triu makes them differ: the result is added to a full tensor.
    x, y = expanded((5, 5), 0), make((5, 5))

    def fn(fd):
        t0, d = fd.from_pytorch(x), fd.define_scalar(None, dtype=DataType.Int)
        t = fd.ops.triu(t0, d)
        fd.add_output(fd.ops.mul(t, fd.from_pytorch(y)))

    check_fusion(fn, [x, 1, y], lambda x, d, y: torch.triu(x, d) * y)


def test_triu_errors():
    with pytest.raises(FusionDefinitionError, match=r"fd.ops.triu: argument 'arg' must have rank >= 2, got rank 1"):
        define(lambda fd: fd.ops.triu(fd.define_tensor([-1])))
    with pytest.raises(FusionDtypeError, match=r"triu: argument 'diagonal' must be an int or an Int scalar, got 1.0"):
        define(lambda fd: fd.ops.triu(fd.define_tensor([-1, -1]), 1.0))
    with pytest.raises(FusionDtypeError, match=r"triu: argument 'arg' must be a TensorView"):
        define(lambda fd: fd.ops.triu(fd.define_scalar(1.0)))


# ==============================================================================================================
# topk


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_topk_sorted_dtypes_layouts(dtype, layout):
    x = distinct(shape_for(layout), dtype, layout)

    def fn(fd):
        v, i = fd.ops.topk(define_input(fd, x, layout), 3, dim=-1, largest=True, sorted=True)
        fd.add_output(v)
        fd.add_output(i)

    # A top-k alone is one generated kernel (codegen/sort_lowerings.py).
    check_fusion(fn, [x], lambda x: list(torch.topk(x, 3, dim=-1, largest=True, sorted=True)), expected_segments=["Reduction"])


@pytest.mark.parametrize("dim", [0, 1, -2])
@pytest.mark.parametrize("largest", [True, False])
def test_topk_dims_and_smallest(dim, largest):
    x = distinct((5, 6))

    def fn(fd):
        v, i = fd.ops.topk(fd.from_pytorch(x), 2, dim=dim, largest=largest, sorted=True)
        fd.add_output(v)
        fd.add_output(i)

    check_fusion(fn, [x], lambda x: list(torch.topk(x, 2, dim=dim, largest=largest, sorted=True)))


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_topk_unsorted(layout):
    # The order of unsorted results is unspecified: compare after sorting both sides along the dim.
    x = distinct((4, 8), torch.float32, layout)

    def fn(fd):
        v, i = fd.ops.topk(fd.from_pytorch(x), 5, dim=1)
        fd.add_output(v)
        fd.add_output(i)

    values, indices = check_fusion(fn, [x])
    ref_values, ref_indices = torch.topk(x, 5, dim=1, sorted=False)
    for out, ref in ((values, ref_values), (indices, ref_indices)):
        assert out.dtype == ref.dtype and out.shape == ref.shape and out.stride() == ref.stride()
        torch.testing.assert_close(out.sort(dim=1).values, ref.sort(dim=1).values, atol=0, rtol=0)
    # The indices point at the values.
    torch.testing.assert_close(torch.gather(x, 1, indices), values, atol=0, rtol=0)


def test_topk_symbolic_k_and_pointwise_consumer():
    x = distinct((4, 8))

    def fn(fd):
        t0, k = fd.from_pytorch(x), fd.define_scalar(None, dtype=DataType.Int)
        v, _ = fd.ops.topk(t0, k, dim=1, sorted=True)
        fd.add_output(fd.ops.mul(v, 2.0))

    check_fusion(fn, [x, 3], lambda x, k: torch.topk(x, k, dim=1, sorted=True).values * 2.0,
                 expected_segments=["ExprEval", "PointWise"])


def test_topk_errors():
    with pytest.raises(FusionDefinitionError, match=r"fd.ops.topk: argument 'k'=6 is out of range for dim 1 of size 5"):
        define(lambda fd: fd.ops.topk(fd.define_tensor([3, 5]), 6, dim=1))
    with pytest.raises(FusionDefinitionError, match=r"topk: argument 'k'=-1 is out of range"):
        define(lambda fd: fd.ops.topk(fd.define_tensor([-1]), -1))
    with pytest.raises(FusionDtypeError, match=r"topk: argument 'k' must be an int or an Int scalar, got 2.0"):
        define(lambda fd: fd.ops.topk(fd.define_tensor([-1]), 2.0))
    with pytest.raises(FusionDtypeError, match=r"topk: does not support DataType.Bool tensors"):
        define(lambda fd: fd.ops.topk(fd.define_tensor([-1], dtype=DataType.Bool), 1))
    with pytest.raises(FusionDtypeError, match=r"topk: does not support DataType.ComplexFloat tensors"):
        define(lambda fd: fd.ops.topk(fd.define_tensor([-1], dtype=DataType.ComplexFloat), 1))
    with pytest.raises(FusionDefinitionError, match=r"topk: argument 'dim'=2 is out of range"):
        define(lambda fd: fd.ops.topk(fd.define_tensor([-1, -1]), 1, dim=2))
    with pytest.raises(FusionDtypeError, match=r"topk: argument 'sorted' must be a bool"):
        define(lambda fd: fd.ops.topk(fd.define_tensor([-1]), 1, sorted=1.0))  # ints convert, as in nvFuser
    with pytest.raises(FusionDefinitionError, match=r"topk: argument 'arg' must have rank >= 1"):
        define(lambda fd: fd.ops.topk(fd.define_tensor([]), 1, dim=0))


# ==============================================================================================================
# argsort


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("descending", [False, True])
def test_argsort_dtypes_layouts(dtype, layout, descending):
    x = distinct(shape_for(layout), dtype, layout)

    def fn(fd):
        fd.add_output(fd.ops.argsort(define_input(fd, x, layout), 1, descending=descending))

    # over a small dim: a generated kernel (codegen/sort_lowerings.py), the sorted dim its columns
    check_fusion(fn, [x], lambda x: torch.argsort(x, dim=1, descending=descending), expected_segments=["Reduction"])


@pytest.mark.parametrize("dim", [0, -1])
@pytest.mark.parametrize("dtype", [torch.int32, torch.bool])
def test_argsort_stable_with_ties(dim, dtype):
    x = make((6, 7), dtype, low=0, high=3)

    def fn(fd):
        fd.add_output(fd.ops.argsort(fd.from_pytorch(x), dim, stable=True))

    check_fusion(fn, [x], lambda x: torch.argsort(x, dim=dim, stable=True))


def test_argsort_errors():
    with pytest.raises(FusionDefinitionError, match=r"fd.ops.argsort: argument 'dim'=2 is out of range"):
        define(lambda fd: fd.ops.argsort(fd.define_tensor([-1, -1]), 2))
    with pytest.raises(FusionDtypeError, match=r"argsort: does not support DataType.ComplexDouble tensors"):
        define(lambda fd: fd.ops.argsort(fd.define_tensor([-1], dtype=DataType.ComplexDouble), 0))
    with pytest.raises(FusionDtypeError, match=r"argsort: argument 'descending' must be a bool"):
        define(lambda fd: fd.ops.argsort(fd.define_tensor([-1]), 0, descending=None))
    with pytest.raises(FusionDefinitionError, match=r"argsort: argument 'arg' must have rank >= 1"):
        define(lambda fd: fd.ops.argsort(fd.define_tensor([]), 0))
