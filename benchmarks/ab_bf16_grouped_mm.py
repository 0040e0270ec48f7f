"""The bf16 baseline of the NVFP4 GEMM ratios, built two ways: why do the two benchmarks disagree?

At N=14336 with 1-16 tokens per expert, ``bench_nvfp4.py``'s ``bf16 torch._grouped_mm`` row has been about 15%
slower than ``ab_nvfp4_decode.py``'s ``bf16`` row, the same call on operands of the same shapes, and the ratios
the README reports depend on which one is the baseline. The two differ in how the operands are made
(``bench_nvfp4``: fp32 ``randn / sqrt(K)`` weights cast to bf16; ``ab_nvfp4_decode``: bf16 ``randn`` weights) and
in how the call is timed (eager against captured in a CUDA graph). This script times, interleaved in one process,
``torch._grouped_mm`` on:

- ``bench operands``: weights and tokens as ``bench_nvfp4.bench_gemm`` makes them;
- ``ab operands``: as ``ab_nvfp4_decode`` makes them;
- ``bench weights, ab tokens``: to split the two;
- ``zero weights``: the same call on zeros (does the data's magnitude change the time at all?);
- ``bench_gemm's operands``: made by ``bench_nvfp4.gemm_operands`` itself, with the NVFP4 quantization, the
  grouped quantize and the fp32 reference that the bench runs before its rows (in the twenty-ninth and thirtieth
  sessions the bench's bf16 row at N=14336 with 16 tokens took 399-404 µs where the sets above took 357);
- ``pyfuser fd op``: the NVFP4 GEMM on those operands, last in each round, so that round 1 shows whether the
  bf16 calls timed after it are slower than those before it;

each eager and captured in a CUDA graph, with do_bench's zeroing flush and with L2 cleared by a read
(benchmarks/timing.py). Run on the GPU machine:

    python benchmarks/ab_bf16_grouped_mm.py --out benchmarks/results --tag h200

Writes <out>/<date>-ab-bf16-grouped-mm[-tag].json and prints one JSON line per shape (times in µs, the median
over ``--rounds`` interleaved rounds).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys

import torch
import triton.testing

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_fusions import parse_shapes, result_suffix  # noqa: E402
from bench_nvfp4 import _gemm_fusion, cuda_graphed, gemm_operands  # noqa: E402
from timing import median_ms_read_flush  # noqa: E402

G, K = 8, 4096


def operand_sets(n: int, tokens_per_expert: int, dev: torch.device) -> dict:
    """{name: callable} of the same ``torch._grouped_mm`` call on operands built each way."""
    m = G * tokens_per_expert
    offs = torch.cumsum(torch.full((G,), tokens_per_expert, device=dev), 0).to(torch.int32)
    w_bench = (torch.randn(G, n, K, device=dev) / K**0.5).to(torch.bfloat16)
    x_bench = torch.randn(m, K, device=dev, dtype=torch.bfloat16)
    w_ab = torch.randn(G, n, K, device=dev, dtype=torch.bfloat16)
    x_ab = torch.randn(m, K, device=dev, dtype=torch.bfloat16)
    w_zero = torch.zeros(G, n, K, device=dev, dtype=torch.bfloat16)
    gemm = gemm_operands(dev, tokens_per_expert, n, K)
    fd = _gemm_fusion()
    return {
        "bench operands": lambda: torch._grouped_mm(x_bench, w_bench.transpose(-1, -2), offs=offs),
        "ab operands": lambda: torch._grouped_mm(x_ab, w_ab.transpose(-2, -1), offs=offs),
        "bench weights, ab tokens": lambda: torch._grouped_mm(x_ab, w_bench.transpose(-1, -2), offs=offs),
        "zero weights": lambda: torch._grouped_mm(x_ab, w_zero.transpose(-1, -2), offs=offs),
        "bench_gemm's operands": lambda: torch._grouped_mm(gemm.x, gemm.w_bf16.transpose(-1, -2), offs=gemm.ends),
        "pyfuser fd op": lambda: fd.execute(list(gemm.args))[0],
    }


def time_shape(n: int, tokens_per_expert: int, rounds: int, dev: torch.device) -> dict:
    fns = operand_sets(n, tokens_per_expert, dev)
    fns.update({f"{name}, CUDA graph": cuda_graphed(fn) for name, fn in list(fns.items()) if "pyfuser" not in name})
    timers = {
        "zeroing flush": lambda fn: triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"),
        "read flush": lambda fn: median_ms_read_flush(fn, n=100),
    }
    times: dict = {}
    for _ in range(rounds):
        for name, fn in fns.items():
            for flush, timer in timers.items():
                times.setdefault(f"{name} [{flush}]", []).append(timer(fn) * 1e3)
    return {"N": n, "tokens_per_expert": tokens_per_expert,
            "us": {k: round(statistics.median(v), 2) for k, v in times.items()},
            "us_rounds": {k: [round(t, 2) for t in v] for k, v in times.items()}}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--tag", default="")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shapes", default="2048x1,2048x16,14336x1,14336x16",
                    help="N x tokens per expert, comma-separated")
    args = ap.parse_args(argv)
    dev = torch.device("cuda")
    torch.manual_seed(0)
    rows = []
    for n, tpe in parse_shapes(args.shapes):
        rows.append(time_shape(n, tpe, args.rounds, dev))
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "us_rounds"}), flush=True)
        torch.cuda.empty_cache()
    os.makedirs(args.out, exist_ok=True)
    name = f"{datetime.date.today().isoformat()}-ab-bf16-grouped-mm{result_suffix(args.tag)}.json"
    with open(os.path.join(args.out, name), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "G": G, "K": K,
                   "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
