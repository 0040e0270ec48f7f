"""Reductions (sum/prod/max/min, var, var_mean, welford) and scans (cumsum/cumprod/cummax/cummin).

Every reference is eager PyTorch written op by op: what ATen does for the same computation, including the
Float upcast of bf16/fp16 and the int64 accumulation of integer and bool sums.
"""

from __future__ import annotations

import math

import pytest
import torch

from harness import DEVICE, check_fusion, define, expanded, make, sliced, transposed
from pyfuser import DataType, FusionDefinition
from pyfuser.errors import FusionDefinitionError, FusionDtypeError, FusionExecutionError, UnsupportedOpError

REDUCED = (torch.bfloat16, torch.float16)
SHAPE = (3, 4, 5)


def _upcast(x):
    return x.float() if x.dtype in REDUCED else x


def _prod(x, dims, keepdim=False):
    for d in sorted(dims, reverse=True):
        x = torch.prod(x, d, keepdim=keepdim)
    return x


# Eager references per op: compute in Float for bf16/fp16 and round back; ints and bool accumulate in int64.
def ref_reduce(op, x, dims, keepdim=False):
    if op == "sum":
        src = x.long() if not x.dtype.is_floating_point else _upcast(x)
        out = torch.sum(src, dims, keepdim=keepdim)
    elif op == "prod":
        src = x.long() if not x.dtype.is_floating_point else _upcast(x)
        out = _prod(src, dims, keepdim)
    elif op == "max":
        out = torch.amax(_upcast(x), dims, keepdim=keepdim)
    else:
        out = torch.amin(_upcast(x), dims, keepdim=keepdim)
    if x.dtype.is_floating_point or op in ("max", "min"):
        out = out.to(x.dtype)
    return out


def _input(dtype, shape=SHAPE):
    # Products of many randn values vanish; keep prod inputs near 1 so the comparison is meaningful.
    if dtype.is_floating_point:
        return make(shape, dtype, low=0.5, high=1.5)
    return make(shape, dtype)


# --------------------------------------------------------------------------------------------------------------
# sum / prod / max / min: call forms, dtypes, keepdim

FORMS = [
    # (call, dims the call reduces, keepdim)
    (lambda op, t: op(t), [0, 1, 2], False),
    (lambda op, t: op(t, 1), [1], False),
    (lambda op, t: op(t, 1, True), [1], True),
    (lambda op, t: op(t, dim=-1, keepdim=True), [2], True),
    (lambda op, t: op(t, [0, 2]), [0, 2], False),
    (lambda op, t: op(t, dims=[2, 0], keepdim=True), [0, 2], True),
    (lambda op, t: op(t, axes=[-2]), [1], False),
    (lambda op, t: op(t, [1, 2], keep_dim=True), [1, 2], True),
]


@pytest.mark.parametrize("form", range(len(FORMS)))
@pytest.mark.parametrize("op", ["sum", "prod", "max", "min"])
def test_call_forms(op, form):
    call, dims, keepdim = FORMS[form]
    x = _input(torch.float32)

    def fn(fd):
        fd.add_output(call(getattr(fd.ops, op), fd.from_pytorch(x)))

    check_fusion(fn, [x], lambda x: ref_reduce(op, x, dims, keepdim), expected_segments=["Reduction"])
    text = repr(define(fn))
    kept = ", keepdim=True" if keepdim else ""  # keepdim=False is the default: not printed (nvFuser's printer)
    # sum/prod print the dtype they resolved, max/min take only the default Null (nvFuser's printer)
    dtype = ", dtype=DataType.Float" if op in ("sum", "prod") else ""
    assert f"fd.ops.{op}(tv0, dims={dims}{kept}{dtype})" in text


DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.bool]


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", ["sum", "prod", "max", "min"])
def test_dtypes(op, dtype, keepdim):
    x = _input(dtype)

    def fn(fd):
        fd.add_output(getattr(fd.ops, op)(fd.from_pytorch(x), [0, 2], keepdim=keepdim))

    outs = check_fusion(fn, [x], lambda x: ref_reduce(op, x, [0, 2], keepdim))
    # The documented dtype rule, independently of the reference: sum/prod of ints and bool give int64.
    if op in ("sum", "prod") and not dtype.is_floating_point:
        assert outs[0].dtype == torch.int64
    else:
        assert outs[0].dtype == dtype


