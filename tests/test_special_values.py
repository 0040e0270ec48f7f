"""Generated kernels vs eager on special values, op by op, bit for bit.

Every op runs as a one-op fusion over NaN, ±inf, ±0, subnormals, the largest finite values and ordinary numbers
(binary ops over every pair), and the result is compared with the eager ATen op on the same device:
- exactly (bit patterns; NaN only by position) for ops ATen and the kernel both compute exactly;
- for transcendental functions (libdevice vs ATen): NaN positions, infinities, zeros with their sign and
  subnormal-vs-zero exactly, other values within a few ulps.

Where eager itself is not one answer, the test says so and why (``CPU_EAGER_AMBIGUOUS``): the kernels follow
ATen's CUDA kernels there. Measured on the H200 (torch 2.11) and on CPU (torch 2.13) for this test:
- CPU relu(-0.0) is -0.0, CUDA's +0.0 (clamp_min through fmax); CPU maximum/minimum of +0.0 and -0.0 depend on
  the tensor size (vectorized vs scalar loop), CUDA's are +0.0/-0.0 in either order;
- CPU fmod/remainder by a subnormal divisor is NaN in the vectorized loop and exact in the scalar one;
- integer division by zero raises on CPU and returns -1 (int32) or 0xffffffff/-1 (int64) on CUDA; INT_MIN // -1
  kills a CPU process (SIGFPE) and is INT_MIN on CUDA.
"""

from __future__ import annotations

import math

import pytest
import torch

from harness import DEVICE, define
from pyfuser.errors import PyfuserError

F32, F64, BF16, F16 = torch.float32, torch.float64, torch.bfloat16, torch.float16
I32, I64 = torch.int32, torch.int64
FLOATS = [F32, F64, BF16, F16]
INTS = [I32, I64]
ON_CPU = DEVICE.type == "cpu"


def float_specials(dt):
    fi = torch.finfo(dt)
    sub = fi.tiny / 4  # a subnormal of dt (bf16 has them too)
    return [math.nan, math.inf, -math.inf, 0.0, -0.0, sub, -2 * sub, fi.tiny, 1.0, -1.0, 2.5, -2.5, 0.5, -0.5,
            3.0, -3.0, fi.max, -fi.max, 7.0, -7.0]


def int_specials(dt):
    ii = torch.iinfo(dt)
    return [0, 1, -1, 2, -2, 7, -7, 3, -3, ii.min, ii.max, ii.min + 1]


def widen(dt):
    return F32 if dt in (BF16, F16) else dt


def column(values, dt):
    return torch.tensor(values, dtype=dt, device=DEVICE)


def pairs(values, dt):
    """a[i, j] = values[i], b[i, j] = values[j]: every pair once."""
    t = torch.tensor(values, dtype=dt, device=DEVICE)
    n = len(values)
    return t[:, None].expand(n, n).contiguous(), t[None, :].expand(n, n).contiguous()


# --- comparisons ----------------------------------------------------------------------------------------------


def _bits(t):
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _describe(inputs, out, ref, bad, k=6):
    idx = bad.nonzero().tolist()[:k]
    rows = []
    for i in idx:
        xs = [x[tuple(i)].item() for x in inputs]
        rows.append(f"{xs}: kernel {out[tuple(i)].item()!r} vs eager {ref[tuple(i)].item()!r}")
    return f"{int(bad.sum())} of {bad.numel()} differ: " + "; ".join(rows)


def assert_bitwise(out, ref, inputs, what, ignore_zero_sign=False):
    assert out.dtype == ref.dtype and out.shape == ref.shape, f"{what}: {out.dtype}{list(out.shape)} vs {ref.dtype}{list(ref.shape)}"
    out, ref = out.cpu(), ref.cpu()
    inputs = [x.cpu() for x in inputs]
    if out.is_floating_point():
        same = _bits(out) == _bits(ref)
        same |= torch.isnan(out) & torch.isnan(ref)
        if ignore_zero_sign:
            same |= (out == 0) & (ref == 0)
    else:
        same = out == ref
    assert bool(same.all()), f"{what}: " + _describe(inputs, out, ref, ~same)


