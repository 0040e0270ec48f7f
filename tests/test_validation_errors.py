"""Errors, each with its exception type and a message that says where and what.

1. execute-time input validation: one test per check; each message names the input position and the expected
   and the found value;
2. definition-time errors of the frontend (define_tensor, define_scalar, define_vector, add_output);
3. definition-time errors of the elementwise ops (messages start with ``fd.ops.<name>:`` and name the argument).

pyfuser's exception classes subclass the builtin a caller would catch (ValueError, TypeError, RuntimeError),
which the tests check too.
"""

from __future__ import annotations

import pytest
import torch

from harness import DEVICE, define, make
from pyfuser import DataType, FusionDefinition
from pyfuser.errors import (
    FusionDefinitionError,
    FusionDtypeError,
    InputDeviceError,
    InputTypeError,
    InputValidationError,
    UnsupportedOpError,
)


def raises(exc, fn, *fragments):
    """Run ``fn``; it must raise ``exc`` with every fragment in the message."""
    with pytest.raises(exc) as info:
        fn()
    msg = str(info.value)
    for fragment in fragments:
        assert fragment in msg, f"{fragment!r} not in {msg!r}"
    return info.value


def defining(body):
    """A callable that defines a fusion with ``body(fd)`` (for errors raised while defining)."""

    def run():
        with FusionDefinition() as fd:
            body(fd)

    return run


@pytest.fixture(autouse=True)
def _quiet(capsys):
    # FusionDefinition prints the exception of a failed definition (as nvFuser does); keep test output clean.
    yield
    capsys.readouterr()


def test_error_classes_subclass_builtins():
    assert issubclass(FusionDefinitionError, ValueError)
    assert issubclass(FusionDtypeError, TypeError) and issubclass(FusionDtypeError, FusionDefinitionError)
    assert issubclass(InputValidationError, ValueError)
    assert issubclass(InputTypeError, TypeError) and issubclass(InputTypeError, InputValidationError)
    assert issubclass(InputDeviceError, RuntimeError) and issubclass(InputDeviceError, InputValidationError)
    assert issubclass(UnsupportedOpError, NotImplementedError)
    # nvFuser raises every failed check as a RuntimeError; code written for it catches ours the same way.
    for cls in (FusionDefinitionError, FusionDtypeError, InputValidationError, InputTypeError, InputDeviceError,
                UnsupportedOpError):
        assert issubclass(cls, RuntimeError), cls


# --------------------------------------------------------------------------------------------------------------
# 1. execute-time input validation


def _two_tensor_fusion():
    def fusion(fd):
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        t1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        fd.add_output(fd.ops.add(t0, t1))

    return define(fusion)


def _scalar_fusion(dtype):
    def fusion(fd):
        s = fd.define_scalar(dtype=dtype)
        t = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
        fd.add_output(fd.ops.where(fd.ops.cast(s, DataType.Bool), t, 0.0))

    return define(fusion)


def test_wrong_number_of_inputs():
    fd, x = _two_tensor_fusion(), make((3, 4))
    raises(InputValidationError, lambda: fd.execute([x]), "expected 2 inputs (T0, T1)", "got 1")
    raises(ValueError, lambda: fd.execute([x, x, x]), "expected 2 inputs", "got 3")


def test_inputs_not_a_list():
    fd, x = _two_tensor_fusion(), make((3, 4))
    raises(InputTypeError, lambda: fd.execute(x), "list of inputs", "Tensor")


def test_tensor_expected_but_scalar_given():
    fd, x = _two_tensor_fusion(), make((3, 4))
    raises(InputTypeError, lambda: fd.execute([x, 1.5]), "input 1 (T1)", "must be a tensor", "got float 1.5",
           "Expected input 1, T1, to be an at::Tensor but got scalar 1.5")  # (nvFuser's sentence, as it prints)
    raises(InputTypeError, lambda: fd.execute([x, 2.0]), "to be an at::Tensor but got scalar 2)")


