"""Sweep tile configs of the NVFP4 grouped GEMM (pyfuser.kernels.nvfp4_grouped_gemm) against bf16 torch._grouped_mm.

Run on the GPU machine:  python benchmarks/sweep_nvfp4_gemm.py --jobs 14 --profile --out <path>.json

1. Every config is first checked against pyfuser.nvfp4.reference.nvfp4_grouped_mm on a small ragged case
   (an empty group, a group over 128 rows, K spanning several k-tiles, the same G and divisibility of N and K as
   the timed shapes, so the kernels compiled here are the ones timed); a config that fails is not timed.
   --jobs N runs these checks in N processes: compiling dominates the sweep, and Triton's on-disk cache then
   serves the timing phase.
2. Shapes: G=8 experts, K=4096, N in {2048, 14336}; decode with 1, 16 and 64 tokens per expert, prefill with
   8192 tokens (1024 per expert). For each: bf16 torch._grouped_mm on the same shape (weights stored [G, N, K]
   and passed transposed, as a Linear weight), then the heuristic's config (checked against the reference at the
   full shape), then each candidate config. Two times, both with L2 cleared before every call (the decode
   weights would otherwise fit in the H200's L2): "us", the median of triton.testing.do_bench, which includes
   whatever host time of the call the GPU cannot hide (at decode sizes the launcher's host time exceeds the
   kernel's: measured on the H200 host, ~140 us per call through Triton's JIT launch path against ~25 us of
   GPU time), and "gpu us", the calls queued behind a sleep kernel so that they run back to back (GPU time only).
   --profile adds, for the heuristic's config, per-kernel GPU times from torch.profiler, the host time per call,
   and a breakdown of the launcher's host cost (with and without grouped_gemm's direct launches).
3. Prints one table per shape (times, GB/s of all operand bytes, speed-ups over bf16) and the best config;
   writes everything as JSON to --out (after every shape, so an interrupted run keeps what it measured).
   Targets (issue 11): >= 3x bf16 at 1-16 tokens per expert, >= 2x at 64, >= 0.9x at prefill.
   --smoke runs tiny shapes with a few configs on any device (CPU: TRITON_INTERPRET=1) to check the script.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import multiprocessing as mp
import os
import sys
import time
from dataclasses import asdict

import torch
import triton
import triton.testing

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel_variant  # noqa: E402
from timing import median_event_ms  # noqa: E402
from pyfuser.nvfp4 import reference  # noqa: E402
from pyfuser.kernels.nvfp4_grouped_gemm import GemmConfig, default_config, nvfp4_grouped_mm  # noqa: E402

G, K = 8, 4096
NS = (2048, 14336)
DECODE_TOKENS = (1, 16, 64)
PREFILL_TOKENS = 8192

# (block_n, block_k, split_k, group_m, predequant, num_warps, num_stages); decode configs take block_m from the shape.
DECODE_CONFIGS = [
    (64, 256, 1, 8, False, 4, 4),
    (64, 256, 2, 8, False, 4, 4),
    (64, 256, 4, 8, False, 4, 4),
    (64, 256, 2, 8, False, 4, 6),
    (64, 256, 2, 8, False, 8, 4),
    (64, 128, 2, 8, False, 4, 6),
    (64, 128, 4, 8, False, 4, 6),
    (64, 512, 1, 8, False, 4, 3),
    (64, 512, 2, 8, False, 4, 3),
    (64, 512, 2, 8, False, 8, 3),
    (64, 512, 4, 8, False, 4, 3),
    (128, 256, 1, 8, False, 4, 4),
    (128, 256, 1, 8, False, 4, 6),
    (128, 256, 2, 8, False, 4, 4),
    (128, 256, 2, 8, False, 8, 4),
    (128, 128, 1, 8, False, 4, 8),
    (128, 256, 1, 8, False, 8, 4),
    (128, 512, 1, 8, False, 8, 3),
    (128, 512, 2, 8, False, 8, 3),
    (256, 128, 1, 8, False, 8, 4),
    (256, 256, 1, 8, False, 8, 3),
]
# (block_m, block_n, block_k, split_k, group_m, predequant, num_warps, num_stages)
PREFILL_CONFIGS = [
    (256, 128, 64, 1, 8, True, 8, 4),
    (256, 128, 64, 1, 8, True, 8, 3),
    (128, 256, 64, 1, 8, True, 8, 3),
    (128, 256, 64, 1, 8, True, 8, 4),
    (128, 256, 64, 1, 4, True, 8, 4),
    (128, 256, 64, 1, 16, True, 8, 4),
    (128, 256, 32, 1, 8, True, 8, 5),
    (128, 128, 64, 1, 8, True, 4, 4),
    (128, 128, 64, 1, 8, True, 8, 4),
    (128, 256, 128, 1, 8, False, 8, 3),
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


def save_partial(result: dict, path: str, t_start: float, dev: torch.device) -> None:
    """After a shape: free its operands' cached blocks and write what was measured so far (with the wall time), so
    a run cut short by its time limit still leaves its results."""
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    result["wall_s"] = round(time.time() - t_start, 1)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


def graph_times(fns: dict, rounds: int, rep_ms: int) -> dict:
    """{name: (median, min, max) us} of each callable captured alone in a CUDA graph (bench_nvfp4.cuda_graphed),
    timed by triton.testing.do_bench (L2 cleared before each replay) in ``rounds`` interleaved rounds."""
    from bench_nvfp4 import cuda_graphed

    replays = {name: cuda_graphed(fn) for name, fn in fns.items()}
    times = {name: [] for name in replays}
    for _ in range(rounds):
        for name, replay in replays.items():
            times[name].append(triton.testing.do_bench(replay, warmup=10, rep=rep_ms, return_mode="median") * 1e3)
    return {name: (statistics.median(ts), min(ts), max(ts)) for name, ts in times.items()}


def record_graph_times(entry_rows: dict, fns: dict, rounds: int, rep_ms: int, moved: int = 0) -> None:
    """graph_times of ``fns`` written into ``entry_rows[name]``: us, us_min, us_max, x_bf16 (against the row named
    "bf16") and, given the bytes ``moved``, GBps."""
    for name, (us, us_min, us_max) in graph_times(fns, rounds, rep_ms).items():
        entry_rows[name].update(us=round(us, 2), us_min=round(us_min, 2), us_max=round(us_max, 2))
        if moved:
            entry_rows[name]["GBps"] = round(moved / us / 1e3, 1)
    bf16_us = entry_rows["bf16"]["us"]
    for row in entry_rows.values():
        row["x_bf16"] = round(bf16_us / row["us"], 3)


def check_rows(rows: dict, ref) -> dict:
    """{name: info} for rows {name: (fn, out, cfg)}: each fn called once, its config, and where it has an output,
    whether that matches ``ref`` (``close``)."""
    infos = {}
    for name, (fn, out, cfg) in rows.items():
        fn()
        info = {"config": None if cfg is None else vars(cfg)}
        if out is not None:
            ok, rel = close(out, ref)
            info.update(matches_reference=ok, max_rel_err=rel)
        infos[name] = info
    return infos


def close(out, ref) -> tuple[bool, float]:
    scale = ref.float().abs().max().item() or 1.0
    err = (out.float() - ref.float()).abs().max().item()
    ok = torch.allclose(out.float(), ref.float(), atol=1e-2 * scale, rtol=1e-2)
    return ok, err / scale


def bench(fn, reps, dev) -> float:
    if dev.type != "cuda":  # --smoke on CPU: one timed call (the interpreter's time means nothing anyway)
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6
    return triton.testing.do_bench(fn, warmup=10, rep=reps, return_mode="median") * 1e3  # us


def bench_gpu(fn, dev, calls=20) -> float:
    """GPU time of one call, host launch cost excluded: a sleep kernel keeps the GPU busy while the host queues
    every call (each after an L2 clear), so the calls then run back to back. Median, in us."""
    if dev.type != "cuda":
        return float("nan")
    cache = torch.empty(256 * 2**20, dtype=torch.int8, device=dev)
    fn()
    torch.cuda.synchronize()
    # ~500 us of host time per queued call; each call after an L2 clear by zeroing, as do_bench's
    return median_event_ms(fn, calls, cache.zero_, queue_ahead_s=calls * 500e-6) * 1e3


def small_case(dev):
    # G experts as in the timed shapes (the kernels specialize on next_pow2(G)); an empty group, a group over two
    # 128-row scale tiles, ragged sizes; N and K with the timed shapes' divisibility by 16 words.
    tokens = ([37, 0, 150, 5] * G)[:G]
    k = 1024 if dev.type == "cuda" else 256
    ops = make_operands(tokens, 256, k, dev, seed=1)
    return ops, reference.nvfp4_grouped_mm(*ops, torch.bfloat16)


_SMALL = None


def check_config(cfg_tuple):
    """Run one config on the small case; (ok, max rel err, error text, seconds). Runs in pool workers."""
    global _SMALL
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if _SMALL is None:
        _SMALL = small_case(dev)
    ops, ref = _SMALL
    t0 = time.time()
    try:
        if cfg_tuple[0] == "baseline":
            out = _baseline_fn(cfg_tuple[1])(*ops, torch.bfloat16)
        else:
            out = nvfp4_grouped_mm(*ops, torch.bfloat16, **asdict(GemmConfig(*cfg_tuple)))
        ok, rel = close(out, ref)
        # Twice: the split-K counters must be back to zero for the next launch.
        ok2, _ = close(nvfp4_grouped_mm(*ops, torch.bfloat16, **asdict(GemmConfig(*cfg_tuple)))
                       if cfg_tuple[0] != "baseline" else out, ref)
        return ok and ok2, rel, None, round(time.time() - t0, 2)
    except Exception as e:  # a config the compiler rejects (registers, shared memory)
        return False, None, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}", round(time.time() - t0, 2)


def profile(fn, calls=20) -> dict:
    """GPU time per kernel (CUPTI, L2 cleared before every call) and the host time of one call."""
    cache = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):  # host time: the launch queue never fills with this few calls
        fn()
    host_us = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    result = {"host_us_per_call": round(host_us, 1)}
    try:  # best-effort: a machine without CUPTI still gets its sweep
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                cache.zero_()
                fn()
            torch.cuda.synchronize()
        result["gpu_us_per_call"] = {
            ev.key[:48]: round(ev.device_time_total / calls, 2) for ev in prof.key_averages()
            if ev.device_time_total > 0 and ev.key != "Memset (Device)"
        }
    except Exception as e:
        result["profiler_error"] = f"{type(e).__name__}: {e}"
    return result


def host_breakdown(ops) -> dict:
    """Host (Python) cost of the launcher's steps on this machine's CPU, in us per call."""
    from pyfuser.kernels import nvfp4_grouped_gemm as gg

    def per_call(f, n=200):
        f()
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        return round((time.perf_counter() - t0) / n * 1e6, 2)

    dev = ops[0].device
    return {
        "validate": per_call(lambda: gg.check_operands(*ops)),
        "words_views_x2": per_call(lambda: (gg._words(ops[0]), gg._words(ops[1].transpose(-1, -2)))),
        "empty": per_call(lambda: torch.empty((8, 2048), dtype=torch.bfloat16, device=dev)),
        "zeros": per_call(lambda: torch.zeros((288,), dtype=torch.int32, device=dev)),
        "whole_call": per_call(lambda: nvfp4_grouped_mm(*ops, torch.bfloat16), n=50),
        "whole_call_jit_launch": _without_fast_launch(lambda: per_call(lambda: nvfp4_grouped_mm(*ops, torch.bfloat16),
                                                                       n=50)),
    }


def _without_fast_launch(f):
    from pyfuser.codegen import launcher

    saved, launcher._direct_enabled = launcher._direct_enabled, False
    try:
        return f()
    finally:
        launcher._direct_enabled = saved


def _baseline_fn(path):
    return kernel_variant.load(path).nvfp4_grouped_mm


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON results path")
    ap.add_argument("--rep-ms", type=int, default=60, help="do_bench measuring time per config (ms)")
    ap.add_argument("--jobs", type=int, default=1, help="processes for the check (compile) phase")
    ap.add_argument("--check-only", action="store_true", help="stop after the check phase (warms Triton's cache)")
    ap.add_argument("--baseline", help="source file of another version of pyfuser/kernels/nvfp4_grouped_gemm.py "
                                       "(git show REV:path > FILE) whose nvfp4_grouped_mm (its own default config) is "
                                       "timed too")
    ap.add_argument("--profile", action="store_true", help="per-kernel GPU times (torch.profiler) and host time "
                                                             "of the default and best configs")
    ap.add_argument("--shapes", default="all", help="comma list of decode1,decode16,decode64,prefill or 'all'")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny shapes, a few configs, any device (CPU needs TRITON_INTERPRET=1): checks the script")
    args = ap.parse_args()
    global G, K, NS, DECODE_TOKENS, PREFILL_TOKENS, DECODE_CONFIGS, PREFILL_CONFIGS
    if args.smoke:
        G, K, NS, DECODE_TOKENS, PREFILL_TOKENS = 2, 256, (128,), (1, 16), 2 * 80
        DECODE_CONFIGS = [(64, 128, 2, 8, False, 4, 2), (64, 128, 1, 8, True, 4, 2)]
        PREFILL_CONFIGS = [(64, 64, 128, 1, 8, True, 4, 2)]
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

    wanted = set(args.shapes.split(",")) if args.shapes != "all" else None
    shapes = [("decode", tpe, n) for tpe in DECODE_TOKENS for n in NS
              if wanted is None or f"decode{tpe}" in wanted]
    if wanted is None or "prefill" in wanted:
        shapes += [("prefill", PREFILL_TOKENS // G, n) for n in NS]

    def configs_for(kind, tpe):
        if kind == "decode":
            bm = max(16, 1 << max(0, (tpe - 1).bit_length()))
            return [GemmConfig(bm, *c) for c in DECODE_CONFIGS]
        return [GemmConfig(*c) for c in PREFILL_CONFIGS]

    # 1. Correctness of every distinct config on a small ragged case (in --jobs processes).
    all_cfgs = {c for kind, tpe, _ in shapes for c in configs_for(kind, tpe)}
    all_cfgs |= {default_config(tpe * G, n, K, G) for _, tpe, n in shapes}
    todo = [tuple(asdict(c).values()) for c in sorted(all_cfgs, key=lambda c: tuple(asdict(c).values()))]
    if args.baseline:
        todo.append(("baseline", args.baseline))
    if args.jobs > 1:
        with mp.get_context("spawn").Pool(args.jobs) as pool:
            checks = pool.map(check_config, todo, chunksize=1)
    else:
        checks = [check_config(c) for c in todo]
    valid = {}
    for c, (ok, rel, err, secs) in zip(todo, checks):
        valid[c] = ok
        result["configs_checked"].append({"config": list(c), "ok": ok, "max_rel_err": rel, "error": err,
                                          "check_s": secs})
        print(f"check {c}: {'ok' if ok else 'FAILED'}{'' if err is None else ' ' + err} ({secs}s)", flush=True)
    print(f"check phase {time.time() - t_start:.1f}s", flush=True)
    if args.check_only:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        return 0 if all(valid.values()) else 1

    # 2. Timings.
    baseline = _baseline_fn(args.baseline) if args.baseline and valid.get(("baseline", args.baseline)) else None
    for kind, tpe, n in shapes:
        tokens = [tpe] * G
        m = sum(tokens)
        ops = make_operands(tokens, n, K, dev)
        a16 = torch.randn(m, K, device=dev, dtype=torch.bfloat16)
        w16 = torch.randn(G, n, K, device=dev, dtype=torch.bfloat16)
        offs = torch.cumsum(torch.tensor(tokens, device=dev), 0).to(torch.int32)
        try:
            bf16_fn = lambda: torch._grouped_mm(a16, w16.transpose(-2, -1), offs=offs)  # noqa: E731
            bf16_us, bf16_gpu_us = bench(bf16_fn, args.rep_ms, dev), bench_gpu(bf16_fn, dev)
        except RuntimeError as e:  # only expected off-GPU (smoke runs)
            print(f"bf16 _grouped_mm failed: {e}")
            bf16_us = bf16_gpu_us = float("nan")
        del w16
        fp4_bytes = G * n * K // 2 + G * n * K // 16 + m * K // 2 + m * K // 16 + m * n * 2

        default = default_config(m, n, K, G)
        if dev.type == "cuda" and args.profile and not result.get("host_breakdown"):
            result["host_breakdown"] = host_breakdown(ops)
            print(f"host breakdown (us per call): {result['host_breakdown']}", flush=True)
        ref = reference.nvfp4_grouped_mm(*ops, torch.bfloat16)
        ok_full, rel_full = close(nvfp4_grouped_mm(*ops, torch.bfloat16), ref)
        del ref
        rows = []
        if baseline is not None:
            us = bench(lambda: baseline(*ops, torch.bfloat16), args.rep_ms, dev)
            rows.append({"config": "baseline", "us": round(us, 2), "GBps": round(fp4_bytes / us / 1e3, 1),
                         "speedup_vs_bf16": round(bf16_us / us, 3)})
        for cfg in [default] + [c for c in configs_for(kind, tpe) if c != default]:
            if not valid.get(tuple(asdict(cfg).values()), False):
                rows.append({"config": asdict(cfg), "us": None, "note": "failed the correctness check"})
                continue
            us = bench(lambda: nvfp4_grouped_mm(*ops, torch.bfloat16, **asdict(cfg)), args.rep_ms, dev)
            gpu_us = bench_gpu(lambda: nvfp4_grouped_mm(*ops, torch.bfloat16, **asdict(cfg)), dev)
            rows.append({"config": asdict(cfg), "default": cfg == default, "us": round(us, 2),
                         "gpu_us": round(gpu_us, 2), "gpu_speedup_vs_bf16": round(bf16_gpu_us / gpu_us, 3),
                         "GBps": round(fp4_bytes / us / 1e3, 1), "speedup_vs_bf16": round(bf16_us / us, 3)})
        timed = [r for r in rows if r["us"] is not None and r["config"] != "baseline"]
        best = min(timed, key=lambda r: r["us"]) if timed else None
        best_gpu = min(timed, key=lambda r: r["gpu_us"]) if timed else None
        entry = {"kind": kind, "tokens_per_expert": tpe, "M": m, "N": n, "K": K, "G": G,
                 "bf16_grouped_mm_us": round(bf16_us, 2), "bf16_gpu_us": round(bf16_gpu_us, 2),
                 "default_config": asdict(default), "default_matches_reference": ok_full,
                 "default_max_rel_err": rel_full,
                 "target_speedup": (3.0 if tpe <= 16 else 2.0) if kind == "decode" else 0.9,
                 "results": rows, "best": best, "best_gpu": best_gpu}
        result["shapes"].append(entry)

        print(f"\n{kind}: {tpe} tokens/expert, M={m} N={n} K={K} G={G}; bf16 _grouped_mm {bf16_us:.1f} us "
              f"(GPU {bf16_gpu_us:.1f}); default config matches reference: {ok_full} (max rel err {rel_full:.2e})")
        print(f"  {'BM':>4} {'BN':>4} {'BK':>4} {'split':>5} {'grp':>4} {'pre':>4} {'warps':>5} {'stages':>6} "
              f"{'us':>9} {'GB/s':>7} {'x bf16':>7} {'gpu us':>8} {'x bf16':>7}")
        for r in rows:
            c = r["config"]
            mark = " <- default" if r.get("default") else ""
            head = ("  baseline" + " " * 40 if c == "baseline" else
                    f"  {c['block_m']:>4} {c['block_n']:>4} {c['block_k']:>4} {c['split_k']:>5} {c['group_m']:>4} "
                    f"{'yes' if c['predequant'] else 'no':>4} {c['num_warps']:>5} {c['num_stages']:>6}")
            if r["us"] is None:
                print(f"{head} {'-':>9} {r['note']}{mark}")
            else:
                gpu = (f" {r['gpu_us']:>8.1f} {r['gpu_speedup_vs_bf16']:>7.2f}" if "gpu_us" in r else "")
                print(f"{head} {r['us']:>9.1f} {r['GBps']:>7.0f} {r['speedup_vs_bf16']:>7.2f}{gpu}{mark}")
        if best:
            print(f"  best: {tuple(best['config'].values())} {best['us']:.1f} us = {best['speedup_vs_bf16']:.2f}x bf16 "
                  f"(target {entry['target_speedup']}x)", flush=True)
        if dev.type == "cuda" and args.profile:
            entry["profile"] = {}
            for name, cfg in (("default", default),):
                if cfg is not None:
                    entry["profile"][name] = profile(lambda: nvfp4_grouped_mm(*ops, torch.bfloat16, **asdict(cfg)))
                    print(f"  {name} {tuple(asdict(cfg).values())}: {entry['profile'][name]}", flush=True)
        del ops
        save_partial(result, args.out, t_start, dev)

    print(f"\nwrote {args.out} ({result['wall_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
