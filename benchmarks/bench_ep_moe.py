"""Expert-parallel NVFP4 MoE decode on 2 GPUs (NCCL) against the single-device layer on one GPU.

Run on a machine with 2 GPUs:   python benchmarks/bench_ep_moe.py --out DIR
Smoke run on CPU (gloo, kernels in the interpreter, tiny sizes):
                                TRITON_INTERPRET=1 python benchmarks/bench_ep_moe.py --cpu --quick --out /tmp/x

The layer is pyfuser/demo/moe_nvfp4.py (one fusion on one device) and pyfuser/demo/moe_ep.py (tokens split over
the ranks, experts sharded, all-to-all dispatch of counts then rows, local grouped GEMMs, all-to-all combine).
Default shape: decode, 256 tokens, H=4096, I=2048, 16 experts, top-2.

Measured (each after warm-up, median of --iters timed calls, every rank synchronized before and after a call):
- one GPU: the single-device layer on all T tokens;
- EP, same batch: the T tokens split over the ranks (T/D per rank);
- EP, scaled batch: T tokens per rank (D*T in all), the throughput a decode server gets by adding a GPU.
Throughput is tokens per second; the issue's target is EP >= 1.6x one GPU. Before timing, the EP output of the
same-batch run is compared with the single-device output bit for bit. Writes DIR/<date>-ep-moe.{md,json}.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist


def _timed(fn, iters: int, sync) -> float:
    """Median seconds of one call (each call bracketed by ``sync``)."""
    times = []
    for _ in range(iters):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _worker(rank: int, world: int, store: str, args, result_path: str) -> None:
    from pyfuser.demo import moe_ep
    from pyfuser.demo import moe_nvfp4 as moe

    cuda = not args.cpu
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("gloo" if args.cpu else "nccl", init_method=f"file://{store}", rank=rank,
                            world_size=world)
    device = torch.device(f"cuda:{rank}" if cuda else "cpu")

    def sync():
        if cuda:
            torch.cuda.synchronize()
        dist.barrier()

    cfg = moe.MoEConfig(hidden=args.hidden, intermediate=args.intermediate, experts=args.experts, top_k=args.top_k)
    q = moe.quantize_weights(moe.make_weights(cfg, device, seed=0))
    T = args.tokens
    x = torch.randn(T, cfg.hidden, generator=torch.Generator().manual_seed(1)).to(device, torch.bfloat16)
    x_scaled = torch.randn(T * world, cfg.hidden, generator=torch.Generator().manual_seed(2)).to(device,
                                                                                                  torch.bfloat16)
    layer = moe_ep.ExpertParallelMoE(cfg, q)
    result = {"rank": rank}

    # correctness first: EP on the split batch vs the single-device layer on the whole batch
    single = moe.MoENVFP4(cfg, q)
    ref = single(x)
    out = layer(moe_ep.shard_tokens(x))
    block = moe_ep.shard_tokens(ref)
    result["bit_exact"] = bool(torch.equal(out, block))
    result["max_abs_diff"] = (out.float() - block.float()).abs().max().item()

    for _ in range(args.warmup):
        layer(moe_ep.shard_tokens(x))
        layer(moe_ep.shard_tokens(x_scaled))
    result["ep_same_batch_s"] = _timed(lambda: layer(moe_ep.shard_tokens(x)), args.iters, sync)
    result["ep_scaled_batch_s"] = _timed(lambda: layer(moe_ep.shard_tokens(x_scaled)), args.iters, sync)
    if rank == 0:
        # one GPU alone: the others wait at the barrier
        for _ in range(args.warmup):
            single(x)
        one_sync = torch.cuda.synchronize if cuda else (lambda: None)
        result["one_gpu_s"] = _timed(lambda: single(x), args.iters, one_sync)
        graphed = None
        if cuda:
            try:
                single(x, enable_options=["cuda_graph"])
                result["one_gpu_cuda_graph_s"] = _timed(lambda: single(x, enable_options=["cuda_graph"]),
                                                        args.iters, one_sync)
            except Exception as e:  # noqa: BLE001 -- recorded, not fatal
                graphed = repr(e)
        result["one_gpu_cuda_graph_error"] = graphed
    dist.barrier()
    torch.save(result, f"{result_path}.{rank}")
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--intermediate", type=int, default=2048)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--cpu", action="store_true", help="gloo on CPU processes (a smoke run)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (16 tokens, H=128, I=64, 4 experts)")
    ap.add_argument("--out", default=None, help="folder for the .md/.json results")
    args = ap.parse_args()
    if args.quick:
        args.tokens, args.hidden, args.intermediate, args.experts, args.iters, args.warmup = 16, 128, 64, 4, 2, 1
    if not args.cpu and torch.cuda.device_count() < args.ranks:
        raise SystemExit(f"needs {args.ranks} CUDA devices, found {torch.cuda.device_count()}")

    tmp = tempfile.mkdtemp()
    store, result_path = os.path.join(tmp, "store"), os.path.join(tmp, "result")
    torch.multiprocessing.spawn(_worker, args=(args.ranks, store, args, result_path), nprocs=args.ranks)
    ranks = [torch.load(f"{result_path}.{r}") for r in range(args.ranks)]

    T, D = args.tokens, args.ranks
    one = ranks[0]["one_gpu_s"]
    same = max(r["ep_same_batch_s"] for r in ranks)
    scaled = max(r["ep_scaled_batch_s"] for r in ranks)
    summary = {
        "config": {k: getattr(args, k) for k in ("ranks", "tokens", "hidden", "intermediate", "experts", "top_k",
                                                 "iters", "cpu")},
        "bit_exact_vs_single_device": all(r["bit_exact"] for r in ranks),
        "max_abs_diff": max(r["max_abs_diff"] for r in ranks),
        "one_gpu_ms": one * 1e3,
        "one_gpu_cuda_graph_ms": (ranks[0].get("one_gpu_cuda_graph_s") or float("nan")) * 1e3,
        "ep_same_batch_ms": same * 1e3,
        "ep_scaled_batch_ms": scaled * 1e3,
        "throughput_tokens_per_s": {"one_gpu": T / one, "ep_same_batch": T / same, "ep_scaled_batch": D * T / scaled},
    }
    tp = summary["throughput_tokens_per_s"]
    summary["speedup_same_batch"] = tp["ep_same_batch"] / tp["one_gpu"]
    summary["speedup_scaled_batch"] = tp["ep_scaled_batch"] / tp["one_gpu"]
    summary["target_1_6x_met"] = max(summary["speedup_same_batch"], summary["speedup_scaled_batch"]) >= 1.6
    lines = [
        f"# EP MoE decode: {T} tokens, H={args.hidden}, I={args.intermediate}, E={args.experts}, top-{args.top_k}, "
        f"{D} ranks ({'gloo/CPU' if args.cpu else 'NCCL/GPU'})",
        f"- EP output vs single device: {'bit-exact' if summary['bit_exact_vs_single_device'] else 'DIFFERENT'} "
        f"(max abs diff {summary['max_abs_diff']:.3g})",
        f"- one device: {summary['one_gpu_ms']:.3f} ms ({tp['one_gpu']:.0f} tokens/s); with cuda_graph "
        f"{summary['one_gpu_cuda_graph_ms']:.3f} ms",
        f"- EP, {T} tokens split: {summary['ep_same_batch_ms']:.3f} ms ({tp['ep_same_batch']:.0f} tokens/s, "
        f"{summary['speedup_same_batch']:.2f}x)",
        f"- EP, {T} tokens per rank: {summary['ep_scaled_batch_ms']:.3f} ms ({tp['ep_scaled_batch']:.0f} tokens/s, "
        f"{summary['speedup_scaled_batch']:.2f}x)",
        f"- target >= 1.6x one device: {'met' if summary['target_1_6x_met'] else 'NOT met'}",
    ]
    print("\n".join(lines))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        stem = os.path.join(args.out, f"{datetime.date.today().isoformat()}-ep-moe")
        with open(stem + ".md", "w") as f:
            f.write("\n".join(lines) + "\n")
        with open(stem + ".json", "w") as f:
            json.dump(summary, f, indent=2)


if __name__ == "__main__":
    main()
