"""Warps of pointwise kernels that read a row vector (a bias) broadcast over their tiles' rows (H200).

    python benchmarks/sweep_pointwise_warps.py [--out FILE.jsonl] [--repeats N]

Triton lays a ``[1, BLOCK_C]`` load out over all of a program's threads; with fewer than one 16-byte vector per
thread its layout differs from the ``[BLOCK_R, BLOCK_C]`` tiles it is broadcast into, and each tile then goes
through shared memory twice (a layout conversion and back, with barriers). ``plan._blocks`` caps such kernels'
warps at ``BLOCK_C / (32 x vector)`` and keeps the elements per thread (``TUNING["pw_row_vector_warps"]``). This
times the bench_fusions tanh-GELU (``gelu(x * w + b)``) and a plain bias add (``x + b``, memory-bound) at the
bench_fusions shapes, bf16 and fp32, with the cap off and on, alternating ``--repeats`` times (fresh fusions
each time), torch.compile once per case; one JSON line per measurement, then the mean per (case, config). (The second run of 2026-12-04,
``-pointwise-warps-run2.jsonl``, also timed the cap keeping the tile on fewer warps, a TUNING knob since dropped:
no better.)
"""

import argparse
import json
import sys

import torch

sys.path.insert(0, "benchmarks")
import bench_fusions as bf  # noqa: E402

from pyfuser import FusionDefinition  # noqa: E402

CONFIGS = {"off": {"pw_row_vector_warps": False}, "on": {"pw_row_vector_warps": True}}


def bias_add_fd(shape, dt):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1], contiguity=[True, True], dtype=dt)
        b = fd.define_tensor([-1], contiguity=[True], dtype=dt)
        fd.add_output(fd.ops.cast(fd.ops.add(x, b), dt))
    return fd


def bias_add_eager(x, b):
    return (x.float() + b.float()).to(x.dtype)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--dtypes", default="bfloat16,float32")
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    copy_bw = bf.copy_bandwidth(dev)
    out = open(args.out, "w") if args.out else None
    sums: dict = {}
    for dtype in [getattr(torch, d) for d in args.dtypes.split(",")]:
        dt = bf._IO_DTYPES[dtype]
        for shape in bf.SHAPES:
            x = torch.randn(*shape, device=dev, dtype=dtype)
            w, b = (torch.randn(shape[1], device=dev, dtype=dtype) for _ in range(2))
            cases = [("gelu(x*w+b)", bf.gelu_bias_fd, bf.gelu_bias_eager, [x, w, b]),
                     ("x + b", bias_add_fd, bias_add_eager, [x, b])]
            for case, make_fd, eager, inputs in cases:
                compiled = torch.compile(eager)
                compiled(*inputs)
                t_comp = bf.bench(lambda: compiled(*inputs))
                for rep in range(args.repeats):
                    for name, cfg in CONFIGS.items():
                        fd, ms, pct = bf.time_with_tuning(lambda: make_fd(shape, dt), eager, inputs, cfg, copy_bw,
                                                          f"{case} {shape} {name}")
                        (p,) = [s.plan for s in _kernel_steps(fd)]
                        rec = dict(case=case, shape=list(shape), dtype=str(dtype), config=name, repeat=rep,
                                   ms=round(ms, 5), pct_copy_bw=round(pct, 1),
                                   vs_compile=round(t_comp / ms, 3), block=[p.block_r, p.block_c],
                                   warps=p.num_warps)
                        print(json.dumps(rec), flush=True)
                        if out:
                            out.write(json.dumps(rec) + "\n")
                        sums.setdefault((case, str(shape), str(dtype), name), []).append(rec["pct_copy_bw"])
    for (case, shape, dtype, name), pcts in sums.items():
        line = json.dumps({"mean": f"{case} {shape} {dtype}", "config": name,
                           "pct_copy_bw": round(sum(pcts) / len(pcts), 1)})
        print(line)
        if out:
            out.write(line + "\n")


def _kernel_steps(fd):
    rt = fd.last_runtime()
    return [rt.kernel_step(i) for i in range(len(rt.segments)) if rt.kernel_step(i) is not None]


if __name__ == "__main__":
    main()
