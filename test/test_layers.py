"""The package's layering, read from the source: data flows down the pipeline, and each layer knows
only its own layer and the layers below it (the order and its reasons: tinychad/__init__.py).

in: every module of the tinychad package, parsed with `ast` (nothing is imported)
out: failures that list every violation at once, so that one run shows all the work that remains.
An import is any `import tinychad.x`, `from tinychad(.x) import y`, relative form, at module level,
inside a function or under `if TYPE_CHECKING:` (a type is knowledge of the layer that defines it),
plus `importlib.import_module("tinychad.x")` and any string constant that is exactly a module's
dotted name (a table of modules to import later, as the device registry keeps).
`from tinychad.pkg import name` counts as importing the module `tinychad.pkg.name` when that is a
module, else the package `tinychad.pkg`. Importing `tinychad.a.b` runs `tinychad/a/__init__.py`
too; that parent is not checked, as a package's __init__ may sit higher than its modules (nn).
"""
from __future__ import annotations
import ast
import pathlib
import pytest

PACKAGE_DIR = pathlib.Path(__file__).resolve().parents[1] / "tinychad"

# The layer order, lowest first: a module may import modules of its own layer or of lower layers only.
# "x/*" is every module under the package x (its __init__ included); "x/__init__" is the package itself.
# A module is in the lowest layer that names it: nn/functional is in 8, the rest of nn/ in 9.
LAYERS: list[tuple[str, ...]] = [
  ("helpers", "dtype", "ops", "host"),                                    # 0 shared facts
  ("view",),                                                              # 1 shapes and strides
  ("codegen/*",),                                                         # 2 kernel tree -> linear IR
  ("renderer/*",),                                                        # 3 linear IR -> source
  ("runtime/*", "device"),                                                # 4 source -> binary -> run
  ("lazy",),                                                              # 5 the lazy graph
  ("engine/*", "viz", "export/*"),                                        # 6 schedule, realize, jit
  ("function",),                                                          # 7 autograd on LazyBuffers
  ("tensor", "indexing", "nn/functional", "distributed/comm"),            # 8 the front end
  ("nn/*", "optim", "data", "datasets", "compat", "models/*", "examples/*", "distributed/*", "__init__"),  # 9 on the front end
]

# Tensor is the front end's hub: some of its methods are defined in these modules (which need Tensor),
# and Tensor imports them inside those methods. Every other pair of modules imports one way only.
MUTUAL_IMPORTS_ALLOWED = {
  frozenset({"tinychad.tensor", "tinychad.indexing"}),        # Tensor.__getitem__/__setitem__/gather/scatter
  frozenset({"tinychad.tensor", "tinychad.nn.functional"}),   # Tensor.conv2d, max_pool2d, cross_entropy, ...
}


def module_files() -> dict[str, pathlib.Path]:
  """Dotted module name -> file, for every .py file of the package (a package is named by its __init__)."""
  modules = {}
  for path in sorted(PACKAGE_DIR.rglob("*.py")):
    parts = ("tinychad",) + path.relative_to(PACKAGE_DIR).with_suffix("").parts
    if parts[-1] == "__init__": parts = parts[:-1]
    modules[".".join(parts)] = path
  return modules


def layer_of(path: pathlib.Path) -> int | None:
  """The layer of a module, from LAYERS's patterns; None when no pattern names it."""
  relative = path.relative_to(PACKAGE_DIR).with_suffix("").as_posix()
  for number, patterns in enumerate(LAYERS):
    for pattern in patterns:
      if pattern.endswith("/*") and relative.startswith(pattern[:-1]): return number
      if relative == pattern: return number
  return None


def imports_of(source: str, package: str, modules: dict[str, pathlib.Path]) -> list[tuple[int, str, str]]:
  """(line, imported tinychad module, the import as written) for every import in a module's source;
  `package` is the package its relative imports start from (itself, for an __init__)."""
  found = []

  def add(node: ast.AST, target: str, written: str) -> None:
    if target == "tinychad" or target.startswith("tinychad."): found.append((node.lineno, target, written))

  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      for alias in node.names: add(node, alias.name, f"import {alias.name}")
    elif isinstance(node, ast.ImportFrom):
      if node.level:
        base = package.split(".")
        base = base[:len(base) - (node.level - 1)]
        source = ".".join(base + ([node.module] if node.module else []))
      else:
        source = node.module or ""
      written = f"from {'.' * node.level}{node.module or ''} import {', '.join(a.name for a in node.names)}"
      for alias in node.names:
        submodule = f"{source}.{alias.name}"
        add(node, submodule if submodule in modules else source, written)
    elif isinstance(node, ast.Call) and _is_import_module(node.func) and node.args:
      arg = node.args[0]
      if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        add(node, arg.value, f"import_module({arg.value!r})")
    elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "." in node.value and node.value in modules:
      add(node, node.value, f"the string {node.value!r} (a module to import)")
  # one entry per (line, module): an import_module call's argument is also a string constant
  unique = {}
  for line, target, written in found: unique.setdefault((line, target), written)
  return [(line, target, written) for (line, target), written in sorted(unique.items())]


