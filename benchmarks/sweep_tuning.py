"""Sweep the kernel launch heuristics (pyfuser.codegen.plan.TUNING) on the GPU and print the best per case.

Run on the GPU machine: python benchmarks/sweep_tuning.py. Each configuration builds fresh fusions (new plans,
new kernels) and times them with triton.testing.do_bench; prints one JSON line per (case, config).
"""

import copy
import json
import sys

import torch
import triton.testing

sys.path.insert(0, "benchmarks")
import bench_fusions as bf  # noqa: E402

from pyfuser.codegen import plan  # noqa: E402

BASE = copy.deepcopy(plan.TUNING)
CONFIGS = {
    "pointwise": [
        {"pw_max_block_c": c, "pw_elems_narrow": e, "pw_warps": w}
        for c in (1024, 2048)
        for e in (8192, 16384)
        for w in (4, 8)
    ],
    "normalization": [
        {"persistent_max_cols": m, "persistent_elems": e, "looped_block_c": lb, "persistent_warps": pw}
        for m in (4096, 8192)
        for e in (2048, 4096)
        for lb in (2048, 4096)
        for pw in ({2048: 4, 8192: 8, 1 << 62: 16}, {1024: 4, 4096: 8, 1 << 62: 16})
    ],
}
CASES = {"gelu(x*w+b)": "pointwise", "slice+add+mul": "pointwise", "rmsnorm": "normalization",
         "layernorm": "normalization", "softmax fp32": "normalization"}


def main():
    dev = torch.device("cuda")
    copy_bw = bf.copy_bandwidth(dev)
    best = {}
    for shape in [(16384, 4096), (8191, 5000)]:
        for cfg_kind, configs in CONFIGS.items():
            for cfg in configs:
                plan.TUNING.clear()
                plan.TUNING.update(copy.deepcopy(BASE))
                plan.TUNING.update(cfg)
                for name, fd, eager, inputs in bf.make_cases(*shape, dev):
                    if CASES[name] != cfg_kind:
                        continue
                    outs = fd.execute(inputs)
                    bf.check(outs, eager(*inputs), name)
                    ms = triton.testing.do_bench(lambda: fd.execute(inputs), warmup=10, rep=60, return_mode="median")
                    moved = bf.nbytes(inputs) + bf.nbytes(outs)
                    row = {"case": name, "shape": shape, "cfg": {k: str(v) for k, v in cfg.items()}, "ms": ms,
                           "pct_copy_bw": 100 * moved / (ms * 1e-3) / 1e9 / copy_bw}
                    print(json.dumps(row))
                    key = (name, shape)
                    if key not in best or ms < best[key]["ms"]:
                        best[key] = row
    print("BEST")
    for row in best.values():
        print(json.dumps(row))


if __name__ == "__main__":
    main()
