"""`python -m pyfuser demo`: it runs every case on CPU and passes, and its checks can fail."""

import dataclasses
import runpy
from pathlib import Path

import pytest
import torch

from pyfuser import demo
from pyfuser.__main__ import main
from pyfuser.codegen.launcher import triton_usable


def test_demo_passes_every_case_on_cpu(capsys):
    rc = main(["demo", "--device", "cpu"])
    out = capsys.readouterr().out
    assert rc == 0, out
    for case in demo.CASES:
        assert f"\nPASS {case.key}\n" in out, out
    assert "FAIL" not in out and "SKIP" not in out, out
    # The report shows the definition, the segments and the inferred layouts of the #4888 view.
    assert "def nvfuser_fusion(fd : FusionDefinition) -> None :" in out
    assert "ExprEval" in out
    assert "contiguity=[None, None, False, True]" in out
    if triton_usable(torch.device("cpu")):
        # Under the interpreter (set by conftest) the demo shows generated kernels: no kernel segment fell back.
        assert "generated Triton kernel" in out
        fallbacks = [line for line in out.splitlines() if "runs as: ATen" in line and "(ExprEval segment)" not in line]
        assert not fallbacks, fallbacks


def test_help_lists_the_commands(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "demo" in out and "ops" in out


def test_wrong_eager_result_fails_with_nonzero_exit(capsys, monkeypatch):
    # The same fusion against an eager reference that is off by a factor: the demo must notice.
    case = next(c for c in demo.CASES if c.key == "layer_norm")
    broken = dataclasses.replace(case, eager=lambda *a, **sz: [r * 2 for r in case.eager(*a, **sz)])
    monkeypatch.setattr(demo, "CASES", [broken])
    rc = demo.run(device="cpu")
    out = capsys.readouterr().out
    assert rc == 1
    assert "\nFAIL layer_norm\n" in out and "values differ" in out


def test_missing_op_is_a_skip_naming_it(capsys, monkeypatch):
    case = dataclasses.replace(demo.CASES[0], key="needs_missing", ops=("add", "no_such_op"))
    monkeypatch.setattr(demo, "CASES", [case])
    rc = demo.run(device="cpu")
    out = capsys.readouterr().out
    assert rc == 0
    assert "SKIP needs_missing: pyfuser has no op fd.ops.no_such_op" in out


def _mutations():
    base = torch.arange(12.0).reshape(3, 4)
    return {
        "strides": (base.t().contiguous().t(), "strides"),
        "dtype": (base.double(), "dtype"),
        "values": (base + 1, "values differ"),
        "shape": (base.reshape(4, 3), "shape"),
        "aliasing": (base, "aliases input"),  # the reference is a copy, this output is the input itself
    }


@pytest.mark.parametrize("what", sorted(_mutations()))
def test_compare_output_reports_each_difference(what):
    base = torch.arange(12.0).reshape(3, 4)
    out, message = _mutations()[what]
    inputs = [out] if what == "aliasing" else []
    problems = demo.compare_output(out, base.clone(), inputs, [])
    assert any(message in p for p in problems), problems


def test_compare_output_accepts_an_equal_result():
    ref = torch.randn(3, 4, dtype=torch.bfloat16)
    assert demo.compare_output(ref.clone(), ref, [], []) == []


EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.py"))


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(script, capsys, monkeypatch):
    # Each example checks itself against eager PyTorch with asserts; running it is the test. It runs as
    # `python examples/<script>` would, without arguments (pytest's own would reach its argument parser).
    monkeypatch.setattr("sys.argv", [str(script)])
    runpy.run_path(str(script), run_name="__main__")
    assert "OK:" in capsys.readouterr().out
