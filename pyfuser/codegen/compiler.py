"""Turning generated source into a Triton JIT function.

``triton.jit`` reads a function's source from its file, so each generated kernel is written to a file in the
kernel cache folder (``PYFUSER_CACHE_DIR``, default ``~/.cache/pyfuser/kernels``) named by the hash of its source,
and imported from there. Equal source means one module: compiled kernels are shared by every fusion and runtime
that generates the same code, and Triton's own cache keeps the binaries.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
import threading

_modules: dict = {}
_lock = threading.Lock()


def cache_dir() -> str:
    d = os.environ.get("PYFUSER_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "pyfuser", "kernels")
    os.makedirs(d, exist_ok=True)
    return d


def load_kernel(source: str, name: str):
    """The JIT function ``name`` defined by ``source`` (loaded once per distinct source)."""
    digest = hashlib.sha1(source.encode()).hexdigest()[:20]
    with _lock:
        mod = _modules.get(digest)
        if mod is None:
            path = os.path.join(cache_dir(), f"k_{digest}.py")
            if not os.path.exists(path):
                fd, tmp = tempfile.mkstemp(dir=cache_dir(), suffix=".py")
                with os.fdopen(fd, "w") as f:
                    f.write(source)
                os.replace(tmp, path)  # atomic: concurrent processes never see a half-written file
            spec = importlib.util.spec_from_file_location(f"pyfuser_kernel_{digest}", path)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            _modules[digest] = mod
    return getattr(mod, name)