def test_fp8_sum_computes_in_float():
    x = make(SHAPE, torch.float8_e4m3fn)

    def fn(fd):
        fd.add_output(fd.ops.sum(fd.from_pytorch(x), [1]))

    check_fusion(fn, [x], lambda x: torch.sum(x.float(), [1]).to(torch.float8_e4m3fn))


DTYPE_ARGS = [
    # (input dtype, op, dtype argument, eager reference: cast first, then reduce)
    (torch.int32, "sum", DataType.Float, lambda x: torch.sum(x.float(), [1])),
    (torch.float32, "sum", DataType.Double, lambda x: torch.sum(x.double(), [1])),
    (torch.bool, "sum", DataType.Int32, lambda x: torch.sum(x.int(), [1]).int()),
    (torch.float32, "sum", DataType.Int, lambda x: torch.sum(x.long(), [1])),
    (torch.bfloat16, "sum", DataType.Float, lambda x: torch.sum(x.float(), [1])),
    (torch.float32, "prod", DataType.BFloat16, lambda x: torch.prod(x.bfloat16().float(), 1).bfloat16()),
    (torch.int64, "prod", DataType.Double, lambda x: torch.prod(x.double(), 1)),
]


@pytest.mark.parametrize("case", range(len(DTYPE_ARGS)))
def test_dtype_argument(case):
    in_dtype, op, dtype, ref = DTYPE_ARGS[case]
    x = make(SHAPE, in_dtype) if in_dtype != torch.float32 or op != "prod" else _input(in_dtype)

    def fn(fd):
        fd.add_output(getattr(fd.ops, op)(fd.from_pytorch(x), [1], dtype=dtype))

    check_fusion(fn, [x], ref)


def test_dtype_positional_first_overload():
    # nvFuser's (arg, dtype) overload: reduce every dim, casting first.
    x = make(SHAPE, torch.int32)

    def fn(fd):
        fd.add_output(fd.ops.sum(fd.from_pytorch(x), DataType.Double))

    check_fusion(fn, [x], lambda x: torch.sum(x.double()))
    assert "fd.ops.sum(tv0, dims=[0, 1, 2], dtype=DataType.Double)" in repr(define(fn))


# --------------------------------------------------------------------------------------------------------------
# non-contiguous inputs


def _stride_ordered(shape, dtype):
    # Memory order reversed: dim 0 is fastest (stride_order [0, 1, 2]).
    return make(tuple(reversed(shape)), dtype).permute(*reversed(range(len(shape))))


LAYOUTS = {
    "transposed": lambda dtype: transposed(SHAPE, dtype),
    "sliced": lambda dtype: sliced(SHAPE, dtype),
    "expanded": lambda dtype: expanded(SHAPE, 1, dtype),
    "permuted3": lambda dtype: make((5, 3, 4), dtype).permute(1, 2, 0),
}


@pytest.mark.parametrize("dims", [[0], [1], [2], [0, 2], [1, 2]], ids=str)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("op,dtype", [("sum", torch.float32), ("max", torch.bfloat16), ("prod", torch.int64)])
def test_non_contiguous(op, dtype, layout, dims):
    x = LAYOUTS[layout](dtype)

    def fn(fd):
        fd.add_output(getattr(fd.ops, op)(fd.from_pytorch(x), dims))

    check_fusion(fn, [x], lambda x: ref_reduce(op, x, dims))


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dims", [[0], [2], [0, 1]], ids=str)
def test_stride_order_defined_input(dims, keepdim):
    x = _stride_ordered(SHAPE, torch.float32)
    assert x.stride() == (1, 3, 12)

    def fn(fd):
        t = fd.define_tensor(
            shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.Float, stride_order=[0, 1, 2]
        )
        fd.add_output(fd.ops.sum(t, dims, keepdim=keepdim))

    check_fusion(fn, [x], lambda x: torch.sum(x, dims, keepdim=keepdim))


