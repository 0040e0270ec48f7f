"""benchmarks/bench_nvfp4.py without a GPU: which GEMM cases ``--gemm-shapes`` runs, and in what order, and which
bf16 baseline each ratio takes.

The order was the option's point: the bf16 baseline's time at one shape seemed to depend on what the process ran
before it. It does not (thirtieth session); it depends on where the operands are allocated, so the ratios take
the faster of two allocations (docs/performance.md, NVFP4 grouped GEMM).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import bench_nvfp4 as bn  # noqa: E402


def test_gemm_shapes_keep_their_order_and_phase():
    cases = bn.gemm_cases(False, [(14336, 16), (14336, 1), (2048, bn.PREFILL_TOKENS // bn.E)])
    assert cases == [("decode", 16, 14336, bn.K_GEMM), ("decode", 1, 14336, bn.K_GEMM),
                     ("prefill", bn.PREFILL_TOKENS // bn.E, 2048, bn.K_GEMM)]
    assert bn.gemm_cases(True, [(128, 2)]) == [("decode", 2, 128, 256)]
    # Without shapes: every decode case of each N, then prefill.
    full = bn.gemm_cases(False)
    assert len(full) == len(bn.N_GEMM) * (len(bn.DECODE_TOKENS_PER_EXPERT) + 1)
    assert [c[0] for c in full[-len(bn.N_GEMM):]] == ["prefill"] * len(bn.N_GEMM)


def test_main_passes_the_shapes_to_the_gemm_section(monkeypatch, tmp_path):
    got = []

    def bench_gemm(dev, timer, copy_bw, quick, shapes=()):
        got.append(list(shapes))
        return []

    monkeypatch.setattr(bn, "bench_gemm", bench_gemm)
    monkeypatch.setattr(bn, "copy_bandwidth", lambda dev, timer: 4000.0)
    bn.main(["--device", "cpu", "--sections", "gemm", "--gemm-shapes", "14336x16,2048x1", "--out", str(tmp_path)])
    assert got == [[(14336, 16), (2048, 1)]]
    bn.main(["--device", "cpu", "--sections", "gemm", "--out", str(tmp_path)])
    assert got[-1] == []


def test_speedups_take_the_faster_bf16_allocation_and_match_graphs():
    rows = [{"impl": "pyfuser fd op", "ms": 1.0, "ms_read_flush": 2.0},
            {"impl": "pyfuser fd op, offset_checks off, CUDA graph", "ms": 1.0},
            {"impl": "bf16 torch._grouped_mm", "ms": 4.0, "ms_read_flush": 5.0},
            {"impl": bn.BF16_OTHER_ALLOCATION, "ms": 3.5, "ms_read_flush": 6.0},
            {"impl": "bf16 torch._grouped_mm, CUDA graph", "ms": 3.0},
            {"impl": bn.BF16_OTHER_ALLOCATION + ", CUDA graph", "error": "capture failed"}]
    bn.attach_speedups(rows)
    assert rows[0]["speedup_vs_bf16"] == 3.5 and rows[0]["speedup_vs_bf16_read_flush"] == 2.5
    assert rows[1]["speedup_vs_bf16"] == 3.0  # a graphed row against the graphed baseline that has a time
    assert rows[2]["speedup_vs_bf16"] == 3.5 / 4.0 and rows[3]["speedup_vs_bf16"] == 1.0
    assert "speedup_vs_bf16" not in rows[5]
