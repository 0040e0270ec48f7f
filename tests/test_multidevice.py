"""Multi-device fusions (docs/multidevice.md) on CPU: gloo process groups of 2 and 4 ranks, spawned here.

Each world size is one spawn (process start-up dominates on a 2-core machine): every rank runs every case of
CASES and records "ok" or its traceback, the expert-parallel MoE returns its output to this process, and the
test fails listing every case that failed on any rank. A rank's exception, a hang (bounded by TIMEOUT_S) and a
non-zero exit all fail the test. Rendezvous goes through a file; gloo's transport uses the loopback interface.

Every case builds the same full tensors on every rank (one seed), runs the sharded fusion on this rank's blocks
and compares this rank's result with the block of an eager PyTorch reference computed from the full tensors:
values (NaN by position, exactly where the collective cannot reorder sums), dtype and shape.
Kernels run under TRITON_INTERPRET=1 (conftest sets it; the ranks inherit it).
"""

from __future__ import annotations

import os
import traceback

import pytest
import torch
import torch.nn.functional as F

import pyfuser
from pyfuser import DataType, FusionDefinition, ParallelType
from pyfuser.errors import FusionDefinitionError, InputValidationError, UnsupportedOpError

dist = pytest.importorskip("torch.distributed")
if not dist.is_available():  # pragma: no cover
    pytest.skip("torch without distributed", allow_module_level=True)

TIMEOUT_S = 150
MESH_X = ParallelType.mesh_x
MOE_TOKENS = 16
_DEVICE_TYPE = ["cpu"]  # "cuda" in NCCL ranks (tests/test_multidevice_gpu.py): tensors are made there by default


# --------------------------------------------------------------------------------------------------------------
# helpers run inside the ranks


def _rank():
    return dist.get_rank()


def _block(t: torch.Tensor, dim: int, d: int) -> torch.Tensor:
    n = t.shape[dim] // d
    return t.narrow(dim, _rank() * n, n)


def _same(out: torch.Tensor, ref: torch.Tensor, exact: bool = True, **tol) -> None:
    assert out.dtype == ref.dtype, (out.dtype, ref.dtype)
    assert out.shape == ref.shape, (tuple(out.shape), tuple(ref.shape))
    if exact:
        assert torch.equal(out.isnan(), ref.isnan()), "NaN positions differ"
        assert torch.equal(out.nan_to_num(0.0), ref.nan_to_num(0.0)), (out, ref)
    else:
        torch.testing.assert_close(out, ref, equal_nan=True, **tol)


def _special(shape, dtype=torch.float32) -> torch.Tensor:
    """Random negative and positive values with NaN, +-inf and -0.0 sprinkled in."""
    t = torch.randn(shape).to(dtype)
    flat = t.view(-1)
    for i, v in zip(range(0, flat.numel(), 7), (float("nan"), float("inf"), -float("inf"), -0.0)):
        flat[i] = v
    return t


def _sharded_input(fd, tv, mesh, dim, outer_split=True):
    tv.set_device_mesh(mesh)
    if dim is None:
        return
    if outer_split:
        tv.split(dim, mesh.size, inner_split=False)
    tv.axis(dim).parallelize(MESH_X)


# --------------------------------------------------------------------------------------------------------------
# the cases: one rule each (names say which)


def case_pointwise_keeps_sharding(d, mesh):
    # x sharded on dim 0; y replicated (each rank takes its block locally); a broadcast bias; special values; a
    # column-major local input.
    x, y, b = _special((2 * d, 6)), torch.randn(2 * d, 6), torch.randn(6)
    with FusionDefinition() as fd:
        tx = fd.define_tensor([-1, -1], contiguity=True, dtype=DataType.Float, stride_order=[0, 1])
        ty = fd.define_tensor([-1, -1], contiguity=True, dtype=DataType.Float)
        tb = fd.define_tensor([-1], contiguity=True, dtype=DataType.Float)
        out = fd.ops.add(fd.ops.mul(tx, ty), fd.ops.broadcast_in_dim(tb, [2 * d, 6], [1]))
        fd.add_output(out)
        _sharded_input(fd, tx, mesh, 0)
        ty.set_device_mesh(mesh)
    x_local = _block(x, 0, d).t().contiguous().t()  # column-major block
    (o,) = fd.execute([x_local, y, b])
    _same(o, _block(x * y + b, 0, d))


