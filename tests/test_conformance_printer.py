"""``repr(fd)`` in nvFuser's printer style: statements depth first from the outputs (names stay in creation order),
the dtype sum/prod resolved, a reduction of size-1 broadcast dims recorded as the squeeze it is, slices with their
steps, a broadcast_in_dim that adds no dim recorded as an expand. Values are checked against eager too, since
the last three change the definition, not only its text."""

from __future__ import annotations

import pytest
import torch

import pyfuser
from harness import check_fusion, define, make, rebuild_from_repr
from pyfuser import DataType
from pyfuser.frontend.printer import fusion_to_python


def _branches(fd):
    a = fd.define_tensor(shape=[-1], contiguity=[True])
    b = fd.define_tensor(shape=[1, -1, 1], contiguity=[None, True, None])
    c = fd.define_tensor(shape=[-1, 1, -1], contiguity=[True, None, True])
    b2 = fd.ops.squeeze(b, [0, -1])
    c2 = fd.ops.squeeze(c, [-2])
    c3 = fd.ops.sum(c2, [0])
    ab = fd.ops.mul(a, b2)  # created after c3, needed before it
    fd.add_output(fd.ops.mul(ab, c3))


def test_statements_printed_depth_first_from_the_outputs_with_creation_order_names():
    text = repr(define(_branches))
    body = [line.strip() for line in text.splitlines()[4:]]
    assert body == [
        "tv3 = fd.ops.squeeze(tv1, dims=[0, 2])",
        "tv6 = fd.ops.mul(tv0, tv3)",
        "tv4 = fd.ops.squeeze(tv2, dims=[1])",
        "tv5 = fd.ops.sum(tv4, dims=[0], dtype=DataType.Float)",
        "tv7 = fd.ops.mul(tv6, tv5)",
        "fd.add_output(tv7)",
    ]
    a, b, c = make((4,)), make((1, 4, 1)), make((2, 1, 4))
    a[0] = float("nan")
    check_fusion(_branches, [a, b, c], lambda a, b, c: a * b.squeeze(0).squeeze(-1) * c.squeeze(1).sum(0),
                 )


def test_rebuilt_definition_prints_the_canonical_form_and_shares_the_cache_entry():
    fd = define(_branches)
    canonical = fusion_to_python(fd.fusion, canonical=True)
    assert "tv4 = fd.ops.mul(tv0, tv3)" in canonical  # numbered in printing order
    fd2 = rebuild_from_repr(fd)
    assert repr(fd2) == canonical
    cache = pyfuser.LRUCache(max_fusions=4)
    assert cache.cache_compile(fd.fusion) is cache.cache_compile(fd2.fusion)
    assert cache.num_fusions() == 1


def test_output_feeding_another_output_is_reached_from_it():
    def fusion(fd):
        t = fd.define_tensor(shape=[-1, -1], contiguity=True)
        u = fd.ops.exp(t)
        v = fd.ops.neg(t)  # dead: no output needs it
        fd.add_output(u)
        w = fd.ops.add(u, 1.0)
        fd.add_output(w)
        del v

    text = repr(define(fusion))
    lines = [line.strip() for line in text.splitlines()[2:]]
    assert lines == ["tv1 = fd.ops.exp(tv0)", "tv3 = fd.ops.add(tv1, 1.00000)", "tv2 = fd.ops.neg(tv0)",
                     "fd.add_output(tv1)", "fd.add_output(tv3)"]
    x = make((2, 3))
    check_fusion(fusion, [x], lambda x: [torch.exp(x), torch.exp(x) + 1.0])


def test_vector_of_computed_scalars_printed_after_them():
    def fusion(fd):
        t = fd.define_tensor(shape=[-1, -1], contiguity=True)
        n = fd.ops.mul(fd.ops.size(t, 0), fd.ops.size(t, 1))
        shape = fd.define_vector([n], dtype=DataType.Int)
        fd.add_output(fd.ops.reshape(fd.ops.relu(t), shape))

    x = make((3, 4))
    check_fusion(fusion, [x], lambda x: torch.relu(x).reshape(12))


