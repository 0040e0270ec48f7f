"""The FusionDefinition frontend: define_tensor overloads, from_pytorch, define_scalar/define_vector, add_output
(aliases included), execute/validate/manual_execute, options, repr, LRUCache, layout descriptors, dtype
conversions, operator overloads and size/shape queries."""

from __future__ import annotations

import pytest
import torch

import pyfuser
import pyfuser as nvfuser_direct
from harness import check_fusion, define, expanded, make, rebuild_from_repr, sliced, transposed
from pyfuser import DataType, FusionDefinition, LRUCache, compute_tensor_descriptor
from pyfuser.errors import InputValidationError, OptionError
from pyfuser.ir.nodes import IterType, Scalar, TensorView, Vector


def domain_kinds(tv):
    """'i' iteration, 'b' broadcast, 'e' expanded broadcast, with the static extent or '?'."""
    out = []
    for d in tv.logical:
        kind = "e" if d.expanded else ("b" if d.iter_type is IterType.Broadcast else "i")
        out.append(f"{kind}{'?' if d.extent is None else d.extent}")
    return out


def input_line(fd):
    return repr(fd).splitlines()[1].strip()


# --------------------------------------------------------------------------------------------------------------
# define_tensor, overload 1: shape, contiguity list, dtype, stride_order


def test_define_tensor_shape_and_contiguity_list():
    x = make((4, 1, 6))

    def fusion(fd):
        t = fd.define_tensor(shape=[-1, 1, -1], contiguity=[True, None, True], dtype=DataType.Float)
        assert domain_kinds(t) == ["i?", "b1", "i?"]
        assert t.contiguity == (True, None, True) and t.alloc_order is None and t.dtype is DataType.Float
        fd.add_output(fd.ops.neg(t))

    check_fusion(fusion, [x], torch.neg)


def test_define_tensor_static_extents_and_expanded_dim():
    # shape entries other than -1 and 1 are static extents; None contiguity on a non-1 dim is an expanded dim.
    x = make((3, 1)).expand(3, 4)

    def fusion(fd):
        t = fd.define_tensor(shape=[3, 4], contiguity=[True, None], dtype=DataType.Float)
        assert domain_kinds(t) == ["i3", "e4"]
        fd.add_output(fd.ops.mul(t, 2.0))

    check_fusion(fusion, [x], lambda x: x * 2.0)


def test_define_tensor_stride_order():
    # stride_order [2, 0, 1] on [G, K, N] gives allocation order [G, N, K]: K (dim 1) is the fastest dim.
    x = make((2, 5, 3)).transpose(1, 2)  # logical [2, 3, 5], strides [15, 1, 3]

    def fusion(fd):
        t = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.Float, stride_order=[2, 0, 1])
        assert t.alloc_order == (0, 2, 1)
        assert t.stride_order() == [2, 0, 1]
        fd.add_output(fd.ops.exp(t))

    check_fusion(fusion, [x], torch.exp)


def test_define_tensor_negative_stride_order_wraps():
    with FusionDefinition() as fd:
        t = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], stride_order=[-2, -1])
    assert t.stride_order() == [0, 1] and t.alloc_order == (1, 0)


def test_define_tensor_contiguity_listed_in_allocation_order():
    # Column-major [4, 6] with padded columns: dim 0 (innermost) contiguous, dim 1 not.
    x = make((6, 9))[:, :4].t()
    assert x.stride() == (1, 9)

    def fusion(fd):
        t = fd.define_tensor(shape=[-1, -1], contiguity=[False, True], dtype=DataType.Float, stride_order=[0, 1])
        fd.add_output(fd.ops.abs(t))

    check_fusion(fusion, [x], torch.abs)


@pytest.mark.parametrize(
    "dtype,torch_dtype",
    [(DataType.Half, torch.float16), (DataType.BFloat16, torch.bfloat16), (DataType.Int, torch.int64),
     (DataType.Int32, torch.int32), (DataType.Bool, torch.bool), (DataType.Double, torch.float64)],
)
def test_define_tensor_dtypes(dtype, torch_dtype):
    x = make((3, 4), torch_dtype)

    def fusion(fd):
        t = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=dtype)
        fd.add_output(fd.ops.set(t))

    out = check_fusion(fusion, [x], lambda x: x.clone())[0]
    assert out.dtype == torch_dtype


