"""The output strides ATen's elementwise kernels give, for layout inference on meta tensors.

On CPU and CUDA, an elementwise op (``add``, ``where``, ``logical_and``, ...) allocates its output through
ATen's TensorIterator: it orders the dims by the operands' strides and lays the output out in that order. On the
meta device the same ops run PyTorch's Python reference implementations, which order the dims by a different rule
and disagree when the comparison is ambiguous: ``logical_and`` of a contiguous [9, 5] and a [1, 1, 5] with strides
(1, 5, 1) gets strides (45, 5, 1) on meta and (1, 1, 9) on CPU and CUDA (fuzzer seed 5635).

:class:`IteratorStridesMode` is active while pyfuser infers layouts on meta tensors: every elementwise ATen op
(``torch.Tag.pointwise``) and every dtype conversion or clone it sees gets the strides ATen would give, computed
here step by step as ATen does (TensorIteratorBase::compute_shape, fast_set_up, compute_strides,
reorder_dimensions and the output allocation; empty_like with preserve_format for conversions and clones).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_aten = torch.ops.aten


def _contiguous_strides(shape: Sequence[int]) -> tuple:
    strides, running = [], 1
    for n in reversed(shape):
        strides.append(running)
        running *= max(int(n), 1)
    return tuple(reversed(strides))


def _is_contiguous(shape, strides) -> bool:
    expected = 1
    for n, st in zip(reversed(shape), reversed(strides)):
        if n == 1:
            continue
        if st != expected:
            return False
        expected *= n
    return True


def _is_channels_last(shape, strides) -> bool:
    if len(shape) != 4:
        return False
    n, c, h, w = shape
    expected = 1
    for d, size in ((1, c), (3, w), (2, h), (0, n)):
        if size != 1 and strides[d] != expected:
            return False
        expected *= size
    return True


def _is_non_overlapping_and_dense(shape, strides) -> bool:
    if len(shape) == 1:
        return shape[0] < 2 or strides[0] == 1
    expected = 1
    for d in sorted(range(len(shape)), key=lambda d: (strides[d], shape[d])):
        if shape[d] == 1:
            continue
        if strides[d] != expected:
            return False
        expected *= shape[d]
    return True


def dense_strides_like(shape: Sequence[int], strides: Sequence[int]) -> tuple:
    """Strides of ``torch.empty_like(x)`` (preserve_format) for a tensor of these sizes and strides: the same
    strides when ``x`` is non-overlapping and dense, else ATen's infer_dense_strides."""
    shape, strides = tuple(shape), tuple(strides)
    if _is_non_overlapping_and_dense(shape, strides):
        return strides
    ndim = len(shape)
    perm = list(range(ndim - 1, -1, -1))

    def should_swap(d0: int, d1: int) -> int:
        s0, s1 = strides[d0], strides[d1]
        if s0 == 0 or s1 == 0:
            return 0
        if s0 != s1:
            return -1 if s0 < s1 else 1
        return 1 if shape[d0] > shape[d1] else 0

    _insertion_sort(perm, should_swap)
    out = [0] * ndim
    running = 1
    for d in perm:
        out[d] = running
        if shape[d] > 1:
            running *= shape[d]
    return tuple(out)


def _insertion_sort(perm: list, should_swap) -> None:
    """ATen's stable insertion sort of dims by a comparison that may be ambiguous (0): not transitive, so the
    result depends on this exact order of comparisons."""
    for i in range(1, len(perm)):
        d1 = i
        for d0 in range(i - 1, -1, -1):
            c = should_swap(perm[d0], perm[d1])
            if c > 0:
                perm[d0], perm[d1] = perm[d1], perm[d0]
                d1 = d0
            elif c < 0:
                break


