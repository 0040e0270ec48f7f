"""Shared test harness: run a fusion every way pyfuser can and compare with an eager ATen reference.

``check_fusion(define, inputs, reference)`` executes the definition
1. through ``fd.execute`` with ``check_layouts`` on (every segment output is compared with its inferred layout),
2. through the printed ``repr(fd)`` re-executed (round trip: equal values and strides),
3. through an ``LRUCache`` executor,
and compares values, shapes, dtypes and strides with ``reference(*inputs)``, an eager PyTorch function written
op by op in the test (never pyfuser's own evaluator, so the check can fail).
"""

from __future__ import annotations

import copy
from typing import Callable, Optional, Sequence

import torch

import pyfuser
from pyfuser import DataType, FusionDefinition  # noqa: F401  (exec'd repr text needs these names)
from pyfuser.frontend.printer import fusion_to_python

DEVICE = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def fd_softmax(fd, t, dim: int):
    """softmax of ``t`` along ``dim`` as a fusion spells it out (max, sub, exp, sum, div)."""
    e = fd.ops.exp(fd.ops.sub(t, fd.ops.max(t, dims=[dim], keepdim=True)))
    return fd.ops.div(e, fd.ops.sum(e, dims=[dim], keepdim=True))


def define(fn: Callable) -> FusionDefinition:
    with FusionDefinition() as fd:
        fn(fd)
    return fd


def rebuild_from_repr(fd: FusionDefinition) -> FusionDefinition:
    text = repr(fd)
    scope = {"FusionDefinition": FusionDefinition, "DataType": DataType}
    exec(text, scope)
    with FusionDefinition() as fd2:
        scope["nvfuser_fusion"](fd2)
    # Names follow creation order (as nvFuser's printer) and statements printing order, so the rebuilt definition,
    # created in printing order, prints the original's canonical form (names numbered in printing order).
    canonical = fusion_to_python(fd.fusion, canonical=True)
    if repr(fd2) != canonical:
        raise AssertionError(f"repr does not round-trip:\n{canonical}\n---\n{repr(fd2)}")
    return fd2


def assert_same(out, ref, *, atol=None, rtol=None, check_strides=True, what="output"):
    if isinstance(ref, torch.Tensor):
        assert isinstance(out, torch.Tensor), f"{what}: expected a tensor, got {type(out).__name__}"
        assert out.dtype == ref.dtype, f"{what}: dtype {out.dtype} != {ref.dtype}"
        assert tuple(out.shape) == tuple(ref.shape), f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
        if check_strides and out.numel() > 1:
            assert_strides_equal(out, ref, what)
        if ref.dtype in (getattr(torch, "float4_e2m1fn_x2", None),):
            assert torch.equal(out.view(torch.uint8), ref.view(torch.uint8)), f"{what}: values differ"
            return
        if ref.is_floating_point() and ref.element_size() == 1:  # fp8: compare as float
            out, ref = out.float(), ref.float()
        torch.testing.assert_close(out, ref.to(out.device), atol=atol, rtol=rtol, equal_nan=True, msg=lambda m: f"{what}: {m}")
    else:
        assert out == ref or (out != out and ref != ref), f"{what}: {out!r} != {ref!r}"


def assert_strides_equal(out: torch.Tensor, ref: torch.Tensor, what="output"):
    # Strides of size-1 dims carry no information; torch itself is not consistent about them.
    o = [s for s, n in zip(out.stride(), out.shape) if n != 1]
    r = [s for s, n in zip(ref.stride(), ref.shape) if n != 1]
    assert o == r, f"{what}: strides {out.stride()} != {ref.stride()} (shape {tuple(out.shape)})"


def clone_inputs(inputs: Sequence) -> list:
    """Deep copies that keep each tensor's strides and storage offset (deepcopy keeps views' layouts)."""
    return copy.deepcopy(list(inputs))


