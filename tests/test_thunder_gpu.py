"""Lightning Thunder as a client: its nvFuser executor, loaded on pyfuser (register_as_nvfuser_direct), runs a
Llama-style decoder block (RMSNorm, causal SDPA, SwiGLU MLP) forward and backward in bf16.

Needs CUDA (Thunder only looks for nvFuser when CUDA is available) and lightning-thunder (0.2.6 works with
torch 2.11; it cannot be imported with torch 2.13). Skipped otherwise.
"""

from __future__ import annotations

import re

import pytest
import torch

import pyfuser

if not torch.cuda.is_available():
    pytest.skip("Thunder's nvFuser executor needs CUDA", allow_module_level=True)

pyfuser.register_as_nvfuser_direct()  # before Thunder looks for nvfuser_direct
thunder = pytest.importorskip("thunder")
nvfuserex_module = pytest.importorskip("thunder.executors.nvfuserex")

import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return y.type_as(x) * self.weight


class DecoderBlock(nn.Module):
    def __init__(self, dim: int = 256, heads: int = 4, hidden: int = 688):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.attn_norm, self.mlp_norm = RMSNorm(dim), RMSNorm(dim)
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.w1, self.w3 = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        b, s, d = x.shape
        h = self.attn_norm(x)
        q, k, v = (w(h).view(b, s, self.heads, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(a.transpose(1, 2).reshape(b, s, d))
        h = self.mlp_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


def test_thunder_nvfuser_executor_loads_on_pyfuser():
    assert nvfuserex_module.nvfuser_available()
    ex = nvfuserex_module.nvfuserex
    assert ex is not None and ex.name == "nvfuser"
    import nvfuser_direct

    assert nvfuser_direct is pyfuser and nvfuser_direct.version() >= "0.2.34"


def _region_calls(trace_text: str) -> int:
    """Call sites of nvFusion regions in a Thunder execution trace (``... = nvFusion3(...)``)."""
    return len(re.findall(r"=\s*nvFusion\d+\(", trace_text))


def test_llama_block_forward_backward_bf16_matches_eager(monkeypatch):
    torch.manual_seed(0)
    device = "cuda"
    model = DecoderBlock().to(device=device, dtype=torch.bfloat16)
    x = torch.randn(2, 64, 256, device=device, dtype=torch.bfloat16)
    grad_out = torch.randn(2, 64, 256, device=device, dtype=torch.bfloat16)

    # Count the fusions pyfuser executes: each nvFusion region Thunder runs goes through a pyfuser executor.
    # Counted at the runtime's executor cache, which every call reaches: fd.execute's common call skips
    # CompiledFusion.execute. Patched before thunder.jit builds the executors, which bind the method then.
    from pyfuser.runtime.executor_cache import FusionExecutorCache

    calls = []
    original = FusionExecutorCache.execute

    def counting(self, *args, **kwargs):
        calls.append(id(self))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(FusionExecutorCache, "execute", counting)

    jmodel = thunder.jit(model, executors=[nvfuserex_module.nvfuserex])

    def step(fn):
        model.zero_grad(set_to_none=True)
        xi = x.clone().requires_grad_(True)
        out = fn(xi)
        out.backward(grad_out)
        return out.detach(), xi.grad, [p.grad.clone() for p in model.parameters()]

    step(jmodel)  # compiles
    calls.clear()
    out_j, gx_j, gp_j = step(jmodel)
    fw_text = str(thunder.last_traces(jmodel)[-1])
    bw_text = str(thunder.last_backward_traces(jmodel)[-1])
    sites = _region_calls(fw_text) + _region_calls(bw_text)
    assert _region_calls(fw_text) > 0 and _region_calls(bw_text) > 0, "Thunder gave no region to the nvFuser executor"
    assert len(calls) == sites, f"pyfuser ran {len(calls)} fusions for {sites} nvFusion call sites"

    out_e, gx_e, gp_e = step(model)
    torch.testing.assert_close(out_j, out_e, atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(gx_j, gx_e, atol=5e-2, rtol=5e-2)
    for (name, _), gj, ge in zip(model.named_parameters(), gp_j, gp_e):
        torch.testing.assert_close(gj, ge, atol=1e-1, rtol=5e-2, msg=lambda m, name=name: f"grad of {name}: {m}")
