"""scatter on the GPU: pyfuser's fused search kernel (codegen/scatter_lowerings.py) against eager and torch.compile.

    python benchmarks/bench_scatter.py --out benchmarks/results

The fusion: a routing-mask-like scatter of k weights per row into a zeroed [T, E] tensor made from x, then a
multiply by x (bf16 in and out; eager runs the same ops one by one). Each output element searches the k positions
of its row, so the kernel's time grows with T * E * k: these cases measure where the search stops paying (k from
2 to 256; scatters over more than scatter_lowerings.MAX_EXTENT positions run on ATen, which the segment column
shows). Times: median of triton.testing.do_bench per call (host time included). Writes
<out>/<date>-scatter.md and .json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os

import torch
import triton

from pyfuser import DataType, FusionDefinition

CASES = ((8192, 64, 2), (8192, 64, 8), (8192, 256, 8), (8192, 256, 32), (1024, 256, 256), (16384, 128, 128))


def fusion():
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
        i = fd.define_tensor([-1, -1], contiguity=[True, True], dtype=DataType.Int)
        w = fd.define_tensor([-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
        s = fd.ops.scatter(fd.ops.cast(fd.ops.mul(x, 0.0), DataType.BFloat16), i, w, 1)
        fd.add_output(fd.ops.cast(fd.ops.mul(fd.ops.cast(s, DataType.Float), fd.ops.cast(x, DataType.Float)),
                                  DataType.BFloat16))
    return fd


def eager(x, i, w):
    return (torch.scatter(x * 0.0, 1, i, w).float() * x.float()).to(x.dtype)


def run_case(T, E, k, compiled):
    idx = torch.argsort(torch.rand(T, E, device="cuda"), dim=1)[:, :k].contiguous()  # k distinct columns a row
    w = torch.rand(T, k, device="cuda").to(torch.bfloat16)
    x = torch.randn(T, E, device="cuda").to(torch.bfloat16)
    fd = fusion()
    out = fd.execute([x, idx, w])[0]
    row = dict(T=T, E=E, k=k, equal=bool(torch.equal(out, eager(x, idx, w))),
               segments=[f"{r.kind}:{r.runs_as}" for r in fd.last_execution()])
    row["pyfuser_ms"] = triton.testing.do_bench(lambda: fd.execute([x, idx, w]), rep=100)
    row["eager_ms"] = triton.testing.do_bench(lambda: eager(x, idx, w), rep=100)
    compiled(x, idx, w)
    row["compile_ms"] = triton.testing.do_bench(lambda: compiled(x, idx, w), rep=100)
    print(json.dumps(row), flush=True)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_scatter.py times GPU kernels: it needs a CUDA device")
    compiled = torch.compile(eager)
    rows = [run_case(T, E, k, compiled) for T, E, k in CASES]
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"{datetime.date.today().isoformat()}-scatter")
    with open(stem + ".json", "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), f, indent=1)
    lines = ["| T | E | k | segments | pyfuser ms | eager ms | compile ms | vs eager |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['T']} | {r['E']} | {r['k']} | {', '.join(r['segments'])} | {r['pyfuser_ms']:.4f} | "
                     f"{r['eager_ms']:.4f} | {r['compile_ms']:.4f} | {r['eager_ms'] / r['pyfuser_ms']:.2f}x |")
    with open(stem + ".md", "w") as f:
        f.write(f"# scatter, {datetime.date.today().isoformat()} ({torch.cuda.get_device_name()})\n\n" + "\n".join(lines) + "\n")
    print("wrote", stem + ".md")


if __name__ == "__main__":
    main()
