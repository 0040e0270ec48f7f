"""Rows of 16384 columns that fit in registers: persistent (16 or 32 warps) against the wide looped kernel and its
variants (tile width, warps, tiles per step), RMSNorm, LayerNorm and softmax, fp32 and bf16 I/O, two runs each.

    python benchmarks/sweep_fp32_wide_rows.py [--out FILE.jsonl]

Chose plan.TUNING["wide_fp32_min_row_inputs"] (2026-12-02, results/2026-12-02-fp32-wide-rows.jsonl; "default"
there is the rule before it: every multi-pass fp32 row wide).
"""
import argparse
import copy
import json
import sys

import torch
import triton.testing

sys.path.insert(0, "benchmarks")
import bench_fusions as bf  # noqa: E402

from pyfuser.codegen import plan  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--out", default="fp32-wide-rows.jsonl")
args = ap.parse_args()
dev = torch.device("cuda")
bw = bf.copy_bandwidth(dev)
base = copy.deepcopy(plan.TUNING)
cfgs = {"default": {"wide_fp32_min_row_inputs": 1}, "persist16": {"wide_fp32_min_cols": 1 << 30},
        "persist32": {"wide_fp32_min_cols": 1 << 30, "persistent_warps": {2048: 4, 8192: 8, 1 << 62: 32},
                      "multi_pass_elems_per_thread": 16},
        "wide2048": {"wide_fp32_block_c": 2048, "wide_fp32_min_row_inputs": 1},
        "wide8192": {"wide_fp32_block_c": 8192, "wide_fp32_min_row_inputs": 1},
        "wide_w16": {"wide_warps": 16, "wide_fp32_min_row_inputs": 1},
        "wide_u2": {"wide_unroll": 2, "wide_fp32_min_row_inputs": 1}}
out = open(args.out, "w")
for dtype in (torch.float32, torch.bfloat16):
    for name_cfg, cfg in cfgs.items():
        for rep in range(2):
            plan.TUNING.clear()
            plan.TUNING.update(copy.deepcopy(base))
            plan.TUNING.update(cfg)
            for name, fd, eager, inputs in bf.make_cases(4096, 16384, dev, dtype):
                if name.split(" [")[0] not in ("layernorm", "softmax fp32", "rmsnorm"):
                    continue
                outs = fd.execute(inputs)
                bf.check(outs, eager(*inputs), name)
                ms = triton.testing.do_bench(lambda: fd.execute(inputs), warmup=10, rep=60, return_mode="median")
                pct = round(100 * (bf.nbytes(inputs) + bf.nbytes(outs)) / (ms * 1e-3) / 1e9 / bw, 1)
                p = fd.last_runtime().kernel_step(0).plan
                row = dict(case=name, cfg=name_cfg, rep=rep, pct=pct, mode=p.mode, warps=p.num_warps)
                print(json.dumps(row), flush=True)
                out.write(json.dumps(row) + "\n")
