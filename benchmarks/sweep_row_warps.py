"""Sweep the warps and rows per program of row-reduction kernels whose rows fit in registers, on the GPU.

    python benchmarks/sweep_row_warps.py [--out FILE.jsonl] [--budget-s S] [--shapes 4096x16384,...]

Persistent rows ([32768, 1024], [16384, 4096], [4096, 16384]): elements per program x warps (one count for every
size); rows in unrolled tiles ([8191, 5000], plan.row_tiles): warps x tile widths. RMSNorm, LayerNorm and softmax, bf16 and
fp32 I/O, fresh fusions per configuration, timed with triton.testing.do_bench; one JSON line per (case, shape,
config) with its share of the measured copy bandwidth, then default and best per case. plan.TUNING's
multi-pass entries come from this sweep (2026-12-02-narrow-sweep.jsonl, run before those entries existed, so its
configurations applied to every row as these do).
"""
import argparse
import copy
import json
import sys
import time

import torch
import triton.testing

sys.path.insert(0, "benchmarks")
import bench_fusions as bf  # noqa: E402

from pyfuser.codegen import plan  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--out", default="row-warps.jsonl")
ap.add_argument("--budget-s", type=float, default=600)
ap.add_argument("--shapes", default="", help="only these shapes (ROWSxCOLS, comma-separated)")
args = ap.parse_args()
dev = torch.device("cuda")
bw = bf.copy_bandwidth(dev)
base = copy.deepcopy(plan.TUNING)
NORM = ("rmsnorm", "layernorm", "softmax fp32")


def persistent(e, w):
    # one count of warps for every size; rows of two or more passes take it too (their own per-thread rule)
    return {"persistent_elems": e, "persistent_warps": {1 << 62: w}, "multi_pass_elems_per_thread": e // (32 * w)}


def tiles(w, widths):
    return {"row_tiles_warps": w, "row_tiles_widths": widths, "multi_pass_row_tiles_warps": {2: w, 4: w},
            "multi_pass_row_tiles_widths": widths}


configs = {
    (32768, 1024): [persistent(e, w) for e in (1024, 2048, 4096, 8192) for w in (1, 2, 4, 8)],
    (16384, 4096): [persistent(e, w) for e in (4096, 8192) for w in (2, 4, 8, 16)],
    # (and rows of a power-of-two width in unrolled tiles, which the default keeps for wasteful widths only)
    (4096, 16384): [persistent(16384, w) for w in (4, 8, 16, 32)]
    + [dict(tiles(w, ws), row_tiles_max_waste=-1.0) for w in (8, 16) for ws in ((4096,), (2048,))],
    (8191, 5000): [tiles(w, ws) for w in (2, 4, 8, 16) for ws in ((4096, 2048, 1024), (1024,))],
}
if args.shapes:
    keep = {tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")}
    configs = {k: v for k, v in configs.items() if k in keep}
out = open(args.out, "w")
best = {}
t0 = time.time()
for dtype in (torch.bfloat16, torch.float32):
    for shape, cfgs in configs.items():
        for cfg in [{}] + cfgs:
            if time.time() - t0 > args.budget_s:
                break
            plan.TUNING.clear(); plan.TUNING.update(copy.deepcopy(base)); plan.TUNING.update(cfg)
            for name, fd, eager, inputs in bf.make_cases(*shape, dev, dtype):
                if name.split(" [")[0] not in NORM:
                    continue
                outs = fd.execute(inputs)
                bf.check(outs, eager(*inputs), name)
                ms = triton.testing.do_bench(lambda: fd.execute(inputs), warmup=10, rep=60, return_mode="median")
                pct = round(100 * (bf.nbytes(inputs) + bf.nbytes(outs)) / (ms * 1e-3) / 1e9 / bw, 1)
                row = dict(case=name, shape=list(shape), cfg={k: str(v) for k, v in cfg.items()},
                           us=round(ms * 1e3, 2), pct=pct)
                out.write(json.dumps(row) + "\n"); out.flush()
                key = (name, shape)
                if cfg == {}:
                    best.setdefault(key, {})["default"] = row
                if key not in best or "best" not in best[key] or ms * 1e3 < best[key]["best"]["us"]:
                    best.setdefault(key, {})["best"] = row
for k, v in best.items():
    print(k, "default", v.get("default", {}).get("pct"), "best", v["best"]["pct"], v["best"]["cfg"], flush=True)
