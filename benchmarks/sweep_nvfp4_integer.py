"""The NVFP4 grouped GEMM's integer kernel (dp4a block dot products) against the tensor-core kernel and bf16.

Run on the GPU machine:  python benchmarks/sweep_nvfp4_integer.py --out <date>-nvfp4-integer.json
Smoke run on CPU:        TRITON_INTERPRET=1 python benchmarks/sweep_nvfp4_integer.py --smoke --out /tmp/int.json

For G=8 experts (--groups), K=4096, N in {2048, 14336} (--n) and 1, 2, 4 and 8 tokens per expert (16 with --tokens), times:
- ``bf16``: torch._grouped_mm on bf16 operands of the same shape (weights [G, N, K] passed transposed);
- ``tensor cores``: ``GroupedGemm`` with ``tensor_core_config`` (the tensor-core kernel's own heuristic);
- ``int BN/BK/W[/S[/SPLIT]]``: ``GroupedGemm`` with the integer kernel at block_n BN, block_k BK, W warps, S
  pipeline stages (default: INTEGER_CONFIG's) and split-K SPLIT (default 1);
- ``default``: ``GroupedGemm`` with ``default_config`` (whichever kernel the heuristic picks);
- ``copy``: a device copy moving the same bytes (half read, half written): each row's ``x_copy`` is the copy's
  time over the row's (1.0: as fast as a copy of its bytes, the floor at this size with the L2 cleared).
Each is prepared once and captured alone in a CUDA graph; a time is the median GPU time of
``triton.testing.do_bench`` over the graph's replays (L2 cleared before each, so the weights come from HBM as in a
decode step), over ``--rounds`` interleaved rounds (median and min-max reported). Every row is checked against
``pyfuser.nvfp4.reference.nvfp4_grouped_mm`` (the tolerance of benchmarks/sweep_nvfp4_gemm.py). GB/s: the fp4
weights, their scales and the tokens read once. Writes the JSON to --out and prints a table; exits 1 on a mismatch.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel_variant  # noqa: E402
from sweep_nvfp4_gemm import check_rows, make_operands, record_graph_times, save_partial  # noqa: E402
from pyfuser.kernels import nvfp4_grouped_gemm as shipped  # noqa: E402
from pyfuser.nvfp4 import reference  # noqa: E402

# (block_n, block_k, num_warps[, num_stages[, split_k]]) of the integer kernel.
INTEGER_CONFIGS = [(32, 512, 4), (64, 512, 4), (64, 512, 8), (128, 256, 4), (64, 1024, 4), (64, 512, 4, 2),
                   (64, 512, 4, 4), (64, 512, 4, 1), (32, 512, 4, 3, 2), (64, 512, 4, 3, 2), (64, 512, 4, 3, 4)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON results path")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds")
    ap.add_argument("--rep-ms", type=int, default=40, help="do_bench time per row and round (ms)")
    ap.add_argument("--tokens", default="1,2,4,8", help="tokens per expert, comma-separated")
    ap.add_argument("--configs", help="integer configs BN/BK/W[/S[/SPLIT]], comma-separated (default: "
                                      "INTEGER_CONFIGS)")
    ap.add_argument("--groups", type=int, default=8, help="experts G")
    ap.add_argument("--n", help="weight rows N, comma-separated (default 2048,14336)")
    ap.add_argument("--module", help="time this version of nvfp4_grouped_gemm.py instead of the shipped one "
                                     "(benchmarks/kernel_variant.py)")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on any device (CPU: TRITON_INTERPRET=1)")
    args = ap.parse_args()
    gg = kernel_variant.load(args.module) if args.module else shipped
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    g, k, ns = (2, 128, (64,)) if args.smoke else (args.groups, 4096, (2048, 14336))
    if args.n:
        ns = tuple(int(v) for v in args.n.split(","))
    configs = [(16, 64, 4), (16, 32, 4, 1, 2)] if args.smoke else INTEGER_CONFIGS
    if args.configs:
        configs = [tuple(int(v) for v in c.split("/")) for c in args.configs.split(",")]
    result = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
              "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (smoke)",
              "torch": torch.__version__, "triton": triton.__version__, "module": args.module or "shipped",
              "G": g, "K": k, "shapes": []}
    t_start = time.time()
    failures = []
    for n in ns:
        for tpe in (int(t) for t in args.tokens.split(",")):
            tokens = [tpe] * g
            m = sum(tokens)
            ops = make_operands(tokens, n, k, dev)
            ref = reference.nvfp4_grouped_mm(*ops, torch.bfloat16)
            rows = {}

            def add(name, **cfg):
                gemm = gg.GroupedGemm(*ops, torch.bfloat16, **cfg)
                out = torch.empty((m, n), dtype=torch.bfloat16, device=dev)
                rows[name] = (lambda: gemm(*ops, out=out), out, gemm.cfg)

            add("tensor cores", **vars(gg.tensor_core_config(m, n, k, g)))
            for bn, bk, w, *rest in configs:
                stages, split = (*rest, *(gg.INTEGER_CONFIG.num_stages, 1)[len(rest):])[:2]
                add(f"int {'/'.join(str(v) for v in (bn, bk, w, *rest))}", integer=True, block_m=1, split_k=split,
                    block_n=bn, block_k=bk, num_warps=w, num_stages=stages)
            add("default")
            if dev.type == "cuda":
                a16 = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                w16 = torch.randn(g, n, k, device=dev, dtype=torch.bfloat16)
                offs = torch.cumsum(torch.tensor(tokens, device=dev), 0).to(torch.int32)
                rows["bf16"] = (lambda: torch._grouped_mm(a16, w16.transpose(-2, -1), offs=offs), None, None)
            moved = sum(t.numel() * t.element_size() for t in ops[:4])
            if dev.type == "cuda":
                src = torch.empty(moved // 2, dtype=torch.uint8, device=dev)
                dst = torch.empty_like(src)
                rows["copy"] = (lambda: dst.copy_(src), None, None)
            entry = {"N": n, "tokens_per_expert": tpe, "M": m, "bytes": moved, "rows": check_rows(rows, ref)}
            failures += [(n, tpe, name) for name, r in entry["rows"].items() if r.get("matches_reference") is False]
            if dev.type == "cuda":
                record_graph_times(entry["rows"], {name: fn for name, (fn, _, _) in rows.items()}, args.rounds,
                                   args.rep_ms, moved)
                for r in entry["rows"].values():
                    r["x_copy"] = round(entry["rows"]["copy"]["us"] / r["us"], 3)
                del a16, w16, src, dst
            result["shapes"].append(entry)
            print(f"\nN={n}, {tpe} tokens/expert (M={m}, G={g}, K={k})")
            for name, r in entry["rows"].items():
                timing = (f"{r['us']:8.1f} us [{r['us_min']:.1f}-{r['us_max']:.1f}] {r['x_bf16']:5.2f}x bf16 "
                          f"{r['x_copy']:5.2f}x copy {r['GBps']:7.0f} GB/s" if "us" in r else "")
                check = "" if "matches_reference" not in r else (
                    f" ref {'ok' if r['matches_reference'] else 'MISMATCH'} ({r['max_rel_err']:.1e})")
                print(f"  {name:16s}{timing}{check}", flush=True)
            del ops, ref, rows
            save_partial(result, args.out, t_start, dev)
    print(f"\nwrote {args.out} ({result['wall_s']} s)")
    if failures:
        print(f"reference mismatches: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
