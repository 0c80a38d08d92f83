"""Device check of CUDA kernels (command line of ``harness.cuda_check.gpu_check``, see there):

    python python/gpu_check.py build --out gpu_bundles [--ops ...] [--no-nvcc]   (here: TVM, nvcc)
    python python/gpu_check.py run gpu_bundles [--budget-s 420] [--ops ...] [--no-micro]
        (GPU machine: torch, cupy, numpy; never imports tvm)
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True)
    # "python python/gpu_check.py" puts python/ (the harness) on the path, not ROOT: the build
    # half needs roller, from ROOT when it is not installed. The run half imports neither TVM
    # nor roller (the GPU machine has no TVM).
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from harness.cuda_check.gpu_check import main

    main()