def case_allgather_set(d, mesh):
    x = _special((d * 4,))
    with FusionDefinition() as fd:
        inp = fd.define_tensor((d * 4,), contiguity=True, dtype=DataType.Float)
        out = fd.ops.set(inp)
        fd.add_output(out)
        _sharded_input(fd, inp, mesh, 0)
        out.set_device_mesh(mesh)
    (o,) = fd.execute([pyfuser.multidevice.shard_tensor(x, inp)])
    _same(o, x)


def case_allgather_expanded_broadcast(d, mesh):
    # a whole dim of extent d on mesh_x (one element per rank), broadcast to [d, 3] still sharded (the static
    # extent d becomes the block extent 1), then gathered by a replicated set.
    x = _special((d,))
    with FusionDefinition() as fd:
        inp = fd.define_tensor([d], contiguity=True, dtype=DataType.Float)
        expanded = fd.ops.broadcast_in_dim(inp, [d, 3], [0])
        out = fd.ops.set(expanded)
        fd.add_output(out)
        for tv in (inp, expanded, out):
            tv.set_device_mesh(mesh)
        inp.axis(0).parallelize(MESH_X)
        expanded.axis(0).parallelize(MESH_X)
    (o,) = fd.execute([_block(x, 0, d)])
    _same(o, x.unsqueeze(-1).expand(-1, 3))


def case_dtensor_placements_are_checked(d, mesh):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Partial, Shard, distribute_tensor

    tmesh = init_device_mesh(_DEVICE_TYPE[0], (d,))
    x = torch.randn(d * 2, 3)
    with FusionDefinition() as fd:
        inp = fd.define_tensor([-1, -1], contiguity=True, dtype=DataType.Float)
        fd.add_output(fd.ops.neg(inp))
        _sharded_input(fd, inp, mesh, 0)
    for placement, error, words in ((Shard(1), InputValidationError, "sharded on dim 0 but it is given sharded on dim 1"),
                                    (Partial(), UnsupportedOpError, "only Shard and Replicate")):
        dt = distribute_tensor(x, tmesh, [Shard(1)]) if isinstance(placement, Shard) else None
        if dt is None:
            from torch.distributed.tensor import DTensor

            dt = DTensor.from_local(x, tmesh, [Partial()], run_check=False)
        try:
            pyfuser.execute_with_dtensors(fd, [dt])
        except error as e:
            assert words in str(e), str(e)
        else:
            raise AssertionError(f"{placement} was accepted")


def case_allreduce_sum(d, mesh):
    x = _special((2, d * 3, 5))
    with FusionDefinition() as fd:
        inp = fd.define_tensor((-1, -1, -1), contiguity=True, dtype=DataType.Float)
        fd.add_output(fd.ops.sum(inp, [1]))
        _sharded_input(fd, inp, mesh, 1)
    (o,) = fd.execute([_block(x, 1, d)])
    _same(o, x.sum(1), exact=False)


def case_allreduce_max_keeps_nan(d, mesh):
    x = torch.randn(4, d * 2)
    x[1, -1] = float("nan")  # in the last rank's block only
    x[2, 0] = -float("inf")
    with FusionDefinition() as fd:
        inp = fd.define_tensor((-1, -1), contiguity=True, dtype=DataType.Float)
        fd.add_output(fd.ops.max(inp, [1]))
        _sharded_input(fd, inp, mesh, 1)
    (o,) = fd.execute([_block(x, 1, d)])
    _same(o, torch.amax(x, 1))


def case_reduce_scatter_sum(d, mesh):
    x = torch.randn(d, 3, d * 4)
    with FusionDefinition() as fd:
        inp = fd.define_tensor((d, 3, d * 4), contiguity=True, dtype=DataType.Float)
        out = fd.ops.sum(inp, [0])
        fd.add_output(out)
        _sharded_input(fd, inp, mesh, 0, outer_split=False)  # a whole dim of extent d: one row per rank
        out.set_device_mesh(mesh)
        out.outer_split(-1, d)
        out.axis(-2).parallelize(MESH_X)
    (o,) = fd.execute([_block(x, 0, d)])
    _same(o, _block(x.sum(0), 1, d), exact=False)


