"""benchmarks/bench_nvfp4.py's ``--gemm-shapes``: which GEMM cases run, and in what order, without a GPU.

The order is the point of the option: the bf16 baseline's time at one shape has depended on what the process ran
before it (docs/performance.md, NVFP4 grouped GEMM), so a run must be able to put any case first.
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