def test_scalar_expected_but_tensor_given():
    fd, x = _scalar_fusion(DataType.Double), make((3,))
    raises(InputTypeError, lambda: fd.execute([x, x]), "input 0 (S0)", "DataType.Double scalar", "torch.float32 tensor",
           "Expected input 0, S0, to be a scalar but got float tensor of rank 1")


def test_wrong_dtype():
    fd, x = _two_tensor_fusion(), make((3, 4))
    raises(TypeError, lambda: fd.execute([x, x.double()]), "input 1 (T1)", "dtype torch.float32", "got torch.float64",
           "Expected input 1, T1, to be bound to a tensor of dtype float, but got a tensor of dtype double")
    raises(TypeError, lambda: fd.execute([x, x.half()]), "but got a tensor of dtype __half")


def test_wrong_rank():
    fd, x = _two_tensor_fusion(), make((3, 4))
    raises(InputValidationError, lambda: fd.execute([x[None], x]), "input 0 (T0)", "rank 2", "got rank 3")


def test_device_mismatch():
    # Meta tensors stand in for a second device on a CPU-only machine.
    fd, x = _two_tensor_fusion(), make((3, 4))
    other = torch.empty(3, 4, device="meta")
    raises(InputDeviceError, lambda: fd.execute([x, other]), "input 1 (T1)", "is on meta", f"runs on {x.device}")


def test_is_cpu_tensor_given_a_non_cpu_tensor():
    def fusion(fd):
        s = fd.define_tensor(shape=[], contiguity=[], dtype=DataType.Float, is_cpu=True)
        fd.add_output(fd.ops.mul(s, 2.0))

    fd = define(fusion)
    raises(
        InputDeviceError,
        lambda: fd.execute([torch.empty((), device="meta")]),
        "input 0 (T0)",
        "is_cpu=True",
        "CPU tensor",
        "on meta",
    )
    assert fd.execute([torch.tensor(1.5)])[0].item() == 3.0


def test_wrong_static_extent():
    fd = define(lambda fd: fd.add_output(fd.ops.exp(fd.define_tensor(shape=[4, 5], contiguity=True))))
    raises(InputValidationError, lambda: fd.execute([make((4, 6))]), "input 0 (T0)", "dim 1", "static extent 5", "got 6")


def test_broadcast_dim_with_size_other_than_1():
    fd = define(lambda fd: fd.add_output(fd.ops.exp(fd.define_tensor(shape=[-1, 1], contiguity=[True, None]))))
    raises(InputValidationError, lambda: fd.execute([make((4, 3))]), "input 0 (T0)", "dim 1", "broadcast", "size 1", "got 3")


def test_expanded_dim_with_nonzero_stride():
    fd = define(lambda fd: fd.add_output(fd.ops.exp(fd.define_tensor(shape=[-1, -1], contiguity=[None, True]))))
    raises(
        InputValidationError, lambda: fd.execute([make((4, 3))]), "input 0 (T0)", "dim 0", "expanded", "stride 0", "got stride 3"
    )
    fd.execute([make((1, 3)).expand(4, 3)])  # the declared layout passes


def test_strides_contradicting_contiguity():
    fd = define(lambda fd: fd.add_output(fd.ops.exp(fd.define_tensor(shape=[-1, -1], contiguity=[True, True]))))
    x = make((4, 8))[:, :5]
    raises(
        InputValidationError,
        lambda: fd.execute([x]),
        "input 0 (T0)",
        "strides [8, 1]",
        "contiguity [True, True]",
        "dim 0 must have stride 5",
    )


def test_strides_contradicting_stride_order():
    def fusion(fd):
        fd.add_output(fd.ops.exp(fd.define_tensor(shape=[-1, -1], contiguity=[False, False], stride_order=[0, 1])))

    fd = define(fusion)
    raises(
        InputValidationError,
        lambda: fd.execute([make((4, 3))]),
        "input 0 (T0)",
        "strides [3, 1]",
        "stride_order [0, 1]",
        "dim 1 is outer to dim 0",
    )
    fd.execute([make((3, 4)).t()])  # column-major passes