# --------------------------------------------------------------------------------------------------------------
# degenerate reductions: empty dim list, extent 0, broadcast and expanded dims, 0-dim tensors


@pytest.mark.parametrize("op", ["sum", "prod", "max", "min"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32], ids=str)
def test_empty_dims_is_identity_copy(op, dtype):
    x = transposed(SHAPE, dtype)

    def fn(fd):
        fd.add_output(getattr(fd.ops, op)(fd.from_pytorch(x), []))

    # torch.sum(x, dim=[]) would reduce every dim; an empty list reduces nothing.
    want = torch.int64 if (op in ("sum", "prod") and not dtype.is_floating_point) else dtype
    outs = check_fusion(fn, [x], lambda x: x.to(want, copy=True))
    assert outs[0].shape == x.shape


def test_empty_dims_output_does_not_alias_input():
    x = make(SHAPE)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.sum(fd.from_pytorch(x), []))
    (out,) = fd.execute([x])
    assert out.data_ptr() != x.data_ptr()
    assert torch.equal(out, x)


@pytest.mark.parametrize("op", ["sum", "prod"])
@pytest.mark.parametrize("keepdim", [False, True])
def test_reduce_zero_extent_dim(op, keepdim):
    x = make((3, 0, 5))

    def fn(fd):
        fd.add_output(getattr(fd.ops, op)(fd.from_pytorch(x), [1], keepdim=keepdim))

    outs = check_fusion(fn, [x], lambda x: ref_reduce(op, x, [1], keepdim))
    assert torch.all(outs[0] == (0.0 if op == "sum" else 1.0))


def test_reduce_non_reduced_zero_extent():
    x = make((3, 0, 5))

    def fn(fd):
        fd.add_output(fd.ops.max(fd.from_pytorch(x), [0, 2]))

    check_fusion(fn, [x], lambda x: torch.amax(x, [0, 2]))


@pytest.mark.parametrize("op", ["max", "min"])
def test_max_of_zero_extent_raises_like_eager(op):
    # torch.amax/amin have no identity for an empty reduction and raise; so do we, at run time.
    x = make((3, 0, 5))
    with pytest.raises((RuntimeError, IndexError)):
        (torch.amax if op == "max" else torch.amin)(x, [1])
    with FusionDefinition() as fd:
        fd.add_output(getattr(fd.ops, op)(fd.from_pytorch(x), [1]))
    with pytest.raises(FusionExecutionError, match=f"fd.ops.{op}"):
        fd.execute([x])


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("op", ["sum", "prod", "max"])
def test_reduce_broadcast_dim(op, keepdim):
    x = _input(torch.float32, (3, 1, 5))

    def fn(fd):
        t = fd.from_pytorch(x)
        assert t.logical[1].is_broadcast
        fd.add_output(getattr(fd.ops, op)(t, [1], keepdim=keepdim))

    check_fusion(fn, [x], lambda x: ref_reduce(op, x, [1], keepdim))


@pytest.mark.parametrize("dims", [[1], [0, 1], [1, 2]], ids=str)
@pytest.mark.parametrize("op", ["sum", "prod", "min"])
def test_reduce_expanded_dim(op, dims):
    # Summing an expanded dim multiplies by its extent, prod raises to its power, min/max just squeeze it.
    x = make((3, 1, 5), low=0.5, high=1.5).expand(*SHAPE)

    def fn(fd):
        t = fd.from_pytorch(x)
        assert t.logical[1].expanded
        fd.add_output(getattr(fd.ops, op)(t, dims))

    check_fusion(fn, [x], lambda x: ref_reduce(op, x, dims))


def test_reduce_zero_dim_tensor():
    x = torch.tensor(2.5, device=DEVICE)

    def fn(fd):
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.sum(t))
        fd.add_output(fd.ops.max(t, dtype=DataType.Null))

    check_fusion(fn, [x], lambda x: (x.clone(), x.clone()))


