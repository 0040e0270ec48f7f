"""The NVFP4 grouped GEMM's integer kernel (dp4a block dot products) against the tensor-core kernel and bf16.

Run on the GPU machine:  python benchmarks/sweep_nvfp4_integer.py --out <date>-nvfp4-integer.json
Smoke run on CPU:        TRITON_INTERPRET=1 python benchmarks/sweep_nvfp4_integer.py --smoke --out /tmp/int.json

For G=8 experts, K=4096, N in {2048, 14336} and 1, 2, 4 and 8 tokens per expert (16 with --tokens), times:
- ``bf16``: torch._grouped_mm on bf16 operands of the same shape (weights [G, N, K] passed transposed);
- ``tensor cores``: ``GroupedGemm`` with ``tensor_core_config`` (the tensor-core kernel's own heuristic);
- ``int BN/BK/W``: ``GroupedGemm`` with the integer kernel at block_n BN, block_k BK, W warps;
- ``default``: ``GroupedGemm`` with ``default_config`` (whichever kernel the heuristic picks).
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
from sweep_nvfp4_gemm import check_rows, make_operands, record_graph_times, save_partial  # noqa: E402
from pyfuser.kernels import nvfp4_grouped_gemm as gg  # noqa: E402
from pyfuser.nvfp4 import reference  # noqa: E402

# (block_n, block_k, num_warps) of the integer kernel.
INTEGER_CONFIGS = [(32, 512, 4), (64, 512, 4), (64, 512, 8), (128, 512, 8), (64, 1024, 4), (128, 256, 4)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON results path")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds")
    ap.add_argument("--rep-ms", type=int, default=40, help="do_bench time per row and round (ms)")
    ap.add_argument("--tokens", default="1,2,4,8", help="tokens per expert, comma-separated")
    ap.add_argument("--configs", help="integer configs BN/BK/W, comma-separated (default: INTEGER_CONFIGS)")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on any device (CPU: TRITON_INTERPRET=1)")
    args = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    g, k, ns = (2, 128, (64,)) if args.smoke else (8, 4096, (2048, 14336))
    configs = [(16, 64, 4)] if args.smoke else INTEGER_CONFIGS
    if args.configs:
        configs = [tuple(int(v) for v in c.split("/")) for c in args.configs.split(",")]
    result = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
              "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (smoke)",
              "torch": torch.__version__, "triton": triton.__version__, "G": g, "K": k, "shapes": []}
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
            for bn, bk, w in configs:
                add(f"int {bn}/{bk}/{w}", integer=True, block_m=1, split_k=1, block_n=bn, block_k=bk, num_warps=w,
                    num_stages=1)
            add("default")
            if dev.type == "cuda":
                a16 = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                w16 = torch.randn(g, n, k, device=dev, dtype=torch.bfloat16)
                offs = torch.cumsum(torch.tensor(tokens, device=dev), 0).to(torch.int32)
                rows["bf16"] = (lambda: torch._grouped_mm(a16, w16.transpose(-2, -1), offs=offs), None, None)
            moved = sum(t.numel() * t.element_size() for t in ops[:4])
            entry = {"N": n, "tokens_per_expert": tpe, "M": m, "bytes": moved, "rows": check_rows(rows, ref)}
            failures += [(n, tpe, name) for name, r in entry["rows"].items() if r.get("matches_reference") is False]
            if dev.type == "cuda":
                record_graph_times(entry["rows"], {name: fn for name, (fn, _, _) in rows.items()}, args.rounds,
                                   args.rep_ms, moved)
                del a16, w16
            result["shapes"].append(entry)
            print(f"\nN={n}, {tpe} tokens/expert (M={m}, G={g}, K={k})")
            for name, r in entry["rows"].items():
                timing = (f"{r['us']:8.1f} us [{r['us_min']:.1f}-{r['us_max']:.1f}] {r['x_bf16']:5.2f}x bf16 "
                          f"{r['GBps']:7.0f} GB/s" if "us" in r else "")
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
