"""benchmarks/bench_fusions.py's subset and time-budget options, and its partial reports, without a GPU.

The GPU parts (timing, the copy's bandwidth) are replaced by stand-ins; what is checked is
which cases run, in what order, that a spent budget stops the run before the next shape's inputs are built, and
that the .md and .json reports say how many of the planned cases ran.
"""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import bench_fusions as bf  # noqa: E402


@pytest.fixture
def fake_gpu(monkeypatch):
    """bench_fusions on the CPU with its timing stood in for: every run_case call advances a clock by 10 s and
    records the case it got; every make_cases call records the inputs it built."""
    clock = SimpleNamespace(now=0.0, ran=[], built=[])

    def run_case(name, fd, eager, inputs, copy_bw, compiled, read_flush=False):
        clock.ran.append((name, tuple(inputs[0].shape), inputs[0].dtype))
        clock.now += 10
        return {"case": name, "shape": list(inputs[0].shape), "segments": ["pointwise"], "runs": ["triton"],
                "pyfuser_ms": 1.0, "eager_ms": 2.0, "compile_ms": 1.5, "bytes": 1, "pyfuser_GBs": 1.0,
                "pct_copy_bw": 90.0, "same_size_copy_ms": 1.0, "pct_same_size_copy": 100.0, "vs_eager": 2.0,
                "vs_compile": 1.5}

    make_cases = bf.make_cases

    def counting_make_cases(rows, cols, dev, dtype=torch.bfloat16):
        clock.built.append((rows, cols, dtype))
        return make_cases(rows, cols, dev, dtype)

    monkeypatch.setattr(bf, "run_case", run_case)
    monkeypatch.setattr(bf, "make_cases", counting_make_cases)
    monkeypatch.setattr(bf, "copy_bandwidth", lambda dev: 4000.0)
    monkeypatch.setattr(bf, "time", SimpleNamespace(perf_counter=lambda: clock.now))
    return clock


def _report(out, tag):
    day = [f for f in os.listdir(out) if f.endswith(f"-{tag}.json")]
    assert len(day) == 1, os.listdir(out)
    with open(os.path.join(out, day[0])) as f:
        data = json.load(f)
    with open(os.path.join(out, day[0][:-5] + ".md")) as f:
        return data, f.read()


def test_cases_and_shapes_select_a_subset(fake_gpu, tmp_path):
    bf.main(["--device", "cpu", "--out", str(tmp_path), "--tag", "subset", "--cases", "gelu,softmax",
             "--shapes", "8x48,4x32", "--fp32"])
    names = ["gelu(x*w+b)", "softmax fp32"]
    want = [(n + tag, shape, dt) for dt, tag in ((torch.bfloat16, ""), (torch.float32, " [fp32]"))
            for shape in ((8, 48), (4, 32)) for n in names]
    assert fake_gpu.ran == want
    data, md = _report(tmp_path, "subset")
    assert [(r["case"], tuple(r["shape"])) for r in data["cases"]] == [(n, s) for n, s, _ in want]
    assert data["partial"] == "8 of 8 cases; the extras were skipped"
    assert "**Partial run**: 8 of 8 cases; the extras were skipped" in md
    assert data["host_overhead_us"] == {} and data["segment_counts"] == {} and data["flush_study"] == []
    assert "Host time per cached call" not in md and "Segments per fusion" not in md


def test_budget_stops_before_the_next_shape(fake_gpu, tmp_path):
    # Cases start at 0, 10 and 20 s; at 30 s the 25 s budget is spent: the rest of the first shape is skipped
    # and the second shape's inputs are never built.
    bf.main(["--device", "cpu", "--out", str(tmp_path), "--tag", "budget", "--shapes", "8x48,4x32", "--budget-s", "25"])
    first = [n for n in bf.CASE_FDS][:3]
    assert fake_gpu.ran == [(n, (8, 48), torch.bfloat16) for n in first]
    assert fake_gpu.built == [(8, 48, torch.bfloat16)]
    data, md = _report(tmp_path, "budget")
    assert len(data["cases"]) == 3
    planned = 2 * len(bf.CASE_FDS)
    assert data["partial"] == f"3 of {planned} cases (the time budget ran out); the extras were skipped"
    assert f"3 of {planned} cases (the time budget ran out)" in md


def test_report_is_written_after_every_case(fake_gpu, tmp_path, monkeypatch):
    # A run stopped from outside after its second case leaves a report of two cases, marked as so far.
    run_case = bf.run_case

    def stopping(*args, **kwargs):
        if len(fake_gpu.ran) == 2:
            raise KeyboardInterrupt
        return run_case(*args, **kwargs)

    monkeypatch.setattr(bf, "run_case", stopping)
    with pytest.raises(KeyboardInterrupt):
        bf.main(["--device", "cpu", "--out", str(tmp_path), "--tag", "stopped", "--shapes", "8x48"])
    data, md = _report(tmp_path, "stopped")
    assert [r["case"] for r in data["cases"]] == list(bf.CASE_FDS)[:2]
    assert data["partial"] == f"2 of {len(bf.CASE_FDS)} cases so far"
    assert "**Partial run**" in md


def test_parse_shapes_and_case_wanted():
    assert bf.parse_shapes("16384x4096,8191x5000") == [(16384, 4096), (8191, 5000)]
    assert bf.case_wanted("gelu(x*w+b) [fp32]", ["gelu"]) and bf.case_wanted("rmsnorm", [])
    assert not bf.case_wanted("rmsnorm", ["gelu", "softmax"])
