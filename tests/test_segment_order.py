"""The segmenter walks a fusion in nvFuser's printing order (pyfuser/ir/order.py): a definition and the one rebuilt
from its repr(fd), whose creation order is that printing order, get the same segments and the same bits.

nvFuser's repro tests rebuild every definition from its printed text and compare the outputs; on the H200 three of
them saw a bf16 rounding step of difference while the segmenter followed creation order (two reductions cut into
different kernels)."""

import torch

from harness import define, make, rebuild_from_repr
from test_codegen_views import bits_equal
from pyfuser import DataType


def _two_branches(fd, x, w):
    # Created branch by branch; printed depth first from the outputs in another order.
    t, s = fd.from_pytorch(x), fd.from_pytorch(w)
    mean = fd.ops.sum(fd.ops.cast(t, DataType.Float), dims=[1], keepdim=True)  # branch A starts
    scaled = fd.ops.mul(fd.ops.cast(s, DataType.Float), 3.0)  # branch B
    centred = fd.ops.sub(fd.ops.cast(t, DataType.Float), mean)  # branch A continues
    norm = fd.ops.sum(fd.ops.mul(centred, centred), dims=[1], keepdim=True)
    out = fd.ops.cast(fd.ops.div(centred, fd.ops.add(norm, scaled)), DataType.BFloat16)
    fd.add_output(fd.ops.cast(scaled, DataType.BFloat16))
    fd.add_output(out)
    fd.add_output(fd.ops.max(centred, dims=[0]))


def test_rebuilt_definition_has_the_same_segments_and_bits():
    x, w = make((33, 70), torch.bfloat16), make((33, 1), torch.bfloat16)
    fd = define(lambda fd: _two_branches(fd, x, w))
    outs = fd.execute([x, w])
    fd2 = rebuild_from_repr(fd)
    outs2 = fd2.execute([x, w])
    assert [(s.kind, [e.op.name for e in s.exprs]) for s in fd.segments()] == \
        [(s.kind, [e.op.name for e in s.exprs]) for s in fd2.segments()]
    for a, b in zip(outs, outs2):
        bits_equal(a, b)


def test_printing_order_differs_from_creation_order_here():
    # (so the test above compares two different creation orders)
    x, w = make((4, 6), torch.bfloat16), make((4, 1), torch.bfloat16)
    fd = define(lambda fd: _two_branches(fd, x, w))
    created = [e.op.name for e in fd.fusion.exprs]
    printed = [e.op.name for e in rebuild_from_repr(fd).fusion.exprs]
    assert created != printed and sorted(created) == sorted(printed)