@pytest.mark.parametrize(
    "dtype,value,found",
    [
        (DataType.Int, 1.5, "float 1.5"),
        (DataType.Int, True, "bool True"),
        (DataType.Int32, "3", "str '3'"),
        (DataType.Bool, 1, "int 1"),
        (DataType.Bool, 0.0, "float 0.0"),
        (DataType.Double, True, "bool True"),
        (DataType.Double, 1j, "complex 1j"),
        (DataType.ComplexDouble, None, "NoneType None"),
    ],
    ids=["float-for-Int", "bool-for-Int", "str-for-Int32", "int-for-Bool", "float-for-Bool", "bool-for-Double",
         "complex-for-Double", "None-for-Complex"],
)
def test_scalar_of_wrong_type(dtype, value, found):
    fd = _scalar_fusion(dtype)
    raises(InputTypeError, lambda: fd.execute([value, make((3,))]), "input 0 (S0)", f"{dtype!r} scalar", f"got {found}")


def test_scalar_of_wrong_type_carries_nvfusers_sentence():
    fd = _scalar_fusion(DataType.Double)
    raises(InputTypeError, lambda: fd.execute([2.0 + 1.0j, make((3,))]),
           "Scalar value (2,1) is not compatible with the expected data type: double.")
    raises(InputTypeError, lambda: fd.execute([True, make((3,))]),
           "Scalar value 1 is not compatible with the expected data type: double.")


def test_int_scalar_out_of_range():
    fd = _scalar_fusion(DataType.Int32)
    raises(InputValidationError, lambda: fd.execute([2**31, make((3,))]), "input 0 (S0)", "DataType.Int32", "got 2147483648")


def test_failed_validation_then_good_call():
    fd, x = _two_tensor_fusion(), make((3, 4))
    with pytest.raises(InputValidationError):
        fd.execute([x, make((3, 8))[:, :4]])
    torch.testing.assert_close(fd.execute([x, x])[0], x + x)


# --------------------------------------------------------------------------------------------------------------
# 2. frontend definition-time errors


@pytest.mark.parametrize("shape,fragment", [([-1, -2], "shape[1]=-2"), ([1.5], "shape[0]=1.5"), ([True], "shape[0]=True"),
                                            (3, "list of ints")], ids=["neg", "float", "bool", "not-a-list"])
def test_define_tensor_bad_shape_entry(shape, fragment):
    raises(FusionDefinitionError, defining(lambda fd: fd.define_tensor(shape=shape, contiguity=True)), "define_tensor", fragment)


def test_define_tensor_contiguity_length_mismatch():
    raises(
        FusionDefinitionError,
        defining(lambda fd: fd.define_tensor(shape=[-1, -1], contiguity=[True])),
        "contiguity has 1 entries",
        "rank 2",
    )


@pytest.mark.parametrize("flag", [True, False])
def test_define_tensor_contiguity_on_shape_1_dim(flag):
    raises(
        FusionDefinitionError,
        defining(lambda fd: fd.define_tensor(shape=[1, -1], contiguity=[flag, True])),
        "dim 0 has shape 1",
        "must be None",
        f"got {flag}",
    )


def test_define_tensor_bad_contiguity_entry():
    raises(FusionDefinitionError, defining(lambda fd: fd.define_tensor(shape=[-1], contiguity=["yes"])), "contiguity[0]='yes'")
    raises(FusionDefinitionError, defining(lambda fd: fd.define_tensor(shape=[-1], contiguity="yes")), "contiguity must be")


@pytest.mark.parametrize(
    "order,fragment",
    [([0, 0], "duplicate"), ([0, 2], "stride_order[1]=2 is out of range"), ([0, -3], "out of range"), ([0], "1 entries")],
    ids=["duplicate", "too-large", "too-negative", "wrong-length"],
)
def test_define_tensor_bad_stride_order(order, fragment):
    raises(
        FusionDefinitionError,
        defining(lambda fd: fd.define_tensor(shape=[-1, -1], contiguity=True, stride_order=order)),
        "stride_order",
        fragment,
    )


def test_define_tensor_is_cpu_on_non_0_dim():
    raises(
        FusionDefinitionError,
        defining(lambda fd: fd.define_tensor(shape=[-1], contiguity=True, is_cpu=True)),
        "is_cpu=True",
        "0-dim",
        "rank 1",
    )


