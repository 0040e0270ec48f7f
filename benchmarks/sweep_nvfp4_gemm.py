"""Sweep tile configs of the NVFP4 grouped GEMM (pyfuser.nvfp4.grouped_gemm) against bf16 torch._grouped_mm.

Run on the GPU machine:  python benchmarks/sweep_nvfp4_gemm.py --out benchmarks/results/<date>-nvfp4-gemm-sweep.json

1. Every config is first checked against pyfuser.nvfp4.reference.nvfp4_grouped_mm on a small ragged case
   (an empty group, a group over 128 rows, K spanning several k-tiles); a config that fails is not timed.
2. Shapes: G=8 experts, K=4096, N in {2048, 14336}; decode with 1, 16 and 64 tokens per expert, prefill with
   8192 tokens (1024 per expert). For each: bf16 torch._grouped_mm on the same shape (weights stored [G, N, K]
   and passed transposed, as a Linear weight), then the heuristic's config (checked against the reference at the
   full shape), then each candidate config. Times are medians of triton.testing.do_bench, which clears L2 between
   runs (the decode weights would otherwise fit in the H200's L2).
3. Prints one table per shape (time, GB/s of all operand bytes, speed-up over bf16) and the best config;
   writes everything as JSON to --out. Targets: >= 2x bf16 at decode shapes, >= 0.5x at prefill.
4. Expected wall time on an H200: about 2-3 minutes, most of it compiling the ~20 distinct configs.
   --smoke runs tiny shapes with two configs per kind on any device (CPU: TRITON_INTERPRET=1) to check the script.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from dataclasses import asdict

import torch
import triton
import triton.testing

from pyfuser.nvfp4 import reference
from pyfuser.nvfp4.grouped_gemm import GemmConfig, default_config, nvfp4_grouped_mm

G, K = 8, 4096
NS = (2048, 14336)
DECODE_TOKENS = (1, 16, 64)
PREFILL_TOKENS = 8192

# (block_m, block_n, block_k, swap_ab, num_warps, num_stages); decode configs take block_m from the shape.
DECODE_CONFIGS = [
    (64, 256, True, 4, 4),
    (128, 256, True, 4, 4),
    (128, 256, True, 8, 4),
    (128, 128, True, 4, 6),
    (64, 512, True, 4, 3),
    (128, 256, False, 4, 4),
    (256, 128, True, 8, 3),
]
PREFILL_CONFIGS = [
    (128, 256, 128, False, 8, 3),
    (128, 256, 128, True, 8, 3),
    (128, 128, 128, False, 8, 3),
    (256, 128, 128, False, 8, 3),
    (128, 128, 256, False, 8, 2),
    (64, 128, 128, False, 4, 4),
    (128, 256, 128, False, 8, 2),
]


def _round_up(a, b):
    return -(-a // b) * b


def make_operands(tokens, n, k, dev, seed=0):
    """Random operands in cutlass_nvfp4_grouped_mm's run-time form (scales in a moderate e4m3 range)."""
    gen = torch.Generator(device=dev).manual_seed(seed)
    g, m = len(tokens), sum(tokens)
    mat1 = reference.pack_fp4(torch.randint(0, 16, (m, k), device=dev, dtype=torch.uint8, generator=gen))
    weights = reference.pack_fp4(torch.randint(0, 16, (g, n, k), device=dev, dtype=torch.uint8, generator=gen))
    mat2 = weights.transpose(-1, -2)  # [G, K/2, N] with strides [N*K/2, 1, K/2]

    def e4m3(shape):  # bit patterns 0x20..0x40: 2**-3 .. 2
        bits = torch.randint(0x20, 0x41, shape, device=dev, dtype=torch.int32, generator=gen)
        return bits.to(torch.uint8).view(torch.float8_e4m3fn)

    e_offs = torch.tensor([sum(tokens[:i]) for i in range(g)], dtype=torch.int32, device=dev)
    sf_offs = torch.tensor([sum(_round_up(t, 128) for t in tokens[:i]) for i in range(g)], dtype=torch.int32,
                           device=dev)
    scale1 = reference.preprocess_grouped_matmul_input_sf(e4m3((m, k // 16)), e_offs, sf_offs)
    scale2 = torch.stack([reference.linear_to_swizzled_128_4(e4m3((n, k // 16))) for _ in range(g)])
    alpha = torch.rand(g, device=dev, generator=gen) / k + 1e-4
    ps = torch.tensor([[t, n, k] for t in tokens], dtype=torch.int32, device=dev)
    return [mat1, mat2, scale1, scale2, alpha, ps, e_offs, sf_offs]


def close(out, ref) -> tuple[bool, float]:
    scale = ref.float().abs().max().item() or 1.0
    err = (out.float() - ref.float()).abs().max().item()
    ok = torch.allclose(out.float(), ref.float(), atol=1e-2 * scale, rtol=1e-2)
    return ok, err / scale


def cfg_kwargs(cfg: GemmConfig) -> dict:
    return asdict(cfg)


def bench(fn, reps, dev) -> float:
    if dev.type != "cuda":  # --smoke on CPU: one timed call (the interpreter's time means nothing anyway)
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6
    return triton.testing.do_bench(fn, warmup=10, rep=reps, return_mode="median") * 1e3  # us


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON results path")
    ap.add_argument("--rep-ms", type=int, default=60, help="do_bench measuring time per config (ms)")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny shapes, two configs per kind, any device (CPU needs TRITON_INTERPRET=1): "
                         "checks the script")
    args = ap.parse_args()
    global G, K, NS, DECODE_TOKENS, PREFILL_TOKENS, DECODE_CONFIGS, PREFILL_CONFIGS
    if args.smoke:
        G, K, NS, DECODE_TOKENS, PREFILL_TOKENS = 2, 256, (128,), (1, 16), 2 * 80
        DECODE_CONFIGS, PREFILL_CONFIGS = DECODE_CONFIGS[:2], PREFILL_CONFIGS[5:6]
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    t_start = time.time()
    result = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (smoke)",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "G": G, "K": K,
        "configs_checked": [],
        "shapes": [],
    }

    shapes = [("decode", tpe, n) for tpe in DECODE_TOKENS for n in NS]
    shapes += [("prefill", PREFILL_TOKENS // G, n) for n in NS]

    def configs_for(kind, tpe):
        if kind == "decode":
            bm = min(64, max(16, 1 << max(0, (tpe - 1).bit_length())))
            return [GemmConfig(bm, *c) for c in DECODE_CONFIGS]
        return [GemmConfig(*c) for c in PREFILL_CONFIGS]

    # 1. Correctness of every distinct config on a small ragged case.
    small = make_operands([37, 0, 150, 5], 256, 512 if not args.smoke else 256, dev, seed=1)
    small_ref = reference.nvfp4_grouped_mm(*small, torch.bfloat16)
    valid = {}
    all_cfgs = {c for kind, tpe, _ in shapes for c in configs_for(kind, tpe)}
    all_cfgs |= {default_config(tpe * G, n, K, G) for _, tpe, n in shapes}
    for cfg in sorted(all_cfgs, key=lambda c: tuple(asdict(c).values())):
        t0 = time.time()
        try:
            out = nvfp4_grouped_mm(*small, torch.bfloat16, **cfg_kwargs(cfg))
            ok, rel = close(out, small_ref)
            err = None
        except Exception as e:  # a config the compiler rejects (registers, shared memory)
            ok, rel, err = False, None, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        valid[cfg] = ok
        result["configs_checked"].append({"config": asdict(cfg), "ok": ok, "max_rel_err": rel, "error": err,
                                          "compile_and_check_s": round(time.time() - t0, 2)})
        print(f"check {tuple(asdict(cfg).values())}: {'ok' if ok else 'FAILED'}"
              f"{'' if err is None else ' ' + err} ({time.time() - t0:.1f}s)", flush=True)

    # 2. Timings.
    for kind, tpe, n in shapes:
        tokens = [tpe] * G
        m = sum(tokens)
        ops = make_operands(tokens, n, K, dev)
        a16 = torch.randn(m, K, device=dev, dtype=torch.bfloat16)
        w16 = torch.randn(G, n, K, device=dev, dtype=torch.bfloat16)
        offs = torch.cumsum(torch.tensor(tokens, device=dev), 0).to(torch.int32)
        try:
            bf16_us = bench(lambda: torch._grouped_mm(a16, w16.transpose(-2, -1), offs=offs), args.rep_ms, dev)
        except RuntimeError as e:  # only expected off-GPU (smoke runs)
            print(f"bf16 _grouped_mm failed: {e}")
            bf16_us = float("nan")
        del w16
        fp4_bytes = G * n * K // 2 + G * n * K // 16 + m * K // 2 + m * K // 16 + m * n * 2

        default = default_config(m, n, K, G)
        ref = reference.nvfp4_grouped_mm(*ops, torch.bfloat16)
        ok_full, rel_full = close(nvfp4_grouped_mm(*ops, torch.bfloat16), ref)
        del ref
        rows = []
        for cfg in [default] + [c for c in configs_for(kind, tpe) if c != default]:
            if not valid.get(cfg, False):
                rows.append({"config": asdict(cfg), "us": None, "note": "failed the correctness check"})
                continue
            us = bench(lambda: nvfp4_grouped_mm(*ops, torch.bfloat16, **cfg_kwargs(cfg)), args.rep_ms, dev)
            rows.append({"config": asdict(cfg), "default": cfg == default, "us": round(us, 2),
                         "GBps": round(fp4_bytes / us / 1e3, 1), "speedup_vs_bf16": round(bf16_us / us, 3)})
        timed = [r for r in rows if r["us"] is not None]
        best = min(timed, key=lambda r: r["us"]) if timed else None
        entry = {"kind": kind, "tokens_per_expert": tpe, "M": m, "N": n, "K": K, "G": G,
                 "bf16_grouped_mm_us": round(bf16_us, 2), "default_config": asdict(default),
                 "default_matches_reference": ok_full, "default_max_rel_err": rel_full,
                 "target_speedup": 2.0 if kind == "decode" else 0.5, "results": rows, "best": best}
        result["shapes"].append(entry)

        print(f"\n{kind}: {tpe} tokens/expert, M={m} N={n} K={K} G={G}; bf16 _grouped_mm {bf16_us:.1f} us; "
              f"default config matches reference: {ok_full} (max rel err {rel_full:.2e})")
        print(f"  {'BM':>4} {'BN':>4} {'BK':>4} {'swap':>5} {'warps':>5} {'stages':>6} {'us':>9} {'GB/s':>7} "
              f"{'x bf16':>7}")
        for r in rows:
            c = r["config"]
            mark = " <- default" if r.get("default") else ""
            if r["us"] is None:
                print(f"  {c['block_m']:>4} {c['block_n']:>4} {c['block_k']:>4} {str(c['swap_ab']):>5} "
                      f"{c['num_warps']:>5} {c['num_stages']:>6} {'-':>9} {r['note']}{mark}")
            else:
                print(f"  {c['block_m']:>4} {c['block_n']:>4} {c['block_k']:>4} {str(c['swap_ab']):>5} "
                      f"{c['num_warps']:>5} {c['num_stages']:>6} {r['us']:>9.1f} {r['GBps']:>7.0f} "
                      f"{r['speedup_vs_bf16']:>7.2f}{mark}")
        if best:
            print(f"  best: {tuple(best['config'].values())} {best['us']:.1f} us = {best['speedup_vs_bf16']:.2f}x bf16 "
                  f"(target {entry['target_speedup']}x)", flush=True)
        del ops
        if dev.type == "cuda":
            torch.cuda.empty_cache()

    result["wall_s"] = round(time.time() - t_start, 1)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"\nwrote {args.out} ({result['wall_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