# --------------------------------------------------------------------------------------------------------------
# define_tensor, overload 2: contiguity as a bool


@pytest.mark.parametrize("flag", [True, False])
def test_define_tensor_contiguity_bool(flag):
    with FusionDefinition() as fd:
        t = fd.define_tensor(shape=[-1, 1, 5], contiguity=flag)
    assert t.contiguity == (flag, None, flag)
    x = make((3, 1, 5)) if flag else make((3, 1, 8))[..., :5]
    check_fusion(lambda fd: fd.add_output(fd.ops.relu(fd.define_tensor([-1, 1, 5], flag))), [x], torch.relu)


def test_define_tensor_contiguity_defaults_to_false():
    with FusionDefinition() as fd:
        t = fd.define_tensor(shape=[-1, -1])
    assert t.contiguity == (False, False)


def test_define_tensor_contiguity_bool_follows_stride_order():
    with FusionDefinition() as fd:
        t = fd.define_tensor(shape=[1, -1, -1], contiguity=True, stride_order=[0, 2, 1])
    # allocation order [1, 2, 0]: the shape-1 dim 0 is innermost, so its None is last.
    assert t.alloc_order == (1, 2, 0) and t.contiguity == (True, True, None)


# --------------------------------------------------------------------------------------------------------------
# define_tensor, overload 3: sizes and strides


@pytest.mark.parametrize("static", [False, True])
def test_define_tensor_sizes_strides(static):
    x = make((4, 8))[:, :5]  # sizes [4, 5], strides [8, 1]

    def fusion(fd):
        t = fd.define_tensor(sizes=[4, 5], strides=[8, 1], dtype=DataType.Float, static_sizes=static)
        assert domain_kinds(t) == (["i4", "i5"] if static else ["i?", "i?"])
        assert t.contiguity == (False, True)
        fd.add_output(fd.ops.sin(t))

    check_fusion(fusion, [x], torch.sin)


def test_define_tensor_sizes_strides_positional():
    # A list of ints as the second argument is the (sizes, strides) overload.
    with FusionDefinition() as fd:
        t = fd.define_tensor([3, 1, 4], [1, 12, 3], DataType.Half)
    assert t.dtype is DataType.Half
    assert domain_kinds(t) == ["i?", "b1", "i?"]
    assert t.stride_order() == [0, 2, 1] and t.contiguity == (None, True, True)


def test_define_tensor_sizes_strides_broadcast_and_expanded():
    with FusionDefinition() as fd:
        t = fd.define_tensor(sizes=[4, 1, 6], strides=[0, 6, 1])
    assert domain_kinds(t) == ["e?", "b1", "i?"]
    assert t.contiguity == (None, None, True)


def test_define_tensor_static_sizes_expanded():
    with FusionDefinition() as fd:
        t = fd.define_tensor(sizes=[4, 6], strides=[0, 1], static_sizes=True)
    assert domain_kinds(t) == ["e4", "i6"]


# --------------------------------------------------------------------------------------------------------------
# from_pytorch

FROM_PYTORCH = {
    # name: (tensor maker, expected input line fragment)
    "contiguous": (lambda: make((4, 5)), "shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float, is_cpu=False)"),
    "transposed": (
        lambda: transposed((4, 5)),
        "shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float, is_cpu=False, stride_order=[0, 1])",
    ),
    "sliced": (lambda: sliced((4, 5)), "shape=[-1, -1], contiguity=[False, True], dtype=DataType.Float, is_cpu=False)"),
    "expanded": (lambda: expanded((4, 5), 1), "shape=[-1, -1], contiguity=[True, None], dtype=DataType.Float, is_cpu=False)"),
    "size1": (lambda: make((4, 1, 5)), "shape=[-1, 1, -1], contiguity=[True, None, True], dtype=DataType.Float, is_cpu=False)"),
    "permuted3d": (
        lambda: make((2, 3, 4)).permute(2, 0, 1),
        "shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.Float, is_cpu=False, stride_order=[0, 2, 1])",
    ),
    "all_size1": (lambda: make((1, 1)), "shape=[1, 1], contiguity=[None, None], dtype=DataType.Float, is_cpu=False)"),
    "empty": (lambda: make((0, 3)), "shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float, is_cpu=False)"),
}


