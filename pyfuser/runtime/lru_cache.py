"""LRUCache(max_fusions): structurally equal fusions share one FusionExecutorCache (caching.md, level 0)."""

from __future__ import annotations

import threading
from collections import OrderedDict

from ..frontend.printer import fusion_to_python
from .executor_cache import FusionExecutorCache


class LRUCache:
    def __init__(self, max_fusions: int = 100):
        if max_fusions < 1:
            raise ValueError(f"LRUCache: max_fusions must be >= 1, got {max_fusions}")
        self.max_fusions = max_fusions
        self._cache: "OrderedDict[str, FusionExecutorCache]" = OrderedDict()
        self._lock = threading.Lock()

    def cache_compile(self, fusion) -> FusionExecutorCache:
        """The executor for ``fusion`` (a Fusion or FusionDefinition), shared with any structurally equal one."""
        fusion = getattr(fusion, "fusion", fusion)
        # The printed definition is complete (it round-trips), so equal text means equal structure.
        key = fusion_to_python(fusion)
        with self._lock:
            fec = self._cache.get(key)
            if fec is None:
                fec = FusionExecutorCache(fusion)
                self._cache[key] = fec
                if len(self._cache) > self.max_fusions:
                    self._cache.popitem(last=False)
            else:
                self._cache.move_to_end(key)
            return fec

    def num_fusions(self) -> int:
        return len(self._cache)
