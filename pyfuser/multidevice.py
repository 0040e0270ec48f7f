"""nvFuser's multi-device names (``multidevice``, ``ParallelType``, ``execute_with_dtensors``).

Clients import them unconditionally (Lightning Thunder's nvFuser executor does), so they exist. Multi-device
execution itself is not supported by pyfuser yet: a DTensor input raises ``UnsupportedOpError`` saying so,
instead of being silently run on its local shard.
"""

from __future__ import annotations

import enum
from typing import Iterable, Sequence

from .errors import UnsupportedOpError

_NOT_YET = "multi-device execution (DTensor inputs, device meshes, sharding) is not supported by pyfuser yet"


class ParallelType(enum.Enum):
    """nvFuser's parallel types. pyfuser schedules kernels itself: they only name axes in nvFuser's API."""

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
    """A device mesh description (nvFuser's ``multidevice.DeviceMesh``). It can be built and inspected; using it
    to shard a fusion raises, since pyfuser runs fusions on one device."""

    def __init__(self, devices: Sequence = ()):
        self.devices = _nested_list(devices)

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

    def __repr__(self) -> str:
        return f"DeviceMesh({self.devices})"


def _nested_list(x):
    if hasattr(x, "tolist"):
        x = x.tolist()
    if isinstance(x, (list, tuple)):
        return [_nested_list(e) for e in x]
    return int(x)


class _Unsupported:
    """Multi-device classes nvFuser has that pyfuser does not: constructing one raises our error."""

    def __init__(self, name: str):
        self._name = name

    def __call__(self, *args, **kwargs):
        raise UnsupportedOpError(f"multidevice.{self._name}: {_NOT_YET}")

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise UnsupportedOpError(f"multidevice.{self._name}.{attr}: {_NOT_YET}")


class _MultideviceNamespace:
    """``nvfuser_direct.multidevice``."""

    DeviceMesh = DeviceMesh
    ParallelType = ParallelType

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Unsupported(name)


multidevice = _MultideviceNamespace()


def _is_dtensor(x) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except Exception:  # noqa: BLE001 -- torch built without distributed support: nothing is a DTensor
        return False
    return isinstance(x, DTensor)


def execute_with_dtensors(fd, in_dtensors: Iterable) -> list:
    """nvFuser runs a sharded fusion on DTensors. pyfuser cannot yet: any DTensor argument raises
    ``UnsupportedOpError``; plain tensors and scalars run through ``fd.execute``."""
    args = list(in_dtensors)
    for i, x in enumerate(args):
        if _is_dtensor(x):
            raise UnsupportedOpError(
                f"execute_with_dtensors: input {i} is a DTensor, but {_NOT_YET}; pass its full tensor "
                f"(dtensor.full_tensor()) to fd.execute instead")
    return fd.execute(args)