@pytest.mark.parametrize("dtype", [DataType.Null, torch.float32], ids=["Null", "torch-dtype"])
def test_define_tensor_bad_dtype(dtype):
    raises(FusionDtypeError, defining(lambda fd: fd.define_tensor(shape=[-1], contiguity=True, dtype=dtype)), "dtype")


@pytest.mark.parametrize(
    "kwargs,fragment",
    [
        (dict(shape=[2], sizes=[2], strides=[1]), "not both"),
        (dict(sizes=[2], strides=[1], stride_order=[0]), "not both"),
        (dict(sizes=[2]), "'sizes' and 'strides' are required"),
        (dict(sizes=[2, 3], strides=[1]), "2 sizes but 1 strides"),
        (dict(sizes=[-1, 3], strides=[3, 1]), "sizes[0]=-1"),
        (dict(sizes=[2, 3], strides=[3, -1]), "negative stride"),
    ],
    ids=["shape-and-sizes", "stride_order-and-strides", "no-strides", "length", "negative-size", "negative-stride"],
)
def test_define_tensor_bad_sizes_strides(kwargs, fragment):
    raises(FusionDefinitionError, defining(lambda fd: fd.define_tensor(**kwargs)), "define_tensor", fragment)


@pytest.mark.parametrize("value", [3, "T0", None], ids=["int", "str", "None"])
def test_add_output_of_non_val(value):
    raises(FusionDefinitionError, defining(lambda fd: fd.add_output(value)), "add_output", "TensorView or Scalar")


def test_add_output_of_vector():
    raises(FusionDefinitionError, defining(lambda fd: fd.add_output(fd.define_vector(2))), "add_output", "Vector")


def test_add_output_of_another_fusions_value():
    with FusionDefinition() as other:
        foreign = other.define_tensor(shape=[-1], contiguity=True)
    raises(FusionDefinitionError, defining(lambda fd: fd.add_output(foreign)), "another fusion")


def test_alias_dtype_mismatch():
    def body(fd):
        t = fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.Float)
        fd.add_output(fd.ops.cast(t, DataType.Half), t)

    raises(FusionDtypeError, defining(body), "add_output", "DataType.Half", "alias input T0 is DataType.Float")


def test_alias_target_must_be_an_input():
    def body(fd):
        t = fd.define_tensor(shape=[-1], contiguity=True)
        fd.add_output(fd.ops.exp(t), fd.ops.neg(t))

    raises(FusionDefinitionError, defining(body), "alias_input must be a tensor input")


def test_alias_rank_mismatch():
    def body(fd):
        t = fd.define_tensor(shape=[-1], contiguity=True)
        u = fd.define_tensor(shape=[-1, -1], contiguity=True)
        fd.add_output(fd.ops.exp(u), t)

    raises(FusionDefinitionError, defining(body), "rank 2", "alias input T0 has rank 1")


def test_alias_of_a_scalar():
    def body(fd):
        t = fd.define_tensor(shape=[-1], contiguity=True)
        fd.add_output(fd.ops.add(fd.define_scalar(), 1.0), t)

    raises(FusionDefinitionError, defining(body), "only tensors")


@pytest.mark.parametrize(
    "kwargs,exc,fragment",
    [
        (dict(value="a"), FusionDtypeError, "Python number or None"),
        (dict(value=2.5, dtype=DataType.Int), FusionDtypeError, "2.5 is not an integer"),
        (dict(value=float("nan"), dtype=DataType.Int32), FusionDtypeError, "nan is not an integer"),
        (dict(value=1j, dtype=DataType.Double), FusionDtypeError, "complex value 1j"),
        (dict(value=1.0, dtype=DataType.Null), FusionDtypeError, "DataType.Null"),
        (dict(value=1.0, dtype=torch.float64), FusionDtypeError, "torch.float64"),
    ],
    ids=["str", "float-for-Int", "nan-for-Int32", "complex-for-Double", "Null", "torch-dtype"],
)
def test_define_scalar_errors(kwargs, exc, fragment):
    raises(exc, defining(lambda fd: fd.define_scalar(**kwargs)), "define_scalar", fragment)


