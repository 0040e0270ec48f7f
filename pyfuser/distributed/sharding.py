"""Sharding annotations on TensorViews: nvFuser's ``set_device_mesh``, ``split``, ``axis(i).parallelize``,
``get_loop_domain`` and ``set_allocation_domain``, as Thunder and nvFuser's multi-device tests call them.

A TensorView's loop domain starts as its logical domain (reduction dims included, as nvFuser counts them). The
only transform pyfuser keeps is one split per logical dim; the only parallelization that means anything is
``ParallelType.mesh_x`` on a whole dim or on the outer part of an outer split (``split(d, D,
inner_split=False)``): the dim is then cut into D equal contiguous blocks, block i on the mesh's i-th rank. The
tensors a rank passes and gets back are its blocks ("local" tensors); the definition keeps global extents.

Everything else nvFuser can express here (multi-dimensional meshes, a device axis from an inner split, thread
parallel types, other allocation domains) raises ``UnsupportedOpError`` naming the call.
"""

from __future__ import annotations

import numbers
from typing import Optional

from ..errors import FusionDefinitionError, UnsupportedOpError
from ..ir.nodes import TensorView
from .mesh import DeviceMesh, ParallelType


class LoopAxis:
    """One axis of a loop domain: a whole logical dim, or the outer/inner part of a split of one."""

    def __init__(self, tv: TensorView, dim: int, part: str = "whole", factor: Optional[int] = None,
                 outer_factor: bool = False):
        self.tv, self.dim, self.part, self.factor = tv, dim, part, factor
        self.outer_factor = outer_factor  # the split's factor is the outer part's extent (inner_split=False)
        self.parallel_type = ParallelType.serial

    def extent(self) -> Optional[int]:
        """The axis's extent where the definition fixes it, else None (nvFuser's ``IterDomain.extent()``)."""
        n = self.tv.logical_domain[self.dim].extent
        if self.part == "whole":
            return n
        factor_here = (self.part == "outer") == self.outer_factor
        if factor_here:
            return self.factor
        return None if n is None else -(-n // self.factor)

    def is_reduction(self) -> bool:
        return self.tv.logical_domain[self.dim].is_reduction

    def parallelize(self, parallel_type) -> None:
        where = f"{self.tv.name}.axis(...).parallelize({getattr(parallel_type, 'name', parallel_type)})"
        if not isinstance(parallel_type, ParallelType):
            raise FusionDefinitionError(f"{where}: expected a ParallelType, got {type(parallel_type).__name__}")
        if parallel_type is ParallelType.serial:
            self.parallel_type = parallel_type
            return
        if parallel_type in (ParallelType.mesh_y, ParallelType.mesh_z):
            raise UnsupportedOpError(f"{where}: pyfuser runs 1-D device meshes only (mesh_x)")
        if parallel_type is not ParallelType.mesh_x:
            raise UnsupportedOpError(
                f"{where}: pyfuser has no manual scheduling (it schedules every kernel itself); only mesh_x, a "
                f"device axis, can be parallelized")
        if self.tv.logical_domain[self.dim].is_reduction:
            raise UnsupportedOpError(f"{where}: a reduction axis cannot be a device axis in pyfuser "
                                     f"(partial results are always reduced across the mesh)")
        if self.part == "inner" or (self.part == "outer" and not self.outer_factor):
            raise UnsupportedOpError(
                f"{where}: pyfuser shards a dim in contiguous blocks only: parallelize a whole dim or the outer "
                f"part of split(dim, mesh_size, inner_split=False)")
        state = annotations(self.tv)
        for other in state.loop:
            if other is not self and other.parallel_type is ParallelType.mesh_x:
                raise UnsupportedOpError(f"{where}: {self.tv.name} already has a mesh_x axis (1-D meshes only)")
        self.parallel_type = parallel_type

    def __repr__(self) -> str:
        ext = "?" if self.extent() is None else str(self.extent())
        tag = "DIDx" if self.parallel_type is ParallelType.mesh_x else "S"
        return f"i{tag}{{{ext}}}"


class TensorSharding:
    """What the user said about one TensorView: its mesh and its loop domain."""

    def __init__(self, tv: TensorView):
        self.tv = tv
        self.mesh: Optional[DeviceMesh] = None
        self.loop: list[LoopAxis] = [LoopAxis(tv, d) for d in range(len(tv.logical_domain))]
        self.allocation_is_loop = False

    def device_dim(self) -> Optional[int]:
        """The logical (non-reduction) dim cut over the mesh, or None."""
        for ax in self.loop:
            if ax.parallel_type is ParallelType.mesh_x:
                return sum(1 for d in range(ax.dim) if not self.tv.logical_domain[d].is_reduction)
        return None


def annotations(tv: TensorView) -> TensorSharding:
    state = tv.__dict__.get("_sharding")
    if state is None:
        state = tv._sharding = TensorSharding(tv)
    return state


def has_annotations(tv) -> bool:
    return isinstance(tv, TensorView) and tv.__dict__.get("_sharding") is not None


def _check_open(tv: TensorView, what: str) -> None:
    if tv.fusion.frozen:
        raise FusionDefinitionError(f"{tv.name}.{what}: the fusion is finalized; shard tensors inside the "
                                    f"`with FusionDefinition()` block")


def _axis_index(state: TensorSharding, axis, what: str) -> int:
    n = len(state.loop)
    if not isinstance(axis, numbers.Integral) or isinstance(axis, bool) or not -n <= axis < n:
        raise FusionDefinitionError(f"{state.tv.name}.{what}: axis {axis!r} is out of range for a loop domain of "
                                    f"{n} axes")
    return int(axis) % n


# --- the TensorView methods ----------------------------------------------------------------------------------


def set_device_mesh(self: TensorView, mesh) -> None:
    _check_open(self, "set_device_mesh")
    if not isinstance(mesh, DeviceMesh):
        raise FusionDefinitionError(f"{self.name}.set_device_mesh: expected a multidevice.DeviceMesh, got "
                                    f"{type(mesh).__name__}")
    mesh.require_1d(f"{self.name}.set_device_mesh")
    annotations(self).mesh = mesh
    self.fusion.has_device_mesh = True  # fd.execute then runs it on the mesh (frontend.fusion_definition)


def split(self: TensorView, axis, factor, inner_split: bool = True) -> None:
    _check_open(self, "split")
    state = annotations(self)
    i = _axis_index(state, axis, "split")
    ax = state.loop[i]
    if not isinstance(factor, numbers.Integral) or isinstance(factor, bool) or factor < 1:
        raise FusionDefinitionError(f"{self.name}.split: factor must be an int >= 1, got {factor!r}")
    if ax.part != "whole":
        raise UnsupportedOpError(f"{self.name}.split: axis {i} is already part of a split; pyfuser keeps one split "
                                 f"per logical dim (the device split)")
    if ax.parallel_type is not ParallelType.serial:
        raise UnsupportedOpError(f"{self.name}.split: axis {i} is already parallelized")
    outer = LoopAxis(self, ax.dim, "outer", int(factor), outer_factor=not inner_split)
    inner = LoopAxis(self, ax.dim, "inner", int(factor), outer_factor=not inner_split)
    state.loop[i:i + 1] = [outer, inner]
    state.allocation_is_loop = False


def outer_split(self: TensorView, axis, factor) -> None:
    split(self, axis, factor, inner_split=False)


def inner_split(self: TensorView, axis, factor) -> None:
    split(self, axis, factor, inner_split=True)


def axis(self: TensorView, i) -> LoopAxis:
    state = annotations(self)
    return state.loop[_axis_index(state, i, "axis")]


def get_loop_domain(self: TensorView) -> list:
    return list(annotations(self).loop)


def set_allocation_domain(self: TensorView, domain, new_contiguity=True) -> None:
    """Only the loop domain itself, contiguous, is accepted (what Thunder sets): each rank's block is then a
    row-major tensor. pyfuser reads every local tensor's layout from its strides at run time anyway."""
    _check_open(self, "set_allocation_domain")
    state = annotations(self)
    if list(domain) != state.loop or not all(a is b for a, b in zip(domain, state.loop)):
        raise UnsupportedOpError(f"{self.name}.set_allocation_domain: pyfuser accepts only the tensor's own loop "
                                 f"domain (tv.get_loop_domain()) as its allocation domain")
    flags = new_contiguity if isinstance(new_contiguity, (list, tuple)) else [new_contiguity]
    if not all(c is True or c is None for c in flags):
        raise UnsupportedOpError(f"{self.name}.set_allocation_domain: only new_contiguity=True is supported")
    state.allocation_is_loop = True


METHODS = {
    "set_device_mesh": set_device_mesh,
    "split": split,
    "outer_split": outer_split,
    "inner_split": inner_split,
    "axis": axis,
    "get_loop_domain": get_loop_domain,
    "set_allocation_domain": set_allocation_domain,
}


def attach() -> None:
    for name, fn in METHODS.items():
        setattr(TensorView, name, fn)
