"""A/B of the generated kernels of two pyfuser source trees, in one run on one GPU.

Run on the GPU machine:  python benchmarks/ab_trees.py --base OTHER_TREE [--cases softmax,layernorm]
                             [--shapes 8191x5000,16384x4096] [--dtypes bf16,fp32] [--rounds 2] [--out DIR]
                         python benchmarks/ab_trees.py --base OTHER_TREE --suite nvfp4-decode [--rounds 3]

OTHER_TREE is a checkout of another commit (``git worktree add`` or ``git archive REV | tar -x``). Each round
times every selected case of bench_fusions.py in the other tree and in this one, each tree in a subprocess of
its own (each imports its own pyfuser), alternating, so that drift of the machine shows as round-to-round
differences. Cases are checked against eager before they are timed. Prints and writes (DIR/<date>-ab-<tag>.json)
% of copy bandwidth per case and tree, and the ratio of the two times (base over this tree: above 1, this tree
is faster).

``--suite nvfp4-decode`` times bench_nvfp4.py's decode-sized layout op and grouped quantize instead (8 experts, 16
tokens each; one-op fusions through ``fd.execute``, the offsets' device check on and off) and, in the same process,
a copy of the same bytes; each is the median of 12 interleaved do_bench medians (microsecond kernels: one
do_bench median moves by about 0.3 us from call to call).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TREE = os.path.dirname(HERE)


def worker(cases: list[str], shapes: list[tuple[int, int]], dtypes: list[str]) -> None:
    """Time the cases of the tree this process runs in (its working directory, also its PYTHONPATH); one JSON
    line per case."""
    import torch

    sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
    import bench_fusions as bf

    dev = torch.device("cuda")
    torch.manual_seed(0)
    copy_bw = bf.copy_bandwidth(dev)
    for dt in dtypes:
        for r, c in shapes:
            for name, fd, eager, inputs in bf.make_cases(r, c, dev, {"bf16": torch.bfloat16, "fp32": torch.float32}[dt]):
                if not any(name.startswith(k) for k in cases):
                    continue
                outs = fd.execute(inputs)
                bf.check(outs, eager(*inputs), name)
                ms = bf.bench(lambda: fd.execute(inputs))
                moved = bf.nbytes(inputs) + bf.nbytes([o for o in outs if o._base is None])
                print(json.dumps({"case": name, "shape": [r, c], "ms": ms,
                                  "pct_copy_bw": 100 * moved / (ms * 1e-3) / 1e9 / copy_bw}), flush=True)


def decode_worker() -> None:
    """Time bench_nvfp4's decode-sized layout op and grouped quantize of the tree this process runs in, with the
    offsets' device check on and off, against a copy of the same bytes; one JSON line per row."""
    import statistics

    import torch
    import triton.testing

    sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
    import bench_nvfp4 as bn

    dev = torch.device("cuda")
    torch.manual_seed(0)
    big_k, cases = bn.layout_cases(False)
    _, m, counts = cases[0]  # decode 8x16
    starts, sf_starts = (t.to(dev) for t in bn.offsets_for(counts))
    k = big_k // 16
    scales = (torch.rand(m, k, device=dev) * 400 + 1).to(torch.float8_e4m3fn)
    x = torch.randn(m, big_k, device=dev, dtype=torch.bfloat16)
    ops = {"layout op": (bn.layout_fusion(), [scales, starts, sf_starts], bn.layout_bytes(m, k), [m, k]),
           "grouped quantize": (bn.grouped_quantize_fusion(), [x, starts, sf_starts],
                                bn.grouped_quantize_bytes(m, big_k), [m, big_k])}
    fns = {}
    for name, (fd, args, nbytes, _) in ops.items():
        a = torch.empty(nbytes // 2, dtype=torch.uint8, device=dev)
        fns[(name, "copy")] = functools.partial(torch.Tensor.copy_, torch.empty_like(a), a)
        fns[(name, "checks device")] = functools.partial(fd.execute, args)
        fns[(name, "checks off")] = functools.partial(fd.execute, args, _disable_options=bn.NO_CHECKS)
    for fn in fns.values():
        fn()
    times = {key: [] for key in fns}
    for _ in range(12):
        for key, fn in fns.items():
            times[key].append(triton.testing.do_bench(fn, warmup=5, rep=40, return_mode="median"))
    for (name, impl), ts in times.items():
        if impl == "copy":
            continue
        ms, copy_ms = statistics.median(ts), statistics.median(times[(name, "copy")])
        print(json.dumps({"case": f"{name}, {impl}", "shape": ops[name][3], "ms": ms, "copy_ms": copy_ms,
                          "pct_same_size_copy": 100 * copy_ms / ms}), flush=True)


def run_tree(tree: str, args) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--suite", args.suite, "--cases", args.cases,
           "--shapes", args.shapes, "--dtypes", args.dtypes]
    env = dict(os.environ, PYTHONPATH=tree)
    out = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{tree}: {out.stderr[-4000:]}")
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return {(r["case"], tuple(r["shape"])): r for r in rows}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", help="the other source tree")
    ap.add_argument("--cases", default="softmax,layernorm,rmsnorm", help="case-name prefixes, comma-separated")
    ap.add_argument("--shapes", default="16384x4096,8191x5000,4096x16384,32768x1024")
    ap.add_argument("--dtypes", default="bf16")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--tag", default="", help="suffix of the result file's name, after a dash (--tag h200: "
                                              "<date>-ab-h200.json)")
    ap.add_argument("--suite", choices=("fusions", "nvfp4-decode"), default="fusions",
                    help="fusions: bench_fusions' cases; nvfp4-decode: the decode-sized NVFP4 layout op and grouped "
                         "quantize (rows then give pct_same_size_copy, the same-size copy's time over the op's, as "
                         "bench_fusions names it)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    if args.worker and args.suite == "nvfp4-decode":
        decode_worker()
        return
    if args.worker:
        worker(args.cases.split(","), shapes, args.dtypes.split(","))
        return
    if not args.base:
        ap.error("--base is required")
    rounds = []
    for i in range(args.rounds):
        base, this = run_tree(os.path.abspath(args.base), args), run_tree(TREE, args)
        for key in this:
            b, t = base[key], this[key]
            pct = "pct_copy_bw" if "pct_copy_bw" in t else "pct_same_size_copy"  # (one worker: the same keys)
            print(f"round {i}  {key[0]:<22} {str(list(key[1])):<15} base {b[pct]:5.1f}%  this {t[pct]:5.1f}%  "
                  f"base/this time {b['ms'] / t['ms']:.3f}", flush=True)
        rounds.append([{"case": k[0], "shape": list(k[1]), "base": base[k], "this": this[k]} for k in this])
    os.makedirs(args.out, exist_ok=True)
    # (the suffix as bench_fusions.result_suffix makes it: this process imports neither tree's modules)
    suffix = "-" + args.tag.lstrip("-") if args.tag else ""
    path = os.path.join(args.out, f"{datetime.date.today().isoformat()}-ab{suffix}.json")
    with open(path, "w") as f:
        json.dump({"base": os.path.abspath(args.base), "cases": args.cases, "rounds": rounds}, f, indent=1)
    print("wrote", path)


if __name__ == "__main__":
    main()