def case_reduce_scatter_bf16_sums_in_fp32(d, mesh):
    x = torch.randn(d * 8, d * 2).bfloat16()
    with FusionDefinition() as fd:
        inp = fd.define_tensor((-1, -1), contiguity=True, dtype=DataType.BFloat16)
        out = fd.ops.sum(inp, [0])
        fd.add_output(out)
        _sharded_input(fd, inp, mesh, 0)
        out.set_device_mesh(mesh)
        out.outer_split(1, d)  # loop domain [r{8d}, i{2d}]: the reduction axis counts
        out.axis(1).parallelize(MESH_X)
    (o,) = fd.execute([_block(x, 0, d)])
    ref = x.float().sum(0)
    _same(o, _block(ref, 0, d).bfloat16(), exact=False, atol=1e-2, rtol=1e-2)


def case_alltoall_both_ways(d, mesh):
    x = _special((d * 2, d * 3)).half()
    for src, dst in ((0, 1), (1, 0)):
        with FusionDefinition() as fd:
            inp = fd.define_tensor((d * 2, d * 3), contiguity=True, dtype=DataType.Half)
            out = fd.ops.set(inp)
            fd.add_output(out)
            _sharded_input(fd, inp, mesh, src)
            out.set_device_mesh(mesh)
            out.outer_split(dst, d)
            out.axis(dst).parallelize(MESH_X)
        (o,) = fd.execute([_block(x, src, d)])
        _same(o, _block(x, dst, d))


def case_replicated_to_sharded_is_local(d, mesh):
    x = _special((3, d * 2))
    with FusionDefinition() as fd:
        inp = fd.define_tensor((-1, -1), contiguity=True, dtype=DataType.Float)
        out = fd.ops.neg(inp)
        fd.add_output(out)
        inp.set_device_mesh(mesh)
        out.set_device_mesh(mesh)
        out.outer_split(1, d)
        out.axis(1).parallelize(MESH_X)
    (o,) = fd.execute([x])
    _same(o, _block(-x, 1, d))


def _thunder_schedule(fd, dtensors):
    """What Thunder's nvFuser executor does to a fusion's inputs for DTensor arguments."""
    for tv, dt in zip(fd.fusion.inputs(), dtensors):
        mesh = pyfuser.multidevice.DeviceMesh(dt.device_mesh.mesh.tolist())
        tv.set_device_mesh(mesh)
        (placement,) = dt.placements
        if placement.is_shard():
            tv.split(placement.dim, mesh.size, inner_split=False)
            tv.axis(placement.dim).parallelize(MESH_X)
            tv.set_allocation_domain(tv.get_loop_domain(), new_contiguity=True)


def case_tensor_parallel_mlp_dtensors(d, mesh):
    # column-parallel linear (weight and bias Shard(0)) -> tanh -> row-parallel linear (weight Shard(1)) with a
    # replicated bias: the second linear contracts a sharded dim, so its partial sums are all-reduced and the
    # bias added once.
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    tmesh = init_device_mesh(_DEVICE_TYPE[0], (d,))
    x, w1, b1 = torch.randn(3, 8), torch.randn(4 * d, 8), torch.randn(4 * d)
    w2, b2 = torch.randn(8, 4 * d), torch.randn(8)
    dts = [distribute_tensor(x, tmesh, [Replicate()]), distribute_tensor(w1, tmesh, [Shard(0)]),
           distribute_tensor(b1, tmesh, [Shard(0)]), distribute_tensor(w2, tmesh, [Shard(1)]),
           distribute_tensor(b2, tmesh, [Replicate()])]
    with FusionDefinition() as fd:
        tx, tw1, tb1, tw2, tb2 = (fd.define_tensor([-1] * t.dim(), contiguity=True, dtype=DataType.Float)
                                  for t in (x, w1, b1, w2, b2))
        h = fd.ops.tanh(fd.ops.linear(tx, tw1, tb1))
        fd.add_output(h)
        fd.add_output(fd.ops.linear(h, tw2, tb2))
        _thunder_schedule(fd, dts)
    oh, oy = pyfuser.execute_with_dtensors(fd, dts)
    assert isinstance(oh, DTensor) and oh.placements == (Shard(1),), oh.placements
    assert oy.placements == (Replicate(),), oy.placements
    h_ref = torch.tanh(F.linear(x, w1, b1))
    _same(oh.to_local(), _block(h_ref, 1, d), exact=False)
    _same(oy.to_local(), F.linear(h_ref, w2, b2), exact=False)
    # The same fusion without any annotation takes its placements from the DTensors.
    with FusionDefinition() as fd2:
        tx, tw1, tb1 = (fd2.define_tensor([-1] * t.dim(), contiguity=True, dtype=DataType.Float)
                        for t in (x, w1, b1))
        fd2.add_output(fd2.ops.linear(tx, tw1, tb1))
    (o2,) = pyfuser.execute_with_dtensors(fd2, dts[:3])
    assert o2.placements == (Shard(1),)
    _same(o2.full_tensor(), F.linear(x, w1, b1), exact=False)


