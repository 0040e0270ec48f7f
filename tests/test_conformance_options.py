"""nvFuser option names whose effect pyfuser reproduces: disabling ``matmul_expr_eval`` leaves matmul and linear
without a way to run (pyfuser has no generated matmul kernel), so executing such a fusion is an error."""

from __future__ import annotations

import pytest
import torch

from harness import define, make
from pyfuser import DataType
from pyfuser.errors import FusionExecutionError


def _matmul(fd):
    a = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
    b = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
    fd.add_output(fd.ops.relu(fd.ops.matmul(a, b)))


def _linear(fd):
    a = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
    w = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
    fd.add_output(fd.ops.linear(a, w))


@pytest.mark.parametrize("enable", [["fuse_matmul"], []])
def test_matmul_expr_eval_disabled_has_no_scheduler(enable):
    fd = define(_matmul)
    a, b = make((5, 3)), make((3, 4))
    with pytest.raises(FusionExecutionError, match=r"Can not find a scheduler to schedule fusion segment: "
                                                   r"fd\.ops\.matmul \(T2\)"):
        fd.execute([a, b], _enable_options=enable, _disable_options=["matmul_expr_eval"])
    # the refusal is per call: the fusion still runs with ATen matmul
    out = fd.execute([a, b])[0]
    torch.testing.assert_close(out, torch.relu(a @ b))


def test_matmul_expr_eval_disabled_through_the_environment(monkeypatch):
    fd = define(_linear)
    a, w = make((5, 3)), make((4, 3))
    monkeypatch.setenv("NVFUSER_DISABLE", "matmul_expr_eval")
    with pytest.raises(FusionExecutionError, match=r"fd\.ops\.linear .*matmul_expr_eval is disabled"):
        fd.execute([a, w])
    monkeypatch.delenv("NVFUSER_DISABLE")
    torch.testing.assert_close(fd.execute([a, w])[0], torch.nn.functional.linear(a, w))


def test_matmul_expr_eval_disabled_without_matmul_changes_nothing():
    def fusion(fd):
        t = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
        fd.add_output(fd.ops.sum(fd.ops.neg(t), [1]))

    x = make((3, 4))
    x[0, 0] = float("nan")
    out = define(fusion).execute([x], _disable_options=["matmul_expr_eval"])[0]
    torch.testing.assert_close(out, (-x).sum(1), equal_nan=True)
