"""Sweep the kernel launch heuristics (pyfuser.codegen.plan.TUNING) on the GPU.

Run on the GPU machine:
    python benchmarks/sweep_tuning.py                       the default grid below; prints the best per case
    python benchmarks/sweep_tuning.py --cases layernorm --shapes 1024x65536 --dtypes bf16,fp32 \
        --configs '[{}, {"wide_welford_min_itemsize": 99}, {"wide_block_c": 4096}]' --rounds 3 --out DIR --tag h200
Each configuration builds fresh fusions (new plans, new kernels), checks them against eager and times them with
triton.testing.do_bench. With --configs, each round times every configuration once per case, in turn (so a
drift of the machine's speed hits every configuration alike), and the per-configuration median over the rounds
is printed and written to <out>/<date>-tuning-<tag>.json. One JSON line per timing either way.
"""

import argparse
import copy
import datetime
import json
import os
import statistics
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


def default_grid():
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


_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def configs_in_rounds(cases: list, shapes: list, dtypes: list, configs: list, rounds: int) -> list:
    """Every (case, shape, dtype) under every configuration of ``configs`` (TUNING overrides), ``rounds`` times,
    the configurations in turn within a round; returns one row per (case, shape, dtype, configuration)."""
    dev = torch.device("cuda")
    copy_bw = bf.copy_bandwidth(dev)
    times: dict = {}
    for rnd in range(rounds):
        for shape in shapes:
            for dtype in dtypes:
                for name, _, eager, inputs in bf.make_cases(*shape, dev, _DTYPES[dtype]):
                    if not bf.case_wanted(name, cases):
                        continue
                    make_fd = bf.CASE_FDS[name.replace(" [fp32]", "")][0]
                    fd_dtype = bf._IO_DTYPES[_DTYPES[dtype]]
                    for i, cfg in enumerate(configs):
                        _, ms, pct = bf.time_with_tuning(lambda: make_fd(shape, fd_dtype), eager, inputs, cfg,
                                                         copy_bw, name)
                        times.setdefault((name, shape, dtype, i), []).append((ms, pct))
                        print(json.dumps({"round": rnd, "case": name, "shape": shape, "cfg": cfg, "ms": ms,
                                          "pct_copy_bw": pct}), flush=True)
    rows = []
    for (name, shape, dtype, i), ts in times.items():
        ms = statistics.median(t[0] for t in ts)
        pct = statistics.median(t[1] for t in ts)
        rows.append({"case": name, "shape": list(shape), "dtype": dtype, "cfg": configs[i], "median_ms": ms,
                     "median_pct_copy_bw": pct, "rounds": [t[0] for t in ts]})
        print(f"{name:22s} {str(shape):15s} {json.dumps(configs[i]):60s} {ms:8.4f} ms {pct:5.1f}%")
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", help="case-name prefixes, comma-separated (with --configs)")
    ap.add_argument("--shapes", default="1024x65536")
    ap.add_argument("--dtypes", default="bf16")
    ap.add_argument("--configs", help="a JSON list of TUNING overrides; {} is the current default")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out")
    ap.add_argument("--tag", default="", help="suffix of the result file's name, after a dash (--tag h200: "
                                              "<date>-tuning-h200.json)")
    args = ap.parse_args(argv)
    if args.configs is None:
        default_grid()
        return
    shapes = bf.parse_shapes(args.shapes)
    rows = configs_in_rounds([c for c in (args.cases or "").split(",") if c], shapes, args.dtypes.split(","),
                             json.loads(args.configs), args.rounds)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        name = f"{datetime.date.today().isoformat()}-tuning{bf.result_suffix(args.tag)}.json"
        path = os.path.join(args.out, name)
        with open(path, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "triton": triton.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
