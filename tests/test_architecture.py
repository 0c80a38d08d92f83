"""The package's shape: layers that only point down, no cycles, one place that picks a backend.

``lint-imports`` checks the contracts in ``.importlinter`` (layers, the backends' independence,
no import cycles in any package); the other checks read the source.
"""
from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "tvm_roller"
# Where a target kind string may pick code: the registry and the backends; the CPU device model
# reads LLVM targets (its own kind check) and the target normalisation completes them; tools
# name targets as data (defaults, test lists).
KIND_STRINGS_ALLOWED = ("backends/", "hardware/cpu.py", "hardware/target.py",
                        "hardware/calibrate.py", "tools/")


def _modules():
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        name = ".".join(rel.parts)
        pkg = name[:-len(".__init__")] if name.endswith(".__init__") else name.rsplit(".", 1)[0]
        yield path, name.removesuffix(".__init__"), pkg, ast.parse(path.read_text())


def test_import_contracts_hold():
    exe = shutil.which("lint-imports")
    if exe is None:
        pytest.fail("lint-imports (import-linter, a test dependency) is not installed")
    env = {"PYTHONPATH": str(ROOT), "PATH": str(Path(sys.executable).parent)}
    res = subprocess.run([exe, "--config", str(ROOT / ".importlinter")], cwd=ROOT,
                         capture_output=True, text=True, env=env)
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
