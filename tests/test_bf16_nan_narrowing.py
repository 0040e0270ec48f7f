"""A bf16 value widened to Float, only moved (padded, selected, its sign changed, picked by a max), and narrowed
back to bf16 must come out with eager's NaN bits: eager's CUDA conversion gives every NaN as 0x7FFF, its CPU one as
0x7FC0. In a kernel LLVM folds such a widening and narrowing into a copy, which kept the NaN's own bits (0x7FC0,
0xFFC0, a signalling payload), so on the GPU those narrowings select 0x7FFF for NaN lanes
(``_to_bf16_canonical_nan`` in the kernel prelude). Narrowings of computed values (a sum of two tensors, a product
with 0.5, an exp, a softmax's quotient) are converted by an instruction that gives 0x7FFF anyway and keep the
plain conversion: the planning test checks both, and the sm_90 PTX of the select, without a GPU."""

import re

import pytest
import torch

from pyfuser import DataType, FusionDefinition
from harness import DEVICE, check_fusion, define
from sm90 import compile_ptx, gpu_plans, kernel_spec

triton = pytest.importorskip("triton")

# bf16 NaNs of either sign, quiet and signalling, with and without a payload; then inf, zeros and plain values.
_NAN_BITS = [0x7FC0, 0xFFC0, 0x7F81, 0xFF81, 0x7FFF, 0xFFFF, 0x7FA5]
_OTHER = [float("inf"), float("-inf"), 0.0, -0.0, 1.5, -2.25, 3e-39]


def _input(layout: str, rows: int = 4, cols: int = 300) -> torch.Tensor:
    width = cols + 5 if layout == "sliced" else cols
    x = torch.randn(rows, width, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    bits = x.view(torch.int16)
    for i, b in enumerate(_NAN_BITS):
        bits[i % rows, (37 * i) % cols] = b - (1 << 16) if b >= 1 << 15 else b
    for i, v in enumerate(_OTHER):
        x[(i + 1) % rows, (53 * i + 11) % cols] = v
    x = x.to(DEVICE)
    return x[:, 3:cols + 3] if layout == "sliced" else x


def _cast(fd, x):
    return fd.ops.cast(fd.from_pytorch(x) if isinstance(x, torch.Tensor) else x, DataType.Float)


# name: (body over the widened value t -> Float result, eager over the Float tensor)
_MOVES = {
    "pad": (lambda fd, t: fd.ops.pad(t, [0, 1], -2.0), lambda t: torch.nn.functional.pad(t, [0, 1], value=-2.0)),
    "where": (lambda fd, t: fd.ops.where(fd.ops.lt(t, 0.0), 1.0, t), lambda t: torch.where(t < 0, 1.0, t)),
    "abs": (lambda fd, t: fd.ops.abs(t), torch.abs),
    "neg": (lambda fd, t: fd.ops.neg(t), torch.neg),
    "relu": (lambda fd, t: fd.ops.relu(t), torch.relu),
    "mul_by_one": (lambda fd, t: fd.ops.mul(t, 1.0), lambda t: t * 1.0),
    "add_negative_zero": (lambda fd, t: fd.ops.add(t, -0.0), lambda t: t + -0.0),
    "sub_zero": (lambda fd, t: fd.ops.sub(t, 0.0), lambda t: t - 0.0),
    "amax": (lambda fd, t: fd.ops.max(t, dims=[1], keepdim=True), lambda t: t.amax(1, keepdim=True)),
}
_COMPUTED = {
    "add": (lambda fd, t: fd.ops.add(t, t), lambda t: t + t),
    "mul_by_half": (lambda fd, t: fd.ops.mul(t, 0.5), lambda t: t * 0.5),
    "add_zero": (lambda fd, t: fd.ops.add(t, 0.0), lambda t: t + 0.0),  # (-0.0 + 0.0 is +0.0: computed)
    "exp": (lambda fd, t: fd.ops.exp(t), torch.exp),
    "softmax": (lambda fd, t: fd.ops.div(fd.ops.exp(fd.ops.sub(t, fd.ops.max(t, dims=[1], keepdim=True))),
                                         fd.ops.sum(fd.ops.exp(fd.ops.sub(t, fd.ops.max(t, dims=[1], keepdim=True))),
                                                    dims=[1], keepdim=True)),
                lambda t: torch.softmax(t, dim=1)),
}


def _fusion(body, x):
    def fn(fd):
        fd.add_output(fd.ops.cast(body(fd, _cast(fd, x)), DataType.BFloat16))
    return fn


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16).cpu()


