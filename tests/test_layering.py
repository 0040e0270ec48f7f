"""The package's layers, checked from its own imports (docs/architecture.md, "Layers").

Every import of a pyfuser module by a pyfuser module counts, function-level imports included (they are still
dependencies, only deferred). A module may import modules of its own layer or of lower layers; the module graph
has no cycles; the semantic layers never import Triton.
"""

from __future__ import annotations

import ast
import pathlib

import pyfuser

ROOT = pathlib.Path(pyfuser.__file__).parent

# Lowest first. A package not listed here is an error: every folder must have a place.
LAYERS = [
    {"errors"},
    {"ir"},
    {"nvfp4"},  # the pure-torch NVFP4 reference and the GEMM's operand contract: no Triton, below the ops
    {"ops"},
    {"segment"},
    {"codegen"},
    {"kernels"},
    {"runtime"},
    {"frontend"},
    {"distributed"},  # multi-device fusions: local stages through the frontend, collectives on torch.distributed
    {"__init__", "__main__", "demo", "pytorch_utils", "multidevice", "nvfuser_names"},
]
NO_TRITON = {"errors", "ir", "nvfp4", "ops", "segment"}


def _module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def _top(module: str) -> str:
    return module.split(".")[0]


def _layer(module: str) -> int:
    top = _top(module)
    for i, layer in enumerate(LAYERS):
        if top in layer:
            return i
    raise AssertionError(f"pyfuser.{module}: its folder/module {top!r} has no layer in tests/test_layering.py")


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> list[str]:
    """Absolute pyfuser-relative module names an ImportFrom refers to (a name may be a submodule)."""
    if node.level == 0:
        if not (node.module or "").startswith("pyfuser"):
            return []
        base = node.module.split(".")[1:]
    else:
        parts = module.split(".") if module != "__init__" else []
        package = parts if is_package else parts[:-1]
        up = node.level - 1
        base = package[: len(package) - up] if up else package
        if node.module:
            base = base + node.module.split(".")
    targets = []
    for alias in node.names:
        candidate = ".".join(base + [alias.name])
        targets.append(candidate if _exists(candidate) else ".".join(base))
    return [t if t else "__init__" for t in targets]


def _exists(module: str) -> bool:
    p = ROOT.joinpath(*module.split("."))
    return p.with_suffix(".py").exists() or (p / "__init__.py").exists()


def _imports() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        module = _module_name(path)
        tree = ast.parse(path.read_text())
        deps: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                deps.update(_resolve(module, path.name == "__init__.py", node))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("pyfuser."):
                        deps.add(alias.name.split(".", 1)[1])
                    elif alias.name == "triton" or alias.name.startswith("triton."):
                        deps.add("<triton>")
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "triton":
                deps.add("<triton>")
        deps.discard(module)
        graph[module] = deps
    return graph


def test_every_import_goes_down_the_layers():
    bad = []
    for module, deps in _imports().items():
        for dep in deps:
            if dep == "<triton>":
                if _top(module) in NO_TRITON:
                    bad.append(f"pyfuser.{module} imports triton (its layer is semantics only)")
                continue
            if _layer(dep) > _layer(module):
                bad.append(f"pyfuser.{module} imports pyfuser.{dep}, a higher layer")
    assert not bad, "\n".join(sorted(bad))


def test_no_import_cycles():
    graph = {m: {d for d in deps if d != "<triton>"} for m, deps in _imports().items()}
    # Importing a submodule runs its package's __init__ first: a package depends on what its __init__ imports,
    # and that is already in the graph under the package's name.
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_the_rules_see_function_level_imports(tmp_path):
    """The checker itself: a deferred import inside a function is found (a rule that cannot fail proves nothing)."""
    tree = ast.parse("def f():\n    from ..runtime import plan\n")
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom))
    assert _resolve("ops.elementwise", False, node) == ["runtime.plan"]
    assert _layer("runtime.plan") > _layer("ops.elementwise")
