"""Multi-device fusions on 2 GPUs with NCCL (skipped without 2 CUDA devices): the CPU suite's cases
(tests/test_multidevice.py: every resharding rule and the expert-parallel MoE, bit for bit against the
single-device layer) on NCCL, one rank per GPU, and a Thunder tensor-parallel MLP on DTensors against eager when
Thunder is installed.

    python -m pytest -q tests/test_multidevice_gpu.py
"""

from __future__ import annotations

import os
import traceback

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices"),
]

WORLD = 2


def test_sharding_rules_and_expert_parallel_moe_on_nccl(tmp_path):
    import test_multidevice as cpu_suite

    results = cpu_suite._spawn(WORLD, tmp_path, backend="nccl")
    cpu_suite.check_results(results, WORLD, device="cuda:0")


def _thunder_worker(rank: int, store: str, out_dir: str) -> None:
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    result = "ok"
    try:
        import pyfuser

        pyfuser.register_as_nvfuser_direct()  # Thunder's nvFuser executor imports nvfuser_direct
        import thunder
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        torch.manual_seed(0)
        mesh = init_device_mesh("cuda", (WORLD,))
        mlp = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)).cuda()
        eager = parallelize_module(mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        x = torch.randn(8, 64, device="cuda")
        expected = eager(x)
        jitted = thunder.jit(eager)
        got = jitted(x)
        torch.testing.assert_close(got, expected)
    except Exception:  # noqa: BLE001 -- reported to the test
        result = traceback.format_exc()
    torch.save(result, os.path.join(out_dir, f"thunder{rank}.pt"))
    dist.destroy_process_group()


def test_thunder_tensor_parallel_mlp_matches_eager(tmp_path):
    pytest.importorskip("thunder")
    ctx = torch.multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_thunder_worker, args=(r, str(tmp_path / "store"), str(tmp_path)), daemon=True)
             for r in range(WORLD)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for r in hung:
        procs[r].kill()
    assert not hung, f"ranks {hung} hung"
    results = [torch.load(tmp_path / f"thunder{r}.pt") for r in range(WORLD)]
    assert results == ["ok"] * WORLD, "\n".join(str(r) for r in results)
