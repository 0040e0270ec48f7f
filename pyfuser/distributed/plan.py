"""From a sharded definition to a plan: local stages (run as ordinary pyfuser fusions) and the collectives
between them. docs/multidevice.md states the rules; this module is their one implementation.

Every tensor of the fusion has a placement: None (replicated: every rank holds all of it) or a logical dim cut
into equal contiguous blocks over the mesh. Inputs and annotated tensors have the placement the user gave (an
input without a mesh is replicated); the others take the placement their op computes in. Op by op:

- an op whose dims map onto its output's (pointwise ops, broadcasts, permute, squeeze, reductions' kept dims)
  computes in the output's annotated placement if a sharded input maps to it, else where its first sharded
  input is sharded: the other inputs are brought to the matching dim (replicated -> a local block, no
  communication; sharded elsewhere -> all-to-all);
- a reduction (sum, max, min, prod) over a sharded dim, or linear/matmul contracting one, computes partial
  results locally and combines them: all-reduce, or reduce-scatter when the output is annotated sharded;
- any other op with a sharded input gathers it first (all-gather) and runs replicated;
- an annotated output placement that differs from the computed one is reached by resharding:
  sharded -> replicated all-gather, replicated -> sharded local block, one dim -> another all-to-all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from ..errors import FusionDefinitionError, InputValidationError, UnsupportedOpError
from ..ir.nodes import Expr, TensorView
from ..ops.registry import OpKind
from ..segment.loop_domain import positional_loop_map
from .mesh import DeviceMesh
from .sharding import has_annotations

# Reductions whose partial results combine with one collective reduction op.
REDUCE_OPS = {"sum": "sum", "max": "max", "min": "min", "prod": "prod"}
CONTRACTIONS = ("linear", "matmul")
# Random ops would draw different numbers on every rank for a tensor meant to be one value.
RANDOM_OPS = frozenset(("uniform", "normal", "rand_like", "randn_like"))
PARTIAL = "partial"


Key = tuple  # (TensorView, placement): one materialized version of a tensor


@dataclass
class StageExpr:
    expr: Expr
    input_keys: dict  # id(input TensorView) -> Key it reads
    placement: object  # output placement while computing (a dim, None, or PARTIAL)
    drop_bias: bool = False  # linear with a contracted sharded dim: the bias is added once, after the reduction
    partial_dtype: Optional[object] = None  # a reduction kept in its compute dtype until combined


@dataclass
class LocalStage:
    exprs: list = field(default_factory=list)
    produced: dict = field(default_factory=dict)  # Key -> TensorView
    outputs: list = field(default_factory=list)  # Keys later steps or the fusion read (filled at the end)


@dataclass
class Reshard:
    """Bring a materialized tensor from one placement to another (collective, or a local block)."""

    source: Key
    target: Key


@dataclass
class Combine:
    """Combine partial results: all-reduce (target placement None) or reduce-scatter (a dim)."""

    source: Key
    target: Key
    op: str
    dtype: object  # the result's torch dtype (partials may be kept wider)
    bias: Optional[Key] = None  # linear's bias, added once after the combination


@dataclass
class Plan:
    mesh: DeviceMesh
    steps: list
    inputs: list  # Keys of the fusion inputs (Scalars keyed (val, None))
    outputs: list  # Keys of the fusion outputs
    placements: dict  # id(tv) -> final placement, every tensor

    def output_placements(self) -> list:
        return [k[1] for k in self.outputs]


def fusion_mesh(fusion) -> Optional[DeviceMesh]:
    """The fusion's one device mesh, or None if no tensor has one (a single-device fusion)."""
    mesh = None
    for v in _tensors(fusion):
        if not has_annotations(v):
            continue
        m = v._sharding.mesh
        if m is None:
            if v._sharding.device_dim() is not None:
                raise FusionDefinitionError(f"{v.name}: an axis is parallelized on mesh_x but the tensor has no "
                                            f"device mesh (call {v.name}.set_device_mesh(mesh) first)")
            continue
        if mesh is not None and m != mesh:
            raise UnsupportedOpError(f"{v.name}: pyfuser runs a fusion on one device mesh; got {mesh} and {m}")
        mesh = m
    return mesh


def _tensors(fusion):
    seen = set()
    for v in list(fusion.inputs) + [o for e in fusion.exprs for o in e.outputs]:
        if isinstance(v, TensorView) and id(v) not in seen:
            seen.add(id(v))
            yield v


def declared(tv: TensorView):
    """(True, placement) if the user placed ``tv`` (gave it a mesh), else (False, None)."""
    if has_annotations(tv) and tv._sharding.mesh is not None:
        return True, tv._sharding.device_dim()
    return False, None


def _describe(p) -> str:
    return "replicated" if p is None else f"sharded on dim {p}"


