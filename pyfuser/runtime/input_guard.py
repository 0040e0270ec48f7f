"""Whether a call repeats a runtime's input signature, told mostly in C++.

The executor cache encodes a call's signature in Python (executor_cache.input_signature): per tensor seven
attribute calls and a tuple, then the key is hashed and compared, ~0.5 us a tensor on the CPU machine, ~4 us for
the NVFP4 GEMM's eight. A call that repeats the signature of the fusion's last call, the usual case, is recognized
instead by an :class:`InputGuard` of that call's runtime: torch's ``TensorGuards`` (torch._C._dynamo.guards, the
tensor check torch.compile's guards were built on) compares every tensor's dispatch keys (which include the
device type and the negative and conjugate bits), dtype, device index, requires_grad, sizes and strides in one
C++ call; Python adds the data pointers' alignment classes and the scalars' keys. So a guard checks everything the
signature encodes, and more (requires_grad, the dispatch keys' other bits and the thread's dispatch state): a call
it rejects takes the signature path, which decides. Where torch has no usable ``TensorGuards`` (a probe on first
use checks that it accepts a tensor and rejects other strides, dtypes, shapes and a negative view), there are no
guards and every call takes the signature path.
"""

from __future__ import annotations

from functools import reduce
from operator import or_
from typing import Any, Callable, Optional, Sequence

import torch

from .signature import ALIGNMENT_BY_LOW_BITS, MAX_VECTOR_BYTES, scalar_key

_data_ptr = torch.Tensor.data_ptr

_tensor_guards: Optional[Callable] = None  # TensorGuards once probed, False where unusable
_probed = False


def _make_tensor_check(tensors: Sequence[torch.Tensor]):
    return _tensor_guards(*tensors, dynamic_dims_sizes=[list(t.shape) for t in tensors],
                          dynamic_dims_strides=[list(t.stride()) for t in tensors])


def _probe() -> None:
    """Use TensorGuards only if it exists and tells apart what a signature does."""
    global _tensor_guards, _probed
    _probed = True
    try:
        from torch._C._dynamo.guards import TensorGuards

        _tensor_guards = TensorGuards
        x = torch.zeros(2, 3)
        check = _make_tensor_check([x])
        others = [torch.zeros(3, 2).t(), torch.zeros(2, 3, dtype=torch.float64), torch.zeros(2, 4),
                  torch._neg_view(x)]
        usable = check.check(torch.zeros(2, 3)) is True and not any(check.check(y) for y in others)
    except Exception:  # absent or changed: a private torch API
        usable = False
    if not usable:
        _tensor_guards = None


class InputGuard:
    """``matches(inputs)``: whether a list of inputs, as passed to execute, has the signature the guard was built
    from (and the call the same options and device argument: ``options_bits``, ``device``)."""

    __slots__ = ("options_bits", "device", "n_inputs", "tensor_positions", "all_tensors", "tensor_check",
                 "alignments", "all_aligned", "scalars")

    def __init__(self, options_bits: int, device, inputs: Sequence[Any], tensor_check, tensor_positions: list):
        self.options_bits, self.device = options_bits, device
        self.n_inputs = len(inputs)
        self.tensor_positions = tensor_positions
        self.all_tensors = len(tensor_positions) == len(inputs)
        self.tensor_check = tensor_check.check
        self.alignments = [ALIGNMENT_BY_LOW_BITS[inputs[i].data_ptr() & 15] for i in tensor_positions]
        self.all_aligned = all(a == MAX_VECTOR_BYTES for a in self.alignments)
        tensors = set(tensor_positions)
        self.scalars = [(i, scalar_key(x)) for i, x in enumerate(inputs) if i not in tensors]

    @staticmethod
    def build(options_bits: int, device, inputs: Sequence[Any]) -> Optional["InputGuard"]:
        """The guard of a call's inputs (a list that needed no flattening), or None where TensorGuards is
        unusable or refuses one of the tensors."""
        if not _probed:
            _probe()
        if _tensor_guards is None:
            return None
        positions = [i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)]
        try:
            check = _make_tensor_check([inputs[i] for i in positions])
        except Exception:  # (a tensor TensorGuards does not take: no guard, the signature path decides)
            return None
        return InputGuard(options_bits, device, inputs, check, positions)

    def matches(self, inputs: list) -> bool:
        if len(inputs) != self.n_inputs:
            return False
        tensors = inputs if self.all_tensors else [inputs[i] for i in self.tensor_positions]
        if not self.tensor_check(*tensors):  # (False for a non-tensor too)
            return False
        if self.all_aligned:  # (the usual case: one OR of the addresses in C tells)
            if reduce(or_, map(_data_ptr, tensors), 0) & 15:
                return False
        elif [ALIGNMENT_BY_LOW_BITS[t.data_ptr() & 15] for t in tensors] != self.alignments:
            return False
        for i, key in self.scalars:
            if scalar_key(inputs[i]) != key:
                return False
        return True
