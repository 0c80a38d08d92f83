"""The package's shape: layers that only point down, no cycles, one place that picks a backend.

``lint-imports`` checks the contracts in ``.importlinter`` (layers, the backends' independence,
no import cycles in any package, the library never importing the development harness); the other
checks read the source.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "tvm_roller"
# Where a target kind string may pick code: the registry and the backends; the CPU device model
# reads LLVM targets (its own kind check) and the target normalisation completes them; tools
# name targets as data (defaults, test lists).
KIND_STRINGS_ALLOWED = ("backends/", "hardware/cpu.py", "hardware/host_name.py",
                        "hardware/target.py", "hardware/calibrate.py", "tools/")


def _modules():
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        name = ".".join(rel.parts)
        pkg = name[:-len(".__init__")] if name.endswith(".__init__") else name.rsplit(".", 1)[0]
        yield path, name.removesuffix(".__init__"), pkg, ast.parse(path.read_text())


def test_import_contracts_hold():
    try:
        import importlinter.cli  # noqa: F401
    except ImportError:
        pytest.fail("import-linter (a test dependency) is not installed")
    # its command through this interpreter: no console script or shell looked up on a PATH
    # (in a virtual environment over the system's packages the script is not beside python)
    env = {"PYTHONPATH": str(ROOT), "PATH": str(Path(sys.executable).parent)}
    res = subprocess.run([sys.executable, "-c", "import sys; from importlinter.cli import "
                          "lint_imports_command; sys.argv[0] = 'lint-imports'; "
                          "lint_imports_command()", "--config", str(ROOT / ".importlinter")],
                         cwd=ROOT, capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "0 broken" in res.stdout


def test_no_private_names_imported_across_packages():
    bad = []
    for path, _, pkg, tree in _modules():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.ImportFrom) and node.module
                    and node.module.startswith("tvm_roller")):
                continue
            is_pkg = (ROOT / node.module.replace(".", "/")).is_dir()
            source_pkg = node.module if is_pkg else node.module.rsplit(".", 1)[0]
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__") \
                        and source_pkg != pkg:
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.module}.{alias.name}")
    assert not bad, bad


def test_the_library_never_imports_the_harness():
    """The development harness (python/harness) is not shipped: no module of tvm_roller imports
    it, neither by an import statement (which lint-imports also sees) nor by name at run time."""
    bad = []
    for path, _, _, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(
                    node.func, "id", "")) in ("import_module", "__import__") and node.args \
                    and isinstance(node.args[0], ast.Constant):
                names = [str(node.args[0].value)]
            else:
                continue
            bad += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names
                    if n == "harness" or n.startswith("harness.")]
    assert not bad, bad
    assert not (PKG / "harness").exists() and (ROOT / "python" / "harness" / "__init__.py").is_file()


def test_target_kinds_pick_code_only_in_the_registry_and_backends():
    bad = []
    for path, _, _, tree in _modules():
        rel = path.relative_to(PKG).as_posix()
        if rel.startswith(KIND_STRINGS_ALLOWED):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in ("llvm", "cuda"):
                bad.append(f"{rel}:{node.lineno} {node.value!r}")
    assert not bad, bad


def test_one_registry_line_per_backend():
    from tvm_roller.backends import registry
    from tvm_roller.backends.base import Backend
    from tvm_roller.hardware import normalize_target

    kinds = registry.target_kinds()
    assert set(kinds) == {"llvm", "cuda"}
    for kind in kinds:
        b = registry.backend_for(normalize_target({"kind": kind} if kind == "llvm" else
                                                  "nvidia/nvidia-h100"))
        assert isinstance(b, Backend) and b.rules, kind
        assert len({r.name for r in b.rules}) == len(b.rules), "rule names are unique"


# -- the layers ------------------------------------------------------------------------------------
def _main_layers() -> list:
    """The package's layers, top first, as .importlinter's main contract lists them."""
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(ROOT / ".importlinter")
    lines = cfg["importlinter:contract:layers"]["layers"].strip().splitlines()
    return [[name.strip() for name in line.split("|")] for line in lines]


_IMPORT_LAYERS = r'''
import importlib, os, pkgutil, sys, traceback
# the third-party packages, loaded once here: each layer's child (forked below) starts with no
# module of tvm_roller imported and imports only those (TVM's own import took most of the time)
import numpy, tvm, tvm.relax, tvm.s_tir  # noqa: F401
assert not [m for m in sys.modules if m.startswith("tvm_roller")]


def check(layer, blocked):
    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if any(name == b or name.startswith(b + ".") for b in blocked):
                raise ImportError(f"{name} is a layer above the one imported")
            return None

    sys.meta_path.insert(0, Blocker())
    for name in layer:
        mod = importlib.import_module("tvm_roller." + name)
        for info in pkgutil.walk_packages(getattr(mod, "__path__", []), mod.__name__ + "."):
            importlib.import_module(info.name)


failed = []
for arg in sys.argv[1:]:  # "layer,names;names,above"
    layer, above = (part.split(",") for part in arg.split(";"))
    pid = os.fork()
    if pid == 0:
        try:
            check(layer, tuple("tvm_roller." + n for n in above if n))
        except BaseException:
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(1)
        os._exit(0)
    if os.waitpid(pid, 0)[1]:
        failed.append(layer)
print("failed:", failed, file=sys.stderr)
sys.exit(1 if failed else 0)
'''


def test_each_layer_imports_without_the_layers_above_it():
    """Importing a layer (every module of it) never needs a layer above it: bottom up, each
    layer in its own process (forked before any module of tvm_roller is imported) with every
    layer above it made unimportable."""
    layers = _main_layers()
    env = {"PYTHONPATH": str(ROOT), "PATH": str(Path(sys.executable).parent),
           "TVM_ROLLER_CALIBRATE": "0", "HOME": str(Path.home())}
    args = [",".join(layers[i]) + ";" + ",".join(n for group in layers[:i] for n in group)
            for i in range(len(layers) - 1, -1, -1)]
    res = subprocess.run([sys.executable, "-c", _IMPORT_LAYERS, *args], capture_output=True,
                         text=True, env=env)
    assert res.returncode == 0, res.stderr[-3000:]


# -- one front door --------------------------------------------------------------------------------
def _tiny_model():
    import torch

    from tvm_roller.integrations.pytorch import import_torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.GELU(),
                                torch.nn.Linear(40, 8)).eval()
    return import_torch(model, torch.randn(5, 24))


def test_one_target_normalisation_per_relax_compile(monkeypatch, tmp_path):
    """The target is normalised once, at the edge, however many functions a model has."""
    import tvm_roller
    from tvm_roller.hardware import target as hw_target

    calls = []
    real = hw_target._complete

    def counting(target):
        calls.append(target)
        return real(target)

    monkeypatch.setattr(hw_target, "_complete", counting)
    mod = _tiny_model()
    report: list = []
    tvm_roller.relax.compile(mod, {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2},
                             report, cache=False)
    assert len(report) >= 2 and len(calls) == 1, calls
    monkeypatch.setenv("TVM_ROLLER_CACHE", str(tmp_path))
    for _ in range(2):  # a compile, then a load from the module cache
        calls.clear()
        tvm_roller.relax.compile(mod, "llvm", [])
        assert len(calls) == 1, calls


def _declined_func():
    from conftest import gather_sum_func

    return gather_sum_func()


def test_every_integration_goes_through_the_one_fallback_path(monkeypatch):
    """build(fallback=True), the dlight rule and the Relax pipeline all decide a decline or an
    error in ``planner.scheduling``'s one fallback function."""
    import tvm
    import warnings

    import tvm_roller
    from tvm_roller.planner import scheduling as planner_scheduling

    target = {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2}
    seen = []
    real = planner_scheduling._fallback

    def spy(name, func, ctx, options, check, fallback, reason, err):
        seen.append((name, fallback))
        return real(name, func, ctx, options, check, fallback, reason, err)

    monkeypatch.setattr(planner_scheduling, "_fallback", spy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tvm_roller.build(_declined_func(), target, fallback=True)
        assert seen == [("main", "decline")]
        rule = tvm_roller.dlight.Roller()
        assert rule.apply(_declined_func().with_attr("global_symbol", "g"),
                          tvm.target.Target(target), False) is None
        assert seen[-1] == ("g", "decline") and "gather" in rule.declined["g"]

        def failing(func, ctx):
            raise RuntimeError("injected")

        monkeypatch.setattr(planner_scheduling, "plan_and_lower", failing)
        report: list = []
        tvm_roller.relax.compile(_tiny_model(), target, report, cache=False)
    errors = {e["name"] for e in report if e["fallback"] == "error"}
    assert errors and errors <= {n for n, kind in seen[2:] if kind == "error"}


def test_the_parts_recursion_is_written_once():
    """Only ``planner.plan.plan_prepared`` recurses over a decomposed function's parts (the
    schedule cache, the buckets and the lowering go through it)."""
    recursive = []
    for path, _, _, tree in _modules():
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef):
                continue
            for node in ast.walk(fn):
                loops = node.generators if isinstance(node, (ast.ListComp, ast.GeneratorExp)) \
                    else [node] if isinstance(node, ast.For) else []
                over_parts = any(isinstance(g.iter, ast.Attribute) and g.iter.attr == "parts"
                                 for g in loops)
                calls_self = any(isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
                                 and c.func.id == fn.name for c in ast.walk(node))
                if over_parts and calls_self:
                    recursive.append(f"{path.relative_to(PKG).as_posix()}:{fn.name}")
    assert sorted(set(recursive)) == ["planner/plan.py:plan_prepared"], recursive
