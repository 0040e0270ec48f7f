"""Scalar forms nvFuser's direct frontend accepts: a cast of a scalar constant (printed as a cast of a literal, which
the printed definition must rebuild), reshape extents computed in floating point (nvFuser converts each extent to
its index type, truncating), and the dtypes of scalar math on Int scalars."""

from __future__ import annotations

import pytest
import torch

from harness import check_fusion, define, make
from pyfuser import DataType
from pyfuser.errors import FusionDtypeError, FusionExecutionError


@pytest.mark.parametrize("value, dtype, expected", [
    (3.0, DataType.Int32, 3), (-2.75, DataType.Int, -2), (2.5, DataType.Bool, True), (0.0, DataType.Bool, False),
    (7, DataType.Double, 7.0), (-0.0, DataType.Float, -0.0),
])
def test_cast_of_a_scalar_constant(value, dtype, expected):
    x = make((2, 4, 8), torch.float64)
    x[0, 0, 0], x[0, 0, 1] = float("nan"), float("-inf")

    def fusion(fd):
        t = fd.from_pytorch(x)
        c = fd.ops.cast(fd.define_scalar(value), dtype)
        fd.add_output(fd.ops.mul(t, fd.ops.cast(c, DataType.Double)))

    check_fusion(fusion, [x], lambda x: x * torch.tensor(float(expected), dtype=torch.float64))


def test_cast_scalar_times_int_tensor_summed_in_int32():
    a = torch.randint(-5, 6, (2, 4, 8), dtype=torch.int32)
    b = torch.randint(-5, 6, (2, 4, 8), dtype=torch.int32)

    def fusion(fd):
        t0, t1 = fd.from_pytorch(a), fd.from_pytorch(b)
        c = fd.ops.cast(fd.define_scalar(3.0), DataType.Int32)
        fd.add_output(fd.ops.sum(fd.ops.mul(fd.ops.add(t0, t1), c), [-1], False, DataType.Int32))

    check_fusion(fusion, [a, b], lambda a, b: torch.sum((a + b) * 3, dim=-1, dtype=torch.int32))


def _dynamic_reshape(fd, subtract):
    n = fd.define_scalar(None, dtype=DataType.Int)
    t = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.Float)
    inv = fd.ops.reciprocal(n)  # Float, as nvFuser promotes integer inputs of float ops
    cols = fd.ops.sub(fd.ops.mul(fd.define_scalar(192, dtype=DataType.Int), inv), subtract)
    assert inv.dtype is DataType.Float and cols.dtype in (DataType.Float, DataType.Double)
    fd.add_output(fd.ops.sum(fd.ops.reshape(t, new_shape=[n, cols]), dims=[1]))


@pytest.mark.parametrize("n", [32, 12, 192])
def test_reshape_extent_from_float_scalar_math(n):
    x = make((4, 8, 6))
    x[0, 0, 0] = float("inf")
    check_fusion(lambda fd: _dynamic_reshape(fd, 0), [n, x], lambda n, x: x.reshape(n, 192 // n).sum(1))


def test_reshape_float_extent_truncates_toward_zero():
    x = make((4, 8, 6))
    fd = define(lambda fd: _dynamic_reshape(fd, -0.75))  # 192/32 + 0.75 = 6.75 -> 6
    torch.testing.assert_close(fd.execute([32, x])[0], x.reshape(32, 6).sum(1))
    with pytest.raises(FusionExecutionError, match="reshape"):  # 192/32 - 0.5 = 5.5 -> 5: 32 * 5 != 192
        define(lambda fd: _dynamic_reshape(fd, 0.5)).execute([32, x])


def test_reshape_refuses_python_floats_and_bool_scalars():
    def floats(fd):
        t = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
        fd.ops.reshape(t, new_shape=[2.0, 3])

    with pytest.raises(FusionDtypeError, match="new_shape"):
        define(floats)

    def bools(fd):
        t = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
        fd.ops.reshape(t, new_shape=[fd.define_scalar(True), 3])

    with pytest.raises(FusionDtypeError, match="non-integer scalar"):
        define(bools)


# --------------------------------------------------------------------------------------------------------------
# outputs computed only from CPU scalar tensors


def _cpu_scalar_fusion(fd, scalar, device_scalar):
    t0 = fd.from_pytorch(scalar)  # a 0-dim CPU tensor: is_cpu
    t1 = fd.ops.add(t0, fd.define_scalar(3.0))  # computed on the host only
    t2 = fd.from_pytorch(device_scalar)
    fd.add_output(t1)
    fd.add_output(fd.ops.mul(t1, t2))


def test_output_computed_only_from_cpu_scalars_is_refused_on_a_device_run():
    from pyfuser.runtime.executor_cache import _refuse_computed_cpu_outputs

    s, d = torch.tensor(2.0), torch.tensor(-0.0)
    fd = define(lambda fd: _cpu_scalar_fusion(fd, s, d))
    with pytest.raises(FusionExecutionError, match=r"KernelExecutor does not support the Fusion provided: output T\d "
                                                   r"\(fd\.ops\.add\) is computed only from CPU scalar tensors"):
        _refuse_computed_cpu_outputs(fd.fusion)
    # forwarding the CPU scalar itself, or combining it with a device tensor, is fine
    def fine(fd):
        t0 = fd.from_pytorch(s)
        fd.add_output(t0)
        fd.add_output(fd.ops.mul(fd.ops.add(t0, 1.0), fd.define_tensor(shape=[-1], contiguity=True)))

    _refuse_computed_cpu_outputs(define(fine).fusion)
    # a CPU run computes it (nothing to refuse: every tensor is on the host)
    out = fd.execute([s, d], device="cpu")
    assert out[0].item() == 5.0 and out[1].item() == 0.0 and out[1].device.type == "cpu"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_output_computed_only_from_cpu_scalars_is_refused_on_cuda():
    s, d = torch.tensor(2.0), torch.tensor(3.0, device="cuda")
    fd = define(lambda fd: _cpu_scalar_fusion(fd, s, d))
    with pytest.raises(RuntimeError, match="KernelExecutor does not support the Fusion provided"):
        fd.execute([s, d])
