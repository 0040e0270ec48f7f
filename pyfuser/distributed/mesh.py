"""Device meshes and parallel types: the names nvFuser's multidevice API shards tensors with.

A mesh lists the ranks of a torch.distributed process group. pyfuser runs 1-D meshes: a tensor is either whole on
every rank of the mesh (replicated) or split along one logical dim into equal contiguous blocks, block i on the
mesh's i-th rank. Building a multi-dimensional mesh is allowed (nvFuser allows it); using one to shard is refused.
"""

from __future__ import annotations

import enum
from typing import Sequence

from ..errors import UnsupportedOpError


class ParallelType(enum.Enum):
    """nvFuser's parallel types. Only ``mesh_x`` (a device axis of a 1-D mesh) and ``serial`` mean something to
    pyfuser: it schedules its kernels itself, so thread/block types have no effect to ask for."""

    mesh_x = "mesh_x"
    mesh_y = "mesh_y"
    mesh_z = "mesh_z"
    stream = "stream"
    grid_x = "grid_x"
    grid_y = "grid_y"
    grid_z = "grid_z"
    block_x = "block_x"
    block_y = "block_y"
    block_z = "block_z"
    vectorize = "vectorize"
    unroll = "unroll"
    serial = "serial"


class DeviceMesh:
    """nvFuser's ``multidevice.DeviceMesh``: built from a list (possibly nested) or a tensor of ranks."""

    def __init__(self, devices: Sequence = ()):
        self.devices = _nested_list(devices)
        flat = self.flat()
        if len(set(flat)) != len(flat):
            raise UnsupportedOpError(f"multidevice.DeviceMesh: a rank appears twice in {self.devices}")
        if any(r < 0 for r in flat):
            raise UnsupportedOpError(f"multidevice.DeviceMesh: ranks must be >= 0, got {self.devices}")

    @property
    def shape(self) -> tuple:
        shape, level = [], self.devices
        while isinstance(level, list):
            shape.append(len(level))
            level = level[0] if level else None
        return tuple(shape)

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def flat(self) -> list[int]:
        out: list[int] = []

        def walk(x):
            if isinstance(x, list):
                for e in x:
                    walk(e)
            else:
                out.append(x)

        walk(self.devices)
        return out

    def require_1d(self, what: str) -> None:
        if self.ndim != 1:
            raise UnsupportedOpError(
                f"{what}: pyfuser runs 1-D device meshes only; got a mesh of shape {self.shape} ({self.devices})")

    def index(self, rank: int) -> int:
        """This rank's position in the (1-D) mesh, i.e. which block of a sharded dim it holds."""
        flat = self.flat()
        if rank not in flat:
            raise UnsupportedOpError(f"multidevice: rank {rank} is not in the device mesh {self.devices}")
        return flat.index(rank)

    def shard_tensor(self, tensor, axis: int):
        """The calling rank's block of ``tensor`` split along ``axis`` (nvFuser's ``DeviceMesh.shard_tensor``)."""
        import torch.distributed as dist

        self.require_1d("DeviceMesh.shard_tensor")
        return block_of(tensor, axis, self.size, self.index(dist.get_rank()))

    def __eq__(self, other) -> bool:
        return isinstance(other, DeviceMesh) and self.devices == other.devices

    def __hash__(self) -> int:
        return hash(repr(self.devices))

    def __repr__(self) -> str:
        return f"DeviceMesh({self.devices})"


def block_of(tensor, axis: int, parts: int, index: int):
    """Block ``index`` of ``parts`` equal contiguous blocks of ``tensor`` along ``axis`` (a view)."""
    from ..errors import InputValidationError

    axis = axis % tensor.dim()
    n = tensor.shape[axis]
    if n % parts:
        raise InputValidationError(
            f"sharding: dim {axis} has extent {n}, which does not split into {parts} equal blocks (one per rank)")
    size = n // parts
    return tensor.narrow(axis, index * size, size)


def _nested_list(x):
    if hasattr(x, "tolist"):
        x = x.tolist()
    if isinstance(x, (list, tuple)):
        return [_nested_list(e) for e in x]
    return int(x)