def assert_close_at_specials(out, ref, inputs, what, ulps=4):
    """Exact where the result is NaN, ±inf or a zero (with its sign); else within a few ulps, counting ulps of
    the subnormal range for subnormal results (a kernel that flushes them to zero fails)."""
    assert out.dtype == ref.dtype and out.shape == ref.shape, what
    out, ref = out.cpu(), ref.cpu()
    inputs = [x.cpu() for x in inputs]
    fi = torch.finfo(out.dtype)
    special = torch.isnan(ref) | torch.isinf(ref) | (ref == 0)
    exact = (_bits(out) == _bits(ref)) | (torch.isnan(out) & torch.isnan(ref))
    o, r = out.double(), ref.double()
    ulp = torch.clamp(r.abs(), min=fi.tiny) * fi.eps  # the smallest subnormal is tiny * eps
    near = ((o - r).abs() <= ulps * ulp) & (torch.signbit(o) == torch.signbit(r)) & (o != 0)
    ok = torch.where(special, exact, near | exact)
    assert bool(ok.all()), f"{what}: " + _describe(inputs, out, ref, ~ok)


def run_one(build, *inputs):
    fd = define(lambda fd: fd.add_output(build(fd, *[fd.from_pytorch(x) for x in inputs])))
    out = fd.execute(list(inputs))[0]
    return fd, out


def ran_kernels(fd) -> list:
    """Per segment of the last run: did it run a generated kernel."""
    rt = fd.last_runtime()
    return [rt.kernel_step(seg.index) is not None for seg in rt.segments]


def triton_runs_here() -> bool:
    from pyfuser.codegen.launcher import triton_usable

    return triton_usable(DEVICE)


def check_ran_as_kernel(fd, what):
    if triton_runs_here():
        rt = fd.last_runtime()
        reasons = [rt.segment_reason(seg.index) for seg in rt.segments]
        assert all(ran_kernels(fd)), f"{what}: expected a generated kernel; ATen because {reasons}"


# --- unary ----------------------------------------------------------------------------------------------------

# op -> (eager function, keeps the input dtype)
EXACT_UNARY = {
    "neg": (torch.neg, False), "abs": (torch.abs, True), "sign": (torch.sign, True), "relu": (torch.relu, True),
    "ceil": (torch.ceil, True), "floor": (torch.floor, True), "round": (torch.round, True),
    "trunc": (torch.trunc, True), "frac": (torch.frac, True), "reciprocal": (torch.reciprocal, False),
}
PREDICATES = {"signbit": torch.signbit, "isnan": torch.isnan, "isinf": torch.isinf, "isfinite": torch.isfinite,
              "isposinf": torch.isposinf, "isneginf": torch.isneginf}
TRANSCENDENTAL = {"exp": torch.exp, "expm1": torch.expm1, "log": torch.log, "log1p": torch.log1p,
                  "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
                  "sin": torch.sin, "cos": torch.cos, "erf": torch.erf, "atan": torch.atan,
                  "silu": torch.nn.functional.silu}
# The kernels follow ATen's CUDA kernels where CPU eager has another or no single answer (module docstring).
CPU_EAGER_AMBIGUOUS = {"relu", "maximum", "minimum", "clamp"}


def _dtype_keeping(fn, dt, keeps):
    """Reduced floats compute in Float; dtype-keeping ops round back."""
    def ref(x, *rest):
        r = fn(x.to(widen(dt)), *[y.to(widen(dt)) if isinstance(y, torch.Tensor) else y for y in rest])
        return r.to(dt) if keeps else r
    return ref