def test_reduction_output_domain():
    with FusionDefinition() as fd:
        t = fd.define_tensor(shape=[-1, 1, 7], contiguity=[True, None, True], dtype=DataType.Float)
        s = fd.ops.sum(t, [0, 2])
        k = fd.ops.sum(t, [0, 2], keepdim=True)
    assert [d.iter_type.value for d in s.logical_domain] == ["Reduction", "Broadcast", "Reduction"]
    assert s.logical_domain[2].extent == 7 and s.ndim == 1
    assert [d.iter_type.value for d in k.logical_domain] == ["Broadcast", "Broadcast", "Broadcast"]
    assert not any(d.expanded for d in k.logical_domain) and k.ndim == 3


def test_chained_reductions():
    # The second reduction indexes the first one's logical dims (its reduction dims are gone).
    x = make(SHAPE)

    def fn(fd):
        s = fd.ops.sum(fd.from_pytorch(x), [1])
        fd.add_output(fd.ops.max(s, [1]))

    check_fusion(fn, [x], lambda x: torch.amax(torch.sum(x, [1]), [1]))


# --------------------------------------------------------------------------------------------------------------
# var, var_mean, welford


def _ref_var_mean(x, dims, correction, keepdim):
    return torch.var_mean(_upcast(x), dims, correction=correction, keepdim=keepdim)


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("correction", [0, 1, 2])
@pytest.mark.parametrize("dims", [[1], [0, 2]], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64], ids=str)
def test_var_mean(dtype, dims, correction, keepdim):
    x = make(SHAPE, dtype)

    def fn(fd):
        t = fd.from_pytorch(x)
        v, m = fd.ops.var_mean(t, dims, correction=correction, keepdim=keepdim)
        fd.add_output(fd.ops.var(t, dims, correction, keepdim))
        fd.add_output(v)
        fd.add_output(m)

    def ref(x):
        v, m = _ref_var_mean(x, dims, correction, keepdim)
        return torch.var(_upcast(x), dims, correction=correction, keepdim=keepdim), v, m

    outs = check_fusion(fn, [x], ref)
    want = torch.float64 if dtype == torch.float64 else torch.float32
    assert all(o.dtype == want for o in outs)


@pytest.mark.parametrize("layout", ["transposed", "sliced", "expanded"])
def test_var_mean_non_contiguous(layout):
    x = LAYOUTS[layout](torch.bfloat16)

    def fn(fd):
        v, m = fd.ops.var_mean(fd.from_pytorch(x), dims=[0, 1])
        fd.add_output(v)
        fd.add_output(m)

    check_fusion(fn, [x], lambda x: _ref_var_mean(x, [0, 1], 1, False))


def test_var_complex_is_real():
    x = make(SHAPE, torch.complex64)

    def fn(fd):
        t = fd.from_pytorch(x)
        v, m = fd.ops.var_mean(t, [2])
        fd.add_output(v)
        fd.add_output(m)

    check_fusion(fn, [x], lambda x: torch.var_mean(x, [2]))


def test_var_empty_dims_is_per_element():
    # Statistics over zero dims cover one element each: the variance is 0 (correction 0), the mean x itself.
    x = make(SHAPE)

    def fn(fd):
        v, m = fd.ops.var_mean(fd.from_pytorch(x), [], correction=0)
        fd.add_output(v)
        fd.add_output(m)

    check_fusion(fn, [x], lambda x: (torch.zeros_like(x), x.clone()))


def test_var_canonical_print():
    x = make(SHAPE)

    def fn(fd):
        fd.add_output(fd.ops.var(fd.from_pytorch(x), dim=-1))

    assert "fd.ops.var(tv0, dims=[2])" in repr(define(fn))


