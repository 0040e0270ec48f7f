"""Layout inference of elementwise ops: pyfuser's TensorIterator stride rule (ops/iterator_strides.py) against ATen
itself.

The meta device runs PyTorch's Python reference implementations, which order ambiguous dims differently from
ATen's TensorIterator (fuzzer seed 5635: strides (45, 5, 1) on meta, (1, 1, 9) on CPU and CUDA). Here thousands
of random operand layouts — permuted, sliced, offset, expanded (stride 0), size-1 dims with arbitrary strides,
broadcast from the left and inside — go through real ATen ops on this machine's device and through the same ops on
meta tensors under IteratorStridesMode; the strides must agree (size-1 dims excepted, as everywhere in pyfuser:
their strides carry no information).
"""

from __future__ import annotations

import random

import pytest
import torch

from harness import DEVICE
from pyfuser.ops.iterator_strides import IteratorStridesMode, dense_strides_like, iterator_output_strides

DTYPES = [torch.float32, torch.bfloat16, torch.int32, torch.bool, torch.float64]


def _layout(rng: random.Random, shape: tuple) -> torch.Tensor:
    """A tensor of ``shape`` in a random layout (values irrelevant: only strides are compared)."""
    kind = rng.choice(["contiguous", "permuted", "sliced", "expanded", "size1_strides", "offset"])
    n = len(shape)
    if kind == "permuted" and n > 1:
        perm = list(range(n))
        rng.shuffle(perm)
        base = torch.zeros([shape[p] for p in perm], device=DEVICE)
        return base.permute([perm.index(i) for i in range(n)])
    if kind == "sliced":
        base = torch.zeros([s * 2 for s in shape], device=DEVICE)
        return base[tuple(slice(None, None, 2) for _ in shape)]
    if kind == "expanded" and n > 0:
        d = rng.randrange(n)
        small = list(shape)
        small[d] = 1
        return torch.zeros(small, device=DEVICE).expand(shape)
    if kind == "size1_strides" and n > 0:
        strides = list(torch.empty(shape).stride())
        for d in range(n):
            if shape[d] == 1:
                strides[d] = rng.choice([1, 3, 7, 64])
        size = max(sum((s - 1) * st for s, st in zip(shape, strides)) + 1, 1)
        return torch.zeros(size, device=DEVICE).as_strided(shape, strides)
    if kind == "offset":
        numel = 1
        for s in shape:
            numel *= s
        return torch.zeros(numel + 3, device=DEVICE)[3:].view(shape)
    return torch.zeros(shape, device=DEVICE)


def _operand_shapes(rng: random.Random, n_ops: int) -> list:
    rank = rng.randint(1, 4)
    out = [rng.choice([1, 2, 3, 5]) for _ in range(rank)]
    shapes = []
    for _ in range(n_ops):
        drop = rng.randint(0, rank - 1) if rng.random() < 0.3 else 0
        s = [1 if (n == 1 or rng.random() < 0.3) else n for n in out][drop:]
        # at least one operand has the full shape
        shapes.append(tuple(s))
    shapes[rng.randrange(n_ops)] = tuple(out)
    return shapes


OPS = {
    "add": (2, lambda a, b: torch.add(a, b)),
    "mul_scalar": (1, lambda a: torch.mul(a, torch.tensor(2, dtype=a.dtype, device=a.device))),
    "logical_and": (2, torch.logical_and),
    "eq": (2, torch.eq),
    "maximum": (2, torch.maximum),
    "where": (3, lambda c, a, b: torch.where(c.bool() if c.dtype != torch.bool else c, a, b)),
    "abs": (1, torch.abs),
    "to_float": (1, lambda a: a.to(torch.float64)),
    "clamp": (3, lambda a, lo, hi: torch.clamp(a, lo, hi)),
}


def _cast(x: torch.Tensor, dtype) -> torch.Tensor:
    # same strides, other dtype (as_strided over a fresh storage of the dtype)
    base = torch.zeros(x.untyped_storage().nbytes() // x.element_size() + 1, dtype=dtype, device=x.device)
    return base.as_strided(x.shape, x.stride(), x.storage_offset())


def _meaningful(t: torch.Tensor) -> tuple:
    return tuple(st for st, n in zip(t.stride(), t.shape) if n != 1)


@pytest.mark.parametrize("op", sorted(OPS))
def test_meta_layouts_match_aten(op):
    arity, fn = OPS[op]
    rng = random.Random(hash(op) % 1000)
    mismatches = []
    for case in range(1000):
        shapes = _operand_shapes(rng, arity)
        dtypes = [rng.choice(DTYPES) for _ in shapes]
        if op in ("maximum", "clamp") and torch.bool in dtypes:
            dtypes = [torch.float32 if d == torch.bool else d for d in dtypes]
        if op == "abs" and dtypes[0] == torch.bool:
            dtypes = [torch.int32]
        real = [_cast(_layout(rng, s), d) for s, d in zip(shapes, dtypes)]
        try:
            expected = fn(*real)
        except RuntimeError:
            continue  # e.g. a dtype combination ATen refuses
        meta = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta") for t in real]
        with IteratorStridesMode(DEVICE.type if isinstance(DEVICE, torch.device) else torch.device(DEVICE).type):
            got = fn(*meta)
        assert got.shape == expected.shape
        if expected.numel() and _meaningful(got) != _meaningful(expected):
            mismatches.append((case, [(tuple(t.shape), t.stride(), t.dtype) for t in real], got.stride(),
                               expected.stride()))
    assert not mismatches, f"{len(mismatches)} mismatches, first: {mismatches[:3]}"


def test_seed_5635_layout():
    """The fuzzer's case: logical_and of a contiguous [9, 5] and a [1, 1, 5] with strides (1, 5, 1)."""
    a = ((9, 5), (5, 1), 2)
    b = ((1, 1, 5), (1, 5, 1), 1)
    assert iterator_output_strides([a, b]) == ((1, 9, 5), (1, 1, 9))


def test_dense_strides_like():
    assert dense_strides_like((3, 4), (4, 1)) == (4, 1)  # dense: kept
    assert dense_strides_like((3, 4), (1, 3)) == (1, 3)
    assert dense_strides_like((3, 4), (0, 1)) == (4, 1)  # expanded: made dense
    x = torch.zeros(6, 8)[::2, ::2]
    assert dense_strides_like(x.shape, x.stride()) == torch.empty_like(x).stride()
