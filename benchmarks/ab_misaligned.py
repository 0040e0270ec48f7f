"""What misaligned 16-bit rows cost a pointwise kernel, and what loading them as 32-bit words recovers (H200).

    python benchmarks/ab_misaligned.py [--out FILE.json]

The slice+add+mul case of bench_fusions reads ``x[:, 1:]`` (every row starts one bf16 element past a 16-byte
boundary) and ``y[:, :-1]``, and writes rows of ``cols - 1`` elements, so neither x's loads nor the stores can be
vectorized; fp32 I/O of the same fusion reaches ~99% of copy bandwidth with 4-byte accesses, bf16 75-84%. Hand
written variants of that kernel, timed in CUDA graphs (GPU time), as % of a measured device copy:

- ``scalar``: the kernel as generated (2-byte loads of x, 2-byte stores);
- ``x aligned`` / ``all aligned``: timing-only bounds that read x from an aligned start (and write rows of
  ``cols`` elements): what vectorized loads (and stores) would give;
- ``x words``: x's odd start handled by loading 32-bit words: the aligned words ``W`` (vectorized) and the words one
  further ``W1`` (4-byte loads, cached by the first), element ``2p`` of the row the high half of ``W[p]``, element
  ``2p + 1`` the low half of ``W1[p]``; a bf16's fp32 value is its 16 bits shifted up, so no conversion is needed.
"""
import argparse
import json
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, "benchmarks")
import bench_fusions as B  # noqa: E402


@triton.jit
def _tile(x, y, o, r, c0, n_rows, n_cols, xs, ys, os, XOFF: tl.constexpr, BC: tl.constexpr, FULL: tl.constexpr,
          WORDS: tl.constexpr):
    # FULL: every column of the tile is inside the row, so the masks are per row only and do not stop the loads and
    # stores from being vectorized (a column mask against an odd n_cols has constancy 1 in Triton's analysis).
    c = c0 + tl.arange(0, BC)[None, :]
    if FULL:
        m = r < n_rows
    else:
        m = (r < n_rows) & (c < n_cols)
    if WORDS:
        # x's start is XOFF (odd) elements past a word boundary; xs is even. Pair p = columns c0 + 2p and + 1.
        p = tl.arange(0, BC // 2)[None, :]
        xw = x.to(tl.pointer_type(tl.int32), bitcast=True)
        q = r * (xs // 2) + (c0 + XOFF - 1) // 2 + p
        if FULL:
            me = r < n_rows
            mo = r < n_rows
        else:
            me = (r < n_rows) & (c0 + 2 * p < n_cols)
            mo = (r < n_rows) & (c0 + 2 * p + 1 < n_cols)
        w0 = tl.load(xw + q, mask=me, other=0)
        w1 = tl.load(xw + q + 1, mask=mo, other=0)
        a = tl.interleave((w0 & -65536).to(tl.float32, bitcast=True), (w1 << 16).to(tl.float32, bitcast=True))
    else:
        a = tl.load(x + r * xs + c + XOFF, mask=m, other=0.0).to(tl.float32)
    b = tl.load(y + r * ys + c, mask=m, other=0.0).to(tl.float32)
    tl.store(o + r * os + c, ((a + b) * 0.5).to(tl.bfloat16), mask=m)


@triton.jit
def _kernel(x, y, o, n_rows, n_cols, xs, ys, os, XOFF: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr,
            SPLIT: tl.constexpr, WORDS: tl.constexpr):
    pid = tl.program_id(0)
    nbc = tl.cdiv(n_cols, BC)
    r = (pid // nbc) * BR + tl.arange(0, BR)[:, None]
    c0 = (pid % nbc) * BC
    if SPLIT and c0 + BC <= n_cols:
        _tile(x, y, o, r, c0, n_rows, n_cols, xs, ys, os, XOFF, BC, True, WORDS)
    else:
        _tile(x, y, o, r, c0, n_rows, n_cols, xs, ys, os, XOFF, BC, False, WORDS)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="misaligned-ab.json")
    args = ap.parse_args()
    bw = B.copy_bandwidth("cuda")
    recs = []
    for rows, cols in ((16384, 4096), (8191, 5000), (4096, 16384), (32768, 1024), (1024, 65536)):
        x = torch.randn(rows, cols, dtype=torch.bfloat16, device="cuda")
        y = torch.randn(rows, cols, dtype=torch.bfloat16, device="cuda")
        n = cols - 1
        ref = ((x[:, 1:].float() + y[:, :-1].float()) * 0.5).to(torch.bfloat16)
        out = torch.empty(rows, n, dtype=torch.bfloat16, device="cuda")
        wide = torch.empty(rows, cols, dtype=torch.bfloat16, device="cuda")
        moved = 3 * rows * n * 2
        for br, bc, warps in ((4, 1024, 8), (2, 2048, 4), (2, 1024, 4)):
            grid = (triton.cdiv(rows, br) * triton.cdiv(n, bc),)
            variants = {  # name: (output, its row stride, x's offset, interior tiles unmasked, x as words)
                "scalar": (out, n, 1, False, False),
                "interior unmasked": (out, n, 1, True, False),
                "x words": (out, n, 1, True, True),
                "x words, masked": (out, n, 1, False, True),
                "x aligned": (out, n, 0, True, False),
                "all aligned": (wide, cols, 0, True, False),
            }
            for name, (o, ostride, xoff, split, words) in variants.items():
                def call(o=o, ostride=ostride, xoff=xoff, split=split, words=words):
                    return _kernel[grid](x, y, o, rows, n, cols, cols, ostride, XOFF=xoff, BR=br, BC=bc, SPLIT=split,
                                         WORDS=words, num_warps=warps)
                ptx = call().asm["ptx"]
                exact = None
                if o is out and xoff == 1:
                    exact = bool(torch.equal(out.view(torch.int16), ref.view(torch.int16)))
                    out.zero_()
                ms = triton.testing.do_bench_cudagraph(call)
                rec = dict(shape=[rows, cols], tile=f"{br}x{bc} w{warps}", variant=name, us=round(1e3 * ms, 2),
                           pct=round(100 * moved / (ms * 1e-3) / 1e9 / bw, 1), exact=exact,
                           ptx={k: ptx.count(k) for k in ("ld.global.v4", "ld.global.b16", "ld.global.b32",
                                                          "st.global.v4", "st.global.b16")})
                print(json.dumps(rec), flush=True)
                recs.append(rec)
    with open(args.out, "w") as f:
        json.dump(dict(copy_gbps=bw, records=recs), f, indent=1)


if __name__ == "__main__":
    main()