@pytest.mark.parametrize("dims", [[1], [0, 2], [2]], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_welford(dtype, dims):
    x = make(SHAPE, dtype)

    def fn(fd):
        avg, var_sum, n = fd.ops.welford(fd.from_pytorch(x), dims)
        for o in (avg, var_sum, n):
            fd.add_output(o)

    def ref(x):
        xf = x.float()
        avg = xf.mean(dims)
        var_sum = ((xf - xf.mean(dims, keepdim=True)) ** 2).sum(dims)
        count = math.prod(x.shape[d] for d in dims)
        return avg, var_sum, torch.full_like(avg, count, dtype=torch.int64)

    check_fusion(fn, [x], ref, atol=1e-5, rtol=1e-5)


def test_welford_expanded_input():
    x = expanded(SHAPE, 0)

    def fn(fd):
        for o in fd.ops.welford(fd.from_pytorch(x), [0]):
            fd.add_output(o)

    # Every row is the same, so the mean is that row and the squared deviations sum to 0.
    check_fusion(fn, [x], lambda x: (x[0].clone(), torch.zeros_like(x[0]), torch.full_like(x[0], 3, dtype=torch.int64)))


# --------------------------------------------------------------------------------------------------------------
# scans


def _acc(x):
    # cumsum/cumprod accumulate ints and bool in int64 (as torch does) and reduced floats in Float.
    return x.long() if not x.dtype.is_floating_point else _upcast(x)


def ref_scan(op, x, dim, init=None):
    if op == "cumsum":
        out = torch.cumsum(_acc(x), dim)
        out = out if init is None else out + init
    elif op == "cumprod":
        out = torch.cumprod(_acc(x), dim)
        out = out if init is None else out * init
    elif op == "cummax":
        out = torch.cummax(_upcast(x), dim).values
        out = out if init is None else torch.clamp_min(out, init)
    else:
        out = torch.cummin(_upcast(x), dim).values
        out = out if init is None else torch.clamp_max(out, init)
    return out.to(x.dtype) if x.dtype.is_floating_point or op in ("cummax", "cummin") else out


SCAN_CASES = [
    ("cumsum", torch.float32), ("cumsum", torch.bfloat16), ("cumsum", torch.int32), ("cumsum", torch.bool),
    ("cumprod", torch.float32), ("cumprod", torch.int64),
    ("cummax", torch.float32), ("cummax", torch.bfloat16), ("cummax", torch.int64), ("cummax", torch.bool),
    ("cummin", torch.float16), ("cummin", torch.int32),
]


@pytest.mark.parametrize("dim", [0, -1])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "expanded"])
@pytest.mark.parametrize("op,dtype", SCAN_CASES, ids=lambda v: str(v))
def test_scans(op, dtype, layout, dim):
    # Float inputs lie in [0.5, 1.5] so that cumprod neither vanishes nor explodes.
    if layout == "contiguous":
        x = _input(dtype)
    elif layout == "transposed":
        x = _input(dtype, (3, 5, 4)).transpose(-1, -2)
    else:
        base = list(SHAPE)
        base[dim] = 1  # scan along the stride-0 dim
        x = _input(dtype, base).expand(*SHAPE)

    def fn(fd):
        fd.add_output(getattr(fd.ops, op)(fd.from_pytorch(x), dim))

    # check_fusion also compares every meta-inferred layout with the real one (cummax/cummin included).
    check_fusion(fn, [x], lambda x: ref_scan(op, x, dim))


@pytest.mark.parametrize(
    "op,dtype,init",
    [("cumsum", torch.float32, 1.5), ("cumsum", torch.int32, 3), ("cumprod", torch.float32, 2.0),
     ("cummax", torch.float32, 0.0), ("cummin", torch.int64, 0), ("cumsum", torch.bfloat16, -2.0)],
    ids=str,
)
def test_scan_init(op, dtype, init):
    x = _input(dtype) if op == "cumprod" else make(SHAPE, dtype)

    def fn(fd):
        fd.add_output(getattr(fd.ops, op)(fd.from_pytorch(x), 1, init=init))

    check_fusion(fn, [x], lambda x: ref_scan(op, x, 1, init))