@pytest.mark.parametrize("dt", FLOATS, ids=str)
@pytest.mark.parametrize("name", sorted(EXACT_UNARY))
def test_exact_unary(name, dt):
    fn, keeps = EXACT_UNARY[name]
    x = column(float_specials(dt), dt)
    fd, out = run_one(lambda fd, t: getattr(fd.ops, name)(t), x)
    ref = _dtype_keeping(fn, dt, keeps)(x)
    check_ran_as_kernel(fd, name)
    assert_bitwise(out, ref.to(out.dtype), [x], f"{name}({dt})", ignore_zero_sign=ON_CPU and name in CPU_EAGER_AMBIGUOUS)


@pytest.mark.parametrize("dt", FLOATS, ids=str)
@pytest.mark.parametrize("name", sorted(PREDICATES))
def test_predicates(name, dt):
    x = column(float_specials(dt), dt)
    fd, out = run_one(lambda fd, t: getattr(fd.ops, name)(t), x)
    check_ran_as_kernel(fd, name)
    assert_bitwise(out, PREDICATES[name](x), [x], f"{name}({dt})")


@pytest.mark.parametrize("dt", FLOATS, ids=str)
@pytest.mark.parametrize("name", sorted(TRANSCENDENTAL))
def test_transcendental(name, dt):
    x = column(float_specials(dt), dt)
    fd, out = run_one(lambda fd, t: getattr(fd.ops, name)(t), x)
    ref = TRANSCENDENTAL[name](x.to(widen(dt)))
    if name == "silu":
        ref = ref.to(dt)
    check_ran_as_kernel(fd, name)
    assert_close_at_specials(out, ref.to(out.dtype), [x], f"{name}({dt})")


@pytest.mark.parametrize("dt", INTS, ids=str)
@pytest.mark.parametrize("name", ["neg", "abs", "sign", "relu", "bitwise_not"])
def test_integer_unary(name, dt):
    x = column(int_specials(dt), dt)
    fd, out = run_one(lambda fd, t: getattr(fd.ops, name)(t), x)
    check_ran_as_kernel(fd, name)
    assert_bitwise(out, getattr(torch, name)(x), [x], f"{name}({dt})")


# --- binary ---------------------------------------------------------------------------------------------------

EXACT_BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.true_divide,
                "truediv": torch.true_divide, "fmod": torch.fmod, "remainder": torch.remainder,
                "maximum": torch.maximum, "minimum": torch.minimum, "eq": torch.eq, "lt": torch.lt,
                "ge": torch.ge, "nextafter": torch.nextafter}


def _cpu_scalar_path(fn, a, b):
    """CPU eager element by element (its scalar loop): for the ops whose vectorized CPU loop disagrees with it."""
    flat = [fn(x.reshape(1), y.reshape(1)) for x, y in zip(a.reshape(-1), b.reshape(-1))]
    return torch.cat(flat).reshape(a.shape)


@pytest.mark.parametrize("dt", FLOATS, ids=str)
@pytest.mark.parametrize("name", sorted(EXACT_BINARY))
def test_exact_binary(name, dt):
    if name == "nextafter" and dt in (BF16, F16):
        pytest.skip("nextafter takes Float and Double only")
    a, b = pairs(float_specials(dt), dt)
    fd, out = run_one(lambda fd, s, t: getattr(fd.ops, name)(s, t), a, b)
    fn = EXACT_BINARY[name]
    compute = widen(dt) if name != "nextafter" else dt
    ref = fn(a.to(compute), b.to(compute))
    if ON_CPU and name in ("fmod", "remainder"):
        # CPU's vectorized fmod turns subnormal divisors into NaN; its scalar loop (and CUDA) does not.
        ref = _cpu_scalar_path(fn, a.to(compute), b.to(compute))
    check_ran_as_kernel(fd, name)
    assert_bitwise(out, ref.to(out.dtype), [a, b], f"{name}({dt})",
                   ignore_zero_sign=ON_CPU and name in CPU_EAGER_AMBIGUOUS)


