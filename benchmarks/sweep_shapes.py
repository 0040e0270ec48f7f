"""Sweep the launch heuristics (pyfuser.codegen.plan.TUNING) over the roofline shapes, on the GPU.

    python benchmarks/sweep_shapes.py [--out FILE.jsonl]

For each shape of the roofline targets and each configuration, fresh fusions (new plans, new kernels) of the
bench_fusions cases are timed with triton.testing.do_bench; one JSON line per (case, shape, config) with its
share of the measured copy bandwidth, then the best configuration per (case, shape). The table in
codegen/plan.py (TUNING and _blocks) is chosen from these results; no autotuning happens on the cached path.
"""

import argparse
import copy
import itertools
import json
import sys
import time

import torch
import triton.testing

sys.path.insert(0, "benchmarks")
import bench_fusions as bf  # noqa: E402

from pyfuser.codegen import plan  # noqa: E402

SHAPES = [(16384, 4096), (8191, 5000), (4096, 16384), (32768, 1024), (1024, 65536)]
NORM = ["rmsnorm", "layernorm", "softmax fp32"]
CONFIGS = {
    "norm": [
        {"persistent_max_cols": m, "persistent_elems": e, "persistent_warps": w}
        for m, e, w in itertools.product(
            (4096, 16384), (2048, 8192),
            ({2048: 4, 8192: 8, 1 << 62: 16}, {1024: 4, 4096: 8, 1 << 62: 16}))
    ],
    "pointwise": [{"pw_elems_narrow": e, "pw_warps": w} for e in (4096, 8192, 16384) for w in (4, 8)],
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--budget-s", type=float, default=1e9)
    args = ap.parse_args()
    dev = torch.device("cuda")
    copy_bw = bf.copy_bandwidth(dev)
    base = copy.deepcopy(plan.TUNING)
    out = open(args.out, "w") if args.out else None
    best: dict = {}
    start = time.time()
    for shape in SHAPES:
        for kind, configs in CONFIGS.items():
            for cfg in configs:
                if time.time() - start > args.budget_s:
                    break
                plan.TUNING.clear()
                plan.TUNING.update(copy.deepcopy(base))
                plan.TUNING.update(cfg)
                for name, fd, eager, inputs in bf.make_cases(*shape, dev):
                    if (name in NORM) != (kind == "norm") or name == "slice+add+mul":
                        continue
                    outs = fd.execute(inputs)
                    bf.check(outs, eager(*inputs), name)
                    ms = triton.testing.do_bench(lambda: fd.execute(inputs), warmup=10, rep=50, return_mode="median")
                    moved = bf.nbytes(inputs) + bf.nbytes(outs)
                    row = {"case": name, "shape": list(shape), "cfg": {k: str(v) for k, v in cfg.items()},
                           "ms": ms, "pct_copy_bw": round(100 * moved / (ms * 1e-3) / 1e9 / copy_bw, 1),
                           "kernel": fd.last_execution()[0].kernel_name}
                    line = json.dumps(row)
                    print(line, flush=True)
                    if out:
                        out.write(line + "\n")
                    key = (name, shape)
                    if key not in best or ms < best[key]["ms"]:
                        best[key] = row
    print("BEST")
    for row in best.values():
        print(json.dumps(row), flush=True)
        if out:
            out.write("BEST " + json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