def _is_import_module(func: ast.AST) -> bool:
  if isinstance(func, ast.Attribute): return func.attr == "import_module"
  return isinstance(func, ast.Name) and func.id == "import_module"


def _rel(path: pathlib.Path) -> str: return path.relative_to(PACKAGE_DIR.parent).as_posix()


def _module_for(target: str, modules: dict[str, pathlib.Path]) -> str | None:
  """The longest prefix of a dotted name that is a module of the package (an import of a name that
  isn't a module, import_module of an attribute path)."""
  while target and target not in modules: target = target.rpartition(".")[0]
  return target or None


def _graph() -> tuple[dict[str, pathlib.Path], dict[str, list[tuple[int, str, str]]]]:
  modules = module_files()
  edges = {}
  for module, path in modules.items():
    resolved = []
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for line, target, written in imports_of(path.read_text(), package, modules):
      known = _module_for(target, modules)
      if known is not None and known != module: resolved.append((line, known, written))
    edges[module] = resolved
  return modules, edges


def test_every_module_has_a_layer():
  modules = module_files()
  missing = [_rel(path) for path in modules.values() if layer_of(path) is None]
  if missing:
    pytest.fail("modules in no layer of test/test_layers.py's LAYERS (add them there and to the order in "
                "tinychad/__init__.py's docstring):\n  " + "\n  ".join(missing), pytrace=False)


def test_no_layer_imports_a_higher_one():
  modules, edges = _graph()
  violations = []
  for module, imports in edges.items():
    mine = layer_of(modules[module])
    if mine is None: continue
    for line, target, written in imports:
      theirs = layer_of(modules[target])
      if theirs is not None and theirs > mine:
        violations.append(f"{_rel(modules[module])}:{line} (layer {mine}) imports {target} (layer {theirs}): {written}")
  if violations:
    pytest.fail(f"{len(violations)} imports of a higher layer:\n  " + "\n  ".join(violations), pytrace=False)


def test_devices_lower_nothing_themselves():
  """A device is an allocator, a compiler and a program loader (with its renderer): lowering kernels to IR is
  codegen's, called by engine/realize.py, so nothing under runtime/ imports codegen/ (a GPU device says it wants
  codegen/gpu.py's lowering with `gpu_lowering`)."""
  modules, edges = _graph()
  found = [f"{_rel(modules[module])}:{line} imports {target}" for module, imports in edges.items()
           if module.startswith("tinychad.runtime") for line, target, _ in imports if target.startswith("tinychad.codegen")]
  assert not found, found


def test_no_two_modules_import_each_other():
  modules, edges = _graph()
  targets = {module: {target for _, target, _ in imports} for module, imports in edges.items()}

  def lines(a: str, b: str) -> str: return ", ".join(f"{_rel(modules[a])}:{line}" for line, t, _ in edges[a] if t == b)

  violations = []
  for module in sorted(edges):
    for other in sorted(targets[module]):
      if module < other and module in targets[other] and frozenset({module, other}) not in MUTUAL_IMPORTS_ALLOWED:
        violations.append(f"{module} <-> {other} ({lines(module, other)}; {lines(other, module)})")
  if violations:
    pytest.fail(f"{len(violations)} pairs of modules import each other:\n  " + "\n  ".join(violations), pytrace=False)


def test_every_module_has_a_docstring():
  missing = [_rel(path) for path in module_files().values() if not ast.get_docstring(ast.parse(path.read_text()))]
  if missing:
    pytest.fail("modules without a module docstring (what comes in, what goes out):\n  " + "\n  ".join(missing),
                pytrace=False)


def test_the_checker_sees_every_kind_of_import():
  """The reader itself: module level, in a function, relative, `from package import module`,
  import_module with a literal, and a table of module names all count."""
  source = (
    "import tinychad.lazy\n"
    "from tinychad import tensor as T\n"
    "from ..engine import schedule\n"
    "def f():\n"
    "  from .. import function\n"
    "  import importlib\n"
    "  importlib.import_module('tinychad.viz')\n"
    "TABLE = {'CPU': 'tinychad.export'}\n")
  modules = {name: PACKAGE_DIR for name in ("tinychad", "tinychad.lazy", "tinychad.tensor", "tinychad.engine",
                                            "tinychad.engine.schedule", "tinychad.function", "tinychad.viz",
                                            "tinychad.export", "tinychad.codegen")}
  found = [target for _, target, _ in imports_of(source, "tinychad.codegen", modules)]
  assert found == ["tinychad.lazy", "tinychad.tensor", "tinychad.engine.schedule", "tinychad.function",
                   "tinychad.viz", "tinychad.export"]