@pytest.mark.parametrize("layout", ["contiguous", "sliced"])
@pytest.mark.parametrize("name", sorted(_MOVES) + ["cat"])
def test_moved_bf16_nans_narrow_to_eagers_bits(name, layout):
    x = _input(layout)
    if name == "cat":
        y = _input(layout).flip(0)

        def fn(fd):
            fd.add_output(fd.ops.cast(fd.ops.cat([_cast(fd, x), _cast(fd, y)], dim=1), DataType.BFloat16))

        def eager(x, y):
            return torch.cat([x.float(), y.float()], dim=1).bfloat16()
        inputs = [x, y]
    else:
        body, ref = _MOVES[name]
        fn = _fusion(body, x)

        def eager(x):
            return ref(x.float()).bfloat16()
        inputs = [x]
    # (values, NaN positions and strides; then the NaNs' bits: on CPU eager's relu keeps a -0.0 by loop kind,
    # which check_fusion allows for, docs/testing.md)
    check_fusion(fn, inputs, eager, atol=0, rtol=0)
    (out,) = define(fn).execute(inputs)
    ref = eager(*inputs)
    nan = ref.isnan().cpu()
    assert nan.any()
    assert torch.equal(_bits(out)[nan], _bits(ref)[nan]), (
        f"NaN bits {sorted(set(_bits(out)[nan].tolist()))} vs eager's {sorted(set(_bits(ref)[nan].tolist()))}")


def _gpu_plans(monkeypatch, fn, inputs):
    return gpu_plans(monkeypatch, define(fn), inputs)


@pytest.mark.parametrize("name", sorted(_MOVES) + sorted(_COMPUTED))
def test_only_narrowings_of_moved_values_select_the_canonical_nan(monkeypatch, name):
    x = _input("contiguous")
    body = (_MOVES.get(name) or _COMPUTED[name])[0]
    (p,) = _gpu_plans(monkeypatch, _fusion(body, x), [x])
    assert ("_to_bf16_canonical_nan(v" in p.source) == (name in _MOVES), p.source
    if name in ("pad", "abs"):
        (ptx,) = compile_ptx([kernel_spec(p, specialized=True)])
        assert re.search(r"selp\.b16\s+%rs\d+, (0x7FFF|32767),", ptx), "no select of 0x7FFF in the PTX"


def test_interpreter_keeps_the_plain_conversion(monkeypatch):
    # On CPU each conversion runs as written (torch's CPU rounding: 0x7FC0 for every NaN, as eager's CPU one),
    # so the interpreter's kernels need no select.
    if DEVICE.type == "cuda":
        pytest.skip("the interpreter's plan")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    x = _input("contiguous")
    fd = define(_fusion(_MOVES["abs"][0], x))
    fd.execute([x])
    assert "_to_bf16_canonical_nan(v" not in fd.last_runtime().kernel_step(0).plan.source


def test_a_product_with_a_scalar_argument_is_computed(monkeypatch):
    # The compiler does not know a scalar argument's value, so x * s is a multiply (canonical NaN): no select.
    x = _input("contiguous")

    def fn(fd):
        t = _cast(fd, x)
        fd.add_output(fd.ops.cast(fd.ops.mul(t, fd.define_scalar(DataType.Float)), DataType.BFloat16))

    (p,) = _gpu_plans(monkeypatch, fn, [x, 1.0])
    assert "_to_bf16_canonical_nan(v" not in p.source