@pytest.mark.parametrize("name", list(FROM_PYTORCH))
def test_from_pytorch(name):
    maker, line = FROM_PYTORCH[name]
    x = maker()
    fusion = lambda fd: fd.add_output(fd.ops.mul(fd.from_pytorch(x), 3.0))  # noqa: E731
    assert input_line(define(fusion)) == "tv0 = fd.define_tensor(" + line
    check_fusion(fusion, [x], lambda x: x * 3.0)


def test_from_pytorch_static_sizes():
    x = make((4, 5))
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x, static_sizes=True)
    assert domain_kinds(t) == ["i4", "i5"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_from_pytorch_zero_dim(dtype):
    x, y = make((), dtype), make((3, 4), dtype)

    def fusion(fd):
        s, t = fd.from_pytorch(x), fd.from_pytorch(y)
        assert s.ndim == 0
        # A 0-dim CPU tensor is a host scalar tensor (is_cpu); 0-dim device tensors are not.
        assert s.is_cpu == (x.device.type == "cpu")
        fd.add_output(fd.ops.logical_not(s))
        fd.add_output(fd.ops.set(t))

    out = check_fusion(fusion, [x, y], lambda x, y: [torch.logical_not(x), y.clone()])[0]
    assert out.shape == ()


def test_from_pytorch_cpu_scalar_tensor_is_cpu():
    x = torch.tensor(2.5)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.mul(t, 2.0))
    assert t.is_cpu
    assert "shape=[], contiguity=[], dtype=DataType.Float, is_cpu=True)" in repr(fd)
    assert fd.execute([x])[0].item() == 5.0


def test_from_pytorch_rejects_non_tensor():
    with pytest.raises(TypeError, match="from_pytorch"):
        with FusionDefinition() as fd:
            fd.from_pytorch([1, 2])


# --------------------------------------------------------------------------------------------------------------
# define_scalar


@pytest.mark.parametrize(
    "value,dtype,printed",
    [
        (3, DataType.Int, "fd.define_scalar(3, dtype=DataType.Int)"),
        (3.0, DataType.Double, "fd.define_scalar(3.00000, dtype=DataType.Double)"),
        (0.1, DataType.Double, "fd.define_scalar(0.1, dtype=DataType.Double)"),
        (True, DataType.Bool, "fd.define_scalar(True, dtype=DataType.Bool)"),
        (1 + 2j, DataType.ComplexDouble, "fd.define_scalar(complex(1.00000, 2.00000), dtype=DataType.ComplexDouble)"),
    ],
    ids=["int", "float", "float-inexact", "bool", "complex"],
)
def test_define_scalar_constant_inferred_dtype(value, dtype, printed):
    with FusionDefinition() as fd:
        s = fd.define_scalar(value)
        fd.add_output(s)
    assert s.dtype is dtype and s.is_constant and s.value == value
    assert s not in fd.fusion.inputs
    assert f"c0 = {printed}" in repr(fd)  # an output: a constant keeps its own line
    out = fd.execute([])[0]
    assert out == value and type(out) is type(value)
    rebuild_from_repr(fd)


@pytest.mark.parametrize(
    "value,dtype,stored",
    [(2, DataType.Double, 2.0), (2, DataType.Float, 2.0), (3.0, DataType.Int, 3), (1, DataType.Bool, True),
     (2.5, DataType.ComplexFloat, 2.5 + 0j), (7, DataType.Int32, 7)],
)
def test_define_scalar_explicit_dtype(value, dtype, stored):
    with FusionDefinition() as fd:
        s = fd.define_scalar(value, dtype=dtype)
    assert s.dtype is dtype and s.value == stored and type(s.value) is type(stored)


