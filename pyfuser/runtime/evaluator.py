"""The reference executor: evaluate expressions op by op with ATen.

It is the CPU path, the fallback for segments without generated kernels, the engine of meta inference (the same
evaluators run on meta tensors) and the reference every other executor is compared with.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

import torch

from ..errors import FusionExecutionError, PyfuserError
from ..ir.fusion import Fusion
from ..ir.nodes import Expr, Scalar, Val, Vector
from ..ops import run_context


class Env(dict):
    """Runtime values keyed by id(Val). Constant scalars resolve to their value without an entry.

    ``device`` is the device the run happens on (see :func:`bind_inputs`). Ops without tensor operands
    (factories) read it through :func:`run_device`, since nothing else tells them where to allocate.
    """

    def __init__(self, *args, device: Optional[torch.device] = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.device = device

    def value(self, v: Val) -> Any:
        try:
            return self[id(v)]
        except KeyError:
            if isinstance(v, Scalar) and v.is_constant:
                return v.value
            if isinstance(v, Vector):
                return [self.value(e) for e in v.elements]
            raise FusionExecutionError(f"internal error: no value bound for {v.name}") from None


def resolve(obj: Any, env: Env) -> Any:
    if isinstance(obj, Val):
        return env.value(obj)
    if isinstance(obj, list):
        return [resolve(x, env) for x in obj]
    if isinstance(obj, tuple):
        return tuple(resolve(x, env) for x in obj)
    if isinstance(obj, dict):
        return {k: resolve(x, env) for k, x in obj.items()}
    return obj


def run_expr(expr: Expr, env: Env, use_kernel: bool = False) -> None:
    """Evaluate one expression with its operands from ``env`` (the reference and meta-inference path; cached
    calls run flat plans instead, pyfuser/runtime/plan.py)."""
    args = resolve(expr.args, env)
    kwargs = resolve(expr.kwargs, env)
    token = run_context.enter(run_context.RunContext(env.device))
    try:
        # The run's device says whether this is meta inference: no need to scan the arguments.
        on_meta = env.device is not None and env.device.type == "meta"
        result = expr.op.run(expr, args, kwargs, use_kernel, on_meta)
    except PyfuserError:
        raise
    except (RuntimeError, ValueError, TypeError, IndexError) as e:
        raise FusionExecutionError(
            f"fd.ops.{expr.op.name} ({', '.join(o.name for o in expr.outputs)}) failed: {e}"
        ) from e
    finally:
        run_context.leave(token)
    outs = expr.outputs
    if len(outs) == 1:
        result = (result,)
    for out, value in zip(outs, result):
        env[id(out)] = value
        if isinstance(out, Vector):
            for e, x in zip(out.elements, value):
                env[id(e)] = x


def run_exprs(exprs: Iterable[Expr], env: Env, use_kernels: bool = False) -> None:
    """``use_kernels``: ops with a hand-written Triton kernel (OpDef.kernel) run it instead of the reference."""
    for e in exprs:
        run_expr(e, env, use_kernels)


def bind_inputs(fusion: Fusion, flat_inputs: Sequence[Any], device: Optional[torch.device] = None) -> Env:
    """Bind inputs by position. The run's device is ``device`` if given, else that of the first tensor input
    that is not a CPU scalar (``is_cpu``), else "meta" if any tensor input is a meta tensor (meta inference of
    a fusion whose only tensors are CPU scalars), else ``run_context.default_device()``."""
    if device is not None and not isinstance(device, torch.device):
        device = torch.device(device)
    env = Env(device=device)
    for v, x in zip(fusion.inputs, flat_inputs):
        env[id(v)] = x
    if env.device is None:
        tensors = [(v, x) for v, x in zip(fusion.inputs, flat_inputs) if isinstance(x, torch.Tensor)]
        device = next((x.device for v, x in tensors if not getattr(v, "is_cpu", False)), None)
        if device is None and any(x.device.type == "meta" for _, x in tensors):
            device = torch.device("meta")
        env.device = device if device is not None else run_context.default_device()
    return env


def collect_outputs(fusion: Fusion, env: Env) -> list:
    """Returned outputs in add_output order, after writing alias outputs into their input buffers."""
    if not fusion.aliases:
        return [env.value(v) for v in fusion.outputs]
    for val, alias_input in fusion.aliases:
        target = env.value(alias_input)
        value = env.value(val)
        if target.device.type != "meta":
            with torch.no_grad():
                target.copy_(value)
    return [env.value(v) for v in fusion.outputs]


def run_reference(fusion: Fusion, inputs: Sequence[Any]) -> list:
    """Validate ``inputs`` against the definition and evaluate the whole fusion with ATen."""
    from .validation import InputBinder

    flat = InputBinder(fusion).bind(inputs)
    env = bind_inputs(fusion, flat)
    with torch.no_grad():
        run_exprs(fusion.exprs, env)
        return collect_outputs(fusion, env)
