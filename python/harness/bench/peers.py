"""The runtimes a CPU user would pick instead of roller, each made ready to run one model:
PyTorch eager, ``torch.compile`` (inductor), ONNX Runtime (CPU EP, every graph optimization)
and OpenVINO (CPU, latency hint, f32 forced: on a CPU with AVX512-BF16 it would pick bf16).

Each ``make_*`` returns a :class:`Contender`: a callable running the model once on the example
input, its output, and the time it took to get ready; or the error that kept it from running
(a peer that cannot convert a model is reported as such, never hidden).
"""
from __future__ import annotations

import os
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable, List, Optional

import numpy as np


@dataclass
class Contender:
    """One way to run the model: ``run()`` once, and what its first call returned."""

    name: str
    run: Optional[Callable[[], object]] = None
    output: Optional[np.ndarray] = None
    setup_s: float = 0.0
    error: str = ""  # why it cannot run (export or conversion failed)
    notes: List[str] = field(default_factory=list)


def _prepare(name: str, make: Callable[[], Callable[[], object]],
             to_numpy: Callable[[object], np.ndarray]) -> Contender:
    t0 = time.perf_counter()
    try:
        run = make()
        out = to_numpy(run())
    except Exception as err:  # noqa: BLE001  (a peer that fails is a reported row, not a crash)
        lines = traceback.format_exception_only(type(err), err)
        return Contender(name, error=" ".join(" ".join(lines).split())[:300],
                         setup_s=time.perf_counter() - t0)
    return Contender(name, run, out, time.perf_counter() - t0)


def _torch_out(y) -> np.ndarray:
    return y.detach().numpy()


def make_eager(model, x) -> Contender:
    import torch

    def make():
        def run():
            with torch.no_grad():
                return model(x)
        return run
    return _prepare("eager", make, _torch_out)


def make_inductor(model, x) -> Contender:
    import torch

    def make():
        compiled = torch.compile(model)

        def run():
            with torch.no_grad():
                return compiled(x)
        return run
    return _prepare("inductor", make, _torch_out)


def export_onnx(model, x, path: str) -> str:
    """``model`` as ONNX at ``path``; the exporter used: torch.export-based (opset 18), else
    the TorchScript one (opset 17) when that fails."""
    import torch

    try:
        with torch.no_grad():
            torch.onnx.export(model, (x,), path, dynamo=True, opset_version=18,
                              external_data=True)
        return "torch.onnx dynamo, opset 18"
    except Exception:  # noqa: BLE001  (the other exporter is tried; its failure is reported)
        with torch.no_grad():
            torch.onnx.export(model, (x,), path, dynamo=False, opset_version=17)
        return "torch.onnx TorchScript, opset 17"


def make_onnxruntime(model, x, threads: int) -> Contender:
    workdir = tempfile.mkdtemp(prefix="roller-onnx-")
    exporter: List[str] = []

    def make():
        import onnxruntime as ort  # (inside: not installed is the peer's reported error)

        path = os.path.join(workdir, "model.onnx")
        exporter.append(export_onnx(model, x, path))
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        name = sess.get_inputs()[0].name
        feed = {name: x.numpy()}
        return lambda: sess.run(None, feed)[0]

    c = _prepare("onnxruntime", make, np.asarray)
    c.notes += exporter
    return c


def make_openvino(model, x, threads: int) -> Contender:
    def make():
        import openvino as ov  # (inside: not installed is the peer's reported error)

        core = ov.Core()
        ov_model = ov.convert_model(model, example_input=x)
        compiled = core.compile_model(ov_model, "CPU", {
            "PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32",
            "INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1})
        request = compiled.create_infer_request()
        feed = x.numpy()

        def run():
            request.infer([feed])
            return request.get_output_tensor(0).data
        return run

    return _prepare("openvino", make, lambda y: np.array(y))