def check_fusion(
    fn: Callable,
    inputs: Sequence,
    reference: Optional[Callable] = None,
    *,
    atol: Optional[float] = None,
    rtol: Optional[float] = None,
    check_strides: bool = True,
    expected_segments: Optional[Sequence[str]] = None,
) -> list:
    """Run ``fn`` (a function of fd) on ``inputs`` all ways; compare with ``reference`` (eager torch).

    Returns the outputs of the first execution."""
    if (atol is None) != (rtol is None):
        atol = atol if atol is not None else 1e-5
        rtol = rtol if rtol is not None else 1.3e-6
    fd = define(fn)
    outs = fd.execute(clone_inputs(inputs), _enable_options=["check_layouts"])
    assert isinstance(outs, list)
    if reference is not None:
        refs = reference(*clone_inputs(inputs))
        if not isinstance(refs, (list, tuple)):
            refs = [refs]
        assert len(outs) == len(refs), f"{len(outs)} outputs, {len(refs)} references"
        for i, (o, r) in enumerate(zip(outs, refs)):
            assert_same(o, r, atol=atol, rtol=rtol, check_strides=check_strides, what=f"output {i}")
    if expected_segments is not None:
        kinds = [s.kind.value for s in fd.segments()]
        assert kinds == list(expected_segments), f"segments {kinds} != {list(expected_segments)}"
    deterministic = not _has_random_ops(fd)
    # Round trip through the printed definition: equal values and equal strides.
    fd2 = rebuild_from_repr(fd)
    outs2 = fd2.execute(clone_inputs(inputs))
    # And through an LRU cache, twice (the second call is a signature hit).
    cache = pyfuser.LRUCache(max_fusions=4)
    fec = cache.cache_compile(fd2.fusion)
    fec.execute(clone_inputs(inputs))
    outs3 = fec.execute(clone_inputs(inputs))
    for i, (a, b, c) in enumerate(zip(outs, outs2, outs3)):
        if deterministic:
            assert_same(b, a, atol=0, rtol=0, check_strides=check_strides, what=f"repr round-trip output {i}")
            assert_same(c, a, atol=0, rtol=0, check_strides=check_strides, what=f"LRU output {i}")
    return outs


def _has_random_ops(fd) -> bool:
    return any(e.op.name in ("rand_like", "randn_like", "uniform", "normal") for e in fd.fusion.exprs)


# --- non-contiguous input makers ---------------------------------------------------------------------------

def transposed(shape, dtype=torch.float32, device=DEVICE):
    """A tensor of ``shape`` whose two innermost dims are swapped in memory."""
    *outer, a, b = shape
    return make((*outer, b, a), dtype, device).transpose(-1, -2)


def sliced(shape, dtype=torch.float32, device=DEVICE, pad=3):
    """A tensor of ``shape`` that is a slice of a wider one (rows not contiguous)."""
    *outer, last = shape
    return make((*outer, last + pad), dtype, device)[..., :last]


def expanded(shape, dim, dtype=torch.float32, device=DEVICE):
    """A tensor of ``shape`` with stride 0 along ``dim``."""
    base_shape = list(shape)
    base_shape[dim] = 1
    return make(base_shape, dtype, device).expand(*shape)


def make(shape, dtype=torch.float32, device=DEVICE, low=None, high=None):
    shape = tuple(shape)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, device=device).bool()
    if not dtype.is_floating_point and not dtype.is_complex:
        lo = -5 if low is None else low
        hi = 6 if high is None else high
        return torch.randint(lo, hi, shape, device=device, dtype=dtype)
    if dtype.itemsize == 1:  # fp8
        return (torch.randn(shape, device=device) * 2).to(dtype)
    t = torch.randn(shape, device=device, dtype=dtype if dtype != torch.float64 else torch.float64)
    if low is not None or high is not None:
        lo = -1.0 if low is None else low
        hi = 1.0 if high is None else high
        t = torch.rand(shape, device=device, dtype=dtype) * (hi - lo) + lo
    return t


def kernel_kind(op_name: str, kernel: str = "PointWise") -> str:
    """The segment kind a single ``op_name`` gets: a generated-kernel kind when the op has a Triton lowering,
    else ExprEval (it runs on ATen). Tests use it so they stay right as lowerings are added."""
    from pyfuser.ops import registry

    return kernel if registry.get(op_name).lower is not None else "ExprEval"


# Allocation order of the "stride_order" layout for rank 3 (dim 0 fastest, then dim 2, dim 1 outermost).
STRIDE_ORDER_3D = [0, 2, 1]


def with_stride_order(shape, stride_order, dtype=torch.float32, device=DEVICE):
    """A dense tensor of ``shape`` allocated in nvFuser's ``stride_order`` (entry = rank of the dim's stride)."""
    rank = len(shape)
    alloc = sorted(range(rank), key=lambda d: -stride_order[d])  # outermost first
    base = make([shape[d] for d in alloc], dtype, device)
    return base.permute([alloc.index(d) for d in range(rank)])


def with_layout(layout: str, shape, dtype=torch.float32):
    """A tensor of ``shape`` (rank 2 or 3) in one of the standard test layouts: contiguous, transposed, sliced,
    expanded (along dim 0) or stride_order."""
    if layout == "contiguous":
        return make(shape, dtype)
    if layout == "transposed":
        return transposed(shape, dtype)
    if layout == "sliced":
        return sliced(shape, dtype)
    if layout == "expanded":
        return expanded(shape, 0, dtype)
    if layout == "stride_order":
        return with_stride_order(shape, STRIDE_ORDER_3D if len(shape) == 3 else [0, 1], dtype)
    raise AssertionError(layout)


def load_source_module(source: str, folder, name: str):
    """A Python module from source text (Triton's JIT reads a kernel's source from its file)."""
    import importlib.util

    path = folder / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
