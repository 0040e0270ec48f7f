"""Where the NVFP4 grouped quantize's time goes: the same x quantized with each scale layout, against a copy.

Run on the GPU machine:  python benchmarks/ab_quantize_layouts.py --out DIR [--variant FILE.py ...]
                                [--timing-only FILE.py ...] [--knobs]
Smoke run on CPU:        TRITON_INTERPRET=1 python benchmarks/ab_quantize_layouts.py --device cpu --m 256 --k 512

The grouped quantize (scales written into the layout op's grouped, 128x4-swizzled buffer) took 1.37x a copy of
its bytes on the H200 at bf16 [16384, 4096], g=8, while the plain quantize (row-major scales) of the same x took
1.15x (docs/nvfp4.md). This script times, for one x, in interleaved rounds:
- ``plain``: ``block_quantize(x)``, row-major scales;
- ``swizzled``: ``block_quantize(x, swizzle=True)``, one group: the swizzled scale store and the zero-padding
  programs, without group lookups;
- ``grouped``: ``grouped_block_quantize(x, starts, sf_starts)`` over g uneven groups;
- a copy moving each layout's bytes (x read, packed data and scales written); each row's ceiling is its bytes at
  the best bandwidth of the three copies;
and the swizzled and grouped rows again with the kernel's other scale stores (``scale_store``: 32-bit words, and
words from rows interleaved within 128-row blocks; bit-identical by construction, checked here).
``--knobs`` adds grouped rows for other tilings (block_k, tiles per program, warps; bit-identical by contract)
and one without the padding programs (timing only: its padding is left unwritten).
``--variant FILE.py`` adds the same three rows for another version of ``pyfuser/kernels/nvfp4_layout.py`` (its
source as in the repository, e.g. ``git show REV:pyfuser/kernels/nvfp4_layout.py > FILE.py``, loaded by
``benchmarks/kernel_variant.py``); its outputs must equal the shipped kernel's bit for bit, or its rows are not
timed. ``--timing-only FILE.py`` times such a file without that check (a variant that leaves work out, to bound
what that work costs); its rows are marked.

Each quantization is prepared once (``BlockQuantize``: checks, config and bound launch, as a cached fusion holds
it) and replayed from a CUDA graph of ``--calls`` calls, so the times are GPU time alone: the H200 host's time
per call (allocation, launch) would otherwise mix in where it exceeds the kernel's. Each time is the median of
``triton.testing.do_bench`` (L2 flushed between replays) over ``--rounds`` interleaved rounds, divided by the
calls per graph; the spread (min-max over rounds) is reported, because kernel times on the H200 have moved by up
to 3x between repeats within one process. Writes DIR/<date>-quantize-layouts.json and .md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel_variant  # noqa: E402
from bench_nvfp4 import offsets_for, uneven_counts  # noqa: E402
from pyfuser.kernels import nvfp4_layout as shipped  # noqa: E402


def _load(path: str):
    return kernel_variant.load(path)


def _timer(device: torch.device, calls: int):
    """ms per call of a prepared quantization: on CUDA replays of a graph of ``calls`` calls (GPU time only)."""
    if device.type == "cuda":
        import triton.testing

        def graphed(fn):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):  # compiles, and warms the caching allocator for the capture
                    fn()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(calls):
                    fn()
            # (the replays read and write what fn's closure holds: kept alive with the graph)
            return lambda fn=fn: triton.testing.do_bench(graph.replay, warmup=25, rep=100,
                                                         return_mode="median") / calls
        return graphed

    def wall(fn):  # CPU smoke runs: a few calls, wall clock
        fn()

        def once():
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3
        return once
    return wall


def _storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """Everything behind a (possibly padded, strided) output, as raw bytes: what a consumer reads."""
    n = t.untyped_storage().nbytes() // t.element_size()
    return torch.as_strided(t, (n,), (1,), 0).view(torch.uint8)


def _rows(module, x, starts, sf_starts, layouts=("plain", "swizzled", "grouped"), **kw):
    """Prepared quantizations of x (checks, config and bound launch done once, as a cached fusion holds them)."""
    rows = {}
    if "plain" in layouts:
        plain = module.BlockQuantize(x, **kw)
        rows["plain"] = lambda: plain(x)
    if "swizzled" in layouts:
        swizzled = module.BlockQuantize(x, swizzle=True, **kw)
        rows["swizzled"] = lambda: swizzled(x)
    if "grouped" in layouts:
        grouped = module.BlockQuantize(x, None, starts, sf_starts, **kw)
        rows["grouped"] = lambda: grouped(x, None, starts, sf_starts)
    return rows


def _without_padding_programs(module, make):
    """``make()`` with the quantize launches' grid cut to the quantize programs (timing only: the swizzled buffer's
    padding is then left unwritten). The quantize programs' count is the launch's 9th integer argument."""
    original = module.bound_launch

    def trimmed(kernel, grid, ints, *args, **kwargs):
        assert kernel is module._block_quantize_kernel and 0 < ints[8] <= grid[0], "launch arguments moved"
        return original(kernel, (ints[8],), ints, *args, **kwargs)

    module.bound_launch = trimmed
    try:
        return make()
    finally:
        module.bound_launch = original


def _same_bits(a_rows, b_rows) -> bool:
    for name in b_rows:
        a, b = a_rows[name](), b_rows[name]()
        if not all(torch.equal(_storage_bytes(p), _storage_bytes(q)) for p, q in zip(a, b)):
            return False
    return True


# Grouped rows with other tilings (block_k, tiles per program, warps; block_m 4 x block_k 512, 2 tiles, 2 warps is
# the default): every tiling gives the same bits.
KNOBS = {
    "block_k 1024": dict(block_k=1024),
    "block_k 1024, 1 tile": dict(block_k=1024, tiles=1),
    "1 tile": dict(tiles=1),
    "4 tiles": dict(tiles=4),
    "4 warps": dict(num_warps=4),
    "8 x 512, 4 warps": dict(block_m=8, num_warps=4),
    "2 x 1024": dict(block_m=2, block_k=1024),
}


ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("--out", default="benchmarks/results")
ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
ap.add_argument("--m", type=int, default=16384)
ap.add_argument("--k", type=int, default=4096)
ap.add_argument("--groups", type=int, default=8)
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--variant", action="append", default=[], help="a module file with a kernel variant")
ap.add_argument("--timing-only", action="append", default=[],
                help="a module file with a kernel variant timed without the bit-identity check")
ap.add_argument("--knobs", action="store_true", help="grouped rows for other tilings, and without padding programs")
ap.add_argument("--calls", type=int, default=10, help="calls per CUDA graph")


def main(argv=None):
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    bench = _timer(dev, args.calls)
    torch.manual_seed(0)
    m, k, g = args.m, args.k, args.groups
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    starts, sf_starts = (t.to(dev) for t in offsets_for(uneven_counts(m, g, seed=m)))
    impls = {"shipped": _rows(shipped, x, starts, sf_starts)}
    skipped = {}
    candidates = [(name, _rows(shipped, x, starts, sf_starts, ("swizzled", "grouped"), scale_store=store))
                  for name, store in (("scale words", shipped.SCALE_WORDS),
                                      ("scale words, rows interleaved", shipped.SCALE_WORDS_INTERLEAVED))]
    if args.knobs:
        candidates += [(name, _rows(shipped, x, starts, sf_starts, ("grouped",), **kw)) for name, kw in KNOBS.items()]
    candidates += [(os.path.basename(path), _rows(_load(path), x, starts, sf_starts)) for path in args.variant]
    for name, rows in candidates:  # each must give the default's bits, or it is not timed
        if _same_bits(impls["shipped"], rows):
            impls[name] = rows
        else:
            skipped[name] = "outputs differ from the shipped kernel's"
    if args.knobs:
        impls["no padding programs (timing only)"] = _without_padding_programs(
            shipped, lambda: _rows(shipped, x, starts, sf_starts, ("swizzled", "grouped")))
    for path in args.timing_only:
        impls[f"{os.path.basename(path)} (timing only)"] = _rows(_load(path), x, starts, sf_starts)
    pk = -(-(k // 16) // 4) * 4
    data_bytes = m * k * 2 + m * k // 2  # x read, packed FP4 written
    scale_bytes = {"plain": m * (k // 16), "swizzled": -(-m // 128) * 128 * pk, "grouped": (m + 127 * g) * pk}
    copies = {}
    for name, nbytes in scale_bytes.items():
        src = torch.empty((data_bytes + nbytes) // 2, dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        copies[name] = bench(lambda dst=dst, src=src: dst.copy_(src))
    impls = {impl: {name: bench(fn) for name, fn in rows.items()} for impl, rows in impls.items()}
    times: dict = {}
    for _ in range(args.rounds):  # interleaved: a drift of the machine hits every row alike
        for name, copy in copies.items():
            times.setdefault(("copy", name), []).append(copy())
        for impl, rows in impls.items():
            for name, timed in rows.items():
                times.setdefault((impl, name), []).append(timed())
    # The ceiling of a row: its bytes at the best bandwidth any of the three copies reached. One copy has run 50%
    # slower than the others for 2% more bytes (where a buffer lands matters on the H200), and dividing by it
    # would flatter its rows.
    moved = {name: data_bytes + nbytes for name, nbytes in scale_bytes.items()}
    copy_ms_of = {name: statistics.median(times[("copy", name)]) for name in scale_bytes}
    best_bw = max(moved[name] / copy_ms_of[name] for name in scale_bytes)  # bytes per ms
    results = []
    for (impl, name), ts in times.items():
        if impl == "copy":
            continue
        copy_ms = moved[name] / best_bw
        med = statistics.median(ts)
        results.append({"impl": impl, "layout": name, "us": med * 1e3, "min_us": min(ts) * 1e3,
                        "max_us": max(ts) * 1e3, "copy_us": copy_ms * 1e3, "x_copy": med / copy_ms})
    meta = {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(dev)
            if dev.type == "cuda" else "cpu", "torch": torch.__version__, "shape": [m, k], "groups": g,
            "rounds": args.rounds, "calls": args.calls, "skipped_variants": skipped}
    lines = [f"# NVFP4 quantize by scale layout, {meta['date']}", "",
             f"{meta['device']}, torch {meta['torch']}; bf16 x {[m, k]}, g={g}; " + (
                 f"GPU time per call: CUDA graphs of {args.calls} prepared calls, median of {args.rounds} interleaved "
                 "rounds of do_bench" if dev.type == "cuda" else f"wall clock of one call, {args.rounds} rounds")
             + " (min-max in brackets). Time / copy: against the row's bytes moved at the best bandwidth of the three "
             "copies below (each moves one layout's bytes).", "",
             "| kernel | scale layout | µs | time / copy |", "|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['impl']} | {r['layout']} | {r['us']:.1f} [{r['min_us']:.1f}-{r['max_us']:.1f}] | "
                     f"{r['x_copy']:.2f}x |")
    lines += [f"| copy | {name} bytes | {copy_ms_of[name] * 1e3:.1f} | {copy_ms_of[name] * best_bw / moved[name]:.2f}x |"
              for name in scale_bytes]
    lines += [f"\nNot timed: {p}: {why}" for p, why in skipped.items()]
    report = "\n".join(lines) + "\n"
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"{meta['date']}-quantize-layouts")
    with open(stem + ".json", "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(report)
    print(report)


if __name__ == "__main__":
    main()
