"""benchmarks/sass_census.py counts the interior path of a pointwise kernel that splits its tiles (rows of odd
widths) apart from the masked edge path, and counts nothing extra where the kernel has no such split.

Compiles for sm_90a on this machine (ptxas and cuobjdump ship with Triton), no GPU needed."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import bench_fusions  # noqa: E402
import sass_census  # noqa: E402
from harness import DEVICE  # noqa: E402
from sm90 import gpu_plans  # noqa: E402


def _plan(monkeypatch, case: str, rows: int, cols: int):
    for name, fd, _eager, inputs in bench_fusions.make_cases(rows, cols, DEVICE):
        if name == case:
            (p,) = gpu_plans(monkeypatch, fd, inputs)
            return p
    raise AssertionError(f"no case {case}")


def test_interior_path_counted_alone_for_split_tiles(monkeypatch):
    p = _plan(monkeypatch, "slice+add+mul", 64, 4096)  # 4095 columns: interior tiles and a masked last one
    assert sass_census.INTERIOR_TEST_LINE in p.source
    row = sass_census.census(p)
    # the two paths together, then the interior one alone: fewer instructions, but more than its loads, stores
    # and arithmetic (scalar accesses of a misaligned row: a few instructions per element at least)
    assert 4 < row["interior_per_elem"] < row["hot_per_elem"] <= row["per_elem"]


def test_no_interior_count_without_a_split(monkeypatch):
    p = _plan(monkeypatch, "gelu(x*w+b)", 64, 4096)  # whole vectors per row: no masked edge path
    assert sass_census.INTERIOR_TEST_LINE not in p.source
    assert "interior_per_elem" not in sass_census.census(p)
