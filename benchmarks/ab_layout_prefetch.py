"""The NVFP4 layout op with and without its L2 prefetch of the input, against a copy of the same bytes, in one process.

Run on the GPU machine:  PYTHONPATH=$PWD python3 benchmarks/ab_layout_prefetch.py [--rounds 10] [--out DIR]

The layout op's programs find their input rows by searching the offsets, so their input loads start one DRAM trip
later than a copy's; the prefetch (nvfp4_layout._prefetch_input_share; LayoutOp's default turns it on for grids of
one wave and inputs up to LAYOUT_PREFETCH_MAX_BYTES) asks L2 for the input at the start instead. Both variants
are prepared ``LayoutOp``s (the kernel launched directly: do_bench's L2 flush keeps the GPU behind the host, so
these are GPU times) on
bench_nvfp4.py's e4m3 [m, 256] scales, g = 8 uneven groups, m = 128 (decode) and 16384 (prefill). Each round times
every variant with do_bench's zeroing flush and with a reading one (timing.py), interleaved; the report gives
medians over rounds, and the time over a same-size copy's. Variants run in one process, so the microsecond
differences between processes' buffer placements (ab_trees.py's nvfp4-decode suite) do not enter.
Writes DIR/<date>-ab-layout-prefetch[-TAG].json.
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
import bench_nvfp4 as bn  # noqa: E402
from timing import median_ms_read_flush  # noqa: E402

from pyfuser.kernels import nvfp4_layout as lk  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    ap.add_argument("--tag", default="")
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    big_k, cases = bn.layout_cases(False)
    k = big_k // 16
    fns, meta = {}, {}
    for label, m, counts in cases:
        starts, outs = (t.to(dev) for t in bn.offsets_for(counts))
        scales = (torch.rand(m, k, device=dev) * 400 + 1).to(torch.float8_e4m3fn)
        expect = None
        for variant, prefetch in (("prefetch", True), ("no prefetch", False)):
            op = lk.LayoutOp(scales, starts, outs, prefetch=prefetch)
            out = bn.grouped_buffer(op(scales, starts, outs)).clone()
            if expect is None:
                expect = out
            assert torch.equal(out, expect), f"{label}: the variants differ"
            fns[(label, variant)] = (lambda op=op, s=scales, a=starts, b=outs: op(s, a, b))
        nbytes = bn.layout_bytes(m, k)
        src = torch.empty(nbytes // 2, dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        fns[(label, "copy")] = (lambda d=dst, s=src: d.copy_(s))
        meta[label] = {"m": m, "k": k, "bytes": nbytes}
    times = {(key, flush): [] for key in fns for flush in ("zero", "read")}
    for _ in range(args.rounds):
        for key, fn in fns.items():
            times[(key, "zero")].append(triton.testing.do_bench(fn, warmup=5, rep=40, return_mode="median"))
            times[(key, "read")].append(median_ms_read_flush(fn, n=60))
    rows = []
    for (label, variant), _ in fns.items():
        for flush in ("zero", "read"):
            ms = statistics.median(times[((label, variant), flush)])
            copy = statistics.median(times[((label, "copy"), flush)])
            rows.append({"case": label, **meta[label], "variant": variant, "flush": flush, "us": ms * 1e3,
                         "x_copy_time": ms / copy, "rounds_us": [t * 1e3 for t in times[((label, variant), flush)]]})
            print(f"{label:<26} {variant:<12} {flush} flush  {ms * 1e3:7.2f} us  {ms / copy:5.2f}x a copy", flush=True)
    os.makedirs(args.out, exist_ok=True)
    suffix = "-" + args.tag if args.tag else ""
    path = os.path.join(args.out, f"{datetime.date.today().isoformat()}-ab-layout-prefetch{suffix}.json")
    with open(path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(dev), "rows": rows}, f, indent=1)
    print("wrote", path)


if __name__ == "__main__":
    main()
