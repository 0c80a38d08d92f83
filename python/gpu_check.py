"""Device check of CUDA kernels (command line of ``tvm_roller.tools.cuda_check.gpu_check``, see there):

    python python/gpu_check.py build --out gpu_bundles [--ops ...] [--no-nvcc]   (here: TVM, nvcc)
    python python/gpu_check.py run gpu_bundles [--budget-s 420] [--ops ...] [--no-micro]
        (GPU machine: torch, cupy, numpy; never imports tvm)
"""
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tvm_free_package() -> None:
    """Let ``run`` (and ``--help``) import tvm_roller.tools.cuda_check.gpu_check without running
    tvm_roller/__init__.py, which imports TVM: the GPU machine has none. The package is found
    by name as usual but not initialised; its submodules then import as usual."""
    if "tvm_roller" not in sys.modules:
        sys.modules["tvm_roller"] = importlib.util.module_from_spec(
            importlib.util.find_spec("tvm_roller"))


if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True)
    if str(ROOT) not in sys.path:  # "python python/gpu_check.py" puts python/ there, not ROOT
        sys.path.insert(0, str(ROOT))
    if sys.argv[1:2] != ["build"]:
        _tvm_free_package()
    from tvm_roller.tools.cuda_check.gpu_check import main

    main()
