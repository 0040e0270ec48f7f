"""Frontend edge cases found by trying pyfuser as a user would (issue 10): ``hasattr`` on ``fd.ops`` and
executing a definition that is still open."""

from __future__ import annotations

import pytest
import torch

from harness import DEVICE
from pyfuser import FusionDefinition, UnsupportedOpError


def test_hasattr_of_an_unknown_op_is_false():
    with FusionDefinition() as fd:
        assert not hasattr(fd.ops, "no_such_op")
        assert getattr(fd.ops, "no_such_op", None) is None
        assert hasattr(fd.ops, "add")


def test_an_unknown_op_is_our_error_naming_it():
    with FusionDefinition() as fd:
        with pytest.raises(UnsupportedOpError, match=r"fd\.ops\.no_such_op is not supported"):
            fd.ops.no_such_op  # noqa: B018
        with pytest.raises(AttributeError):  # what code written for nvFuser's bindings catches
            fd.ops.no_such_op(fd.define_tensor([2]))


def test_execute_inside_the_definition_then_more_outputs():
    """execute inside `with`, then more ops and outputs: the later executes see the whole definition (before the
    fix the first execute's executor was kept and the second failed with 'no value bound for T2')."""
    x = torch.tensor([[-1.0, 2.0], [3.0, -4.0]], device=DEVICE)
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(x)
        fd.add_output(fd.ops.relu(t0))
        (first,) = fd.execute([x])
        torch.testing.assert_close(first, torch.relu(x))
        fd.add_output(fd.ops.neg(t0))
        inside = fd.execute([x])
    after = fd.execute([x])
    for outs in (inside, after):
        assert len(outs) == 2
        torch.testing.assert_close(outs[0], torch.relu(x))
        torch.testing.assert_close(outs[1], torch.neg(x))


def test_execute_inside_the_definition_then_a_new_input():
    x = torch.tensor([1.0, -2.0, 3.0], device=DEVICE)
    y = torch.tensor([0.5, 0.5, 0.5], device=DEVICE)
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(x)
        fd.add_output(fd.ops.abs(t0))
        fd.execute([x])
        t1 = fd.from_pytorch(y)
        fd.add_output(fd.ops.mul(t0, t1))
    outs = fd.execute([x, y])
    torch.testing.assert_close(outs[0], torch.abs(x))
    torch.testing.assert_close(outs[1], x * y)