def case_matmul_contracted_dim(d, mesh):
    a, b = torch.randn(5, d * 3), torch.randn(d * 3, 4)
    with FusionDefinition() as fd:
        ta = fd.define_tensor([-1, -1], contiguity=True, dtype=DataType.Float)
        tb = fd.define_tensor([-1, -1], contiguity=True, dtype=DataType.Float)
        fd.add_output(fd.ops.matmul(ta, tb))
        _sharded_input(fd, ta, mesh, 1)
        tb.set_device_mesh(mesh)  # replicated: each rank takes its rows
    (o,) = fd.execute([_block(a, 1, d), b])
    _same(o, a @ b, exact=False)


def case_unmapped_ops_gather_first(d, mesh):
    # cumsum along the sharded dim and a reshape have no dim map: their sharded input is all-gathered first.
    x = torch.randn(d * 2, 3)
    with FusionDefinition() as fd:
        inp = fd.define_tensor([-1, -1], contiguity=True, dtype=DataType.Float)
        fd.add_output(fd.ops.cumsum(inp, dim=0))
        fd.add_output(fd.ops.reshape(inp, [d * 6]))
        _sharded_input(fd, inp, mesh, 0)
    c, r = fd.execute([_block(x, 0, d)])
    _same(c, torch.cumsum(x, 0), exact=False)
    _same(r, x.reshape(-1))


def case_shape_arguments_follow_the_block(d, mesh):
    # x - rowsum(x), the rowsum broadcast back by static extents and by x.size(): sharded rows stay local.
    x = torch.randn(d * 2, 5)
    for symbolic in (False, True):
        with FusionDefinition() as fd:
            inp = fd.define_tensor([-1, -1] if symbolic else [d * 2, 5], contiguity=True, dtype=DataType.Float)
            s = fd.ops.sum(inp, [1])
            shape = [inp.size(0), inp.size(1)] if symbolic else [d * 2, 5]
            out = fd.ops.sub(inp, fd.ops.broadcast_in_dim(s, shape, [0]))
            fd.add_output(out)
            _sharded_input(fd, inp, mesh, 0)
        (o,) = fd.execute([_block(x, 0, d)])
        _same(o, _block(x - x.sum(1, keepdim=True), 0, d), exact=False)


def case_bad_local_input_is_named(d, mesh):
    with FusionDefinition() as fd:
        inp = fd.define_tensor((d * 4, 3), contiguity=True, dtype=DataType.Float)
        fd.add_output(fd.ops.neg(inp))
        _sharded_input(fd, inp, mesh, 0)
    try:
        fd.execute([torch.randn(d * 4, 3)])  # the whole tensor instead of this rank's block
    except InputValidationError as e:
        assert "input 0" in str(e) and "expected 4" in str(e), str(e)
    else:
        raise AssertionError("a whole tensor passed as a block was accepted")


CASES = {name[len("case_"):]: fn for name, fn in sorted(globals().items()) if name.startswith("case_")}


def _moe_config():
    from pyfuser.demo import moe_nvfp4 as moe

    return moe.MoEConfig(hidden=128, intermediate=64, experts=4, top_k=2)


