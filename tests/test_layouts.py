"""The contiguity/allocation reset from inferred strides (meta_inference.md), case by case."""

import pytest
import torch

from pyfuser.ir import DataType, Fusion, IterDomain, IterType, TensorView
from pyfuser.runtime.layouts import contiguous_strides, layout_from_strides


def tv(*dims):
    """A TensorView over IterDomains given as 'i' (iteration), 'b' (broadcast), 'e' (expanded), 'r' (reduction)."""
    kinds = {
        "i": lambda: IterDomain.iteration(None),
        "b": lambda: IterDomain.broadcast(),
        "e": lambda: IterDomain(None, IterType.Broadcast, True),
        "r": lambda: IterDomain.reduction(None),
    }
    return TensorView(Fusion(), [kinds[d]() for d in dims], DataType.Float)


def test_issue_4888_pattern():
    # T49 = expand(slice(broadcast(T10))): [1,32,4096,4096] with strides [S,0,4097,1], S = 4096*4097.
    s = 4096 * 4097
    layout = layout_from_strides(tv("b", "e", "i", "i"), [1, 32, 4096, 4096], [s, 0, 4097, 1])
    assert list(layout.contiguity) == [None, None, False, True]
    assert layout.alloc_order is None  # identity order is not stored


def test_contiguous_row_major():
    layout = layout_from_strides(tv("i", "i", "i"), [2, 3, 4], [12, 4, 1])
    assert list(layout.contiguity) == [True, True, True]
    assert layout.alloc_order is None


def test_transposed_gets_allocation_order():
    layout = layout_from_strides(tv("i", "i"), [4, 3], [1, 4])
    assert layout.alloc_order == (1, 0)
    assert list(layout.contiguity) == [True, True]


def test_sliced_inner_dim_makes_outer_non_contiguous():
    base = torch.empty(4, 5)[:, :3]
    layout = layout_from_strides(tv("i", "i"), base.shape, base.stride())
    assert list(layout.contiguity) == [False, True]


def test_innermost_not_unit_stride():
    base = torch.empty(4, 6)[:, ::2]
    layout = layout_from_strides(tv("i", "i"), base.shape, base.stride())
    assert list(layout.contiguity) == [True, False]


def test_reduction_dims_keep_their_place_and_get_none():
    # sum over dim 1 of [2,3,4] gives a [2,4] tensor; the TV keeps a reduction ID in the middle.
    layout = layout_from_strides(tv("i", "r", "i"), [2, 4], [4, 1])
    assert list(layout.contiguity) == [True, None, True]
    assert layout.alloc_order is None


def test_reduction_with_permuted_output():
    # A [2,4] result stored column-major: the reduction slot stays, the rest follows the strides.
    layout = layout_from_strides(tv("i", "r", "i"), [2, 4], [1, 2])
    assert layout.alloc_order == (2, 1, 0)
    assert list(layout.contiguity) == [True, None, True]


def test_broadcast_dims_are_none_and_skipped():
    # [3,1,5] contiguous; the size-1 broadcast dim does not break the chain.
    layout = layout_from_strides(tv("i", "b", "i"), [3, 1, 5], [5, 5, 1])
    assert list(layout.contiguity) == [True, None, True]


def test_expanded_dim_is_none_and_keeps_position():
    t = torch.empty(3, 1, 5).expand(3, 7, 5)
    layout = layout_from_strides(tv("i", "e", "i"), t.shape, t.stride())
    assert list(layout.contiguity) == [True, None, True]
    assert layout.alloc_order is None


def test_size_one_non_broadcast_dim_is_contiguous_whatever_its_stride():
    # A symbolic (iteration) dim that happens to have size 1 at run time: any stride is legal.
    layout = layout_from_strides(tv("i", "i"), [1, 5], [123, 1])
    assert list(layout.contiguity) == [True, True]


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.empty(2, 3, 4),
        lambda: torch.empty(2, 3, 4).permute(2, 0, 1),
        lambda: torch.empty(2, 3, 6)[:, :, 1:5],
        lambda: torch.empty(4, 3, 2).transpose(0, 2),
    ],
)
def test_contiguity_agrees_with_torch_for_dense_tensors(make):
    t = make()
    layout = layout_from_strides(tv("i", "i", "i"), t.shape, t.stride())
    order = layout.alloc_order or (0, 1, 2)
    permuted = t.permute(*order)
    assert all(layout.contiguity) == permuted.is_contiguous()


def test_contiguous_strides_assumption():
    assert contiguous_strides(tv("i", "i"), [4, 5]) == (5, 1)
    # Expanded dims get stride 0; a reduction ID has no stride.
    assert contiguous_strides(tv("i", "e", "i"), [4, 7, 5]) == (5, 0, 1)
    assert contiguous_strides(tv("i", "r", "i"), [4, 5]) == (5, 1)
    permuted = TensorView(Fusion(), [IterDomain.iteration(None)] * 2, DataType.Float, alloc_order=[1, 0])
    assert contiguous_strides(permuted, [4, 5]) == (1, 4)
