"""Rows split across programs: an experiment for reductions over very long rows, kept with its numbers.

pyfuser's looped kernel reads a [1024, 65536] row from DRAM once per reduction depth. Here each row is split
into SPLIT pieces of BLOCK_C columns, each held in registers by its own program; the programs of a row exchange
partial sums through a workspace and meet at a per-row spin barrier, so the row is read once. Programs take
their (row, piece) from a ticket counter in the order they start, so the programs of a row that is waiting have
all started (no deadlock whatever order the hardware dispatches them in); the last program of a row resets its
counters, so the workspace is reusable. RMSNorm (one barrier) and LayerNorm (two) in fp32 and bf16:

    python benchmarks/sweep_split_rows.py [--out benchmarks/results]

Measured on the H200 (2026-12-01, benchmarks/results/2026-12-01-split-rows.json): correct, but at best 71% of
copy bandwidth for RMSNorm and 59% for LayerNorm in fp32 at [1024, 65536] (looped kernel: 62% and 48%), and
below the persistent kernel at every narrower shape: the barrier's round trips through L2 cost what the saved
reads gain. Not adopted; docs/codegen.md lists it with the other variants tried.
"""

import argparse
import datetime
import json
import os

import torch
import triton
import triton.language as tl

@triton.jit
def _barrier_sum(ws_ptr, arrive_ptr, pid_r, pid_s, part, level, SPLIT: tl.constexpr, SP2: tl.constexpr, NLEV: tl.constexpr):
    base = ws_ptr + (pid_r * NLEV + level) * SP2
    tl.store(base + pid_s, part)
    tl.debug_barrier()
    tl.atomic_add(arrive_ptr + pid_r, 1, sem="release", scope="gpu")
    target = SPLIT * (level + 1)
    while tl.atomic_add(arrive_ptr + pid_r, 0, sem="acquire", scope="gpu") < target:
        pass
    offs = tl.arange(0, SP2)
    parts = tl.load(base + offs, mask=offs < SPLIT, other=0.0, cache_modifier=".cg")
    return tl.sum(parts, axis=0)

@triton.jit
def ln_split(x_ptr, w_ptr, b_ptr, y_ptr, cnt_ptr, ws_ptr, n_rows, n_cols, eps,
             BLOCK_C: tl.constexpr, SPLIT: tl.constexpr, SP2: tl.constexpr, LN: tl.constexpr):
    n_progs = n_rows * SPLIT
    tk = tl.atomic_add(cnt_ptr, 1)
    if tk == n_progs - 1:
        tl.atomic_xchg(cnt_ptr, 0)
    pid_r = tk // SPLIT
    pid_s = tk % SPLIT
    arrive_ptr = cnt_ptr + 1
    done_ptr = cnt_ptr + 1 + n_rows
    c = pid_s * BLOCK_C + tl.arange(0, BLOCK_C)
    m = c < n_cols
    x = tl.load(x_ptr + pid_r * n_cols + c, mask=m, other=0.0).to(tl.float32)
    if LN:
        s = _barrier_sum(ws_ptr, arrive_ptr, pid_r, pid_s, tl.sum(x, axis=0), 0, SPLIT, SP2, 2)
        mean = s / n_cols
        d = tl.where(m, x - mean, 0.0)
        v = _barrier_sum(ws_ptr, arrive_ptr, pid_r, pid_s, tl.sum(d * d, axis=0), 1, SPLIT, SP2, 2)
        rstd = 1.0 / tl.sqrt(v / n_cols + eps)
        y = d * rstd * tl.load(w_ptr + c, mask=m, other=0.0).to(tl.float32) + tl.load(b_ptr + c, mask=m, other=0.0).to(tl.float32)
    else:
        v = _barrier_sum(ws_ptr, arrive_ptr, pid_r, pid_s, tl.sum(x * x, axis=0), 0, SPLIT, SP2, 1)
        rstd = 1.0 / tl.sqrt(v / n_cols + eps)
        y = x * rstd * tl.load(w_ptr + c, mask=m, other=0.0).to(tl.float32)
    tl.store(y_ptr + pid_r * n_cols + c, y.to(y_ptr.dtype.element_ty), mask=m)
    tl.debug_barrier()
    if tl.atomic_add(done_ptr + pid_r, 1, sem="acq_rel", scope="gpu") == SPLIT - 1:
        tl.atomic_xchg(arrive_ptr + pid_r, 0)
        tl.atomic_xchg(done_ptr + pid_r, 0)

def main():
    ap = argparse.ArgumentParser(description="rows split across programs (experiment)")
    ap.add_argument("--out", default="benchmarks/results")
    out = ap.parse_args().out
    os.makedirs(out, exist_ok=True)
    x8 = torch.empty(1 << 30, dtype=torch.uint8, device="cuda"); y8 = torch.empty_like(x8)
    copy = 2 * x8.numel() / (triton.testing.do_bench(lambda: y8.copy_(x8), rep=200) * 1e-3) / 1e9
    del x8, y8
    res = []
    for dtype in (torch.float32, torch.bfloat16):
        for rows, cols in ((1024, 65536), (4096, 16384), (8191, 5000), (256, 262144)):
            x = torch.randn(rows, cols, device="cuda", dtype=dtype)
            w = torch.randn(cols, device="cuda", dtype=dtype); b = torch.randn(cols, device="cuda", dtype=dtype)
            for ln in (False, True):
                ref = (torch.nn.functional.layer_norm(x.float(), (cols,), w.float(), b.float(), 1e-5) if ln else
                       torch.nn.functional.rms_norm(x.float(), (cols,), w.float(), 1e-5)).to(dtype)
                nb = (x.numel() * 2 + 2 * cols) * x.element_size()
                for bc in (2048, 4096, 8192, 16384):
                    split = triton.cdiv(cols, bc)
                    if split > 64 or split < 2: continue
                    for warps in (4, 8, 16):
                        if bc // (32 * warps) < 4 or bc // (32 * warps) > 64: continue
                        cnt = torch.zeros(1 + 2 * rows, dtype=torch.int32, device="cuda")
                        sp2 = triton.next_power_of_2(split)
                        ws = torch.empty(rows * 2 * sp2, dtype=torch.float32, device="cuda")
                        y = torch.empty_like(x)
                        f = lambda: ln_split[(rows * split,)](x, w, b, y, cnt, ws, rows, cols, 1e-5, BLOCK_C=bc, SPLIT=split, SP2=sp2, LN=ln, num_warps=warps)
                        try:
                            f(); torch.cuda.synchronize()
                            err = (y.float() - ref.float()).abs().max().item()
                            ok = int(cnt.abs().sum())
                            ms = triton.testing.do_bench_cudagraph(f, rep=50)
                            r = dict(kind="ln" if ln else "rms", dtype=str(dtype)[6:], shape=[rows, cols], bc=bc, split=split, warps=warps,
                                     ms=round(ms, 4), pct=round(100 * nb / (ms * 1e-3) / 1e9 / copy, 1), maxerr=err, cnt_left=ok)
                        except Exception as e:
                            r = dict(kind="ln" if ln else "rms", shape=[rows, cols], bc=bc, warps=warps, error=str(e)[:200])
                        print(json.dumps(r), flush=True); res.append(r)
    with open(os.path.join(out, f"{datetime.date.today().isoformat()}-split-rows.json"), "w") as f:
        json.dump(res, f)


if __name__ == "__main__":
    main()