def _moe_inputs(device="cpu", skewed=False):
    """``skewed``: positive tokens and a router whose experts 0 and 1 always win, so the ranks owning the other
    experts receive no rows."""
    from pyfuser.demo import moe_nvfp4 as moe

    cfg = _moe_config()
    q = moe.quantize_weights(moe.make_weights(cfg, device, seed=0))
    x = torch.randn(MOE_TOKENS, cfg.hidden, generator=torch.Generator().manual_seed(1), device="cpu")
    if skewed:
        x = x.abs()
        signs = torch.tensor([1.0, 1.0, -1.0, -1.0]).repeat_interleave(cfg.experts // 4)[:, None]
        router = signs * (0.05 + 0.01 * torch.rand(cfg.experts, cfg.hidden, generator=torch.Generator().manual_seed(2)))
        q.router = router.to(device=device, dtype=torch.bfloat16)
    return cfg, q, x.to(device=device, dtype=torch.bfloat16)


def _worker(rank: int, world: int, store: str, out_dir: str, backend: str = "gloo") -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # loopback only
    if backend == "nccl":  # one GPU per rank; tensors are made on it
        torch.cuda.set_device(rank)
        torch.set_default_device(f"cuda:{rank}")
        _DEVICE_TYPE[0] = "cuda"
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world)
    results: dict = {}
    mesh = pyfuser.multidevice.DeviceMesh(torch.arange(world))
    for name, fn in CASES.items():
        torch.manual_seed(0)  # the same full tensors on every rank
        try:
            fn(world, mesh)
            results[name] = "ok"
        except Exception:  # noqa: BLE001 -- reported to the test, which fails on it
            results[name] = traceback.format_exc()
    try:
        from pyfuser.demo import moe_ep

        device = f"{_DEVICE_TYPE[0]}:{rank}" if _DEVICE_TYPE[0] == "cuda" else "cpu"
        for key, skewed in (("ep_moe", False), ("ep_moe_idle_ranks", True)):
            cfg, q, x = _moe_inputs(device, skewed)
            layer = moe_ep.ExpertParallelMoE(cfg, q)
            results[key] = layer(moe_ep.shard_tokens(x)).cpu()
    except Exception:  # noqa: BLE001
        results["ep_moe"] = traceback.format_exc()
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


def _spawn(world: int, tmp_path, backend: str = "gloo") -> list:
    ctx = torch.multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_worker, args=(r, world, str(tmp_path / "store"), str(tmp_path), backend),
                         daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    import time

    deadline = time.monotonic() + TIMEOUT_S
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for r in hung:
        procs[r].kill()
        procs[r].join()
    assert not hung, f"ranks {hung} of {world} did not finish within {TIMEOUT_S} s"
    codes = [p.exitcode for p in procs]
    assert codes == [0] * world, f"rank exit codes {codes}"
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]


_MOE_REFERENCE: dict = {}


def _single_device_moe(device="cpu", skewed=False) -> torch.Tensor:
    if (device, skewed) not in _MOE_REFERENCE:
        from pyfuser.demo import moe_nvfp4 as moe

        cfg, q, x = _moe_inputs(device, skewed)
        _MOE_REFERENCE[device, skewed] = moe.MoENVFP4(cfg, q)(x).cpu()
    return _MOE_REFERENCE[device, skewed]


def check_results(results: list, world: int, device: str = "cpu") -> None:
    """Every case ok on every rank; each rank's EP MoE block equals the single-device layer's bit for bit."""
    failed = [f"--- {name} on rank {r} of {world}:\n{res}" for r, rank_results in enumerate(results)
              for name, res in rank_results.items() if not name.startswith("ep_moe") and res != "ok"]
    assert set(results[0]) >= set(CASES) | {"ep_moe"}
    assert not failed, "\n".join(failed)
    # Expert-parallel MoE vs the single-device fusion: bit for bit (on CPU: kernels under TRITON_INTERPRET=1);
    # the skewed routing leaves the ranks owning experts 2.. without rows.
    per = MOE_TOKENS // world
    for key, skewed in (("ep_moe", False), ("ep_moe_idle_ranks", True)):
        ref = _single_device_moe(device, skewed)
        if skewed:  # the routing really leaves experts 2.. (and the ranks owning them) without rows
            from pyfuser.demo import moe_nvfp4 as moe

            cfg, q, x = _moe_inputs("cpu", True)
            assert moe.route(x, q.router, cfg.top_k)[1].max() < 2
        for r, rank_results in enumerate(results):
            out = rank_results[key if isinstance(rank_results["ep_moe"], torch.Tensor) else "ep_moe"]
            assert isinstance(out, torch.Tensor), f"rank {r}:\n{out}"
            block = ref[r * per:(r + 1) * per]
            assert out.dtype == block.dtype and out.shape == block.shape
            assert torch.equal(out, block), f"{key}, rank {r}: max difference {(out.float() - block.float()).abs().max()}"


