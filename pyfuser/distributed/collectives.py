"""Resharding on torch.distributed: the only place pyfuser talks to a process group.

Placements are a dim (equal contiguous blocks, block i on the group's i-th rank) or None (replicated). Every
function takes and returns the calling rank's local tensor. Collectives work on dim 0 of contiguous buffers, so
a sharded dim is moved to the front first. Bool tensors travel as uint8 (not every backend reduces or gathers
bools).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from ..errors import UnsupportedOpError
from .mesh import DeviceMesh, block_of

# torch 2.13 renames the tensor forms (the old names warn); torch 2.11 has only the old ones.
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
               "prod": dist.ReduceOp.PRODUCT}


class Group:
    """A process group seen through a 1-D mesh: ``size`` ranks, this one at ``index`` (its block)."""

    def __init__(self, mesh: DeviceMesh, group=None):
        if not dist.is_available() or not dist.is_initialized():
            raise UnsupportedOpError("multi-device fusion: torch.distributed is not initialized "
                                     "(call torch.distributed.init_process_group first)")
        mesh.require_1d("multi-device fusion")
        self.group = group
        ranks = dist.get_process_group_ranks(group if group is not None else dist.group.WORLD)
        if list(ranks) != mesh.flat():
            raise UnsupportedOpError(
                f"multi-device fusion: the device mesh {mesh.devices} must list the process group's ranks in "
                f"group order ({list(ranks)})")
        self.mesh = mesh
        self.size = mesh.size
        self.index = mesh.index(dist.get_rank())

    def _wire(self, x: torch.Tensor):
        return (x.to(torch.uint8), torch.bool) if x.dtype is torch.bool else (x, None)

    def all_gather(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        x, back = self._wire(x)
        front = x.movedim(dim, 0).contiguous()
        out = torch.empty((front.shape[0] * self.size,) + tuple(front.shape[1:]), dtype=front.dtype, device=x.device)
        _all_gather(out, front, group=self.group)
        out = out.movedim(0, dim)
        return out if back is None else out.to(back)

    def all_reduce(self, x: torch.Tensor, op: str) -> torch.Tensor:
        x, back = self._wire(x)
        x = x.clone(memory_format=torch.contiguous_format)  # reduced in place: never a caller's buffer
        dist.all_reduce(x, op=_REDUCE_OPS[op], group=self.group)
        return x if back is None else x.to(back)

    def reduce_scatter(self, x: torch.Tensor, dim: int, op: str) -> torch.Tensor:
        x, back = self._wire(x)
        front = x.movedim(dim, 0).contiguous()
        if front.shape[0] % self.size:
            raise UnsupportedOpError(f"reduce-scatter: dim {dim} has extent {front.shape[0]}, which does not split "
                                     f"into {self.size} equal blocks")
        out = torch.empty((front.shape[0] // self.size,) + tuple(front.shape[1:]), dtype=front.dtype,
                          device=x.device)
        _reduce_scatter(out, front, op=_REDUCE_OPS[op], group=self.group)
        out = out.movedim(0, dim)
        return out if back is None else out.to(back)

    def all_to_all(self, x: torch.Tensor, src: int, dst: int) -> torch.Tensor:
        """Sharded on ``src`` -> sharded on ``dst``: block j of my ``dst`` extent goes to rank j, and the blocks
        received (rank j's block of ``src``) are put side by side along ``src``."""
        x, back = self._wire(x)
        n = x.shape[dst]
        if n % self.size:
            raise UnsupportedOpError(f"all-to-all: dim {dst} has extent {n}, which does not split into {self.size} "
                                     f"equal blocks")
        send = torch.stack([block_of(x, dst, self.size, j) for j in range(self.size)]).contiguous()
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=self.group)
        out = torch.cat(list(recv.unbind(0)), dim=src)
        return out if back is None else out.to(back)

    def all_to_all_rows(self, x: torch.Tensor, send_counts: list, recv_counts: list) -> torch.Tensor:
        """Rows of ``x`` (dim 0) in destination order, ``send_counts[j]`` of them to rank j; returns the rows
        received, source rank by source rank (the expert-parallel dispatch and combine)."""
        x, back = self._wire(x)
        x = x.contiguous()
        out = torch.empty((sum(recv_counts),) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
        dist.all_to_all_single(out, x, output_split_sizes=list(recv_counts), input_split_sizes=list(send_counts),
                               group=self.group)
        return out if back is None else out.to(back)

    def reshard(self, x: torch.Tensor, src: Optional[int], dst: Optional[int]) -> torch.Tensor:
        """The one resharding rule table (docs/multidevice.md)."""
        if src == dst:
            return x
        if src is None:
            return block_of(x, dst, self.size, self.index)  # replicated -> sharded: no communication
        if dst is None:
            return self.all_gather(x, src)
        return self.all_to_all(x, src, dst)

    def combine(self, x: torch.Tensor, dst: Optional[int], op: str) -> torch.Tensor:
        """Partial results -> the full result, replicated (all-reduce) or sharded on ``dst`` (reduce-scatter).

        max/min gather the partials and reduce them with torch instead: a backend's MAX/MIN compares with < (a NaN
        is kept or dropped by operand order), where eager's amax/amin return NaN whenever one is there."""
        if op in ("max", "min"):
            return self._gathered_extremum(x, dst, op)
        if dst is None:
            return self.all_reduce(x, op)
        return self.reduce_scatter(x, dst, op)

    def _gathered_extremum(self, x: torch.Tensor, dst: Optional[int], op: str) -> torch.Tensor:
        x, back = self._wire(x)
        if dst is None:
            send = x.unsqueeze(0).contiguous()
            parts = torch.empty((self.size,) + tuple(x.shape), dtype=x.dtype, device=x.device)
            _all_gather(parts, send, group=self.group)
        else:
            if x.shape[dst] % self.size:
                raise UnsupportedOpError(f"reduce-scatter: dim {dst} has extent {x.shape[dst]}, which does not split "
                                         f"into {self.size} equal blocks")
            send = torch.stack([block_of(x, dst, self.size, j) for j in range(self.size)]).contiguous()
            parts = torch.empty_like(send)
            dist.all_to_all_single(parts, send, group=self.group)
        out = torch.amax(parts, 0) if op == "max" else torch.amin(parts, 0)
        return out if back is None else out.to(back)