@pytest.mark.parametrize(
    "make_values,exc,fragment",
    [
        (lambda fd: -1, FusionDefinitionError, ">= 0, got -1"),
        (lambda fd: [2, 1.5], FusionDtypeError, "element 1"),
        (lambda fd: [fd.define_scalar(2.0)], FusionDtypeError, "element 0 (S0) is DataType.Double"),
    ],
    ids=["negative-count", "float-element", "double-scalar-element"],
)
def test_define_vector_errors(make_values, exc, fragment):
    raises(exc, defining(lambda fd: fd.define_vector(make_values(fd))), "define_vector", fragment)


def test_ops_after_the_definition_is_closed():
    with FusionDefinition() as fd:
        t = fd.define_tensor(shape=[-1], contiguity=True)
    raises(FusionDefinitionError, lambda: fd.ops.exp(t), "finalized")
    raises(FusionDefinitionError, lambda: fd.add_output(t), "finalized")


# --------------------------------------------------------------------------------------------------------------
# 3. elementwise definition-time errors


def _tensors(fd, *specs):
    """Inputs from (shape, dtype) pairs."""
    return [fd.define_tensor(shape=list(shape), contiguity=True, dtype=dtype) for shape, dtype in specs]


def test_static_extent_mismatch():
    def body(fd):
        a, b = _tensors(fd, ([3, 4], DataType.Float), ([3, 5], DataType.Float))
        fd.ops.mul(a, b)

    raises(FusionDefinitionError, defining(body), "fd.ops.mul:", "4 and 5")


def test_expanded_extent_mismatch():
    def body(fd):
        a = fd.define_tensor(shape=[3, 6], contiguity=[True, None])
        (b,) = _tensors(fd, ([3, 5], DataType.Float))
        fd.ops.sub(a, b)

    raises(FusionDefinitionError, defining(body), "fd.ops.sub:", "expanded extent 6", "5")


def test_neg_of_bool():
    def body(fd):
        (t,) = _tensors(fd, ([-1], DataType.Bool))
        fd.ops.neg(t)

    raises(FusionDtypeError, defining(body), "fd.ops.neg:", "'arg'", "DataType.Bool", "logical_not")


@pytest.mark.parametrize("op", ["bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift", "gcd"])
def test_bitwise_on_floats(op):
    def body(fd):
        a, b = _tensors(fd, ([-1], DataType.Int), ([-1], DataType.Float))
        getattr(fd.ops, op)(a, b)

    raises(FusionDtypeError, defining(body), f"fd.ops.{op}:", "argument 'rhs' of DataType.Float")


def test_shift_of_bool():
    def body(fd):
        (t,) = _tensors(fd, ([-1], DataType.Bool))
        fd.ops.bitwise_right_shift(t, 1)

    raises(FusionDtypeError, defining(body), "fd.ops.bitwise_right_shift:", "argument 'lhs' of DataType.Bool")


def test_where_with_non_bool_predicate():
    def body(fd):
        p, t = _tensors(fd, ([-1], DataType.Int), ([-1], DataType.Float))
        fd.ops.where(p, t, 0.0)

    raises(FusionDtypeError, defining(body), "fd.ops.where:", "'pred' must be Bool", "DataType.Int")


@pytest.mark.parametrize("dtype", [DataType.Null, torch.float16, "Half"], ids=["Null", "torch-dtype", "str"])
def test_cast_to_invalid_dtype(dtype):
    def body(fd):
        (t,) = _tensors(fd, ([-1], DataType.Float))
        fd.ops.cast(t, dtype)

    raises(FusionDtypeError, defining(body), "fd.ops.cast:", "'dtype'", repr(dtype))


def test_cast_of_scalar_to_fp4_is_refused():
    """FP4 values exist only packed in pairs inside tensors (test_ops_nvfp4.py covers tensor casts)."""

    def body(fd):
        fd.ops.cast(fd.define_scalar(1.0), DataType.Float4_e2m1fn)

    raises(FusionDtypeError, defining(body), "fd.ops.cast", "Float4_e2m1fn")


