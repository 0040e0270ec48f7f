"""GPU timing shared by the benchmark scripts.

``triton.testing.do_bench`` clears L2 before each timed call by zeroing a 256 MB buffer, so every call starts with
L2 full of dirty lines and pays for writing some of them back. For calls that move tens of MB that write-back is a
large share of the time (H200: a 32 MiB copy reaches 3075 GB/s after the zeroing flush, 3641 GB/s after a reading
one; ``bench_fusions.py``'s flush study). :func:`median_ms_read_flush` clears L2 by reading instead: the timed call
still finds none of its data in L2, but writes back nothing of the flush's.
"""

from __future__ import annotations

import torch


def median_event_ms(fn, n: int, clear, queue_ahead_s: float = 0.0) -> float:
    """Median ms of ``fn()`` over ``n`` calls, each timed by CUDA events right after ``clear()`` (an L2 flush).
    ``queue_ahead_s``: a sleep kernel of about that many seconds first keeps the GPU busy while the host queues every
    call, so the calls then run back to back and host launch time stays out of the events."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    if queue_ahead_s:
        torch.cuda._sleep(int(2e9 * queue_ahead_s))  # (cycles, at ~2 GHz)
    for i in range(n):
        clear()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return sorted(s.elapsed_time(e) for s, e in zip(starts, ends))[n // 2]


def median_ms_read_flush(fn, n: int = 100, warmup: int = 10) -> float:
    """Median ms of ``fn()`` over ``n`` calls, each timed by CUDA events after L2 was cleared by reading 256 MB."""
    flush = torch.empty(64 << 20, dtype=torch.int32, device="cuda")
    for _ in range(warmup):
        fn()
    return median_event_ms(fn, n, flush.sum)
