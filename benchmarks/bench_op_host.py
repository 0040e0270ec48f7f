"""Host time of cached calls of the NVFP4 op kernels (grouped GEMM, layout op, grouped quantize, the MoE layer),
and of bench_host's generated-kernel cases (--cases host), measured on any machine, GPU or not, by stubbing the
launches.

Run:  python benchmarks/bench_op_host.py [--n 3000] [--moe-hidden 4096] [--json FILE]
      python benchmarks/bench_op_host.py --cases host [--n 5000]     (1 kernel, 3 segments, 8-op chain)

Method. The Triton interpreter is switched on (TRITON_INTERPRET=1, set here) so that CPU tensors take the op
kernels' and generated kernels' path. A bound launch (``launcher.BoundLaunch``: every generated kernel and every
prepared op kernel) runs pyfuser's own CUDA direct launch code, with a no-op standing for Triton's compiled
launcher (and the current stream's handle on a CPU build of torch); any other launch is replaced by a stub that
does the host work of the direct launch path once its specialization is cached (the pointer list, the
specialization key, the lookup) and then calls a no-op. So a time is everything pyfuser does on the host for a
cached ``fd.execute`` call except Triton's compiled launcher and the driver (a few us per launch on the H200's
host, the same before and after a change that keeps the number of launches). Values are never computed: outputs are
uninitialized memory, which no host path reads (offset values are only read by the host-check rows).

Offset checks, three ways:
- "off": ``_disable_options=["offset_checks"]``;
- "device": the path a CUDA call takes by default (the check is a launch that ORs a bit mask into the fusion's
  error flags, read by the next call). A CPU runtime normally checks on the host; this row lets CPU runtimes keep
  device error flags too (``fusion_runtime.DEFERRED_ERROR_DEVICES``), so the CUDA path runs with its launches
  stubbed. Absent (n/a) on code without that switch;
- "host": the CPU path (values read directly, no synchronization to avoid on CPU).

Each time is the median of 5 rounds of N back-to-back calls (MoE: N/10), after a warm-up (bench_host's timing).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported: CPU tensors take the kernels' path

import torch  # noqa: E402

from bench_host import per_call_us  # noqa: E402  (the same timing: median of 5 rounds of n calls)
from pyfuser import DataType, FusionDefinition  # noqa: E402
from pyfuser.codegen import launcher  # noqa: E402
from pyfuser.runtime import fusion_runtime  # noqa: E402

NO_CHECKS = {"_disable_options": ["offset_checks"]}


# --------------------------------------------------------------------------------------------------------------
# launch stubs: the direct path's host work, then nothing


def _noop(*args):
    return None


def _stub_launch(self, grid, tensors, scalars=(), constexprs=(), jit_tensors=None):
    """Launcher.launch on a cached specialization: pointers, the full specialization key, the lookup, the call."""
    ptrs = [t.data_ptr() for t in tensors]
    key = (0, *[t.dtype for t in tensors], *[p % 16 == 0 for p in ptrs], *map(launcher._scalar_spec, scalars),
           *constexprs)
    self._compiled.get(key)
    _noop(grid[0], *ptrs, *map(launcher._raw, scalars), *constexprs)


def _stub_bound(compiled: dict, tensors, scalars=()):
    """A launch whose grid and trailing arguments are bound: pointers, an alignment key, the lookup, the call."""
    ptrs = [t.data_ptr() for t in tensors]
    key = (tuple([p & 15 == 0 for p in ptrs]), tuple(map(launcher._scalar_spec, scalars)) if scalars else ())
    compiled.get(key)
    _noop(*ptrs, *scalars)


class _NoopCompiled:
    """Stands for a compiled Triton kernel: its launcher does nothing."""

    function = 0
    packed_metadata = ()

    @staticmethod
    def run(*args):
        return None


def stub_launches() -> None:
    launcher.Launcher.launch = _stub_launch
    if hasattr(launcher, "BoundLaunch") and hasattr(launcher.BoundLaunch, "_launch"):
        # Bound launches run pyfuser's own CUDA direct path (hooks test, pointers, specialization key, lookup, the
        # current stream, the compiled launcher's call); only the compiled launcher is a no-op, and a launch of a
        # new specialization registers one instead of compiling.
        init = launcher.BoundLaunch.__init__

        def cuda_init(self, *args, **kwargs):
            init(self, *args, **kwargs)
            self.cuda = True

        launcher.BoundLaunch.__init__ = cuda_init
        # (a launch returns the runner of its compiled kernel since compiled_runner, the kernel itself before)
        runner = launcher.compiled_runner(_NoopCompiled()) if hasattr(launcher, "compiled_runner") else _NoopCompiled()
        launcher.BoundLaunch._launch = lambda self, tensors, scalars, jit_tensors: runner
        if not hasattr(torch._C, "_cuda_getCurrentRawStream"):  # (a CPU build of torch)
            torch._C._cuda_getCurrentRawStream = lambda index: 0
    elif hasattr(launcher, "BoundLaunch"):
        launcher.BoundLaunch.__call__ = lambda self, tensors, scalars=(), jit_tensors=None: _stub_bound(
            self._compiled, tensors, scalars)
    if hasattr(launcher.Launcher, "launch_bound"):  # (the launcher before BoundLaunch: bind, then launch_bound)
        launcher.Launcher.launch_bound = lambda self, tensors, scalars: _stub_bound(self._bound, tensors, scalars)


def device_checks_supported() -> bool:
    return hasattr(fusion_runtime, "DEFERRED_ERROR_DEVICES")


class device_checks:
    """CPU runtimes built inside keep device error flags (the CUDA default path of the offset checks)."""

    def __enter__(self):
        self.saved = fusion_runtime.DEFERRED_ERROR_DEVICES
        fusion_runtime.DEFERRED_ERROR_DEVICES = self.saved | {"cpu"}

    def __exit__(self, *exc):
        fusion_runtime.DEFERRED_ERROR_DEVICES = self.saved


# --------------------------------------------------------------------------------------------------------------
# inputs (shapes of the H200 decode rows; values random, never computed with)


def _input(fd, dtype, ndim, stride_order=()):
    return fd.define_tensor(shape=[-1] * ndim, contiguity=[True] * ndim, dtype=dtype, stride_order=stride_order)


def _offsets(tokens):
    starts, sf, a, b = [], [], 0, 0
    for t in tokens:
        starts.append(a)
        sf.append(b)
        a += t
        b += -(-t // 128) * 128
    return torch.tensor(starts, dtype=torch.int32), torch.tensor(sf, dtype=torch.int32)


def _fp4(*shape):
    return torch.randint(0, 256, shape, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)


def _e4m3(*shape):
    return (torch.rand(shape) * 4 + 0.5).to(torch.float8_e4m3fn)


def gemm_case(g=8, per_expert=16, n=2048, k=4096):
    with FusionDefinition() as fd:
        ins = [_input(fd, DataType.Float4_e2m1fn, 2), _input(fd, DataType.Float4_e2m1fn, 3, [2, 0, 1]),
               _input(fd, DataType.Float8_e4m3fn, 2), _input(fd, DataType.Float8_e4m3fn, 3),
               _input(fd, DataType.Float, 1), _input(fd, DataType.Int32, 2), _input(fd, DataType.Int32, 1),
               _input(fd, DataType.Int32, 1)]
        fd.add_output(fd.ops.cutlass_nvfp4_grouped_mm(*ins, dtype=DataType.BFloat16))
    m = g * per_expert
    starts, sf = _offsets([per_expert] * g)
    scale1 = torch.as_strided(_e4m3((m + 127 * g) * (k // 16)), (m, k // 16), (k // 16, 1))  # the layout op's form
    sizes = torch.tensor([[per_expert, n, k]] * g, dtype=torch.int32)
    inputs = [_fp4(m, k // 2), _fp4(g, n, k // 2).transpose(-1, -2), scale1, _e4m3(g, n, k // 16),
              torch.ones(g), sizes, starts, sf]
    return f"grouped GEMM {g}x{per_expert} tok, N={n}, K={k}", fd, inputs


def layout_case(g=8, m=128, k=256):
    with FusionDefinition() as fd:
        s, a, b = _input(fd, DataType.Float8_e4m3fn, 2), _input(fd, DataType.Int32, 1), _input(fd, DataType.Int32, 1)
        fd.add_output(fd.ops.preprocess_grouped_matmul_input_sf(s, a, b))
    starts, sf = _offsets([m // g] * g)
    return f"layout op e4m3 [{m}, {k}], g={g}", fd, [_e4m3(m, k), starts, sf]


def quantize_case(g=8, m=128, k=4096):
    with FusionDefinition() as fd:
        x, a, b = _input(fd, DataType.BFloat16, 2), _input(fd, DataType.Int32, 1), _input(fd, DataType.Int32, 1)
        for o in fd.ops.nv_grouped_block_quantize(x, a, b):
            fd.add_output(o)
    starts, sf = _offsets([m // g] * g)
    return f"grouped quantize bf16 [{m}, {k}], g={g}", fd, [torch.randn(m, k, dtype=torch.bfloat16), starts, sf]


def moe_case(tokens=16, hidden=4096, intermediate=2048, experts=8):
    from pyfuser.demo import moe_nvfp4 as moe

    cfg = moe.MoEConfig(hidden=hidden, intermediate=intermediate, experts=experts, top_k=2)

    def expert(n, kk):
        return moe.NVFP4Expert(_fp4(experts, n, kk // 2), _e4m3(experts, n, kk // 16), None, None,
                               torch.ones(experts))

    weights = moe.QuantizedMoE(torch.randn(experts, hidden, dtype=torch.bfloat16) / 64,
                               expert(2 * intermediate, hidden), expert(hidden, intermediate))
    layer = moe.MoENVFP4(cfg, weights)
    x = torch.randn(tokens, hidden, dtype=torch.bfloat16)
    return (f"MoE layer {tokens} tokens (H={hidden}, I={intermediate}, E={experts}, top-2)", layer.fusion(tokens),
            layer.inputs(x))


# --------------------------------------------------------------------------------------------------------------


def host_rows(n: int) -> list:
    """bench_host's cases (relu of 16 floats; pointwise -> matmul -> pointwise; an 8-op chain) on CPU tensors with
    their generated kernels' launches stubbed, and one eager op for scale."""
    from bench_host import CASES

    x, w = torch.randn(16), torch.randn(16, 16)
    rows = []
    for name, make in CASES.items():
        fd, _ = make()
        inputs = [x] if len(fd.fusion.inputs) == 1 else [x, w]
        fd.execute(inputs)  # builds the runtime for this signature
        us = per_call_us(lambda: fd.execute(inputs), lambda: None, n)
        rows.append({"case": name, "segments": [f"{r.kind}:{r.runs_as}" for r in fd.last_execution()],
                     "us": round(us, 2)})
        print(f"{name:20s} {us:7.2f} us   {', '.join(rows[-1]['segments'])}")
    us = per_call_us(lambda: torch.relu(x), lambda: None, n)
    rows.append({"case": "one eager op (relu)", "us": round(us, 2)})
    print(f"{'one eager op (relu)':20s} {us:7.2f} us")
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", choices=("op", "host"), default="op",
                    help="op: the NVFP4 op kernels and the MoE layer; host: bench_host's generated-kernel cases")
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--moe-hidden", type=int, default=4096, help="MoE hidden size (intermediate = hidden / 2)")
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    stub_launches()
    if args.cases == "host":
        rows = host_rows(args.n)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"python": sys.version.split()[0], "torch": torch.__version__, "rows": rows}, f, indent=1)
        return
    rows = []
    moe = functools.partial(moe_case, hidden=args.moe_hidden, intermediate=args.moe_hidden // 2)
    for case in (gemm_case, layout_case, quantize_case, moe):
        modes = ["off", "device"] if case is moe else ["off", "device", "host"]  # (the MoE's offsets are computed
        for mode in modes:                                                      # in the fusion: garbage here)
            label, fd, inputs = case()  # a fusion per mode: the mode decides how its runtime is built
            if mode == "device" and not device_checks_supported():
                rows.append({"case": label, "offset checks": mode, "us": None})
                print(f"{label:60s} checks {mode:6s}     n/a")
                continue
            kwargs = NO_CHECKS if mode == "off" else {}
            with device_checks() if mode == "device" else contextlib.nullcontext():
                fd.execute(inputs, **kwargs)  # builds the runtime for this signature
            n = args.n if case is not moe else max(args.n // 10, 100)
            us = per_call_us(lambda: fd.execute(inputs, **kwargs), lambda: None, n)
            rows.append({"case": label, "offset checks": mode, "us": round(us, 1)})
            print(f"{label:60s} checks {mode:6s} {us:7.1f} us")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"python": sys.version.split()[0], "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