# (op, operand dtypes, argument named in the message, its position): dtypes an op does not accept.
UNSUPPORTED_DTYPES = [
    ("imag", [DataType.Float], "arg", 0),
    ("frac", [DataType.Int], "arg", 0),
    ("silu", [DataType.Int32], "arg", 0),
    ("erf", [DataType.ComplexFloat], "arg", 0),
    ("lgamma", [DataType.ComplexFloat], "arg", 0),
    ("relu", [DataType.Bool], "arg", 0),
    ("ceil", [DataType.ComplexFloat], "arg", 0),
    ("abs", [DataType.Bool], "arg", 0),
    ("sign", [DataType.ComplexFloat], "arg", 0),
    ("signbit", [DataType.ComplexFloat], "arg", 0),
    ("isposinf", [DataType.ComplexDouble], "arg", 0),
    ("bitwise_not", [DataType.Float], "arg", 0),
    ("rand_like", [DataType.Int], "arg", 0),
    ("randn_like", [DataType.ComplexFloat], "arg", 0),
    ("atan2", [DataType.Float, DataType.ComplexFloat], "rhs", 1),
    ("fmod", [DataType.ComplexFloat, DataType.Float], "lhs", 0),
    ("lt", [DataType.ComplexFloat, DataType.ComplexFloat], "lhs", 0),
    ("minimum", [DataType.Float, DataType.ComplexDouble], "rhs", 1),
    ("nextafter", [DataType.Int, DataType.Float], "lhs", 0),
    ("complex", [DataType.Float, DataType.Int], "imag", 1),
    ("lerp", [DataType.Float, DataType.Int, DataType.Float], "end", 1),
    ("clamp", [DataType.ComplexFloat, DataType.Float, DataType.Float], "arg", 0),
    ("threshold", [DataType.Float, DataType.ComplexFloat, DataType.Float], "threshold", 1),
]


@pytest.mark.parametrize(
    "op,dtypes,arg,pos", UNSUPPORTED_DTYPES, ids=[f"{o}-{'-'.join(d.name for d in dts)}" for o, dts, _, _ in UNSUPPORTED_DTYPES]
)
def test_unsupported_operand_dtype(op, dtypes, arg, pos):
    def body(fd):
        getattr(fd.ops, op)(*_tensors(fd, *[([-1], dt) for dt in dtypes]))

    raises(FusionDtypeError, defining(body), f"fd.ops.{op}:", f"argument '{arg}' of {dtypes[pos]!r}")


@pytest.mark.parametrize("op", ["sub", "pow", "fmod", "remainder"])
def test_bool_arithmetic(op):
    def body(fd):
        a, b = _tensors(fd, ([-1], DataType.Bool), ([-1], DataType.Bool))
        getattr(fd.ops, op)(a, b)

    raises(FusionDtypeError, defining(body), f"fd.ops.{op}:", "Bool")


@pytest.mark.parametrize("dtype", [DataType.BFloat16, DataType.Half])
def test_nextafter_needs_full_precision(dtype):
    def body(fd):
        a, b = _tensors(fd, ([-1], dtype), ([-1], dtype))
        fd.ops.nextafter(a, b)

    raises(FusionDtypeError, defining(body), "fd.ops.nextafter:", repr(dtype), "Float and Double")


@pytest.mark.parametrize("bad", ["x", [1.0, 2.0], None, torch.ones(2)], ids=["str", "list", "None", "torch-tensor"])
def test_operand_that_is_not_a_value(bad):
    def body(fd):
        (t,) = _tensors(fd, ([-1], DataType.Float))
        fd.ops.add(t, bad)

    raises(FusionDtypeError, defining(body), "fd.ops.add:", "argument 'rhs' must be a tensor or a scalar")


def test_operands_from_different_fusions():
    with FusionDefinition() as other:
        foreign = other.define_tensor(shape=[-1], contiguity=True)

    def body(fd):
        (t,) = _tensors(fd, ([-1], DataType.Float))
        fd.ops.add(t, foreign)

    raises(FusionDefinitionError, defining(body), "fd.ops.add:", "different fusions")