def _check_static_extent(tv: TensorView, dim: int, size: int) -> None:
    ext = tv.logical[dim].extent
    dom = tv.logical[dim]
    if dom.is_broadcast and not dom.expanded:
        raise UnsupportedOpError(f"{tv.name}: its dim {dim} is a size-1 broadcast and cannot be sharded")
    if ext is not None and ext % size:
        raise FusionDefinitionError(f"{tv.name}: dim {dim} has extent {ext}, which does not split into {size} equal "
                                    f"blocks (one per device of the mesh)")


# --- dim maps --------------------------------------------------------------------------------------------------


def _out_tv(e: Expr) -> Optional[TensorView]:
    outs = [o for o in e.outputs if isinstance(o, TensorView)]
    return outs[0] if len(outs) == 1 else None


def _mapped_kind(e: Expr) -> Optional[str]:
    op = e.op
    if op.name in CONTRACTIONS:
        return "contraction"
    if op.kind is OpKind.REDUCTION:
        return "reduction" if op.name in REDUCE_OPS and _out_tv(e) is not None else None
    if op.kind is OpKind.POINTWISE or (op.kind is OpKind.VIEW and op.loop_map is not None):
        return "map" if _out_tv(e) is not None else None
    return None


def _pairs(e: Expr) -> list:
    """((out, out_dim), (in, in_dim)) pairs of the same dim, for the one output."""
    kind = _mapped_kind(e)
    if kind == "contraction":
        return _contraction(e)[0]
    return (e.op.loop_map or positional_loop_map)(e)


def _contraction(e: Expr):
    """(pairs, contracted [(tv, dim)]) of linear / matmul. None contracted when a shape is not handled."""
    out = _out_tv(e)
    tensors = [v for v in e.args if isinstance(v, TensorView)]
    bias = e.kwargs.get("bias") if e.op.name == "linear" else None
    if e.op.name == "linear":
        a, w = e.args[0], e.args[1]
        if len(e.args) > 2 and isinstance(e.args[2], TensorView):
            bias = e.args[2]
        pairs = [((out, i), (a, i)) for i in range(a.ndim - 1)]
        if w.ndim == 2:
            pairs.append(((out, out.ndim - 1), (w, 0)))
        if isinstance(bias, TensorView):
            lead = out.ndim - bias.ndim
            pairs += [((out, lead + d), (bias, d)) for d in range(bias.ndim)]
        return pairs, [(a, a.ndim - 1), (w, w.ndim - 1)]
    a, b = tensors[0], tensors[1]
    if a.ndim < 2 or b.ndim < 2:
        return [], None
    batch = out.ndim - 2
    pairs = []
    for t in (a, b):
        lead = batch - (t.ndim - 2)
        pairs += [((out, lead + d), (t, d)) for d in range(t.ndim - 2)]
    pairs += [((out, out.ndim - 2), (a, a.ndim - 2)), ((out, out.ndim - 1), (b, b.ndim - 1))]
    return pairs, [(a, a.ndim - 1), (b, b.ndim - 2)]


def _linear_bias(e: Expr) -> Optional[TensorView]:
    if e.op.name != "linear":
        return None
    if len(e.args) > 2 and isinstance(e.args[2], TensorView):
        return e.args[2]
    b = e.kwargs.get("bias")
    return b if isinstance(b, TensorView) else None


def _size1(tv: TensorView, d: int) -> bool:
    dom = tv.logical[d]
    return dom.is_broadcast and not dom.expanded


# --- the planner -------------------------------------------------------------------------------------------------


