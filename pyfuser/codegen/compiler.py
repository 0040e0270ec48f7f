"""Turning generated source into a Triton JIT function, owned by whoever uses it.

``triton.jit`` reads a function's source from its file, so each generated kernel is written to a file and
imported from there. Equal source means one JIT function: every runtime that generates the same code shares it
(and Triton's own on-disk cache keeps the compiled binaries across processes).

Ownership: every user of a kernel (a runtime's launcher) acquires it with :func:`load_kernel` and is counted;
when the last one is garbage-collected (its fusion evicted from an LRUCache, or its FusionDefinition dropped),
the function, its module, its compiled specializations and its source file are released. Under the Triton
interpreter that includes the interpreter's own never-emptied table of rewritten functions. Source
files live in a folder of this process (under ``PYFUSER_CACHE_DIR`` if set, else the system's temporary folder),
removed at exit, so concurrent processes never touch each other's files.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
import threading
import time
import weakref

log = logging.getLogger("pyfuser")

_functions: dict = {}  # digest -> [JIT function, source path, number of owners]
_lock = threading.Lock()
_folder = None


def kernel_folder() -> str:
    """This process's folder of generated kernel sources."""
    global _folder
    if _folder is None or not os.path.isdir(_folder):
        base = os.environ.get("PYFUSER_CACHE_DIR") or None
        if base:
            os.makedirs(base, exist_ok=True)
        _folder = tempfile.mkdtemp(prefix="pyfuser-kernels-", dir=base)
        atexit.register(shutil.rmtree, _folder, True)
    return _folder


def live_kernels() -> int:
    """How many generated kernels are loaded now (tests check that this stays bounded)."""
    with _lock:
        _drain()
        return len(_functions)


_released: list = []  # digests whose owner was collected, not yet processed


def _release(digest: str) -> None:
    # A finalizer: it may run during any allocation (garbage collection), even inside load_kernel while _lock is
    # held, so it only records the release (list.append is atomic); _drain does the work under the lock.
    _released.append(digest)


def _drain() -> None:
    """Process recorded releases (caller holds _lock)."""
    while _released:
        digest = _released.pop()
        entry = _functions.get(digest)
        if entry is None:
            continue
        entry[2] -= 1
        if entry[2] <= 0:
            del _functions[digest]
            _unload(entry)


def _unload(entry: list) -> None:
    fn, path, _ = entry
    try:
        os.remove(path)
    except OSError:
        pass
    try:  # the interpreter caches a rewritten copy of every function it ran, forever
        from triton.runtime.interpreter import InterpretedFunction

        InterpretedFunction.rewritten_fn.pop(getattr(fn, "fn", None), None)
    except (ImportError, AttributeError):
        pass


def load_kernel(source: str, name: str, owner: object):
    """The JIT function ``name`` defined by ``source``, held for ``owner``: it is released when the last of its
    owners is garbage-collected."""
    digest = hashlib.sha1(source.encode()).hexdigest()[:20]
    with _lock:
        _drain()
        entry = _functions.get(digest)
        if entry is None:
            start = time.perf_counter()
            path = os.path.join(kernel_folder(), f"k_{digest}.py")
            with open(path, "w") as f:
                f.write(source)
            spec = importlib.util.spec_from_file_location(f"pyfuser_kernel_{digest}", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            entry = _functions[digest] = [getattr(module, name), path, 0]
            log.info("pyfuser: generated kernel %s loaded in %.1f ms (compiled at its first launch)", name,
                     (time.perf_counter() - start) * 1e3)
        entry[2] += 1
        weakref.finalize(owner, _release, digest)
    return entry[0]
