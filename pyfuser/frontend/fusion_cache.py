"""nvFuser's cache protocol: ``LRUCache.cache_compile(fusion)`` and the executor ``fd.fec`` holds.

``LRUCache(max_fusions)`` maps a finished fusion to one :class:`CompiledFusion`, shared by every structurally
equal fusion (the printed definition is the key: it round-trips, so equal text means equal structure). The
protocol nvFuser's users follow::

    fd.fec = cache.cache_compile(fd.fusion)
    del fd._fusion          # the definition now lives in the executor
    fd.execute(inputs)      # runs fd.fec

``LruFusionCache`` is the decorator form: it compiles the FusionDefinition a function returns.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections import OrderedDict
from typing import Any, Sequence

from ..errors import FusionDefinitionError, UnsupportedOpError
from ..ir.fusion import Fusion
from . import profiler
from .printer import fusion_to_python


class CompiledFusion:
    """The executor of one fusion (nvFuser's ``FusionExecutorCache`` as Python sees it).

    ``fusion()`` returns the fusion; ``execute`` takes nvFuser's keywords (``_enable_options``...) or ours
    (``enable_options``...). Everything else (``stats``, ``num_runtimes()``, ``last_runtime``) is the runtime's
    executor cache."""

    def __init__(self, fusion: Fusion, fusion_id: int = 0):
        # Imported here: pyfuser.ops still imports a helper from this package while it is being loaded.
        from ..runtime.executor_cache import FusionExecutorCache

        refuse_device_meshes(fusion, "a fusion cache")
        self._fusion = fusion
        self._fec = FusionExecutorCache(fusion)
        # The common call, inputs only and no profiler listening: FusionDefinition.execute calls this directly,
        # one Python frame (~0.3 us) less than execute().
        self.execute_inputs = self._fec.execute
        self.fusion_id = fusion_id
        if hasattr(fusion, "_executor_ref"):
            fusion._executor_ref = weakref.ref(self._fec)

    def fusion(self) -> Fusion:
        return self._fusion

    def execute(self, inputs: Sequence[Any], *, device=None, enable_options=(), disable_options=(),
                _enable_options=(), _disable_options=()) -> list:
        if device is None and not (enable_options or _enable_options or disable_options or _disable_options):
            outputs = self._fec.execute(inputs)  # the common call: no keywords to pass on
        else:
            outputs = self._fec.execute(inputs, device=device,
                                        enable_options=_merge(enable_options, _enable_options),
                                        disable_options=_merge(disable_options, _disable_options))
        if profiler._active:
            profiler.notify(self.fusion_id, self._fec.last_runtime)
        return outputs

    @property
    def executor_cache(self):
        """The runtime's FusionExecutorCache."""
        return self._fec

    @property
    def last_runtime(self):
        return self._fec.last_runtime

    @property
    def stats(self):
        return self._fec.stats

    def num_runtimes(self) -> int:
        return self._fec.num_runtimes()

    def is_compiled(self, inputs: Sequence[Any]) -> bool:
        """Whether a runtime for these inputs' signature exists (the next execute with them is a hit)."""
        return self._fec.has_runtime(inputs)

    def get_cuda_kernel(self, inputs: Sequence[Any] = ()) -> str:
        """pyfuser generates Triton, not CUDA C++: the generated Triton source of the last execution."""
        return self._fusion.print_kernel() if hasattr(self._fusion, "print_kernel") else ""

    def get_output_shardings(self):
        from ..errors import UnsupportedOpError

        raise UnsupportedOpError(
            "FusionExecutorCache.get_output_shardings: multi-device execution is not supported by pyfuser yet")

    def __getattr__(self, name: str):
        # Scheduling and IR-dumping entry points of nvFuser's C++ executor have no counterpart here.
        if name.startswith("_"):
            raise AttributeError(name)
        if name in _UNSUPPORTED_FEC:
            from ..errors import UnsupportedOpError

            raise UnsupportedOpError(f"FusionExecutorCache.{name}: {_UNSUPPORTED_FEC[name]}")
        return getattr(self._fec, name)


_UNSUPPORTED_FEC = {
    "get_scheduled_ir": "pyfuser has no scheduled IR (it generates Triton from segments); use fd.last_execution()",
    "get_most_recent_scheduled_ir": "pyfuser has no scheduled IR; use fd.last_execution()",
    "get_most_recent_runtime": "use fd.last_runtime()",
}


def _merge(ours, theirs):
    """Options given under our keyword or nvFuser's; passed on untouched when only one is given, so that the
    runtime's own check of the argument (a list of names, not a string) sees what the caller wrote."""
    if not theirs:
        return ours
    if not ours:
        return theirs
    return list(ours) + list(theirs)


def structural_key(fusion: Fusion) -> str:
    return fusion_to_python(fusion, canonical=True)


class LRUCache:
    """Structurally equal fusions share one executor; the least recently used is evicted past max_fusions."""

    def __init__(self, max_fusions: int = 100):
        if isinstance(max_fusions, bool) or not isinstance(max_fusions, int) or max_fusions < 1:
            raise ValueError(f"LRUCache: max_fusions must be an int >= 1, got {max_fusions!r}")
        self.max_fusions = max_fusions
        # key -> [executor, hits]; most recently used last
        self._items: "OrderedDict[str, list]" = OrderedDict()
        self._lock = threading.Lock()
        self._lookups = 0
        self._hits = 0
        self._compiled = 0

    def cache_compile(self, fusion) -> CompiledFusion:
        """The executor for ``fusion`` (a Fusion, or a FusionDefinition), shared with any structurally equal one."""
        fusion = _fusion_of(fusion)
        if not fusion.frozen:
            raise FusionDefinitionError(
                "cache_compile: the fusion is still being defined (leave the `with` block first)"
            )
        refuse_device_meshes(fusion, "LRUCache.cache_compile")  # before the lookup: shardings are not in the key
        key = structural_key(fusion)
        with self._lock:
            self._lookups += 1
            item = self._items.get(key)
            if item is not None:
                self._hits += 1
                item[1] += 1
                self._items.move_to_end(key)
                return item[0]
            if len(self._items) >= self.max_fusions:
                self._items.popitem(last=False)
            executor = CompiledFusion(fusion, fusion_id=self._compiled)
            self._compiled += 1
            self._items[key] = [executor, 0]
            return executor

    def num_fusions(self) -> int:
        return len(self._items)

    def stats(self) -> str:
        """nvFuser's text: capacity, sizes, hits per entry from most to least recently used, hit rate."""
        with self._lock:
            lines = [f"Max Fusions Allowed: {self.max_fusions}"]
            if not self._items:
                return "\n".join(lines + ["The fusion cache is empty."]) + "\n"
            lines.append(f"Total Fusions in Cache: {len(self._items)}")
            lines.append(f"Total Unique Fusions Compiled: {self._compiled}")
            lines.append("Cache Hits by LRU ordering:")
            for i, (_, hits) in enumerate(reversed(self._items.values())):
                lines.append(f"\t{i} -> {hits} hits")
            rate = 0.0 if self._lookups == 0 else self._hits / self._lookups * 100.0
            lines.append(f"Cache Lookups: {self._lookups}")
            lines.append(f"Cache Hits: {self._hits}")
            lines.append(f"Hit Rate: {_format_rate(rate)}%")
            return "\n".join(lines) + "\n"


def _format_rate(rate: float) -> str:
    # C++ stream formatting of a float: 80 prints as "80", 66.6667 with six significant digits.
    return f"{rate:.6g}"


def _fusion_of(obj) -> Fusion:
    if isinstance(obj, Fusion):
        return obj
    fusion = getattr(obj, "fusion", None)
    if isinstance(fusion, Fusion):
        return fusion
    raise FusionDefinitionError(f"cache_compile: expected a Fusion or FusionDefinition, got {type(obj).__name__}")


class LruFusionCache:
    """Decorator: the FusionDefinition a function returns is compiled through one shared LRUCache.

    >>> @LruFusionCache(max_fusions=10)
    ... def make(n):
    ...     with FusionDefinition() as fd:
    ...         ...
    ...     return fd
    >>> make(4).execute(inputs); make.stats(); make.num_fusions()
    """

    def __init__(self, max_fusions: int = 16384):
        self.cache = LRUCache(max_fusions)

    def __call__(self, create_fusion_definition):
        @functools.wraps(create_fusion_definition)
        def wrapper(*args, **kwargs):
            fd = create_fusion_definition(*args, **kwargs)
            if not hasattr(fd, "fec"):
                fd.fec = self.cache.cache_compile(fd.fusion)
                del fd._fusion  # the definition now lives in the shared executor
            return fd

        wrapper.stats = self.cache.stats
        wrapper.num_fusions = self.cache.num_fusions
        wrapper.cache = self.cache
        return wrapper


def refuse_device_meshes(fusion: Fusion, what: str) -> None:
    """Run on one rank's blocks alone, a sharded fusion would compute a wrong result (docs/multidevice.md): it runs
    only through fd.execute or execute_with_dtensors."""
    if fusion.has_device_mesh:
        raise UnsupportedOpError(f"{what}: the fusion has device meshes; run it with FusionDefinition.execute or "
                                 "execute_with_dtensors")


def executor_for(fusion: Fusion) -> CompiledFusion:
    """A private executor (what ``fd.execute`` makes when no cache was used)."""
    return CompiledFusion(fusion)


__all__ = ["CompiledFusion", "LRUCache", "LruFusionCache", "executor_for"]
