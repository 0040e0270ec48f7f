"""Host time of a cached fd.execute against eager PyTorch and torch.compile, on tiny tensors (the GPU is never the
bottleneck, so the time per call is the host's).

Run:  python benchmarks/bench_host.py --out benchmarks/results            (CUDA if present, else CPU)
      python benchmarks/bench_host.py --device cpu --out benchmarks/results
Writes <out>/<date>-host-<device>.md and .json with the targets of the runtime (README "Status") met or missed.

Cases:
- 1 kernel: relu of 16 floats, against one eager relu;
- 3 segments: pointwise -> matmul (ATen) -> pointwise, against the same three eager ops;
- 8-op chain: eight pointwise ops fused (one kernel on CUDA), against eight eager ops.
Each time is the median of 5 rounds of N back-to-back calls, synchronized at both ends.

Without a GPU, ``bench_op_host.py --cases host`` times the same cases' host work on CPU tensors, with the
generated kernels' launches running pyfuser's direct-launch code and a no-op for Triton's compiled launcher.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import time

import torch

from pyfuser import DataType, FusionDefinition
from pyfuser.codegen import launcher


def one_kernel():
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1], contiguity=[True], dtype=DataType.Float)
        fd.add_output(fd.ops.relu(t))
    return fd, lambda x, w: torch.relu(x)


def three_segments():
    with FusionDefinition() as fd:  # pointwise -> matmul (ExprEval) -> pointwise
        t = fd.define_tensor([-1], contiguity=[True])
        m = fd.define_tensor([-1, -1], contiguity=[True, True])
        fd.add_output(fd.ops.mul(fd.ops.matmul(m, fd.ops.relu(t)), 2.0))
    return fd, lambda x, w: (w @ torch.relu(x)) * 2.0


def chain8():
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1], contiguity=[True])
        y = fd.ops.relu(t)
        y = fd.ops.mul(y, 2.0)
        y = fd.ops.add(y, 1.0)
        y = fd.ops.neg(y)
        y = fd.ops.abs(y)
        y = fd.ops.sub(y, 0.5)
        y = fd.ops.mul(y, y)
        y = fd.ops.add(y, 3.0)
        fd.add_output(y)

    def eager(x, w):
        y = torch.relu(x)
        y = y * 2.0
        y = y + 1.0
        y = -y
        y = y.abs()
        y = y - 0.5
        y = y * y
        return y + 3.0

    return fd, eager


CASES = {"1 kernel": one_kernel, "3 segments": three_segments, "8-op chain": chain8}


def per_call_us(fn, sync, n: int) -> float:
    for _ in range(max(n // 10, 20)):
        fn()
    sync()
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        rounds.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(rounds)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile (slow to warm up on CPU)")
    args = ap.parse_args()
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    x = torch.randn(16, device=dev)
    w = torch.randn(16, 16, device=dev)
    results = {}
    for name, make in CASES.items():
        fd, eager = make()
        inputs = [x] if len(fd.fusion.inputs) == 1 else [x, w]
        torch.testing.assert_close(fd.execute(inputs)[0], eager(x, w))
        row = {"segments": [f"{r.kind}:{r.runs_as}" for r in fd.last_execution()]}
        jit_before = launcher.stats["jit"]
        row["pyfuser_us"] = per_call_us(lambda: fd.execute(inputs), sync, args.n)
        row["jit_dispatches_on_cached_calls"] = launcher.stats["jit"] - jit_before
        row["eager_us"] = per_call_us(lambda: eager(x, w), sync, args.n)
        if not args.no_compile:
            compiled = torch.compile(eager)
            compiled(x, w)
            row["compile_us"] = per_call_us(lambda: compiled(x, w), sync, args.n)
        results[name] = row
        print(name, json.dumps(row))
    one_op = per_call_us(lambda: torch.relu(x), sync, args.n)  # "one eager op"
    k1, s3, c8 = results["1 kernel"], results["3 segments"], results["8-op chain"]
    if dev.type == "cuda":
        targets = [
            ("cached single-kernel fusion <= 1.0x one eager op", k1["pyfuser_us"] / one_op, 1.0),
            ("each further segment <= 0.5x one eager op", (s3["pyfuser_us"] - k1["pyfuser_us"]) / 2 / one_op, 0.5),
            ("8-op pointwise chain <= 0.3x eight eager ops", c8["pyfuser_us"] / c8["eager_us"], 0.3),
        ]
    else:
        targets = [
            ("CPU cached 1-op fusion <= 2x the eager op", k1["pyfuser_us"] / k1["eager_us"], 2.0),
            ("CPU 8-op fusion <= 1.5x eight eager ops", c8["pyfuser_us"] / c8["eager_us"], 1.5),
        ]
    report(args.out, dev, one_op, results, targets)


def report(out_dir, dev, one_op, results, targets):
    date = datetime.date.today().isoformat()
    os.makedirs(out_dir, exist_ok=True)
    name = f"{date}-host-{dev.type}"
    meta = {"date": date, "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor()
            or platform.machine(), "torch": torch.__version__, "python": platform.python_version(),
            "one_eager_op_us": one_op}
    with open(os.path.join(out_dir, name + ".json"), "w") as f:
        json.dump({"meta": meta, "cases": results,
                   "targets": [{"target": t, "ratio": r, "limit": lim, "met": r <= lim} for t, r, lim in targets]},
                  f, indent=1)
    lines = [f"# Host time per cached call ({meta['device']}, {date})", "",
             f"torch {meta['torch']}, Python {meta['python']}; one eager op (relu of 16 floats): {one_op:.1f} us", "",
             "| case | segments | pyfuser us | eager us | torch.compile us | JIT dispatches on cached calls |",
             "|---|---|---|---|---|---|"]
    for case, r in results.items():
        comp = f"{r['compile_us']:.1f}" if "compile_us" in r else "-"
        lines.append(f"| {case} | {', '.join(r['segments'])} | {r['pyfuser_us']:.1f} | {r['eager_us']:.1f} | {comp} "
                     f"| {r['jit_dispatches_on_cached_calls']} |")
    lines += ["", "| target | measured | met |", "|---|---|---|"]
    lines += [f"| {t} | {r:.2f}x | {'yes' if r <= lim else 'NO'} |" for t, r, lim in targets]
    with open(os.path.join(out_dir, name + ".md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
