"""FusionDefinition: nvFuser's direct Python frontend (``with FusionDefinition() as fd: ...``)."""

from __future__ import annotations

import inspect
import numbers
import traceback
from typing import Any, Optional, Sequence, Union

import torch

from .ops_namespace import ops as _ops_namespace
from ..errors import FusionDefinitionError, FusionDtypeError, UnsupportedOpError
from ..ir.dtypes import DataType, from_torch_dtype
from ..ir.fusion import Fusion, FusionGuard
from ..ir.nodes import IterDomain, IterType, Scalar, TensorView, Val, Vector
from ..ops.common import literal_dtype
from . import profiler
from .defined_fusion import DefinedFusion
from .fusion_cache import executor_for, refuse_device_meshes
from .printer import fusion_to_python
from .repro import fake_copies, repro_script
from .validation import compare_outputs, reference_run
from .tensor_descriptor import alloc_order_from_stride_order, compute_tensor_descriptor

_NO_DTYPE = object()

# Runs a fusion whose tensors have device meshes: set by pyfuser.distributed (a higher layer) when it is imported.
SHARDED_EXECUTE = None


class FusionDefinition:
    """Define a fusion in a ``with`` block, then ``execute`` it.

    >>> with FusionDefinition() as fd:
    ...     t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
    ...     fd.add_output(fd.ops.relu(t0))
    >>> fd.execute([torch.randn(4, 4)])
    """

    ops = _ops_namespace

    def __init__(self):
        self._fusion: Optional[Fusion] = None
        self._guard: Optional[FusionGuard] = None

    # --- lifecycle ------------------------------------------------------------------------------------------
    @property
    def fusion(self) -> Fusion:
        """The fusion: the executor's once ``fd.fec`` exists (nvFuser's protocol deletes ``fd._fusion`` then)."""
        fec = self.__dict__.get("fec")
        if fec is not None:
            return fec.fusion()
        fusion = self.__dict__.get("_fusion")
        if fusion is None:
            raise FusionDefinitionError(
                "the FusionDefinition is empty: define it inside `with FusionDefinition() as fd:`"
            )
        return fusion

    @property
    def _executor(self):
        """The runtime's executor cache behind ``fd.fec`` (None before the first execute or cache_compile)."""
        fec = self.__dict__.get("fec")
        return None if fec is None else fec.executor_cache

    @property
    def sched(self):
        return _UNSUPPORTED_SCHEDULE

    def __enter__(self):
        self.__dict__.pop("fec", None)
        self._fusion = DefinedFusion()
        self._guard = FusionGuard(self._fusion)
        self._guard.__enter__()
        return self

    def __exit__(self, exc_type, exc_value, tb):
        self._guard.__exit__(exc_type, exc_value, tb)
        self._guard = None
        self._fusion.frozen = True
        if exc_type is not None:
            # nvFuser prints the failure and re-raises it.
            print(f"Exception occurred: {exc_type.__name__}: {exc_value}")
            if tb is not None:
                print("Traceback (most recent call last):")
                traceback.print_tb(tb)
        return False

    def __repr__(self) -> str:
        if self.__dict__.get("fec") is None and self.__dict__.get("_fusion") is None:
            return "<empty FusionDefinition>"
        return fusion_to_python(self.fusion)

    def __getattr__(self, name: str):
        # Only reached for missing attributes: nvFuser's manual-scheduling entry points get our error.
        if name in _UNSUPPORTED_FD:
            raise UnsupportedOpError(f"FusionDefinition.{name}: {_UNSUPPORTED_FD[name]}")
        raise AttributeError(f"'FusionDefinition' object has no attribute '{name}'")

    # --- inputs -----------------------------------------------------------------------------------------------
    def define_tensor(self, *args, **kwargs) -> TensorView:
        """Three overloads, as in nvFuser:

        1. ``define_tensor(shape, contiguity: list[bool|None], dtype, is_cpu, stride_order)``
        2. ``define_tensor(shape, contiguity: bool=False, dtype, is_cpu, stride_order)``
        3. ``define_tensor(sizes, strides, dtype, static_sizes, is_cpu)`` (what ``from_pytorch`` uses)

        Overload 3 is chosen by the keywords ``sizes``/``strides`` or by a list of ints as the second positional
        argument; positional arguments then bind in its order (the 4th is ``static_sizes``).
        ``shape``: -1 symbolic, 1 broadcast, other values static extents checked at run time. ``contiguity``
        is listed in allocation order; None marks a broadcast (expanded when its extent is not 1).
        """
        second = args[1] if len(args) > 1 else kwargs.get("contiguity")
        ints = isinstance(second, (list, tuple)) and all(
            isinstance(c, numbers.Integral) and not isinstance(c, bool) for c in second)
        # A 0-dim tensor's [] fits both: a bool in the 5th slot (is_cpu, not stride_order) means overload 3.
        by_strides = "sizes" in kwargs or "strides" in kwargs or (
            ints and (len(second) > 0 or (len(args) > 4 and isinstance(args[4], bool))))
        if ("sizes" in kwargs or "strides" in kwargs) and ({"shape", "contiguity", "stride_order"} & kwargs.keys()):
            # The layout comes from the strides; a second description of it would be silently ignored.
            raise FusionDefinitionError(
                "define_tensor: give either shape/contiguity/stride_order or sizes/strides, not both"
            )
        sig = _DEFINE_BY_STRIDES if by_strides else _DEFINE_BY_SHAPE
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as e:
            raise FusionDefinitionError(f"define_tensor: {e}") from None
        bound.apply_defaults()
        a = bound.arguments
        if by_strides:
            if a["sizes"] is None or a["strides"] is None:
                raise FusionDefinitionError("define_tensor: both 'sizes' and 'strides' are required")
            return self._define_from_strides(a["sizes"], a["strides"], a["dtype"], a["static_sizes"], a["is_cpu"])
        if a["shape"] is None:
            raise FusionDefinitionError("define_tensor: 'shape' (or 'sizes' and 'strides') is required")
        return self._define_from_shape(a["shape"], a["contiguity"], a["dtype"], a["is_cpu"], a["stride_order"])

    def _check_dtype(self, dtype) -> DataType:
        if not isinstance(dtype, DataType) or dtype is DataType.Null:
            raise FusionDtypeError(f"define_tensor: dtype must be a DataType other than Null, got {dtype!r}")
        return dtype

    def _check_shape(self, shape) -> list[int]:
        if not isinstance(shape, (list, tuple, torch.Size)):
            raise FusionDefinitionError(f"define_tensor: shape must be a list of ints, got {type(shape).__name__}")
        shape = list(shape)
        for i, s in enumerate(shape):
            if not isinstance(s, numbers.Integral) or isinstance(s, bool) or s < -1:
                raise FusionDefinitionError(
                    f"define_tensor: shape[{i}]={s!r} must be -1 (symbolic), 1 (broadcast) or an extent >= 0"
                )
        return [int(s) for s in shape]

    def _define_from_shape(self, shape, contiguity, dtype, is_cpu, stride_order) -> TensorView:
        shape = self._check_shape(shape)
        dtype = self._check_dtype(dtype)
        rank = len(shape)
        alloc = alloc_order_from_stride_order(stride_order, rank, "define_tensor: stride_order")
        order = alloc or list(range(rank))
        if contiguity is None or isinstance(contiguity, bool):
            flag = bool(contiguity)
            contiguity = [None if shape[d] == 1 else flag for d in order]
        if not isinstance(contiguity, (list, tuple)):
            raise FusionDefinitionError(
                "define_tensor: contiguity must be a bool or a list of True/False/None, "
                f"got {type(contiguity).__name__}"
            )
        contiguity = list(contiguity)
        if len(contiguity) != rank:
            raise FusionDefinitionError(
                f"define_tensor: contiguity has {len(contiguity)} entries but shape has rank {rank}"
            )
        if dtype is DataType.Float4_e2m1fn_x2 and rank > 0:
            # Packed pairs become FP4 elements: the fastest allocation dim doubles (frontend.md "Packed FP4").
            dtype, inner = DataType.Float4_e2m1fn, order[-1]
            if shape[inner] == 1:
                contiguity[rank - 1] = True if contiguity[rank - 1] is None else contiguity[rank - 1]
            if shape[inner] > 0:
                shape[inner] *= 2
        domain: list[Optional[IterDomain]] = [None] * rank
        for pos, d in enumerate(order):
            c = contiguity[pos]
            if c is not None and not isinstance(c, bool):
                raise FusionDefinitionError(f"define_tensor: contiguity[{pos}]={c!r} must be True, False or None")
            if shape[d] == 1:
                if c is not None:
                    raise FusionDefinitionError(
                        f"define_tensor: dim {d} has shape 1 (a broadcast), so its contiguity (position {pos}) "
                        f"must be None, got {c}"
                    )
                domain[d] = IterDomain.broadcast()
            elif c is None:
                domain[d] = IterDomain(None if shape[d] < 0 else shape[d], IterType.Broadcast, True)
            else:
                domain[d] = IterDomain.iteration(None if shape[d] < 0 else shape[d])
        if is_cpu and rank != 0:
            raise FusionDefinitionError(
                f"define_tensor: is_cpu=True is only allowed for 0-dim tensors, got rank {rank}"
            )
        tv = TensorView(self.fusion, domain, dtype, contiguity=contiguity, alloc_order=alloc, is_cpu=bool(is_cpu))
        self.fusion.add_statement(tv)
        self.fusion.add_input(tv)
        return tv

    def _define_from_strides(self, sizes, strides, dtype, static_sizes, is_cpu) -> TensorView:
        if sizes is None or strides is None:
            raise FusionDefinitionError("define_tensor: both 'sizes' and 'strides' are required")
        sizes, strides = list(sizes), list(strides)
        if len(sizes) != len(strides):
            raise FusionDefinitionError(f"define_tensor: {len(sizes)} sizes but {len(strides)} strides")
        for what, values in (("sizes", sizes), ("strides", strides)):
            for i, v in enumerate(values):
                # Real tensor sizes: -1 would otherwise pass as a symbolic extent.
                if not isinstance(v, numbers.Integral) or isinstance(v, bool) or (what == "sizes" and v < 0):
                    raise FusionDefinitionError(f"define_tensor: {what}[{i}]={v!r} must be an int >= 0")
        try:
            contiguity, stride_order = compute_tensor_descriptor(sizes, strides)
        except ValueError as e:
            raise FusionDefinitionError(f"define_tensor: {e}") from None
        shape = []
        for s, st in zip(sizes, strides):
            if s == 1:
                shape.append(1)
            elif static_sizes:
                shape.append(s)
            else:
                shape.append(-1)
        return self._define_from_shape(shape, contiguity, dtype, is_cpu, stride_order)

    def from_pytorch(self, tensor: torch.Tensor, static_sizes: bool = False) -> TensorView:
        """Define an input that matches ``tensor``'s dtype and layout (sizes symbolic unless static_sizes)."""
        if not isinstance(tensor, torch.Tensor):
            raise FusionDtypeError(f"from_pytorch: expected a torch.Tensor, got {type(tensor).__name__}")
        is_cpu = tensor.device.type == "cpu" and tensor.dim() == 0
        return self._define_from_strides(
            list(tensor.shape), list(tensor.stride()), from_torch_dtype(tensor.dtype), static_sizes, is_cpu
        )

    def define_scalar(self, value: Any = None, dtype: Any = _NO_DTYPE) -> Scalar:
        """A constant (value given) or a symbolic scalar input (value None, default dtype Double).

        As in nvFuser's bindings, ``define_scalar(DataType.Int)`` (the dtype alone, first) is a symbolic input."""
        if isinstance(value, DataType) and dtype is _NO_DTYPE:
            value, dtype = None, value
        if value is not None and (isinstance(value, Val) or not isinstance(value, (numbers.Number, bool))):
            raise FusionDtypeError(f"define_scalar: value must be a Python number or None, got {type(value).__name__}")
        if dtype is _NO_DTYPE:
            dtype = DataType.Double if value is None else literal_dtype(value)
        if not isinstance(dtype, DataType) or dtype is DataType.Null:
            raise FusionDtypeError(f"define_scalar: dtype must be a DataType, got {dtype!r}")
        if value is not None:
            value = _coerce_scalar(value, dtype)
        s = Scalar(self.fusion, dtype, value)
        s.declared = True
        self.fusion.add_statement(s)
        if value is None:
            self.fusion.add_input(s)
        return s

    def define_vector(self, values: Union[int, Sequence[Any]], dtype: DataType = DataType.Int) -> Vector:
        """``define_vector(n)``: n symbolic Int inputs (bound from a flattened list at execute);
        ``define_vector([..])``: a vector of ints / Int scalars."""
        if dtype not in (DataType.Int, DataType.Int32, DataType.Index):
            raise FusionDtypeError(f"define_vector: dtype must be an integer DataType, got {dtype!r}")
        if isinstance(values, numbers.Integral) and not isinstance(values, bool):
            if values < 0:
                raise FusionDefinitionError(f"define_vector: the number of elements must be >= 0, got {values}")
            elements = [self.define_scalar(None, dtype=dtype) for _ in range(int(values))]
        else:
            elements = []
            for i, v in enumerate(values):
                if isinstance(v, Scalar):
                    # Vectors are shapes: a Double element could not be an extent.
                    if v.dtype not in (DataType.Int, DataType.Int32, DataType.Index):
                        raise FusionDtypeError(f"define_vector: element {i} ({v.name}) is {v.dtype!r}, not an integer")
                    elements.append(v)
                elif isinstance(v, numbers.Integral) and not isinstance(v, bool):
                    elements.append(Scalar(self.fusion, dtype, int(v)))
                else:
                    raise FusionDtypeError(f"define_vector: element {i} must be an int or Int scalar, got {v!r}")
        vec = Vector(self.fusion, elements, dtype)
        self.fusion.add_statement(vec)
        return vec

    # --- outputs ----------------------------------------------------------------------------------------------
    def add_output(self, output: Val, alias_input: Optional[TensorView] = None) -> None:
        """Return ``output`` from execute; with ``alias_input``, write it into that input's buffer instead."""
        if not isinstance(output, (TensorView, Scalar)):
            raise FusionDefinitionError(f"add_output: expected a TensorView or Scalar, got {type(output).__name__}")
        if output.fusion is not self.fusion:
            raise FusionDefinitionError(f"add_output: {output.name} belongs to another fusion")
        if alias_input is not None:
            if not isinstance(alias_input, TensorView) or alias_input not in self.fusion.inputs:
                raise FusionDefinitionError("add_output: alias_input must be a tensor input of this fusion")
            if not isinstance(output, TensorView):
                raise FusionDefinitionError("add_output: only tensors can be written into an input")
            if output.dtype is not alias_input.dtype:
                raise FusionDtypeError(
                    f"add_output: {output.name} is {output.dtype!r} but alias input {alias_input.name} "
                    f"is {alias_input.dtype!r}"
                )
            if output.ndim != alias_input.ndim:
                raise FusionDefinitionError(
                    f"add_output: {output.name} has rank {output.ndim} but alias input {alias_input.name} "
                    f"has rank {alias_input.ndim}"
                )
        self.fusion.add_output(output, alias_input)

    # --- execution --------------------------------------------------------------------------------------------
    def _check_definition(self) -> None:
        """nvFuser's errors for executing a definition that was never made or has nothing in it."""
        if self.__dict__.get("_fusion") is None:
            raise NotImplementedError(
                "Fusion does not exist! Use `with FusionDefinition() as fd: ...` to define a fusion.")
        if not self._fusion.output_log:
            raise NotImplementedError("Fusion is empty! Add outputs with fd.add_output(...).")

    def _get_executor(self):
        fec = self.__dict__.get("fec")
        if fec is None:
            self._check_definition()
            if "ke" in self.__dict__:
                raise AssertionError("KernelExecutor already exists! Use manual_execute() to execute the fusion.")
            if self._guard is not None:
                # Still inside `with`: later ops, inputs or outputs would change the fusion under a cached
                # executor (a stale one fails with "no value bound"); run this one fresh and keep none.
                return executor_for(self._fusion)
            fec = self.fec = executor_for(self._fusion)
        return fec

    def execute(
        self,
        inputs: Sequence[Any],
        *,
        device=None,
        save_repro_inputs: bool = False,
        _enable_options: Sequence[str] = (),
        _disable_options: Sequence[str] = (),
        profile: bool = False,
    ) -> list:
        """Run the fusion; returns a list of outputs in add_output order (alias-only outputs excluded).

        The first call makes ``fd.fec``, the fusion's executor (or uses the one ``cache_compile`` gave).
        ``save_repro_inputs=True`` keeps fake copies of the inputs for :meth:`last_repro_script`. ``device``:
        None, an int (CUDA index), a string or a torch.device."""
        del profile  # accepted for compatibility: use PythonProfiler to profile
        state = self.__dict__
        fusion = state.get("_fusion")
        if fusion is not None and fusion.has_device_mesh and SHARDED_EXECUTE is not None:
            # local shards in and out (docs/multidevice.md)
            return SHARDED_EXECUTE(self, inputs, _enable_options, _disable_options)
        fec = state.get("fec")
        if fec is None:
            fec = self._get_executor()
        if save_repro_inputs:
            self.fake_inputs = fake_copies(inputs)
        if device is None and not _enable_options and not _disable_options:  # the common call
            if not profiler._active:
                return fec.execute_inputs(inputs)
            return fec.execute(inputs)
        return fec.execute(inputs, device=_device_arg(device), enable_options=_enable_options,
                           disable_options=_disable_options)

    def manual_execute(self, inputs: Sequence[Any], heuristic_params=None) -> list:
        """Evaluate the fusion op by op with ATen (the reference executor), bypassing segmentation and caches.

        nvFuser runs a user-scheduled kernel here; pyfuser has no manual scheduling, so the whole definition is
        evaluated unscheduled. As in nvFuser, a definition runs either through execute or through this."""
        from ..runtime.evaluator import run_reference

        _refuse_device_meshes(self, "manual_execute")
        if heuristic_params is not None:
            raise UnsupportedOpError("FusionDefinition.manual_execute(heuristic_params=...): pyfuser has no manual "
                                     "scheduling (heuristic parameters)")
        if self.__dict__.get("fec") is not None:
            raise AssertionError("FusionExecutorCache already exists! Use execute() to execute the fusion.")
        self._check_definition()
        self.ke = _REFERENCE_EXECUTOR
        outputs = run_reference(self.fusion, inputs)
        if profiler._active:
            profiler.notify(0, None, scheduler="user", fusion=self.fusion)
        return outputs

    def validate(self, inputs: Sequence[Any], reference_outputs: Optional[Sequence[Any]] = None,
                 device=None, **tolerances) -> list:
        """Execute, compare with ``reference_outputs`` and return the outputs.

        Without references the fusion is also evaluated op by op with ATen on copies of the inputs, and the
        outputs must match it in values, shapes, dtypes and strides. Given references are compared in values,
        shapes and dtypes. Tolerances are nvFuser's, by dtype and reduction size (frontend/validation.py);
        ``atol``/``rtol`` override them. Raises AssertionError on a mismatch."""
        _refuse_device_meshes(self, "validate")
        references, sizes = reference_run(self.fusion, inputs)
        check_strides = reference_outputs is None
        outputs = self.execute(inputs, device=device)
        compare_outputs(outputs, references if check_strides else reference_outputs, check_strides, sizes,
                        **tolerances)
        return outputs

    def manual_validate(self, inputs: Sequence[Any], reference_outputs: Optional[Sequence[Any]] = None,
                        **tolerances) -> list:
        """:meth:`manual_execute`, then the comparison of :meth:`validate`; returns the outputs."""
        _refuse_device_meshes(self, "manual_validate")
        references, sizes = reference_run(self.fusion, inputs)
        check_strides = reference_outputs is None
        outputs = self.manual_execute(inputs)
        compare_outputs(outputs, references if check_strides else reference_outputs, check_strides, sizes,
                        **tolerances)
        return outputs

    # --- repro scripts ----------------------------------------------------------------------------------------
    def repro_script_for(self, inputs: Optional[Sequence[Any]] = None) -> str:
        """A standalone script that rebuilds this fusion and, given inputs, runs it on tensors like them."""
        return repro_script(self, inputs)

    def last_repro_script(self) -> str:
        fake = self.__dict__.get("fake_inputs")
        if fake is None:
            raise AssertionError(
                "fd.last_repro_script() cannot provide a repro because fd.execute(inputs, save_repro_inputs=True) "
                "was not executed!")
        return repro_script(self, fake)

    # --- introspection ----------------------------------------------------------------------------------------
    def last_runtime(self):
        """The runtime (segments, boundary layouts) used by the most recent execute, or None."""
        return None if self._executor is None else self._executor.last_runtime

    def last_execution(self) -> list:
        """Reports of the segments the last execute ran: kind, Triton kernel (name, source) or ATen (reason),
        and the layout of every boundary tensor. Empty before the first execute."""
        rt = self.last_runtime()
        return [] if rt is None else rt.describe()

    def segments(self):
        rt = self.last_runtime()
        return [] if rt is None else rt.segments