def build_plan(fusion, mesh: DeviceMesh, input_placements: Optional[Sequence] = None) -> Plan:
    """``input_placements``: one per fusion input (None for scalars), e.g. from DTensor inputs; an input the
    definition also places must agree."""
    if fusion.aliases:
        raise UnsupportedOpError("multi-device fusion: outputs written into inputs (add_output(out, alias_input=...)) "
                                 "are not supported")
    size = mesh.size
    placement: dict[int, object] = {}
    inputs = []
    for i, v in enumerate(fusion.inputs):
        if isinstance(v, TensorView):
            is_decl, p = declared(v)
            if input_placements is not None:
                given = input_placements[i]
                if is_decl and given != p:
                    raise InputValidationError(
                        f"input {i} ({v.name}): the definition places it {_describe(p)} but it is given "
                        f"{_describe(given)}")
                p = given
            if p is not None:
                _check_static_extent(v, p, size)
            placement[id(v)] = p
            inputs.append((v, p))
        else:
            inputs.append((v, None))

    steps: list = []
    stage = LocalStage()

    def close_stage():
        nonlocal stage
        if stage.exprs:
            steps.append(stage)
        stage = LocalStage()

    def convert(tv: TensorView, src, dst) -> Key:
        if src == dst:
            return (tv, src)
        if dst is not None:
            _check_static_extent(tv, dst, size)
        if (tv, src) in stage.produced:
            close_stage()
        steps.append(Reshard((tv, src), (tv, dst)))
        return (tv, dst)

    for e in fusion.exprs:
        if e.op.name in RANDOM_OPS:
            raise UnsupportedOpError(f"fd.ops.{e.op.name} in a multi-device fusion: every rank would draw different "
                                     f"numbers for one tensor")
        outs = [o for o in e.outputs if isinstance(o, TensorView)]
        if not outs:
            continue  # scalar ops (size, scalar math) are replayed where their values are used
        tins = [v for v in e.inputs if isinstance(v, TensorView)]
        kind = _mapped_kind(e)
        exec_place = None
        contracted = None
        reduced = []
        pairs = []
        if kind is not None:
            pairs = _pairs(e)
            if kind == "contraction":
                _, contracted = _contraction(e)
                if contracted is None:
                    kind = None
            elif kind == "reduction":
                inp = tins[0]
                reduced = [(inp, d) for d in e.op.reduced_dims(e)]
        if kind is not None:
            out = outs[0]
            partial_dims = set(map(lambda p: (id(p[0]), p[1]), (contracted or []) + reduced))
            candidates = []  # what each sharded input would have the op compute as, in input order
            for t in tins:
                p = placement[id(t)]
                if p is None:
                    continue
                if (id(t), p) in partial_dims:
                    candidates.append(PARTIAL)
                    continue
                o = next((od for (ov, od), (iv, idim) in pairs if iv is t and idim == p and ov is out), None)
                if o is not None and not _size1(out, o):
                    candidates.append(o)
            # The output's own annotated placement wins when an input already computes it (no resharding after);
            # then partial results (they need a combination anyway), then the first sharded input.
            _, wanted = declared(out)
            if wanted is not None and wanted in candidates:
                exec_place = wanted
            elif PARTIAL in candidates:
                exec_place = PARTIAL
            elif candidates:
                exec_place = candidates[0]
        # What each input must be for the op to run locally.
        input_keys = {}
        bias = _linear_bias(e)
        for t in tins:
            if id(t) in input_keys:
                continue
            if exec_place == PARTIAL and t is bias:
                continue  # added once after the combination, placed like the combined result (below)
            if kind is None or exec_place is None:
                need = None
            elif exec_place == PARTIAL:
                need = next((d for tv, d in (contracted or []) + reduced if tv is t), None)
                if need is not None and _size1(t, need):
                    need = None
            else:
                need = next((idim for (ov, od), (iv, idim) in pairs if iv is t and od == exec_place), None)
                if need is not None and _size1(t, need):
                    need = None
            input_keys[id(t)] = convert(t, placement[id(t)], need)

        is_decl, decl = declared(outs[0])
        se = StageExpr(e, input_keys, exec_place)
        if exec_place == PARTIAL:
            out = outs[0]
            se.drop_bias = _linear_bias(e) is not None
            compute = e.info.get("compute")
            if e.op.name == "sum" and compute is not None:
                se.partial_dtype = compute
            stage.exprs.append(se)
            stage.produced[(out, PARTIAL)] = out
            close_stage()
            target = decl if is_decl else None
            if target is not None:
                _check_static_extent(out, target, size)
            bias_key = None
            if se.drop_bias:
                b = _linear_bias(e)
                need = None
                if target is not None:
                    lead = out.ndim - b.ndim
                    need = target - lead if target - lead >= 0 and not _size1(b, target - lead) else None
                bias_key = convert(b, placement[id(b)], need)
            op = "sum" if kind == "contraction" else REDUCE_OPS[e.op.name]
            steps.append(Combine((out, PARTIAL), (out, target), op, out.dtype, bias_key))
            placement[id(out)] = target
            continue
        stage.exprs.append(se)
        for o in outs:
            p = exec_place if o is outs[0] else None
            if len(outs) > 1:
                p = None
            stage.produced[(o, p)] = o
            placement[id(o)] = p
        if is_decl and decl != placement[id(outs[0])]:
            o = outs[0]
            convert(o, placement[id(o)], decl)
            placement[id(o)] = decl
        elif not is_decl and len(outs) == 1 and has_annotations(outs[0]) and outs[0]._sharding.device_dim() is not None:
            raise FusionDefinitionError(f"{outs[0].name}: parallelized on mesh_x without a device mesh")
    close_stage()

    outputs = []
    for v in fusion.outputs:
        if not isinstance(v, TensorView):
            raise UnsupportedOpError(f"multi-device fusion: output {v.name} is a scalar; only tensors are supported")
        outputs.append((v, placement[id(v)]))
    _fill_stage_outputs(steps, outputs)
    return Plan(mesh, steps, inputs, outputs, placement)


def _fill_stage_outputs(steps: list, outputs: list) -> None:
    """A stage returns the tensors later steps or the fusion read."""
    needed: set = {(id(tv), p) for tv, p in outputs}
    for step in reversed(steps):
        if isinstance(step, LocalStage):
            step.outputs = [k for k in step.produced if (id(k[0]), k[1]) in needed]
            for se in step.exprs:
                for k in se.input_keys.values():
                    needed.add((id(k[0]), k[1]))
        else:
            needed.add((id(step.source[0]), step.source[1]))
            if isinstance(step, Combine) and step.bias is not None:
                needed.add((id(step.bias[0]), step.bias[1]))