def iterator_output_strides(operands: Sequence[tuple]) -> Optional[tuple]:
    """(shape, strides) of the output TensorIterator allocates for these inputs, each ``(shape, strides,
    itemsize)`` in the order the op adds them. None when the shapes do not broadcast."""
    shape: tuple = ()
    all_same_shape, has_scalars, has_tensors = True, False, False
    first = True
    for sizes, _, _ in operands:
        if len(sizes) == 0:
            has_scalars = True
        else:
            has_tensors = True
        if has_scalars and has_tensors:
            all_same_shape = False
        if first:
            shape, first = tuple(sizes), False
        elif tuple(sizes) != shape:
            all_same_shape = False
            try:
                shape = tuple(torch.broadcast_shapes(shape, tuple(sizes)))
            except RuntimeError:
                return None
    ndim = len(shape)
    # fast_set_up: all inputs of one shape, all contiguous / channels-last / dense with equal strides.
    if all_same_shape:
        if all(_is_contiguous(s, st) for s, st, _ in operands):
            return shape, _contiguous_strides(shape)
        if all(_is_channels_last(s, st) for s, st, _ in operands):
            n, c, h, w = shape
            return shape, (h * w * c, 1, w * c, c)
        if all(_is_non_overlapping_and_dense(s, st) for s, st, _ in operands):
            last = tuple(operands[-1][1])
            if all(tuple(st) == last for _, st, _ in operands):
                return shape, last
    if ndim == 0:
        return shape, ()
    # compute_strides: per operand, byte strides over the broadcast shape (broadcast dims: 0).
    byte_strides = []
    for sizes, strides, itemsize in operands:
        offset = ndim - len(sizes)
        bs = [0] * ndim
        for i, (n, st) in enumerate(zip(sizes, strides)):
            bs[offset + i] = 0 if (n == 1 and shape[offset + i] != 1) else st * itemsize
        byte_strides.append(bs)
    if ndim == 1:
        perm = [0]
    else:
        perm = list(range(ndim - 1, -1, -1))

        def should_swap(d0: int, d1: int) -> int:
            for bs in byte_strides:
                s0, s1 = bs[d0], bs[d1]
                if s0 == 0 or s1 == 0:
                    continue
                if s0 != s1:
                    return -1 if s0 < s1 else 1
                if shape[d0] > shape[d1]:
                    return 1
            return 0

        _insertion_sort(perm, should_swap)
    if perm == list(range(ndim - 1, -1, -1)):
        return shape, _contiguous_strides(shape)
    out = [0] * ndim
    running = 1
    for d in perm:  # perm[0] is the fastest-moving dim
        out[d] = running
        running *= shape[d]
    return shape, tuple(out)


def _where_operands(args):
    """where(cond, self, other) converts self/other to their result type and cond to Bool before iterating."""
    cond, a, b = args[:3]
    result = torch.result_type(a, b)
    conv = [cond if cond.dtype == torch.bool else _converted(cond, torch.bool)]
    conv += [x if x.dtype == result else _converted(x, result) for x in (a, b)]
    return conv


def _converted(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty_strided(x.shape, dense_strides_like(x.shape, x.stride()), dtype=dtype, device="meta")


class IteratorStridesMode(TorchDispatchMode):
    """Restride meta results of elementwise ATen ops and dtype conversions as CPU/CUDA lay them out.

    ``device_type``: where the real call will run. On CPU, TensorIterator first converts inputs of another dtype
    than the computation's (a copy laid out like the input), CUDA reads them as they are."""

    def __init__(self, device_type: str):
        super().__init__()
        self.cpu = device_type == "cpu"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not isinstance(out, torch.Tensor) or out.device.type != "meta" or out.layout != torch.strided:
            return out
        packet = func.overloadpacket
        if packet in (_aten._to_copy, _aten.clone):  # empty_like(input) and a copy, not a TensorIterator output
            src = args[0]
            fmt = kwargs.get("memory_format")
            if isinstance(src, torch.Tensor) and fmt in (None, torch.preserve_format) and src.shape == out.shape:
                return _restrided(out, dense_strides_like(src.shape, src.stride()))
            return out
        if torch.Tag.pointwise not in func.tags or func._schema.is_mutable or packet is _aten.masked_fill:
            return out  # (masked_fill writes into a contiguous clone of its input)
        if any(r.alias_info is not None for r in func._schema.returns):
            return out
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if not tensors:
            return out
        if packet is _aten.where and len(tensors) == 3:
            tensors = _where_operands(args)
        elif self.cpu:
            common = out.dtype if not out.dtype == torch.bool else _common_dtype(tensors)
            tensors = [t if t.dtype == common or t.dim() == 0 else _converted(t, common) for t in tensors]
        result = iterator_output_strides([(tuple(t.shape), tuple(t.stride()), t.element_size()) for t in tensors])
        if result is None or result[0] != tuple(out.shape):
            return out
        return _restrided(out, result[1])


def _common_dtype(tensors) -> torch.dtype:
    dt = tensors[0].dtype
    for t in tensors[1:]:
        dt = torch.promote_types(dt, t.dtype) if t.dim() else dt
    return dt


def _restrided(out: torch.Tensor, strides: tuple) -> torch.Tensor:
    if tuple(out.stride()) == tuple(strides):
        return out
    return torch.empty_strided(tuple(out.shape), tuple(strides), dtype=out.dtype, device="meta")
