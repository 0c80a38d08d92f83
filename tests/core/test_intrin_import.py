"""``import_tensor_intrin``: the intrinsics are registered, inspect's cache is left as it was."""
from __future__ import annotations

import subprocess
import sys
import textwrap


def test_import_tensor_intrin_registers_and_restores_inspect():
    # a fresh process: the import happens once per process
    code = textwrap.dedent("""
        import inspect, time
        from tvm_roller.core.intrin_import import PSEUDO_FILES, import_tensor_intrin
        before = dict(inspect.modulesbyfile)
        t0 = time.perf_counter()
        import_tensor_intrin()
        seconds = time.perf_counter() - t0
        import_tensor_intrin()  # a second call is a no-op
        from tvm.s_tir import TensorIntrin
        assert TensorIntrin.get("dot_16x4_avx512", allow_missing=True) is not None
        assert TensorIntrin.get("wmma_sync_16x16x16_f16f16f32", allow_missing=True) is not None
        assert not any(name in inspect.modulesbyfile for name in PSEUDO_FILES
                       if name not in before)
        print(f"{seconds:.1f}")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    # the plain import takes 60-70 s on the 2-core machine, this one ~6 s
    assert float(out.stdout.split()[-1]) < 30, out.stdout