def test_define_scalar_positional_dtype():
    with FusionDefinition() as fd:
        s = fd.define_scalar(3.0, DataType.Float)
    assert s.dtype is DataType.Float


@pytest.mark.parametrize("dtype,value", [(None, 1.25), (DataType.Int, 5), (DataType.Bool, False), (DataType.ComplexDouble, 1 - 1j)])
def test_define_scalar_symbolic_input(dtype, value):
    x = make((2, 3))

    def fusion(fd):
        t = fd.from_pytorch(x)
        s = fd.define_scalar() if dtype is None else fd.define_scalar(dtype=dtype)
        assert s.is_symbolic() and s.dtype is (dtype or DataType.Double)
        fd.add_output(fd.ops.mul(t, s))

    check_fusion(fusion, [x, value], lambda x, s: x * s)
    assert "fd.define_scalar(None, dtype=DataType." in repr(define(fusion))


# --------------------------------------------------------------------------------------------------------------
# define_vector


def test_define_vector_of_symbolic_inputs_bound_from_flattened_list():
    x = make((12,))

    def fusion(fd):
        t = fd.from_pytorch(x)
        v = fd.define_vector(2)
        assert isinstance(v, Vector) and len(v) == 2 and all(e.is_symbolic() for e in v)
        fd.add_output(fd.ops.reshape(t, v))
        fd.add_output(fd.ops.mul(v[0], v[1]))

    fd = define(fusion)
    assert len(fd.fusion.inputs) == 3
    for inputs in ([x, [3, 4]], [x, (3, 4)], [x, 3, 4]):
        out, n = fd.execute(inputs)
        assert out.shape == (3, 4) and n == 12
    out = check_fusion(fusion, [x, [6, 2]], lambda x, shape: [x.reshape(shape), shape[0] * shape[1]])[0]
    assert out.shape == (6, 2)


def test_define_vector_of_ints_and_scalars():
    x = make((12,))

    def fusion(fd):
        t = fd.from_pytorch(x)
        s = fd.define_scalar(dtype=DataType.Int)
        v = fd.define_vector([s, 4])
        assert v[1].is_constant and v[1].value == 4 and v[0] is s
        fd.add_output(fd.ops.reshape(t, v))

    assert "fd.define_vector([c0, 4], dtype=DataType.Int)" in repr(define(fusion))
    check_fusion(fusion, [x, 3], lambda x, s: x.reshape(s, 4))


def test_define_vector_rejects_non_integers():
    with pytest.raises(TypeError, match="define_vector"):
        with FusionDefinition() as fd:
            fd.define_vector([2, 1.5])


# --------------------------------------------------------------------------------------------------------------
# add_output and aliases


def test_execute_returns_list_in_add_output_order():
    x = make((3, 4))

    def fusion(fd):
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.exp(t))
        fd.add_output(fd.ops.neg(t))
        fd.add_output(fd.ops.exp(t))

    outs = check_fusion(fusion, [x], lambda x: [torch.exp(x), torch.neg(x), torch.exp(x)])
    assert isinstance(outs, list) and len(outs) == 3


def test_same_value_added_twice():
    x = make((3, 4))

    def fusion(fd):
        y = fd.ops.exp(fd.from_pytorch(x))
        fd.add_output(y)
        fd.add_output(y)

    check_fusion(fusion, [x], lambda x: [torch.exp(x), torch.exp(x)])


def test_alias_output_updates_input_and_is_not_returned():
    x = make((3, 4))
    buf = x.clone()
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.add(t, 1.0), t)
    assert "fd.add_output(tv1, tv0)" in repr(fd)
    outs = fd.execute([buf])
    assert outs == []
    torch.testing.assert_close(buf, x + 1.0)
    rebuild_from_repr(fd)


def test_alias_output_also_added_plainly_is_returned():
    x, y = make((3, 4)), make((3, 4))
    buf = x.clone()
    with FusionDefinition() as fd:
        t, u = fd.from_pytorch(x), fd.from_pytorch(y)
        out = fd.ops.mul(t, u)
        fd.add_output(out, t)
        fd.add_output(out)
        fd.add_output(fd.ops.sub(t, u))
    outs = fd.execute([buf, y])
    assert len(outs) == 2
    torch.testing.assert_close(buf, x * y)
    torch.testing.assert_close(outs[0], x * y)
    # The other output reads the input before the in-place write.
    torch.testing.assert_close(outs[1], x - y)