def test_scan_init_symbolic_scalar():
    x = make(SHAPE)

    def fn(fd):
        t = fd.from_pytorch(x)
        s = fd.define_scalar(None, dtype=DataType.Double)
        fd.add_output(fd.ops.cumsum(t, dim=2, init=s))

    check_fusion(fn, [x, 0.25], lambda x, s: torch.cumsum(x, 2) + s)
    assert "fd.ops.cumsum(tv0, dim=2, init=c0)" in repr(define(fn))


def test_scan_is_scan_kind():
    from pyfuser.ops import OpKind, get

    assert all(get(n).kind is OpKind.SCAN for n in ("cumsum", "cumprod", "cummax", "cummin"))
    assert all(get(n).kind is OpKind.REDUCTION for n in ("sum", "prod", "max", "min", "var", "var_mean", "welford"))


# --------------------------------------------------------------------------------------------------------------
# reductions feeding pointwise ops: normalization segments


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_softmax_is_one_inner_persistent_segment(dtype):
    x = make((6, 16), dtype)

    def fn(fd):
        t = fd.from_pytorch(x)
        m = fd.ops.max(t, [1], keepdim=True)
        e = fd.ops.exp(fd.ops.sub(t, m))
        s = fd.ops.sum(e, [1], keepdim=True)
        fd.add_output(fd.ops.cast(fd.ops.div(e, s), DataType.BFloat16 if dtype == torch.bfloat16 else DataType.Float))

    def ref(x):
        m = torch.amax(x, [1], keepdim=True)
        e = torch.exp(x.float() - m.float())
        return (e / torch.sum(e, [1], keepdim=True)).to(dtype)

    check_fusion(fn, [x], ref, expected_segments=["InnerPersistent"])


def test_layer_norm_is_one_inner_persistent_segment():
    x = make((6, 16), torch.bfloat16)

    def fn(fd):
        t = fd.from_pytorch(x)
        var, mean = fd.ops.var_mean(t, [1], correction=0, keepdim=True)
        y = fd.ops.mul(fd.ops.sub(t, mean), fd.ops.rsqrt(fd.ops.add(var, 1e-5)))
        fd.add_output(fd.ops.cast(y, DataType.BFloat16))
        fd.add_output(mean)

    def ref(x):
        var, mean = torch.var_mean(x.float(), [1], correction=0, keepdim=True)
        return ((x.float() - mean) * torch.rsqrt(var + 1e-5)).bfloat16(), mean

    check_fusion(fn, [x], ref, expected_segments=["InnerPersistent"])


def test_plain_reduction_after_pointwise_is_reduction_segment():
    x = make((6, 16))

    def fn(fd):
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.sum(fd.ops.mul(t, t), [1]))

    check_fusion(fn, [x], lambda x: torch.sum(x * x, [1]), expected_segments=["Reduction"])


# --------------------------------------------------------------------------------------------------------------
# definition-time errors


F, I, B, C = DataType.Float, DataType.Int, DataType.Bool, DataType.ComplexFloat
DEF, DT, UNS = FusionDefinitionError, FusionDtypeError, UnsupportedOpError