@pytest.mark.parametrize("dtype, printed", [
    (torch.float32, "DataType.Float"), (torch.bfloat16, "DataType.BFloat16"), (torch.int32, "DataType.Int"),
    (torch.bool, "DataType.Int"),
])
def test_sum_and_prod_print_their_resolved_dtype_max_min_none(dtype, printed):
    x = make((3, 5), dtype)

    def fusion(fd):
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.sum(t, [1]))
        fd.add_output(fd.ops.prod(t, [0]))
        if dtype is not torch.bool:
            fd.add_output(fd.ops.max(t, [1]))

    text = repr(define(fusion))
    assert f"fd.ops.sum(tv0, dims=[1], dtype={printed})" in text
    assert f"fd.ops.prod(tv0, dims=[0], dtype={printed})" in text
    if dtype is not torch.bool:
        assert "fd.ops.max(tv0, dims=[1])" in text

    def ref(x):
        acc = torch.int64 if not x.is_floating_point() else x.dtype
        outs = [torch.sum(x, [1], dtype=acc), torch.prod(x, 0, dtype=acc)]
        return outs if dtype is torch.bool else outs + [torch.amax(x, [1])]

    check_fusion(fusion, [x], ref, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("op", ["sum", "prod", "max", "min"])
def test_reducing_only_size_one_broadcast_dims_is_a_squeeze(op):
    x = make((4, 1, 3), torch.int32)
    x[0, 0, 0] = -(2 ** 31)

    def fusion(fd):
        t = fd.define_tensor(shape=[-1, 1, -1], contiguity=[True, None, True], dtype=DataType.Int32)
        fd.add_output(getattr(fd.ops, op)(t, [1]))

    text = repr(define(fusion))
    if op in ("sum", "prod"):  # cast first (Int32 sums to Int), then squeeze
        assert "tv1 = fd.ops.cast(tv0, dtype=DataType.Int)\n    tv2 = fd.ops.squeeze(tv1, dims=[1])" in text
    else:
        assert "tv1 = fd.ops.squeeze(tv0, dims=[1])" in text
        assert f"fd.ops.{op}" not in text
    ref = {"sum": lambda x: torch.sum(x, [1]), "prod": lambda x: torch.prod(x, 1),
           "max": lambda x: torch.amax(x, [1]), "min": lambda x: torch.amin(x, [1])}[op]
    check_fusion(fusion, [x], ref)


def test_reducing_broadcast_and_real_dims_squeezes_then_reduces():
    x = make((4, 1, 3))
    x[1, 0, 2] = float("inf")

    def fusion(fd):
        t = fd.define_tensor(shape=[-1, 1, -1], contiguity=[True, None, True])
        fd.add_output(fd.ops.sum(t, [1, 2]))
        fd.add_output(fd.ops.max(t, [0, 1], keepdim=True))  # keepdim: the plain reduction

    text = repr(define(fusion))
    assert "tv1 = fd.ops.squeeze(tv0, dims=[1])\n    tv2 = fd.ops.sum(tv1, dims=[1], dtype=DataType.Float)" in text
    assert "fd.ops.max(tv0, dims=[0, 1], keepdim=True)" in text
    check_fusion(fusion, [x], lambda x: [x.sum([1, 2]), torch.amax(x, [0, 1], keepdim=True)])


def test_slice_to_static_extent_one_is_a_broadcast_dim():
    """As in nvFuser, a slice known to give extent 1 makes a broadcast dim: it broadcasts against a wider tensor
    and reducing it is a squeeze."""
    x, y = make((6, 5)), make((3, 5))
    x[2, 0] = float("nan")

    def fusion(fd):
        tx = fd.define_tensor(shape=[-1, -1], contiguity=True)
        ty = fd.define_tensor(shape=[-1, -1], contiguity=True)
        row = fd.ops.slice(tx, [2, 0], [3, 5], manual_normalization=True)  # [1, 5] on a symbolic extent
        fd.add_output(fd.ops.add(row, ty))
        fd.add_output(fd.ops.sum(row, [0]))

    fd = define(fusion)
    text = repr(fd)
    assert "fd.ops.slice(tv0, start_indices=[2, 0], end_indices=[3, 5], strides=[1, 1], manual_normalization=True)" \
        in text
    assert "fd.ops.squeeze(tv2, dims=[0])" in text
    check_fusion(fusion, [x, y], lambda x, y: [x[2:3] + y, x[2:3].sum(0)])


def test_broadcast_in_dim_adding_no_dim_is_an_expand():
    def with_bid(fd):
        t0 = fd.define_tensor(shape=[1, -1], contiguity=[None, True])
        t1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True])
        fd.add_output(fd.ops.add(fd.ops.broadcast_in_dim(t0, fd.ops.shape(t1), [0, 1]), t1))

    def with_expand(fd):
        t0 = fd.define_tensor(shape=[1, -1], contiguity=[None, True])
        t1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True])
        fd.add_output(fd.ops.add(fd.ops.expand(t0, fd.ops.shape(t1)), t1))

    assert repr(define(with_bid)) == repr(define(with_expand))
    a, b = make((1, 4)), make((3, 4))
    a[0, 1] = float("-inf")
    check_fusion(with_bid, [a, b], lambda a, b: a.expand(3, 4) + b)
    # a broadcast_in_dim that does add dims keeps its own form
    text = repr(define(lambda fd: fd.add_output(fd.ops.broadcast_in_dim(
        fd.define_tensor(shape=[-1], contiguity=True), [2, 3], [1]))))
    assert "fd.ops.broadcast_in_dim(tv0, shape=[2, 3], broadcast_dims=[1])" in text