def test_alias_into_transposed_input_keeps_its_layout():
    x = transposed((3, 4))
    buf = x.clone()
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.mul(t, 2.0), t)
    fd.execute([buf])
    assert buf.stride() == x.stride()
    torch.testing.assert_close(buf, x * 2.0)


# --------------------------------------------------------------------------------------------------------------
# execute options, validate, manual_execute


def test_unknown_option_raises_option_error():
    x = make((2, 2))
    fd = define(lambda fd: fd.add_output(fd.ops.exp(fd.from_pytorch(x))))
    with pytest.raises(OptionError, match="no_such_option"):
        fd.execute([x], _enable_options=["no_such_option"])
    with pytest.raises(OptionError, match="no_such_option"):
        fd.execute([x], _disable_options=["no_such_option"])
    with pytest.raises(OptionError, match="list"):
        fd.execute([x], _enable_options="check_layouts")  # a bare string is not a list of names
    # Known options are accepted and do not change the result.
    torch.testing.assert_close(fd.execute([x], _disable_options=["infer_contiguity"])[0], torch.exp(x))
    torch.testing.assert_close(fd.execute([x], _enable_options=["check_layouts"])[0], torch.exp(x))


def test_validate_passes_and_fails():
    x = make((3, 4))
    fd = define(lambda fd: fd.add_output(fd.ops.sigmoid(fd.from_pytorch(x))))
    fd.validate([x])  # against the ATen reference evaluation
    fd.validate([x], [torch.sigmoid(x)])
    with pytest.raises(AssertionError):
        fd.validate([x], [torch.sigmoid(x) + 1.0])
    # Given references are compared in values, shapes and dtypes (as nvFuser does); strides are checked against
    # the ATen evaluation only.
    fd.validate([x], [torch.sigmoid(x).t().contiguous().t()])
    with pytest.raises(AssertionError, match="dtype|float64"):
        fd.validate([x], [torch.sigmoid(x).double()])
    with pytest.raises(AssertionError, match="outputs"):
        fd.validate([x], [])


def test_validate_with_alias_output_uses_copies_for_the_reference():
    x = make((3, 4))
    buf = x.clone()
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.add(t, 1.0), t)
        fd.add_output(fd.ops.mul(t, 2.0))
    fd.validate([buf])
    torch.testing.assert_close(buf, x + 1.0)  # updated exactly once


def test_manual_execute():
    x, y = make((3, 4)), transposed((3, 4))
    fd = define(lambda fd: fd.add_output(fd.ops.atan2(fd.from_pytorch(x), fd.from_pytorch(y))))
    out = fd.manual_execute([x, y])
    assert isinstance(out, list)
    torch.testing.assert_close(out[0], torch.atan2(x, y))
    with pytest.raises(InputValidationError):
        fd.manual_execute([x])


def test_failed_execute_leaves_fusion_and_cache_usable():
    x = make((3, 4))
    fd = define(lambda fd: fd.add_output(fd.ops.mul(fd.from_pytorch(x), 2.0)))
    with pytest.raises(InputValidationError):
        fd.execute([make((3, 4, 5))])
    with pytest.raises(TypeError):
        fd.execute([x.double()])
    torch.testing.assert_close(fd.execute([x])[0], x * 2.0)
    with pytest.raises(InputValidationError):
        fd.execute([])
    y = make((6, 2))
    torch.testing.assert_close(fd.execute([y])[0], y * 2.0)
    torch.testing.assert_close(fd.execute([x])[0], x * 2.0)


def test_execute_builds_no_shared_cache_between_definitions():
    x = make((3, 4))
    fd1 = define(lambda fd: fd.add_output(fd.ops.exp(fd.from_pytorch(x))))
    fd2 = define(lambda fd: fd.add_output(fd.ops.exp(fd.from_pytorch(x))))
    fd1.execute([x])
    assert fd2.last_runtime() is None


