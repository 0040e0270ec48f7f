"""Triton lowerings of the view ops that only re-index, attached to the registry by name.

Inside a kernel such a view changes nothing but which loop dims its value is indexed by (the op's ``loop_map``
says which); the value itself passes through.
"""

from __future__ import annotations

from ..ops.registry import attach
from .lowering import identity_view

for _name in ("broadcast", "broadcast_in_dim", "expand", "permute", "squeeze", "stride_order"):
    attach(_name, lower=identity_view)