ERRORS = [
    # (op, build, input dtype, exception, message after "fd.ops.<op>: ")
    ("sum", lambda fd, t: fd.ops.sum(t, 3), F, DEF, r"argument 'dims'=3 is out of range"),
    ("max", lambda fd, t: fd.ops.max(t, dim=-4), F, DEF, r"argument 'dim'=-4 is out of range"),
    ("prod", lambda fd, t: fd.ops.prod(t, [0, -3]), F, DEF, r"argument 'dims'=\[0, -3\] repeats"),
    ("min", lambda fd, t: fd.ops.min(t, axes=[1, 1]), F, DEF, r"argument 'axes'.* repeats"),
    ("sum", lambda fd, t: fd.ops.sum(t, [1.0]), F, DT, r"argument 'dims' must be an int"),
    ("sum", lambda fd, t: fd.ops.sum(t, [True]), F, DT, r"argument 'dims' must be an int"),
    ("sum", lambda fd, t: fd.ops.sum(t, "1"), F, DT, r"argument 'dims' must be an int or a list"),
    ("sum", lambda fd, t: fd.ops.sum(t, [0], dim=1), F, DEF, r"give only one of 'dims', 'dim'"),
    ("sum", lambda fd, t: fd.ops.sum(t, [0], keepdim=1), F, DT, r"argument 'keepdim' must be a bool"),
    ("sum", lambda fd, t: fd.ops.sum(t, [0], keepdim=True, keep_dim=True), F, DEF, r"give only one of 'keepdim'"),
    ("sum", lambda fd, t: fd.ops.sum(t, [0], dtype="float"), F, DT, r"argument 'dtype' must be a DataType"),
    ("sum", lambda fd, t: fd.ops.sum(t, F, dtype=F), F, DEF, r"argument 'dtype' given twice"),
    ("max", lambda fd, t: fd.ops.max(t, [0], dtype=F), F, DT, r"argument 'dtype' must be DataType\.Null"),
    ("min", lambda fd, t: fd.ops.min(t, [0]), C, DT, r"argument 'arg' must not be complex"),
    ("sum", lambda fd, t: fd.ops.sum(t, [0], dtype=DataType.Float4_e2m1fn), F, UNS, r"argument 'dtype'"),
    ("sum", lambda fd, t: fd.ops.sum(2.0), F, DT, r"argument 'arg' must be a TensorView"),
    ("var", lambda fd, t: fd.ops.var(t, [0]), I, DT, r"argument 'arg' must be a floating-point"),
    ("var_mean", lambda fd, t: fd.ops.var_mean(t, [0]), B, DT, r"argument 'arg' must be a floating-point"),
    ("var", lambda fd, t: fd.ops.var(t), F, DEF, r"argument 'dims' is required"),
    ("var", lambda fd, t: fd.ops.var(t, [0], correction=0.5), F, DT, r"argument 'correction' must be an int"),
    ("var_mean", lambda fd, t: fd.ops.var_mean(t, [0], correction=-1), F, DEF, r"argument 'correction'=-1"),
    ("var", lambda fd, t: fd.ops.var(t, [0, 5]), F, DEF, r"argument 'dims'=5 is out of range"),
    ("welford", lambda fd, t: fd.ops.welford(t, [0]), DataType.Int32, DT, r"argument 'arg' must be a real floating"),
    ("welford", lambda fd, t: fd.ops.welford(t, [0]), C, DT, r"argument 'arg' must be a real"),
    ("welford", lambda fd, t: fd.ops.welford(t), F, DEF, r"argument 'dims' is required"),
    ("cumsum", lambda fd, t: fd.ops.cumsum(t, 3), F, DEF, r"argument 'dim'=3 is out of range"),
    ("cumprod", lambda fd, t: fd.ops.cumprod(t, [0]), F, DT, r"argument 'dim' must be an int"),
    ("cumsum", lambda fd, t: fd.ops.cumsum(t, 0, init=1.5), I, DT, r"argument 'init' of DataType\.Double"),
    ("cummax", lambda fd, t: fd.ops.cummax(t, 0, init=t), F, DT, r"argument 'init' must be a scalar"),
    ("cummin", lambda fd, t: fd.ops.cummin(t, 0), DataType.ComplexDouble, DT, r"argument 'arg' must not be complex"),
    ("cumsum", lambda fd, t: fd.ops.cumsum(1, 0), F, DT, r"argument 'arg' must be a TensorView"),
]


@pytest.mark.parametrize("case", range(len(ERRORS)))
def test_definition_errors(case):
    op, build, dtype, exc, message = ERRORS[case]
    with pytest.raises(exc, match=rf"^fd\.ops\.{op}: {message}"):
        with FusionDefinition() as fd:
            t = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=dtype)
            build(fd, t)


def test_torch_rejects_what_we_reject():
    # The dtype errors above mirror eager: torch has no var of integers and no ordering of complex numbers.
    with pytest.raises(RuntimeError):
        torch.var(torch.ones(3, dtype=torch.int64), 0)
    with pytest.raises(RuntimeError):
        torch.amax(torch.ones(3, dtype=torch.complex64), 0)
