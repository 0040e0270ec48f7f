"""A/B of the generated kernels of two pyfuser source trees, in one run on one GPU.

Run on the GPU machine:  python benchmarks/ab_trees.py --base OTHER_TREE [--cases softmax,layernorm]
                             [--shapes 8191x5000,16384x4096] [--dtypes bf16,fp32] [--rounds 2] [--out DIR]

OTHER_TREE is a checkout of another commit (``git worktree add`` or ``git archive REV | tar -x``). Each round
times every selected case of bench_fusions.py in the other tree and in this one, each tree in a subprocess of
its own (each imports its own pyfuser), alternating, so that drift of the machine shows as round-to-round
differences. Cases are checked against eager before they are timed. Prints and writes (DIR/<date>-ab-<tag>.json)
% of copy bandwidth per case and tree, and the ratio of the two times (base over this tree: above 1, this tree
is faster).
"""

from __future__ import annotations

import argparse
import datetime
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


def run_tree(tree: str, args) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--cases", args.cases,
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
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
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
            print(f"round {i}  {key[0]:<22} {str(list(key[1])):<15} base {b['pct_copy_bw']:5.1f}%  this "
                  f"{t['pct_copy_bw']:5.1f}%  base/this time {b['ms'] / t['ms']:.3f}", flush=True)
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