@pytest.mark.parametrize("dt", FLOATS, ids=str)
@pytest.mark.parametrize("name", ["atan2", "pow"])
def test_transcendental_binary(name, dt):
    a, b = pairs(float_specials(dt), dt)
    fd, out = run_one(lambda fd, s, t: getattr(fd.ops, name)(s, t), a, b)
    ref = getattr(torch, name)(a.to(widen(dt)), b.to(widen(dt)))
    check_ran_as_kernel(fd, name)
    assert_close_at_specials(out, ref.to(out.dtype), [a, b], f"{name}({dt})")


@pytest.mark.parametrize("dt", FLOATS, ids=str)
@pytest.mark.parametrize("const", [-0.0, 0.0, -1.0, 1e-40, -1e-310, 2.5])
@pytest.mark.parametrize("name", ["mul", "add", "sub", "div"])
def test_float_constant_operand(name, const, dt):
    """Constants keep their sign and subnormal value: x * -0.0 is -0.0 for positive x.

    The eager reference takes the constant as a 0-dim tensor of the compute dtype, as pyfuser's ATen path does
    (and nvFuser's semantics: the constant is a value of the op's dtype). With a Python number, ATen's CUDA
    division multiplies by the reciprocal (measured on the H200: x / 2.5 in Double is x * 0.4, one ulp off, and
    0 / 1e-40 in Float is 0 * inf = NaN); CPU divides."""
    x = column(float_specials(dt), dt)
    fd, out = run_one(lambda fd, t: getattr(fd.ops, name)(t, const), x)
    fn = {"mul": torch.mul, "add": torch.add, "sub": torch.sub, "div": torch.true_divide}[name]
    ref = fn(x.to(widen(dt)), torch.tensor(const, dtype=widen(dt), device=DEVICE))
    check_ran_as_kernel(fd, name)
    assert_bitwise(out, ref.to(out.dtype), [x], f"{name}(x, {const!r}) {dt}")


@pytest.mark.parametrize("dt", FLOATS, ids=str)
def test_clamp(dt):
    x = column(float_specials(dt), dt)
    fd, out = run_one(lambda fd, t: fd.ops.clamp(t, -1.0, 1.0), x)
    ref = torch.clamp(x.to(widen(dt)), -1.0, 1.0).to(out.dtype)
    check_ran_as_kernel(fd, "clamp")
    assert_bitwise(out, ref, [x], f"clamp({dt})")


# --- integers -------------------------------------------------------------------------------------------------

INT_DIVISION = {"div": lambda a, b: torch.div(a, b, rounding_mode="trunc"), "fmod": torch.fmod,
                "remainder": torch.remainder}


def _int_division_by_minus_one(name, a):
    # torch wraps: INT_MIN // -1 == INT_MIN, INT_MIN % -1 == 0 (CUDA, measured; CPU eager traps on it).
    return a * -1 if name == "div" else torch.zeros_like(a)


@pytest.mark.parametrize("dt", INTS, ids=str)
@pytest.mark.parametrize("divisor", [1, -1, 3, -3, 7, 2**31 - 1, -2**31])
@pytest.mark.parametrize("name", sorted(INT_DIVISION))
def test_integer_division_by_constant(name, divisor, dt):
    a = column(int_specials(dt), dt)
    fd, out = run_one(lambda fd, t: getattr(fd.ops, name)(t, divisor), a)
    if divisor == -1:
        ref = _int_division_by_minus_one(name, a)
    else:
        ref = INT_DIVISION[name](a, torch.tensor(divisor, dtype=dt))
    check_ran_as_kernel(fd, name)
    assert_bitwise(out, ref, [a], f"{name}(x, {divisor}) {dt}")


@pytest.mark.parametrize("dt", INTS, ids=str)
@pytest.mark.parametrize("name", sorted(INT_DIVISION))
def test_integer_division_by_tensor_without_zeros(name, dt):
    a, b = pairs(int_specials(dt), dt)
    keep = (b != 0) & (b != -1)  # -1: CPU eager traps on INT_MIN // -1
    b = torch.where(keep, b, torch.full_like(b, 5))
    fd, out = run_one(lambda fd, s, t: getattr(fd.ops, name)(s, t), a, b)
    assert_bitwise(out, INT_DIVISION[name](a, b), [a, b], f"{name}({dt})")


