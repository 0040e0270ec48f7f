"""Runs a plan (plan.py): local stages as ordinary pyfuser fusions over local tensors, collectives between them.

A local stage is defined again, op by op, from the original definition's expressions (each op's canonical
call), over inputs that are this rank's tensors: segmentation, generated kernels and caching are pyfuser's
usual ones. Sizes are symbolic, so one stage definition serves every shard shape with the same layout; the only
rewrites are the ones sharding implies (a sharded output extent in broadcast_in_dim/expand, a size() of a
sharded dim, a partial sum kept in its compute dtype, linear's bias left for after the combination).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from ..errors import InputTypeError, InputValidationError, UnsupportedOpError
from ..frontend import FusionDefinition
from ..ir.dtypes import from_torch_dtype, to_torch_dtype
from ..ir.nodes import Expr, Scalar, TensorView, Val, Vector
from ..ir.tensor_layout import compute_tensor_descriptor
from .collectives import Group
from .mesh import DeviceMesh
from .plan import PARTIAL, Combine, LocalStage, Plan, Reshard, build_plan

_SHAPE_ARG_OPS = ("broadcast_in_dim", "expand")


class ShardedExecutor:
    """One fusion on one mesh with given input placements; caches its plan and its stages' definitions."""

    def __init__(self, fusion, mesh: DeviceMesh, input_placements: Optional[Sequence] = None):
        self.fusion = fusion
        self.plan: Plan = build_plan(fusion, mesh, input_placements)
        self._stages: dict = {}

    def output_placements(self) -> list:
        return self.plan.output_placements()

    def run(self, args: Sequence, group=None, enable_options=(), disable_options=()) -> list:
        """This rank's outputs; options as ``fd.execute`` takes them apply to every local stage."""
        g = Group(self.plan.mesh, group)
        self._options = dict(_enable_options=list(enable_options), _disable_options=list(disable_options))
        env: dict = {}  # (id(tv), placement) -> local tensor
        latest: dict = {}  # id(tv) -> (local tensor, placement): for size() of a tensor
        scalars: dict = {}  # id(scalar input) -> value
        args = list(args)
        if len(args) != len(self.plan.inputs):
            raise InputValidationError(f"execute: the fusion has {len(self.plan.inputs)} inputs, got {len(args)}")
        for i, ((v, p), a) in enumerate(zip(self.plan.inputs, args)):
            if isinstance(v, TensorView):
                _check_local_input(i, v, p, a, g.size)
                env[(id(v), p)] = a
                latest[id(v)] = (a, p)
            elif isinstance(v, Scalar):
                scalars[id(v)] = a
            else:
                raise UnsupportedOpError(f"multi-device fusion: input {i} ({v.name}) is a vector; only tensors and "
                                         f"scalars are supported")
        for index, step in enumerate(self.plan.steps):
            if isinstance(step, LocalStage):
                self._run_stage(index, step, env, latest, scalars, g.size)
            elif isinstance(step, Reshard):
                (tv, src), (_, dst) = step.source, step.target
                out = g.reshard(env[(id(tv), src)], src, dst)
                env[(id(tv), dst)] = out
                latest[id(tv)] = (out, dst)
            elif isinstance(step, Combine):
                (tv, _), (_, dst) = step.source, step.target
                out = g.combine(env[(id(tv), PARTIAL)], dst, step.op)
                if step.bias is not None:
                    out = out + env[(id(step.bias[0]), step.bias[1])]
                out = out.to(to_torch_dtype(step.dtype))
                env[(id(tv), dst)] = out
                latest[id(tv)] = (out, dst)
        return [env[(id(tv), p)] for tv, p in self.plan.outputs]

    # --- one local stage ----------------------------------------------------------------------------------------
    def _run_stage(self, index: int, stage: LocalStage, env, latest, scalars, size: int) -> None:
        keys = []
        for se in stage.exprs:
            for k in se.input_keys.values():
                if k not in stage.produced and k not in keys:
                    keys.append(k)
        tensors = [env[(id(k[0]), k[1])] for k in keys]
        signature = (index,) + tuple(_signature(t) for t in tensors)
        built = self._stages.get(signature)
        if built is None:
            built = self._stages[signature] = _StageBuilder(stage, keys, tensors, size).build()
        fd, sources = built
        inputs = []
        for kind, ref in sources:
            if kind == "tensor":
                inputs.append(env[(id(ref[0]), ref[1])])
            elif kind == "scalar":
                inputs.append(scalars[id(ref)])
            else:  # ("size", (tv, dim)): a global extent
                tv, dim = ref
                if id(tv) not in latest:
                    raise UnsupportedOpError(f"multi-device fusion: size() of {tv.name}, which is computed inside "
                                             f"the same local stage; take sizes of inputs instead")
                t, p = latest[id(tv)]
                inputs.append(t.shape[dim] * (size if p == dim else 1))
        outs = fd.execute(inputs, **self._options)
        for k, out in zip(stage.outputs, outs):
            env[(id(k[0]), k[1])] = out
            latest[id(k[0])] = (out, k[1])