def test_exception_inside_definition_is_reraised():
    with pytest.raises(ValueError):
        with FusionDefinition() as fd:
            fd.define_tensor(shape=[-2])


def test_definition_is_closed_after_the_with_block():
    with FusionDefinition() as fd:
        t = fd.define_tensor(shape=[-1], contiguity=True)
    with pytest.raises(ValueError, match="finalized|active fusion"):
        fd.ops.exp(t)


# --------------------------------------------------------------------------------------------------------------
# repr


def test_repr_text_format():
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float, is_cpu=False)
        s = fd.define_scalar(3.0, dtype=DataType.Double)
        t1 = fd.ops.mul(t0, s)
        t2 = fd.ops.add(t1, 2)
        fd.add_output(t2)
    assert repr(fd) == (
        "def nvfuser_fusion(fd : FusionDefinition) -> None :\n"
        "    tv0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float, is_cpu=False)\n"
        "    tv1 = fd.ops.mul(tv0, 3.00000)\n"
        "    tv2 = fd.ops.add(tv1, 2)\n"
        "    fd.add_output(tv2)\n"
    )


def test_repr_is_runnable_and_rebuilds_an_equal_fusion():
    x, y = transposed((3, 4), torch.bfloat16), make((3, 1), torch.bfloat16)

    def fusion(fd):
        a, b = fd.from_pytorch(x), fd.from_pytorch(y)
        s = fd.define_scalar(dtype=DataType.Double)
        c = fd.ops.where(fd.ops.gt(a, 0.5), fd.ops.mul(a, s), fd.ops.cast(b, DataType.Float))
        fd.add_output(fd.ops.cast(c, DataType.BFloat16))
        fd.add_output(fd.ops.isnan(c))

    fd = define(fusion)
    scope = {"FusionDefinition": FusionDefinition, "DataType": DataType}
    exec(repr(fd), scope)
    with FusionDefinition() as fd2:
        scope["nvfuser_fusion"](fd2)
    assert repr(fd2) == repr(fd)
    inputs = [x, y, 0.25]
    for a, b in zip(fd.execute(inputs), fd2.execute(inputs)):
        assert torch.equal(a, b) and a.stride() == b.stride()


def test_repr_special_floats_round_trip():
    x = make((2, 3))

    def fusion(fd):
        t = fd.from_pytorch(x)
        t = fd.ops.add(t, float("inf"))
        t = fd.ops.mul(t, float("nan"))
        fd.add_output(fd.ops.add(t, -0.0))
        fd.add_output(fd.ops.mul(fd.from_pytorch(x), 1e-300))

    text = repr(define(fusion))
    assert 'float("inf")' in text and 'float("nan")' in text and "1e-300" in text
    check_fusion(fusion, [x, x], lambda x, y: [x + float("inf") * float("nan") - 0.0, y * 1e-300])


def test_repr_prints_numpy_scalars_as_python_numbers():
    np = pytest.importorskip("numpy")
    x = make((2, 3))
    fusion = lambda fd: fd.add_output(fd.ops.add(fd.ops.mul(fd.from_pytorch(x), np.float32(2.5)), np.int64(3)))  # noqa: E731
    text = repr(define(fusion))
    assert "fd.ops.mul(tv0, 2.5)" in text and "fd.ops.add(tv1, 3)" in text
    check_fusion(fusion, [x], lambda x: x * 2.5 + 3)


def test_empty_definition_repr():
    assert "empty" in repr(FusionDefinition())


# --------------------------------------------------------------------------------------------------------------
# LRUCache


def _fusion_scaled(k):
    def fusion(fd):
        t = fd.define_tensor(shape=[-1, -1], contiguity=True)
        fd.add_output(fd.ops.mul(t, k))

    return fusion


def test_lru_cache_shares_structurally_equal_fusions():
    cache = LRUCache(max_fusions=8)
    x = make((3, 4))
    fec1 = cache.cache_compile(define(_fusion_scaled(2.0)))
    assert cache.num_fusions() == 1
    fec2 = cache.cache_compile(define(_fusion_scaled(2.0)))
    assert cache.num_fusions() == 1 and fec2 is fec1
    fec3 = cache.cache_compile(define(_fusion_scaled(3.0)))
    assert cache.num_fusions() == 2 and fec3 is not fec1
    torch.testing.assert_close(fec1.execute([x])[0], x * 2.0)
    torch.testing.assert_close(fec3.execute([x])[0], x * 3.0)


