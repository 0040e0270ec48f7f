"""``python -m pyfuser demo``: build a few real fusions, run them, and check them against eager PyTorch.

Each case defines a fusion with the nvFuser direct API, executes it on the best available device, prints the
definition (``repr(fd)``), its segments, the meta-inferred boundary layouts, and compares every output with an
eager PyTorch implementation of the same computation written here (values, shapes, dtypes, strides and which
input an output aliases). A case whose ops are not registered yet is reported as SKIP, naming the missing ops.

The eager functions deliberately use different building blocks from the fusions (``torch.softmax``,
``F.gelu(approximate="tanh")``, ``F.layer_norm``), so a mistake in pyfuser's lowering cannot hide in both.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional, TextIO

import torch
import torch.nn.functional as F

from ..frontend import FusionDefinition
from ..ir import DataType
from ..ops import registry

# Sizes per device: small enough for a 2-core CPU in well under a second, large enough on a GPU that the
# layouts and timings mean something. S+1 columns make the #4888 slice leave rows that are not 16-byte aligned.
SIZES = {
    "small": dict(S=64, H=4, B=2, T=16, K=64, N=128, rows=64, D=256),
    "large": dict(S=2048, H=16, B=8, T=512, K=1024, N=4096, rows=8192, D=4096),
}

# (atol, rtol) per output dtype. bf16 keeps 8 mantissa bits: one rounding step is 2**-8 relative.
TOLERANCES = {
    torch.bfloat16: (1e-2, 1.6e-2),
    torch.float16: (1e-3, 1e-3),
    torch.float32: (1e-5, 1e-5),
    torch.float64: (1e-7, 1e-7),
}

ATTENTION_SCALE = 1 / math.sqrt(128)  # 0.0883883..., the scale in nvFuser's test_issue4888 (head dim 128)
LAYER_NORM_EPS = 1e-5


@dataclass
class Case:
    key: str
    title: str
    ops: tuple[str, ...]  # every fd.ops name the definition uses; missing ones make the case SKIP
    make_inputs: Callable[[dict, torch.device], list]
    define: Callable[[FusionDefinition, list, dict], None]
    eager: Callable[..., list]  # eager(*inputs, **sizes) -> outputs in add_output order
    sizes: tuple[str, ...]  # the SIZES entries this case uses (for the report)


# --------------------------------------------------------------------------------------------------------------
# (a) attention-score block: the nvFuser #4888 pattern (a sliced, expanded view is both an output and the input
# of a softmax segment, so the softmax must see its real, non-contiguous layout).


def _attention_inputs(sz: dict, device: torch.device) -> list:
    S, H = sz["S"], sz["H"]
    rows = torch.arange(S, device=device).unsqueeze(1)
    cols = torch.arange(S + 1, device=device).unsqueeze(0)
    # A causal additive mask: every row keeps its diagonal, so no softmax row is all -inf.
    mask = torch.zeros(S, S + 1, device=device).masked_fill(cols > rows, float("-inf")).to(torch.bfloat16)
    scores = torch.randn(1, H, S, S, device=device, dtype=torch.bfloat16)
    return [mask, scores]


def _attention_define(fd: FusionDefinition, inputs: list, sz: dict) -> None:
    S, H = sz["S"], sz["H"]
    mask = fd.from_pytorch(inputs[0])
    scores = fd.from_pytorch(inputs[1])
    m4 = fd.ops.broadcast_in_dim(mask, shape=[1, 1, S, S + 1], broadcast_dims=[2, 3])
    m4 = fd.ops.slice(m4, start_indices=[0, 0, 0, 0], end_indices=[1, 1, S, S])
    view = fd.ops.broadcast_in_dim(m4, shape=[1, H, S, S], broadcast_dims=[0, 1, 2, 3])
    fd.add_output(view)
    x = fd.ops.add(fd.ops.mul(fd.ops.cast(scores, DataType.Float), ATTENTION_SCALE), fd.ops.cast(view, DataType.Float))
    row_max = fd.ops.broadcast_in_dim(fd.ops.max(x, dims=[3]), shape=[1, H, S, S], broadcast_dims=[0, 1, 2])
    e = fd.ops.exp(fd.ops.sub(x, row_max))
    row_sum = fd.ops.broadcast_in_dim(fd.ops.sum(e, dims=[3]), shape=[1, H, S, S], broadcast_dims=[0, 1, 2])
    probs = fd.ops.div(e, row_sum)
    fd.add_output(probs)
    fd.add_output(fd.ops.cast(probs, DataType.BFloat16))


def _attention_eager(mask, scores, *, S, H, **_):
    view = mask[None, None, :, :S].expand(1, H, S, S)
    probs = torch.softmax(scores.float() * ATTENTION_SCALE + view.float(), dim=-1)
    return [view, probs, probs.to(torch.bfloat16)]


# --------------------------------------------------------------------------------------------------------------
# (b) linear + GELU (tanh approximation), bf16 in and out: an ATen ExprEval segment feeding a pointwise one.


def _linear_inputs(sz: dict, device: torch.device) -> list:
    B, T, K, N = sz["B"], sz["T"], sz["K"], sz["N"]
    x = torch.randn(B, T, K, device=device, dtype=torch.bfloat16)
    w = (torch.randn(N, K, device=device) / math.sqrt(K)).to(torch.bfloat16)
    b = (torch.randn(N, device=device) * 0.1).to(torch.bfloat16)
    return [x, w, b]


def _linear_define(fd: FusionDefinition, inputs: list, sz: dict) -> None:
    x, w, b = (fd.from_pytorch(t) for t in inputs)
    y = fd.ops.cast(fd.ops.linear(x, w, b), DataType.Float)
    # gelu_tanh(y) = 0.5 * y * (1 + tanh(sqrt(2/pi) * (y + 0.044715 * y^3)))
    inner = fd.ops.mul(fd.ops.add(y, fd.ops.mul(fd.ops.mul(fd.ops.mul(y, y), y), 0.044715)), math.sqrt(2 / math.pi))
    out = fd.ops.mul(fd.ops.mul(y, 0.5), fd.ops.add(fd.ops.tanh(inner), 1.0))
    fd.add_output(fd.ops.cast(out, DataType.BFloat16))


def _linear_eager(x, w, b, **_):
    return [F.gelu(F.linear(x, w, b).float(), approximate="tanh").to(torch.bfloat16)]


# --------------------------------------------------------------------------------------------------------------
# (c) LayerNorm over the last dim, bf16 in and out, Float compute; also returns mean and 1/std like a forward
# pass that saves them for backward.


def _layer_norm_inputs(sz: dict, device: torch.device) -> list:
    rows, D = sz["rows"], sz["D"]
    x = (torch.randn(rows, D, device=device) * 2 + 0.5).to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(D, device=device)).to(torch.bfloat16)
    b = (0.1 * torch.randn(D, device=device)).to(torch.bfloat16)
    return [x, w, b]


def _layer_norm_define(fd: FusionDefinition, inputs: list, sz: dict) -> None:
    rows, D = sz["rows"], sz["D"]
    x, w, b = (fd.from_pytorch(t) for t in inputs)
    xf = fd.ops.cast(x, DataType.Float)
    var, mean = fd.ops.var_mean(xf, dims=[1], correction=0)
    invstd = fd.ops.rsqrt(fd.ops.add(var, LAYER_NORM_EPS))
    centered = fd.ops.sub(xf, fd.ops.broadcast_in_dim(mean, shape=[rows, D], broadcast_dims=[0]))
    xhat = fd.ops.mul(centered, fd.ops.broadcast_in_dim(invstd, shape=[rows, D], broadcast_dims=[0]))
    wf = fd.ops.broadcast_in_dim(fd.ops.cast(w, DataType.Float), shape=[rows, D], broadcast_dims=[1])
    bf = fd.ops.broadcast_in_dim(fd.ops.cast(b, DataType.Float), shape=[rows, D], broadcast_dims=[1])
    fd.add_output(fd.ops.cast(fd.ops.add(fd.ops.mul(xhat, wf), bf), DataType.BFloat16))
    fd.add_output(mean)
    fd.add_output(invstd)


def _layer_norm_eager(x, w, b, *, D, **_):
    xf = x.float()
    var, mean = torch.var_mean(xf, dim=-1, correction=0)
    out = F.layer_norm(xf, (D,), w.float(), b.float(), LAYER_NORM_EPS).to(torch.bfloat16)
    return [out, mean, torch.rsqrt(var + LAYER_NORM_EPS)]


CASES = [
    Case(
        "attention",
        "(a) attention-score block: mask -> broadcast_in_dim -> slice -> expand (an output view) -> softmax",
        ("broadcast_in_dim", "slice", "cast", "mul", "add", "max", "sub", "exp", "sum", "div"),
        _attention_inputs,
        _attention_define,
        _attention_eager,
        ("S", "H"),
    ),
    Case(
        "linear_gelu",
        "(b) linear + GELU (tanh approximation), bf16",
        ("linear", "cast", "mul", "add", "tanh"),
        _linear_inputs,
        _linear_define,
        _linear_eager,
        ("B", "T", "K", "N"),
    ),
    Case(
        "layer_norm",
        "(c) LayerNorm over the last dim, bf16 in/out, Float compute (var_mean)",
        ("cast", "var_mean", "rsqrt", "add", "sub", "mul", "broadcast_in_dim"),
        _layer_norm_inputs,
        _layer_norm_define,
        _layer_norm_eager,
        ("rows", "D"),
    ),
]


# --------------------------------------------------------------------------------------------------------------
# checking and reporting


def _nontrivial_strides(t: torch.Tensor) -> tuple:
    # Strides of size-1 dims carry no information (torch itself is not consistent about them).
    return tuple(s for s, n in zip(t.stride(), t.shape) if n != 1)


def _aliased_input(t: torch.Tensor, inputs: list) -> Optional[int]:
    """Index of the input whose storage ``t`` shares, or None: eager parity includes returning views."""
    ptr = t.untyped_storage().data_ptr()
    for i, x in enumerate(inputs):
        if isinstance(x, torch.Tensor) and x.untyped_storage().data_ptr() == ptr:
            return i
    return None


def compare_output(out, ref, out_inputs: list, ref_inputs: list) -> list[str]:
    """Every way ``out`` differs from the eager ``ref``; empty means PASS."""
    problems = []
    if not isinstance(out, torch.Tensor):
        return [f"expected a tensor, got {type(out).__name__}"]
    if out.dtype != ref.dtype:
        problems.append(f"dtype {out.dtype} != {ref.dtype}")
    if tuple(out.shape) != tuple(ref.shape):
        problems.append(f"shape {list(out.shape)} != {list(ref.shape)}")
        return problems
    if out.numel() > 1 and _nontrivial_strides(out) != _nontrivial_strides(ref):
        problems.append(f"strides {out.stride()} != {ref.stride()}")
    if _aliased_input(out, out_inputs) != _aliased_input(ref, ref_inputs):
        problems.append(
            f"aliases input {_aliased_input(out, out_inputs)}, eager aliases {_aliased_input(ref, ref_inputs)}"
        )
    if out.dtype == ref.dtype:
        atol, rtol = TOLERANCES.get(ref.dtype, (0, 0))
        if not torch.allclose(out, ref.to(out.device), atol=atol, rtol=rtol, equal_nan=True):
            problems.append(f"values differ beyond atol={atol}, rtol={rtol}")
    return problems


def _max_abs_diff(out: torch.Tensor, ref: torch.Tensor) -> float:
    if out.shape != ref.shape or out.numel() == 0:
        return float("nan")
    a, b = out.double(), ref.double().to(out.device)
    both_inf = torch.isinf(a) & (a == b)  # equal infinities are equal values (the causal mask holds -inf)
    return (a - b).masked_fill(both_inf, 0).abs().max().item()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device: torch.device):
    _sync(device)
    start = time.perf_counter()
    result = fn()
    _sync(device)
    return result, (time.perf_counter() - start) * 1e3


def _best_of(n: int, fn, inputs: list, device: torch.device) -> float:
    """The fastest of ``n`` timed ``fn(fresh copy of inputs)`` calls, in ms (warm calls: what a steady-state step
    costs). The copies are made outside the timed region."""
    times = []
    for _ in range(n):
        args = _fresh_inputs(inputs)
        times.append(_timed(lambda: fn(args), device)[1])
    return min(times)


def _fmt_layout(layout) -> str:
    order = "" if layout.alloc_order is None else f" alloc_order={list(layout.alloc_order)}"
    return f"sizes={list(layout.sizes)} strides={list(layout.strides)} contiguity={list(layout.contiguity)}{order}"


def _fresh_inputs(inputs: list) -> list:
    # clone() of a contiguous tensor keeps its strides; the demo's inputs are all freshly allocated.
    return [x.clone() for x in inputs]


def run_case(case: Case, device: torch.device, sz: dict, out: TextIO, first_in_process: bool = False) -> str:
    """Run one case, print its report, return "PASS", "FAIL" or "SKIP"."""
    p = lambda *a: print(*a, file=out)  # noqa: E731
    p("=" * 100)
    p(case.title)
    p(f"device: {device}, sizes: " + ", ".join(f"{k}={sz[k]}" for k in case.sizes))
    missing = [name for name in case.ops if name not in registry.all_ops()]
    if missing:
        p(f"SKIP {case.key}: pyfuser has no op {', '.join('fd.ops.' + m for m in missing)} yet")
        return "SKIP"

    torch.manual_seed(0)
    inputs = case.make_inputs(sz, device)
    try:
        fd, t_define = _timed(lambda: _define(case, inputs, sz), device)
    except Exception as e:  # report and carry on with the other cases
        p(f"FAIL {case.key}: defining the fusion raised {type(e).__name__}: {e}")
        return "FAIL"
    p("\nfusion definition (repr(fd)):")
    p(repr(fd).rstrip())
    try:
        run_inputs = _fresh_inputs(inputs)
        outs, t_first = _timed(lambda: fd.execute(run_inputs), device)
        t_cached = _best_of(3, fd.execute, inputs, device)
        _print_segments(fd, p)
        _print_layouts(case, fd, inputs, sz, p)
        # A separate run with check_layouts compares every segment output with its meta-inferred layout.
        _define(case, inputs, sz).execute(_fresh_inputs(inputs), _enable_options=["check_layouts"])
    except Exception as e:
        p(f"FAIL {case.key}: execute raised {type(e).__name__}: {e}")
        return "FAIL"

    ref_inputs = _fresh_inputs(inputs)
    refs = case.eager(*ref_inputs, **sz)
    t_eager = _best_of(3, lambda args: case.eager(*args, **sz), inputs, device)

    p("\noutputs: pyfuser | eager")
    ok = len(outs) == len(refs)
    if not ok:
        p(f"  FAIL: {len(outs)} outputs, eager has {len(refs)}")
    names = [v.name for v in fd.fusion.outputs]
    for i, (o, r) in enumerate(zip(outs, refs)):
        problems = compare_output(o, r, run_inputs, ref_inputs)
        ok = ok and not problems
        alias = _aliased_input(o, run_inputs)
        p(
            f"  [{i}] {names[i]:<4} {str(o.dtype):<15} shape={list(o.shape)} strides={list(o.stride())}"
            + ("" if alias is None else f" (view of input {alias})")
        )
        p(
            f"       eager {str(r.dtype):<15} shape={list(r.shape)} strides={list(r.stride())}"
            f"  max|diff|={_max_abs_diff(o, r):.3g}  {'PASS' if not problems else 'FAIL: ' + '; '.join(problems)}"
        )
    p("  segment outputs match their inferred layouts at run time (check_layouts): PASS")
    p(
        f"\ntime: define {t_define:.1f} ms, first execute (builds the runtime) {t_first:.1f} ms"
        f", cached execute {t_cached:.1f} ms, eager {t_eager:.1f} ms"
    )
    if first_in_process:
        p("      (the first fusion in a process also pays torch's one-time set-up of its meta kernels)")
    verdict = "PASS" if ok else "FAIL"
    p(f"{verdict} {case.key}")
    return verdict


def _define(case: Case, inputs: list, sz: dict) -> FusionDefinition:
    with FusionDefinition() as fd:
        case.define(fd, inputs, sz)
    return fd


def _print_segments(fd: FusionDefinition, p) -> None:
    p("\nsegments:")
    runtime = fd.last_runtime()
    for seg, report in zip(runtime.segments, runtime.describe()):
        ins = ", ".join(v.name for v in seg.inputs)
        outs = ", ".join(v.name for v in seg.outputs)
        ops = ", ".join(e.op.name for e in seg.exprs)
        p(f"  {seg.index}: {seg.kind.value:<16} ({ins}) -> ({outs})  ops: {ops}")
        p(f"     runs as: {_run_summary(runtime, report)}")


def _run_summary(runtime, report) -> str:
    """A generated Triton kernel (by name), a hand-written kernel, or ATen with the reason."""
    step = runtime.kernel_step(report.index)
    if step is not None:
        return f"generated Triton kernel {step.plan.name} (grid {step.plan.grid})"
    if report.runs_as == "op kernel":
        return f"hand-written Triton kernel ({report.reason})"
    return f"ATen, op by op ({report.reason})"


def _print_layouts(case: Case, fd: FusionDefinition, inputs: list, sz: dict, p) -> None:
    p("\nboundary layouts (inferred on meta tensors):")
    layouts = fd.last_runtime().boundary_layouts()
    for name, layout in layouts.items():
        p(f"  {name:<4} {_fmt_layout(layout)}")
    # What the pre-#4888 assumption (ExprEval outputs are contiguous) would have told the next segment.
    legacy_fd = _define(case, inputs, sz)
    legacy_fd.execute(_fresh_inputs(inputs), _disable_options=["infer_contiguity"])
    legacy = legacy_fd.last_runtime().boundary_layouts()
    for name, layout in layouts.items():
        old = legacy.get(name)
        if old is not None and old.contiguity != layout.contiguity:
            p(
                f"  (with _disable_options=['infer_contiguity'] {name} would be assumed contiguity "
                f"{list(old.contiguity)}, strides {list(old.strides)})"
            )


def _ran_before(results: dict) -> bool:
    return any(v != "SKIP" for v in results.values())


def pick_device(requested: str = "auto") -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch.cuda.is_available() is False")
    return torch.device(requested)


MOE_CASE = "moe_nvfp4"


def run_moe(device: torch.device, out: TextIO) -> str:
    """The NVFP4 MoE layer (pyfuser/demo/moe_nvfp4.py): one fusion from router to weighted sum, NVFP4 expert weights,
    checked against a torch emulation of the same math (tightly) and the bf16 layer (NVFP4's error)."""
    from . import moe_nvfp4 as moe

    print("=" * 100, file=out)
    print("(moe) MoE layer with NVFP4 experts: router, top-k, permutation, grouped quantize + layout op, NVFP4 "
          "grouped GEMMs (Triton, dequantized in registers), SiLU*mul, un-permute", file=out)
    try:
        metrics = moe.run_demo(device)
    except Exception as e:  # report and carry on
        print(f"FAIL {MOE_CASE}: {type(e).__name__}: {e}", file=out)
        return "FAIL"
    print(moe.format_report(metrics), file=out)
    verdict = "PASS" if metrics["ok"] else "FAIL"
    print(f"{verdict} {MOE_CASE}", file=out)
    return verdict


def run(
    device: str = "auto", size: str = "auto", cases: Optional[list[str]] = None, out: Optional[TextIO] = None
) -> int:
    """Run the demo; returns the process exit code (1 if any case failed)."""
    out = sys.stdout if out is None else out  # looked up at call time, so redirected stdout is honoured
    dev = pick_device(device)
    if size == "auto":
        size = "large" if dev.type == "cuda" else "small"
    sz = SIZES[size]
    selected = [c for c in CASES if cases is None or c.key in cases]
    results = {}
    for c in selected:
        results[c.key] = run_case(c, dev, sz, out, first_in_process=not _ran_before(results))
    if cases is None or MOE_CASE in cases:
        results[MOE_CASE] = run_moe(dev, out)
    print("=" * 100, file=out)
    print("summary: " + ", ".join(f"{k} {v}" for k, v in results.items()), file=out)
    return 1 if "FAIL" in results.values() else 0
