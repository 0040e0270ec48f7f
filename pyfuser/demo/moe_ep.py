"""The NVFP4 MoE layer (pyfuser/demo/moe_nvfp4.py) with expert parallelism over a torch.distributed group.

Rank r of D holds a block of the tokens (data parallel) and experts [r*E/D, (r+1)*E/D) (expert parallel). One
call:

1. local fusion: router, top-k, (token, slot) pairs sorted by expert, rows per expert;
2. dispatch: all-to-all of the per-expert row counts, then all-to-all of the rows themselves (the rows for rank
   j are one contiguous block, since experts are sorted and rank j owns a contiguous range of them);
3. local fusion: the received rows sorted by local expert, the gate/up and down NVFP4 grouped GEMMs, the rows put
   back in received order;
4. combine: the reverse all-to-all of the rows, then a local fusion that un-permutes and takes the routing-weighted
   sum over the k slots.

The fusions are built from the single-device layer's own pieces (define_router, define_permutation,
define_counts, define_offsets, define_experts, define_combine), so a token's every row goes through the same
ops as in the single-device fusion: the output equals it bit for bit (tests/test_multidevice.py checks this on
CPU with gloo, kernels under TRITON_INTERPRET=1).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from ..distributed.collectives import Group
from ..distributed.mesh import DeviceMesh
from ..errors import InputValidationError, UnsupportedOpError
from ..frontend import FusionDefinition
from ..ir import DataType
from . import moe_nvfp4 as moe


def local_experts(q: moe.QuantizedMoE, rank_index: int, ranks: int) -> moe.QuantizedMoE:
    """The experts rank ``rank_index`` of ``ranks`` owns (a contiguous range), router kept whole."""
    E = q.w13.packed.shape[0]
    if E % ranks:
        raise UnsupportedOpError(f"expert parallelism: {E} experts do not split evenly over {ranks} ranks")
    per = E // ranks
    lo, hi = rank_index * per, (rank_index + 1) * per

    def part(w: moe.NVFP4Expert) -> moe.NVFP4Expert:
        return moe.NVFP4Expert(w.packed[lo:hi], w.scales[lo:hi], w.scales_linear[lo:hi], w.global_scale[lo:hi],
                               w.alpha[lo:hi])

    return moe.QuantizedMoE(router=q.router, w13=part(q.w13), w2=part(q.w2))


class ExpertParallelMoE:
    """Call with this rank's tokens [T_r, H] bf16; returns their layer outputs [T_r, H] bf16."""

    def __init__(self, cfg: moe.MoEConfig, weights: moe.QuantizedMoE, group=None, quant: str = "grouped"):
        cfg.check()
        if not dist.is_available() or not dist.is_initialized():
            raise UnsupportedOpError("ExpertParallelMoE: torch.distributed is not initialized")
        ranks = dist.get_process_group_ranks(group if group is not None else dist.group.WORLD)
        self.group = Group(DeviceMesh(list(ranks)), group)
        self.cfg, self.quant = cfg, quant
        self.ranks = self.group.size
        self.local_E = cfg.experts // self.ranks
        self.weights = local_experts(weights, self.group.index, self.ranks)
        self._route: dict = {}
        self._experts: dict = {}
        self._combine: dict = {}

    # --- the three local fusions, one definition per row count (shapes are static in the layer's pieces) -----
    def route_fusion(self, tokens: int) -> FusionDefinition:
        if tokens not in self._route:
            cfg, k = self.cfg, self.cfg.top_k
            with FusionDefinition() as fd:
                x = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
                w_router = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
                topw, topi = moe.define_router(fd, x, w_router, k)
                flat_ids, x_perm, inv_perm = moe.define_permutation(fd, x, topi, tokens * k, k)
                counts = moe.define_counts(fd, flat_ids, tokens * k, cfg.experts)
                for out in (x_perm, counts, inv_perm, topw):
                    fd.add_output(out)
            self._route[tokens] = fd
        return self._route[tokens]

    def experts_fusion(self) -> FusionDefinition:
        """One definition for every number of received rows (data: it changes from call to call), so the row
        count is the symbolic extent of the received rows, not a constant."""
        if "fd" not in self._experts:
            E = self.local_E
            with FusionDefinition() as fd:
                x_recv = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
                ids = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Int)
                experts = moe.define_expert_weights(fd)
                rows = fd.ops.size(x_recv, 0)
                perm = fd.ops.argsort(ids, dim=0, stable=True)  # received rows are by source rank, then expert
                x_sorted = fd.ops.index_select(x_recv, perm, 0)
                offsets = moe.define_offsets(fd, moe.define_counts(fd, ids, rows, E), E)
                y_sorted = moe.define_experts(fd, self.cfg, x_sorted, experts, offsets, rows, E, self.quant)
                fd.add_output(fd.ops.index_select(y_sorted, fd.ops.argsort(perm, dim=0), 0))
            self._experts["fd"] = fd
        return self._experts["fd"]

    def combine_fusion(self, tokens: int) -> FusionDefinition:
        if tokens not in self._combine:
            k = self.cfg.top_k
            with FusionDefinition() as fd:
                y_perm = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
                inv_perm = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Int)
                topw = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
                fd.add_output(moe.define_combine(fd, self.cfg, y_perm, inv_perm, topw, tokens))
            self._combine[tokens] = fd
        return self._combine[tokens]

    # --- the layer ------------------------------------------------------------------------------------------
    def __call__(self, x: torch.Tensor, enable_options=(), disable_options=()) -> torch.Tensor:
        if x.dim() != 2 or x.shape[1] != self.cfg.hidden or x.dtype != torch.bfloat16:
            raise InputValidationError(f"ExpertParallelMoE: x must be [tokens, {self.cfg.hidden}] bfloat16, got "
                                       f"{tuple(x.shape)} {x.dtype}")
        opts = dict(_enable_options=list(enable_options), _disable_options=list(disable_options))
        T, D, El, g = x.shape[0], self.ranks, self.local_E, self.group
        x_perm, counts, inv_perm, topw = self.route_fusion(T).execute([x, self.weights.router], **opts)

        # dispatch: counts first (each rank learns how many rows it receives, per source and local expert), then
        # the rows. The counts cross to the host here: the receive sizes are data.
        per_rank = counts.to(torch.int64).reshape(D, El).contiguous()
        recv_counts = torch.empty_like(per_rank)
        dist.all_to_all_single(recv_counts, per_rank, group=g.group)
        send_rows = per_rank.sum(1).tolist()
        recv_rows = recv_counts.sum(1).tolist()
        x_recv = g.all_to_all_rows(x_perm, send_rows, recv_rows)

        rows = sum(recv_rows)
        if rows:
            ids = torch.repeat_interleave(torch.arange(El, device=x.device).repeat(D), recv_counts.flatten())
            w = self.weights
            (y_recv,) = self.experts_fusion().execute([
                x_recv, ids,
                w.w13.packed.transpose(-1, -2), w.w13.scales, w.w13.alpha,
                w.w2.packed.transpose(-1, -2), w.w2.scales, w.w2.alpha,
            ], **opts)
        else:
            y_recv = x_recv.new_empty((0, self.cfg.hidden))

        # combine: the rows go back to where they came from, in the order they were sent
        y_perm = g.all_to_all_rows(y_recv, recv_rows, send_rows)
        (out,) = self.combine_fusion(T).execute([y_perm, inv_perm, topw], **opts)
        return out


def shard_tokens(x: torch.Tensor, group: Optional[object] = None) -> torch.Tensor:
    """This rank's contiguous block of the tokens (dim 0)."""
    from ..distributed.mesh import block_of

    ranks = dist.get_process_group_ranks(group if group is not None else dist.group.WORLD)
    return block_of(x, 0, len(ranks), list(ranks).index(dist.get_rank()))