def test_lru_cache_distinguishes_dtypes_and_layouts():
    cache = LRUCache(max_fusions=8)
    for dtype in (DataType.Float, DataType.Half):
        for contiguity in (True, False):
            for _ in range(2):
                cache.cache_compile(define(lambda fd: fd.add_output(fd.ops.exp(fd.define_tensor([-1], contiguity, dtype)))))
    assert cache.num_fusions() == 4


def test_lru_cache_evicts_least_recently_used():
    cache = LRUCache(max_fusions=2)
    a = cache.cache_compile(define(_fusion_scaled(1.0)))
    cache.cache_compile(define(_fusion_scaled(2.0)))
    assert cache.cache_compile(define(_fusion_scaled(1.0))) is a  # touch: 2.0 is now least recent
    cache.cache_compile(define(_fusion_scaled(3.0)))  # evicts 2.0
    assert cache.num_fusions() == 2
    assert cache.cache_compile(define(_fusion_scaled(1.0))) is a
    cache.cache_compile(define(_fusion_scaled(2.0)))  # rebuilt, evicting 3.0
    assert cache.num_fusions() == 2


def test_lru_cache_capacity_must_be_positive():
    with pytest.raises(ValueError):
        LRUCache(max_fusions=0)


# --------------------------------------------------------------------------------------------------------------
# compute_tensor_descriptor and dtype conversions


@pytest.mark.parametrize(
    "sizes,strides,contiguity,order",
    [
        ([4, 3], [5, 1], [False, True], [1, 0]),  # [4, 5][:, :3]
        ([4, 3], [1, 4], [True, True], [0, 1]),  # transposed [3, 4]
        ([2, 2, 2, 2], [8, 4, 0, 2], [True, True, None, False], [3, 2, 1, 0]),
        ([3, 1, 4], [4, 4, 1], [True, None, True], [2, 1, 0]),
        ([2, 3], [0, 0], [None, None], [1, 0]),
        ([], [], [], []),
    ],
    ids=["sliced", "transposed", "spec-stride0", "size1", "all-stride0", "0-dim"],
)
def test_compute_tensor_descriptor(sizes, strides, contiguity, order):
    assert compute_tensor_descriptor(sizes, strides) == (contiguity, order)


def test_compute_tensor_descriptor_matches_from_pytorch():
    for x in (make((4, 5))[:, :3], transposed((4, 3)), make((2, 3, 4)).permute(1, 2, 0), expanded((3, 4), 0)):
        contiguity, order = compute_tensor_descriptor(x.shape, x.stride())
        with FusionDefinition() as fd:
            t = fd.from_pytorch(x)
        assert list(t.contiguity) == contiguity and t.stride_order() == order


def test_compute_tensor_descriptor_rejects_negative_strides():
    with pytest.raises(ValueError, match="negative"):
        compute_tensor_descriptor([2, 3], [3, -1])


@pytest.mark.parametrize(
    "torch_dtype,dtype",
    [
        (torch.float32, DataType.Float),
        (torch.float64, DataType.Double),
        (torch.float16, DataType.Half),
        (torch.bfloat16, DataType.BFloat16),
        (torch.long, DataType.Int),
        (torch.int32, DataType.Int32),
        (torch.bool, DataType.Bool),
        (torch.complex64, DataType.ComplexFloat),
        (torch.complex128, DataType.ComplexDouble),
        (torch.float8_e4m3fn, DataType.Float8_e4m3fn),
        (torch.float8_e5m2, DataType.Float8_e5m2),
        (torch.float8_e8m0fnu, DataType.Float8_e8m0fnu),
        (torch.float4_e2m1fn_x2, DataType.Float4_e2m1fn_x2),
    ],
)
def test_torch_dtype_to_nvfuser_dtype(torch_dtype, dtype):
    from pyfuser.pytorch_utils import torch_dtype_to_nvfuser_dtype

    assert torch_dtype_to_nvfuser_dtype(torch_dtype) is dtype
    assert pyfuser.frontend.pytorch_utils.nvfuser_dtype_to_torch_dtype(dtype) == torch_dtype