def _refuse_device_meshes(fd, what: str) -> None:
    fusion = fd.__dict__.get("_fusion")  # (gone after the cache protocol's `del fd._fusion`)
    if fusion is not None:
        refuse_device_meshes(fusion, f"FusionDefinition.{what}")


def _device_arg(device):
    """nvFuser's device argument: None, a CUDA index, or anything torch.device accepts."""
    if device is None or isinstance(device, torch.device):
        return device
    if isinstance(device, numbers.Integral) and not isinstance(device, bool):
        return torch.device("cuda", int(device))
    if isinstance(device, str):
        return torch.device(device)
    raise FusionDefinitionError(f"execute: device must be None, an int, a string or a torch.device, got {device!r}")


class _ReferenceExecutor:
    """What ``fd.ke`` holds after manual_execute: the unscheduled ATen evaluation (no KernelExecutor here)."""

    def is_compiled(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "<pyfuser reference executor>"


_REFERENCE_EXECUTOR = _ReferenceExecutor()

# nvFuser's manual-scheduling and multi-device attributes of a FusionDefinition, with why they are missing.
_NO_SCHEDULING = "pyfuser has no manual scheduling API (it schedules every segment itself)"
_UNSUPPORTED_FD = {
    "schedule": _NO_SCHEDULING,
    "sched": _NO_SCHEDULING,
    "id_model": _NO_SCHEDULING,
    "idm": _NO_SCHEDULING,
    "multidevice_schedule": "multi-device execution is not supported by pyfuser yet",
}


class _UnsupportedSchedule:
    """``fd.sched``: every scheduling call (split, merge, parallelize, cache_after, ...) raises our error."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise UnsupportedOpError(f"fd.sched.{name}: {_NO_SCHEDULING}")


_UNSUPPORTED_SCHEDULE = _UnsupportedSchedule()


def _by_shape(shape=None, contiguity=None, dtype=DataType.Float, is_cpu=False, stride_order=()):
    pass


def _by_strides(sizes=None, strides=None, dtype=DataType.Float, static_sizes=False, is_cpu=False):
    pass


# The two parameter lists of define_tensor (nvFuser's overloads 1/2 and 3), for binding its arguments.
_DEFINE_BY_SHAPE = inspect.signature(_by_shape)
_DEFINE_BY_STRIDES = inspect.signature(_by_strides)


def _coerce_scalar(value, dtype: DataType):
    if isinstance(value, complex) and dtype not in (DataType.ComplexFloat, DataType.ComplexDouble):
        raise FusionDtypeError(f"define_scalar: complex value {value!r} cannot have dtype {dtype!r}")
    if dtype is DataType.Bool:
        return bool(value)
    if dtype in (DataType.Int, DataType.Int32, DataType.Index, DataType.UInt64):
        if isinstance(value, float) and not value.is_integer():
            raise FusionDtypeError(f"define_scalar: {value!r} is not an integer but dtype is {dtype!r}")
        return int(value)
    if dtype in (DataType.ComplexFloat, DataType.ComplexDouble):
        return complex(value)
    return float(value)