@pytest.mark.parametrize("world", [2, 4])
def test_sharding_rules_and_expert_parallel_moe_on_gloo(world, tmp_path):
    check_results(_spawn(world, tmp_path), world)


# --------------------------------------------------------------------------------------------------------------
# definition-time rules (no process group needed)


def test_loop_domain_split_and_parallelize():
    mesh = pyfuser.multidevice.DeviceMesh([0, 1])
    with FusionDefinition() as fd:
        t = fd.define_tensor([8, -1], contiguity=True, dtype=DataType.Float)
        r = fd.ops.sum(t, [1])
        fd.add_output(r)
        t.set_device_mesh(mesh)
        t.split(0, 2, inner_split=False)
        assert [a.extent() for a in t.get_loop_domain()] == [2, 4, None]
        assert [a.is_reduction() for a in r.get_loop_domain()] == [False, True]
        t.axis(0).parallelize(MESH_X)
        assert repr(t.get_loop_domain()) == "[iDIDx{2}, iS{4}, iS{?}]"
        t.set_allocation_domain(t.get_loop_domain(), new_contiguity=True)
        t2 = fd.define_tensor([6], contiguity=True, dtype=DataType.Float)
        t2.split(0, 3)  # inner split: [2, 3]
        assert [a.extent() for a in t2.get_loop_domain()] == [2, 3]
        assert len(r.get_loop_domain()) == 2  # reduction axes count, as in nvFuser
    assert pyfuser.distributed.plan.declared(t) == (True, 0)
    assert pyfuser.multidevice.DeviceMesh(torch.tensor([0, 1])).shape == (2,)


@pytest.mark.parametrize("what", ["mesh_2d", "mesh_y", "block_x", "inner_part", "inner_split_outer",
                                  "reduction_axis", "split_twice", "allocation", "two_device_axes"])
def test_unsupported_sharding_is_refused_with_our_error(what):
    mesh = pyfuser.multidevice.DeviceMesh([0, 1])
    with FusionDefinition() as fd:
        t = fd.define_tensor([4, 6], contiguity=True, dtype=DataType.Float)
        r = fd.ops.sum(t, [1])
        fd.add_output(r)
        with pytest.raises(UnsupportedOpError) as info:
            if what == "mesh_2d":
                t.set_device_mesh(pyfuser.multidevice.DeviceMesh([[0, 1], [2, 3]]))
            elif what == "mesh_y":
                t.axis(0).parallelize(ParallelType.mesh_y)
            elif what == "block_x":
                t.axis(0).parallelize(ParallelType.block_x)
            elif what == "inner_part":
                t.split(0, 2, inner_split=False)
                t.axis(1).parallelize(MESH_X)
            elif what == "inner_split_outer":
                t.split(0, 2)
                t.axis(0).parallelize(MESH_X)
            elif what == "reduction_axis":
                r.axis(1).parallelize(MESH_X)
            elif what == "split_twice":
                t.split(0, 2)
                t.split(0, 2)
            elif what == "allocation":
                t.split(0, 2)
                t.set_allocation_domain(list(reversed(t.get_loop_domain())), new_contiguity=True)
            elif what == "two_device_axes":
                t.axis(0).parallelize(MESH_X)
                t.axis(1).parallelize(MESH_X)
        assert t.name in str(info.value) or "DeviceMesh" in str(info.value) or r.name in str(info.value)
    del mesh


def test_bad_arguments_are_definition_errors():
    with FusionDefinition() as fd:
        t = fd.define_tensor([4], contiguity=True, dtype=DataType.Float)
        fd.add_output(fd.ops.neg(t))
        with pytest.raises(FusionDefinitionError, match="axis 3 is out of range"):
            t.axis(3)
        with pytest.raises(FusionDefinitionError, match="factor must be an int"):
            t.split(0, 0)
        with pytest.raises(FusionDefinitionError, match="expected a multidevice.DeviceMesh"):
            t.set_device_mesh([0, 1])
    with pytest.raises(FusionDefinitionError, match="finalized"):
        t.split(0, 2)