def test_torch_dtype_without_datatype_raises():
    with pytest.raises(TypeError, match="uint8"):
        nvfuser_direct.pytorch_utils.torch_dtype_to_nvfuser_dtype(torch.uint8)


# --------------------------------------------------------------------------------------------------------------
# nvFuser-style usage: module alias, operator overloads, size/shape


def test_nvfuser_direct_style_usage():
    x, y = make((2, 4, 8)), make((2, 4, 8))
    with nvfuser_direct.FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=nvfuser_direct.DataType.Float,
                              is_cpu=False, stride_order=[2, 1, 0])
        t1 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=nvfuser_direct.DataType.Float)
        c0 = fd.define_scalar(3.0)
        t2 = fd.ops.add(t0, t1)
        fd.add_output(fd.ops.mul(t2, c0))
    out = fd.execute([x, y])
    torch.testing.assert_close(out[0], (x + y) * 3.0)
    assert t0.dtype() is DataType.Float  # nvFuser spells it as a method


def test_operator_overloads():
    x, y = make((3, 4)), make((3, 4), low=0.5, high=2.0)

    def fusion(fd):
        a, b = fd.from_pytorch(x), fd.from_pytorch(y)
        fd.add_output(a + b)
        fd.add_output(a * 2.0)
        fd.add_output(1.0 - a)
        fd.add_output(-a)
        fd.add_output(a / b)
        fd.add_output(abs(a))
        fd.add_output(b ** 2)
        fd.add_output(a < b)
        fd.add_output(3 * a)

    refs = lambda x, y: [x + y, x * 2.0, 1.0 - x, -x, x / y, abs(x), y**2, x < y, 3 * x]  # noqa: E731
    check_fusion(fusion, [x, y], refs)
    text = repr(define(fusion))
    assert "fd.ops.add(tv0, tv1)" in text and "fd.ops.mul(tv0, 2.00000)" in text and "fd.ops.sub(1.00000, tv0)" in text


def test_size_and_shape():
    x = make((3, 5))

    def fusion(fd):
        t = fd.from_pytorch(x)
        n0 = t.size(0)
        dims = fd.ops.shape(t)
        assert isinstance(n0, Scalar) and n0.dtype is DataType.Int and len(dims) == 2
        fd.add_output(fd.ops.mul(n0, dims[1]))
        fd.add_output(fd.ops.div(t, dims[1]))
        fd.add_output(fd.ops.size(t, -1))

    check_fusion(fusion, [x], lambda x: [15, x / 5, 5])
    assert "fd.ops.size(tv0, dim=1)" in repr(define(fusion))


def test_ops_namespace_lists_ops_and_rejects_unknown():
    fd = FusionDefinition()
    assert {"add", "exp", "cast", "where", "shape"} <= set(dir(fd.ops))
    with pytest.raises(NotImplementedError, match="no_such_op"):
        fd.ops.no_such_op


def test_tensor_view_repr_and_queries():
    with FusionDefinition() as fd:
        t = fd.define_tensor(shape=[-1, 1, 4], contiguity=[True, None, True])
    assert isinstance(t, TensorView) and t.ndim == 3 and repr(t) == "T0"
    assert t.static_shape() == [None, 1, 4]


def test_define_tensor_overload3_positional():
    """nvFuser's define_tensor(sizes, strides, dtype, static_sizes, is_cpu): the 4th positional argument is
    static_sizes (it used to land in is_cpu)."""
    with FusionDefinition() as fd:
        t = fd.define_tensor([4, 5], [5, 1], DataType.Half, True)
        u = fd.define_tensor([4, 5], [5, 1], DataType.Half, False)
        s = fd.define_tensor([], [], DataType.Float, False, True)
    assert t.static_shape() == [4, 5] and not t.is_cpu
    assert u.static_shape() == [None, None]
    assert s.is_cpu