def _signature(t: torch.Tensor) -> tuple:
    contiguity, order = compute_tensor_descriptor(list(t.shape), list(t.stride()))
    return (t.dtype, t.device.type, tuple(s == 1 for s in t.shape), tuple(contiguity), tuple(order))


def _check_local_input(i: int, tv: TensorView, p, a, size: int) -> None:
    if not isinstance(a, torch.Tensor):
        raise InputTypeError(f"input {i} ({tv.name}): expected a tensor, got {type(a).__name__}")
    if a.dim() != tv.ndim:
        raise InputValidationError(f"input {i} ({tv.name}): expected a local tensor of rank {tv.ndim}, got shape "
                                   f"{tuple(a.shape)}")
    for d, dom in enumerate(tv.logical):
        ext = dom.extent if (not dom.is_broadcast or dom.expanded) else 1
        if ext is None:
            continue
        want = ext // size if d == p else ext
        if a.shape[d] != want:
            what = f"its block of {ext} over {size} ranks" if d == p else "the defined extent"
            raise InputValidationError(f"input {i} ({tv.name}): dim {d} of the local tensor is {a.shape[d]}, "
                                       f"expected {want} ({what})")


class _StageBuilder:
    """Defines one stage as a new FusionDefinition. ``sources`` says where each of its inputs comes from."""

    def __init__(self, stage: LocalStage, keys: list, tensors: list, size: int):
        self.stage, self.keys, self.tensors, self.size = stage, keys, tensors, size
        self.vals: dict = {}  # (id(tv), placement) -> new Val, and id(scalar) -> new Val
        self.sources: list = []

    def build(self):
        with FusionDefinition() as fd:
            self.fd = fd
            for k, t in zip(self.keys, self.tensors):
                self.vals[(id(k[0]), k[1])] = fd.from_pytorch(t)
                self.sources.append(("tensor", k))
            for se in self.stage.exprs:
                self._replay(se)
            for tv, p in self.stage.outputs:
                fd.add_output(self.vals[(id(tv), p)])
        return fd, self.sources

    def _scalar(self, v: Scalar):
        got = self.vals.get(id(v))
        if got is not None:
            return got
        d = v.defined_by
        if d is None:
            if v.is_constant:
                new = self.fd.define_scalar(v.value, dtype=v.dtype)
            else:
                new = self.fd.define_scalar(dtype=v.dtype)
                self.sources.append(("scalar", v))
        elif d.op.name == "size":
            new = self.fd.define_scalar(dtype=v.dtype)
            self.sources.append(("size", (d.inputs[0], d.kwargs["dim"])))
        elif any(isinstance(x, TensorView) for x in d.inputs):
            raise UnsupportedOpError(f"multi-device fusion: the scalar {v.name} comes from fd.ops.{d.op.name} of a "
                                     f"tensor; only size() is supported there")
        else:
            args = self._map(d.args, None)
            kwargs = self._map(d.kwargs, None)
            new_expr = self._call(d, args, kwargs)
            for o, n in zip(d.outputs, new_expr.outputs):
                self.vals[id(o)] = n
            new = self.vals[id(v)]
        self.vals[id(v)] = new
        return new

    def _map(self, obj, se):
        if isinstance(obj, TensorView):
            k = se.input_keys[id(obj)]
            return self.vals[(id(k[0]), k[1])]
        if isinstance(obj, Scalar):
            return self._scalar(obj)
        if isinstance(obj, Vector):
            return [self._map(e, se) for e in obj.elements]
        if isinstance(obj, list):
            return [self._map(x, se) for x in obj]
        if isinstance(obj, tuple):
            return tuple(self._map(x, se) for x in obj)
        if isinstance(obj, dict):
            return {k: self._map(x, se) for k, x in obj.items()}
        return obj

    def _call(self, e: Expr, args, kwargs) -> Expr:
        fusion = self.fd.fusion
        before = len(fusion.statements)
        e.op.builder(*args, **kwargs)
        new = [s for s in fusion.statements[before:] if isinstance(s, Expr)]
        if not new:
            raise UnsupportedOpError(f"multi-device fusion: fd.ops.{e.op.name} could not be defined again locally")
        return new[-1]

    def _replay(self, se) -> None:
        e = se.expr
        args, kwargs = list(e.args), dict(e.kwargs)
        if se.drop_bias:  # linear's bias is added once, after the partial results are combined
            args = args[:2]
            kwargs.pop("bias", None)
        args = self._map(args, se)
        kwargs = self._map(kwargs, se)
        if se.partial_dtype is not None and "dtype" in kwargs:
            kwargs["dtype"] = from_torch_dtype(se.partial_dtype)
        if e.op.name in _SHAPE_ARG_OPS and isinstance(se.placement, int):
            kwargs["shape"] = self._local_shape(kwargs["shape"], se.placement)
        new = self._call(e, args, kwargs)
        for o, n in zip(e.outputs, new.outputs):
            if not isinstance(o, TensorView):
                self.vals[id(o)] = n
                continue
            for k in self.stage.produced:
                if k[0] is o:
                    self.vals[(id(o), k[1])] = n

    def _local_shape(self, shape, dim: int):
        """A shape argument whose entry ``dim`` is a sharded output dim: that entry becomes the block extent."""
        shape = list(shape)
        entry = shape[dim]
        if isinstance(entry, Val):
            if isinstance(entry, Scalar) and entry.is_constant and entry.value != -1:
                shape[dim] = int(entry.value) // self.size
            elif not (isinstance(entry, Scalar) and entry.is_constant):
                shape[dim] = self.fd.ops.div(entry, self.size)
        elif entry != -1:
            shape[dim] = int(entry) // self.size
        return shape


def executor_for(fusion, mesh: DeviceMesh, input_placements: Optional[Sequence] = None) -> ShardedExecutor:
    cache = fusion.__dict__.setdefault("_sharded_executors", {})
    key = (mesh, None if input_placements is None else tuple(input_placements))
    ex = cache.get(key)
    if ex is None:
        ex = cache[key] = ShardedExecutor(fusion, mesh, input_placements)
    return ex


def execute_sharded(fd, inputs: Sequence, enable_options=(), disable_options=(), group=None) -> list:
    """``fd.execute`` of a fusion with device meshes: local tensors in, local tensors out (nvFuser's
    convention), on the default process group unless ``group`` is given."""
    from .plan import fusion_mesh

    fusion = fd.fusion
    mesh = fusion_mesh(fusion)
    return executor_for(fusion, mesh).run(inputs, group, enable_options, disable_options)


def output_placements(fd) -> Optional[list]:
    from .plan import fusion_mesh

    mesh = fusion_mesh(fd.fusion)
    return None if mesh is None else executor_for(fd.fusion, mesh).output_placements()
