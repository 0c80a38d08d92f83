"""Packaging for tvm-roller. The version lives in tvm_roller/core/version.py (read, not imported:
importing the package needs TVM, which may not be installed yet)."""
import re
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).resolve().parent
VERSION = re.search(r'^__version__\s*=\s*["\']([^"\']+)["\']',
                    (HERE / "tvm_roller" / "core" / "version.py").read_text(encoding="utf-8"),
                    re.M).group(1)
README = HERE / "README.md"

# torch is pinned to the CPU wheel family the project is tested with; matplotlib and the
# notebook packages run the tutorials / benchmark plots.
# transformers builds HuggingFace architectures from their configs (random weights, no download)
# for the whole-model tests and benchmarks. import-linter checks the package's layers in CI.
# onnxruntime: the peer the harness's model contest times (tests/harness/test_bench_contest.py).
# pytest-xdist: the test command runs two workers, one test file each at a time (-n 2 --dist
# loadfile: a file's module fixtures are built once).
# serve: `tvm-roller serve`, an OpenAI-compatible server (FastAPI under uvicorn, Prometheus
# metrics); it loads a model directory with transformers (and its tokenizer) into torch. Its tests
# drive it with the official openai client and raw httpx requests.
SERVE_EXTRAS = ["fastapi", "uvicorn", "prometheus_client", "torch==2.13.0",
                "transformers==5.24.0"]
TEST_EXTRAS = ["pytest", "pytest-xdist", "import-linter==2.17", "torch==2.13.0",
               "transformers==5.24.0", "onnxruntime",
               "matplotlib", "nbclient", "nbformat", "ipykernel",
               "pandas",  # MetaSchedule prints its progress table with pandas inside Jupyter
               "fastapi", "uvicorn", "prometheus_client", "openai", "httpx"]

setup(
    name="tvm-roller",
    version=VERSION,
    description="ROLLER-style (OSDI'22) constructed tensor-program schedules for Apache TVM 0.27",
    long_description=README.read_text(encoding="utf-8") if README.is_file() else "",
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    license_files=["LICENSE"],
    packages=find_packages(include=["tvm_roller", "tvm_roller.*"]),
    # the shipped MetaSchedule baselines (tvm_roller/tools/suite/baselines.py); MANIFEST.in adds them
    # to the sdist
    package_data={"tvm_roller.tools.suite": ["data/*/*.json", "data/*/*.jsonl", "data/*/*.md"]},
    include_package_data=True,
    python_requires=">=3.10",
    install_requires=[
        # apache-tvm-ffi 0.1.15.x segfaults in tvm.ir.save_json: keep both pinned together.
        "apache-tvm==0.27.0.post1",
        "apache-tvm-ffi==0.1.14.post1",
        "numpy",
        "xgboost",
        "scipy",        # the cost check's rank correlations
        "psutil",       # MetaSchedule's defaults need it
        "cloudpickle",  # ditto
        "tqdm",
    ],
    extras_require={"test": list(TEST_EXTRAS), "bench": list(TEST_EXTRAS),
                    "serve": list(SERVE_EXTRAS)},
    entry_points={"console_scripts": ["tvm-roller=tvm_roller.tools.cli:main"]},
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Software Development :: Compilers",
    ],
)