@pytest.mark.parametrize("name", sorted(INT_DIVISION))
def test_integer_division_by_zero_is_eagers(name):
    """A kernel can neither raise nor know CUDA's garbage: an integer divisor that is not a constant makes the op
    run on ATen, so the result (or the error) is eager's."""
    a = column([5, -5, 0, 7], I32)
    b = column([0, 2, 0, -3], I32)
    fd = define(lambda fd: fd.add_output(getattr(fd.ops, name)(fd.from_pytorch(a), fd.from_pytorch(b))))
    try:
        expected = INT_DIVISION[name](a, b)
    except RuntimeError:
        with pytest.raises((RuntimeError, PyfuserError), match="ZeroDivisionError"):
            fd.execute([a, b])
        return
    assert_bitwise(fd.execute([a, b])[0], expected, [a, b], name)
    assert not any(ran_kernels(fd)), "integer division by a tensor must not run in a generated kernel"


@pytest.mark.parametrize("name", sorted(INT_DIVISION))
def test_integer_division_by_constant_zero_runs_on_aten(name):
    a = column([5, -5, 0, 7], I64)
    fd = define(lambda fd: fd.add_output(getattr(fd.ops, name)(fd.from_pytorch(a), 0)))
    try:
        expected = INT_DIVISION[name](a, torch.tensor(0, dtype=I64, device=DEVICE))
    except RuntimeError:
        with pytest.raises((RuntimeError, PyfuserError), match="ZeroDivisionError"):
            fd.execute([a])
        return
    assert_bitwise(fd.execute([a])[0], expected, [a], name)


# --- reductions -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["max", "min", "sum"])
def test_reductions_propagate_nan_and_inf(name):
    rows = [[math.nan, 1.0, 2.0], [1.0, math.nan, -math.inf], [math.inf, -1.0, 3.0], [-math.inf, math.inf, 0.0],
            [-0.0, -0.0, -0.0], [1e-40, 1e-40, 0.0], [2.0, 1.0, math.nan]]
    x = torch.tensor(rows, device=DEVICE)
    fd, out = run_one(lambda fd, t: getattr(fd.ops, name)(t, [1]), x)
    ref = {"max": torch.amax, "min": torch.amin, "sum": torch.sum}[name](x, 1)
    check_ran_as_kernel(fd, name)
    # the sign of a zero from max/min over equal zeros depends on the order ATen combines them in
    assert_bitwise(out, ref, [x[:, 0]], name, ignore_zero_sign=name != "sum")


def test_var_mean_of_rows_holding_inf():
    """var of a row holding inf is NaN in both. The mean: ATen's var_mean (Welford) gives NaN or inf depending on
    where the inf sits and the order ATen combines partial results in (CPU [1, 2, inf] -> inf, CUDA -> NaN;
    CUDA [1, inf, 2] -> inf, CPU -> NaN), so eager has no single answer: the kernel's mean is the mean op's
    (inf), and it must be NaN or inf exactly where eager's is NaN or inf."""
    x = torch.tensor([[math.inf, 1.0, 2.0], [1.0, 2.0, math.inf], [0.5, 1.5, -1.0], [math.inf, -math.inf, 0.0]],
                     device=DEVICE)
    fd = define(lambda fd: [fd.add_output(o) for o in fd.ops.var_mean(fd.from_pytorch(x), [1], correction=0)])
    var, mean = fd.execute([x])
    ref_var, ref_mean = torch.var_mean(x, 1, correction=0)
    assert_bitwise(var, ref_var, [x[:, 0]], "var")
    finite = torch.isfinite(ref_mean)
    assert torch.equal(torch.isfinite(mean), finite)
    assert_close_at_specials(mean[finite], ref_mean[finite], [x[:, 0][finite]], "mean")