def test_plan_rules_without_a_process_group():
    """The planner's choices, read from the plan: which collective each rule lowers to."""
    from pyfuser.distributed.plan import Combine, LocalStage, Reshard, build_plan

    mesh = pyfuser.multidevice.DeviceMesh([0, 1])
    with FusionDefinition() as fd:
        x = fd.define_tensor([4, 6], contiguity=True, dtype=DataType.Float)
        y = fd.define_tensor([4, 6], contiguity=True, dtype=DataType.Float)
        z = fd.ops.add(x, y)  # y replicated: local block
        s = fd.ops.sum(z, [0])  # over the sharded dim: all-reduce
        g = fd.ops.set(z)
        fd.add_output(s)
        fd.add_output(g)
        _sharded_input(fd, x, mesh, 0)
        g.set_device_mesh(mesh)  # replicated: all-gather
    plan = build_plan(fd.fusion, mesh)
    kinds = [type(st).__name__ for st in plan.steps]
    # the set computes where its input is (sharded), then its output is gathered to the annotated placement
    assert kinds == ["Reshard", "LocalStage", "Combine", "LocalStage", "Reshard"], kinds
    assert plan.steps[0].source[1] is None and plan.steps[0].target[1] == 0  # replicated -> block of y
    assert isinstance(plan.steps[2], Combine) and plan.steps[2].target[1] is None and plan.steps[2].op == "sum"
    assert isinstance(plan.steps[4], Reshard) and (plan.steps[4].source[1], plan.steps[4].target[1]) == (0, None)
    assert isinstance(plan.steps[1], LocalStage) and plan.output_placements() == [None, None]


def test_random_ops_and_unready_process_group_are_refused():
    mesh = pyfuser.multidevice.DeviceMesh([0, 1])
    with FusionDefinition() as fd:
        x = fd.define_tensor([4], contiguity=True, dtype=DataType.Float)
        fd.add_output(fd.ops.add(x, fd.ops.rand_like(x)))
        _sharded_input(fd, x, mesh, 0)
    with pytest.raises(UnsupportedOpError, match="rand_like in a multi-device fusion"):
        fd.execute([torch.randn(2)])
    with FusionDefinition() as fd:
        x = fd.define_tensor([4], contiguity=True, dtype=DataType.Float)
        fd.add_output(fd.ops.neg(x))
        _sharded_input(fd, x, mesh, 0)
    if not dist.is_initialized():
        with pytest.raises(UnsupportedOpError, match="torch.distributed is not initialized"):
            fd.execute([torch.randn(2)])


def test_single_device_paths_refuse_a_sharded_fusion():
    """Run on one rank's blocks alone, these would compute a wrong result: they raise instead."""
    mesh = pyfuser.multidevice.DeviceMesh([0, 1])
    with FusionDefinition() as fd:
        x = fd.define_tensor([4], contiguity=True, dtype=DataType.Float)
        fd.add_output(fd.ops.sum(x, [0]))
        _sharded_input(fd, x, mesh, 0)
    block = torch.randn(2)
    for call in (lambda: fd.manual_execute([block]), lambda: fd.validate([block]),
                 lambda: fd.manual_validate([block])):
        with pytest.raises(UnsupportedOpError, match="device meshes"):
            call()
    with pytest.raises(UnsupportedOpError, match="device meshes"):
        pyfuser.LRUCache(2).cache_compile(fd.fusion)


def test_plan_computes_in_the_annotated_output_placement():
    """x sharded on dim 0, y on dim 1, the output annotated on dim 1: one all-to-all (of x), none after."""
    from pyfuser.distributed.plan import LocalStage, Reshard, build_plan

    mesh = pyfuser.multidevice.DeviceMesh([0, 1])
    with FusionDefinition() as fd:
        x = fd.define_tensor([4, 6], contiguity=True, dtype=DataType.Float)
        y = fd.define_tensor([4, 6], contiguity=True, dtype=DataType.Float)
        out = fd.ops.add(x, y)
        fd.add_output(out)
        _sharded_input(fd, x, mesh, 0)
        _sharded_input(fd, y, mesh, 1)
        out.set_device_mesh(mesh)
        out.outer_split(1, 2)
        out.axis(1).parallelize(MESH_X)
    plan = build_plan(fd.fusion, mesh)
    assert [type(st) for st in plan.steps] == [Reshard, LocalStage]
    assert plan.steps[0].source[0] is x and (plan.steps[0].source[1], plan.steps[0].target[1]) == (0, 1)
    assert plan.output_placements() == [1]
