"""Where the NVFP4 grouped quantize's time goes: the same x quantized with each scale layout, against a copy.

Run on the GPU machine:  python benchmarks/ab_quantize_layouts.py --out DIR [--variant FILE.py ...]
Smoke run on CPU:        TRITON_INTERPRET=1 python benchmarks/ab_quantize_layouts.py --device cpu --m 256 --k 512

The grouped quantize (scales written into the layout op's grouped, 128x4-swizzled buffer) took 1.37x a copy of
its bytes on the H200 at bf16 [16384, 4096], g=8, while the plain quantize (row-major scales) of the same x took
1.15x (docs/nvfp4.md). This script times, for one x, in interleaved rounds:
- ``plain``: ``block_quantize(x)``, row-major scales;
- ``swizzled``: ``block_quantize(x, swizzle=True)``, one group: the swizzled scale store and the zero-padding
  programs, without group lookups;
- ``grouped``: ``grouped_block_quantize(x, starts, sf_starts)`` over g uneven groups;
- a copy moving each row's bytes (x read, packed data and scales written), the ceiling;
and the swizzled and grouped rows again with the kernel's other scale stores (``scale_store``: 32-bit words, and
words from rows interleaved within 128-row blocks; bit-identical by construction, checked here).
``--variant FILE.py`` adds the same three rows for a module file that defines ``block_quantize`` and
``grouped_block_quantize`` with the same contract (a kernel variant under study: a copy of
``pyfuser/kernels/nvfp4_layout.py`` with absolute imports and without its ``attach`` calls, which would register
the ops a second time); its outputs must equal the shipped kernel's bit for bit, or its rows are not timed.

Each time is the median of ``triton.testing.do_bench`` (L2 flushed between calls) over ``--rounds`` interleaved
rounds; the spread (min-max over rounds) is reported, because kernel times on the H200 have moved by up to 3x
between repeats within one process. Writes DIR/<date>-quantize-layouts.json and .md.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_nvfp4 import offsets_for, uneven_counts  # noqa: E402
from pyfuser.kernels import nvfp4_layout as shipped  # noqa: E402


def _load(path: str):
    spec = importlib.util.spec_from_file_location(f"variant_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _timer(device: torch.device):
    if device.type == "cuda":
        import triton.testing

        return lambda fn: triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")

    def wall(fn):  # CPU smoke runs: a few calls, wall clock
        fn()
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    return wall


def _storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """Everything behind a (possibly padded, strided) output, as raw bytes: what a consumer reads."""
    n = t.untyped_storage().nbytes() // t.element_size()
    return torch.as_strided(t, (n,), (1,), 0).view(torch.uint8)


def _rows(module, x, starts, sf_starts, **kw):
    return {
        "plain": lambda: module.block_quantize(x, **kw),
        "swizzled": lambda: module.block_quantize(x, swizzle=True, **kw),
        "grouped": lambda: module.grouped_block_quantize(x, starts, sf_starts, **kw),
    }


def _same_bits(a_rows, b_rows) -> bool:
    for name in b_rows:
        a, b = a_rows[name](), b_rows[name]()
        if not all(torch.equal(_storage_bytes(p), _storage_bytes(q)) for p, q in zip(a, b)):
            return False
    return True


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--m", type=int, default=16384)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variant", action="append", default=[], help="a module file with a kernel variant")
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    bench = _timer(dev)
    torch.manual_seed(0)
    m, k, g = args.m, args.k, args.groups
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    starts, sf_starts = (t.to(dev) for t in offsets_for(uneven_counts(m, g, seed=m)))
    impls = {"shipped": _rows(shipped, x, starts, sf_starts)}
    skipped = {}
    # The shipped kernel's scale stores (nvfp4_layout.SCALE_*): bytes (the default), words, words from interleaved
    # rows; they must give the default's bits.
    for name, store in (("scale words", shipped.SCALE_WORDS), ("scale words, rows interleaved",
                                                                shipped.SCALE_WORDS_INTERLEAVED)):
        rows = _rows(shipped, x, starts, sf_starts, scale_store=store)
        if _same_bits(impls["shipped"], rows):
            impls[name] = {k: v for k, v in rows.items() if k != "plain"}  # (row-major scales: always bytes)
        else:
            skipped[name] = "outputs differ from the default's"
    for path in args.variant:
        rows = _rows(_load(path), x, starts, sf_starts)
        if _same_bits(impls["shipped"], rows):
            impls[os.path.basename(path)] = rows
        else:
            skipped[path] = "outputs differ from the shipped kernel's"
    pk = -(-(k // 16) // 4) * 4
    data_bytes = m * k * 2 + m * k // 2  # x read, packed FP4 written
    scale_bytes = {"plain": m * (k // 16), "swizzled": -(-m // 128) * 128 * pk, "grouped": (m + 127 * g) * pk}
    copies = {}
    for name, nbytes in scale_bytes.items():
        src = torch.empty((data_bytes + nbytes) // 2, dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        copies[name] = lambda dst=dst, src=src: dst.copy_(src)
    times: dict = {}
    for _ in range(args.rounds):  # interleaved: a drift of the machine hits every row alike
        for name, copy in copies.items():
            times.setdefault(("copy", name), []).append(bench(copy))
        for impl, rows in impls.items():
            for name, fn in rows.items():
                times.setdefault((impl, name), []).append(bench(fn))
    results = []
    for (impl, name), ts in times.items():
        if impl == "copy":
            continue
        copy_ms = statistics.median(times[("copy", name)])
        med = statistics.median(ts)
        results.append({"impl": impl, "layout": name, "us": med * 1e3, "min_us": min(ts) * 1e3,
                        "max_us": max(ts) * 1e3, "copy_us": copy_ms * 1e3, "x_copy": med / copy_ms})
    meta = {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(dev)
            if dev.type == "cuda" else "cpu", "torch": torch.__version__, "shape": [m, k], "groups": g,
            "rounds": args.rounds, "skipped_variants": skipped}
    lines = [f"# NVFP4 quantize by scale layout, {meta['date']}", "",
             f"{meta['device']}, torch {meta['torch']}; bf16 x {[m, k]}, g={g}; median of {args.rounds} "
             "interleaved rounds of do_bench (min-max in brackets); the copy moves the same bytes.", "",
             "| kernel | scale layout | µs | time / copy |", "|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['impl']} | {r['layout']} | {r['us']:.1f} [{r['min_us']:.1f}-{r['max_us']:.1f}] | "
                     f"{r['x_copy']:.2f}x |")
    lines += [f"| copy | {name} bytes | {statistics.median(times[('copy', name)]) * 1e3:.1f} | 1.00x |"
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
