"""nvFuser's multi-device names: ``multidevice`` (``DeviceMesh``, ``ParallelType``, ``shard_tensor``),
``ParallelType`` and ``execute_with_dtensors``. The work is done by pyfuser.distributed (docs/multidevice.md).
"""

from __future__ import annotations

from typing import Iterable

from .distributed import DeviceMesh, ParallelType, executor_for, fusion_mesh
from .distributed.sharding import annotations
from .errors import InputValidationError, UnsupportedOpError


class _Unsupported:
    """Multi-device classes nvFuser has that pyfuser does not: constructing or using one raises our error."""

    def __init__(self, name: str):
        self._name = name

    def __call__(self, *args, **kwargs):
        raise UnsupportedOpError(f"multidevice.{self._name} is not supported by pyfuser (it runs fusions on "
                                 f"torch.distributed process groups: see execute_with_dtensors)")

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise UnsupportedOpError(f"multidevice.{self._name}.{attr} is not supported by pyfuser")


def shard_tensor(tensor, tv):
    """This rank's block of ``tensor`` as ``tv`` is sharded (the whole tensor if ``tv`` is replicated)."""
    import torch.distributed as dist

    state = annotations(tv)
    dim = state.device_dim()
    if dim is None:
        return tensor
    if state.mesh is None:
        raise UnsupportedOpError(f"multidevice.shard_tensor: {tv.name} has a mesh_x axis but no device mesh")
    return state.mesh.shard_tensor(tensor, dim) if dist.is_initialized() else _not_initialized()


def _not_initialized():
    raise UnsupportedOpError("multidevice.shard_tensor: torch.distributed is not initialized")


class Communicator:
    """nvFuser's ``multidevice.Communicator`` over torch.distributed's default process group (pyfuser has no
    communicator of its own)."""

    _instance = None

    @classmethod
    def instance(cls) -> "Communicator":
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    @staticmethod
    def _dist():
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise UnsupportedOpError("multidevice.Communicator: torch.distributed is not initialized "
                                     "(call torch.distributed.init_process_group first)")
        return dist

    def size(self) -> int:
        return self._dist().get_world_size()

    def rank(self) -> int:
        return self._dist().get_rank()

    def local_size(self) -> int:
        import os

        return int(os.environ.get("LOCAL_WORLD_SIZE", self.size()))

    def local_rank(self) -> int:
        import os

        return int(os.environ.get("LOCAL_RANK", self.rank()))

    def barrier(self) -> None:
        self._dist().barrier()


class _MultideviceNamespace:
    """``nvfuser_direct.multidevice``."""

    DeviceMesh = DeviceMesh
    ParallelType = ParallelType
    Communicator = Communicator
    shard_tensor = staticmethod(shard_tensor)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Unsupported(name)


multidevice = _MultideviceNamespace()


def _dtensor_type():
    try:
        from torch.distributed.tensor import DTensor
    except Exception:  # noqa: BLE001 -- torch built without distributed support: nothing is a DTensor
        return None
    return DTensor


def execute_with_dtensors(fd, in_dtensors: Iterable) -> list:
    """Run ``fd`` on DTensors: each rank passes its local blocks, the fusion runs on the DTensors' 1-D mesh and
    process group, and the outputs come back as DTensors placed as the definition implies (Shard(d) or
    Replicate()). Input placements come from the DTensors; where the definition also places an input they must
    agree. Plain tensors are replicated values. Without DTensors and device meshes this is ``fd.execute``."""
    from torch.distributed.tensor import Replicate, Shard

    args = list(in_dtensors)
    DTensor = _dtensor_type()
    dts = [(i, a) for i, a in enumerate(args) if DTensor is not None and isinstance(a, DTensor)]
    if not dts:
        if fusion_mesh(fd.fusion) is None:
            return fd.execute(args)
        raise InputValidationError("execute_with_dtensors: the fusion has device meshes but no input is a DTensor; "
                                   "call fd.execute with the local tensors instead")
    torch_mesh = dts[0][1].device_mesh
    for i, a in dts:
        if a.device_mesh.ndim != 1:
            raise UnsupportedOpError(f"execute_with_dtensors: input {i} is on a {a.device_mesh.ndim}-D device mesh; "
                                     f"pyfuser runs 1-D meshes only")
        if a.device_mesh != torch_mesh:
            raise UnsupportedOpError(f"execute_with_dtensors: input {i} is on {a.device_mesh}, input {dts[0][0]} on "
                                     f"{torch_mesh}; all DTensors must share one mesh")
    mesh = DeviceMesh(torch_mesh.mesh)
    declared_mesh = fusion_mesh(fd.fusion)
    if declared_mesh is not None and declared_mesh != mesh:
        raise InputValidationError(f"execute_with_dtensors: the definition's mesh is {declared_mesh}, the DTensors' "
                                   f"{mesh}")
    placements, local = [], []
    for i, a in enumerate(args):
        if DTensor is not None and isinstance(a, DTensor):
            (pl,) = a.placements
            if pl.is_shard():
                placements.append(pl.dim % a.dim() if a.dim() else pl.dim)
            elif pl.is_replicate():
                placements.append(None)
            else:
                raise UnsupportedOpError(f"execute_with_dtensors: input {i} has placement {pl}; only Shard and "
                                         f"Replicate are supported")
            local.append(a.to_local())
        else:
            placements.append(None)
            local.append(a)
    ex = executor_for(fd.fusion, mesh, placements)
    outs = ex.run(local, torch_mesh.get_group())
    return [DTensor.from_local(o, torch_mesh, [Replicate() if p is None else Shard(p)], run_check=False)
            for o, p in zip(outs, ex.output_placements())]
