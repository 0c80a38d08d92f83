"""bf16 models (``model.to(torch.bfloat16)``) through roller's Relax pipeline: every PrimFunc
roller's (the matmuls on AMX), the output within bf16's precision of the float32 model (cosine
≥ 0.999) and no further from it than PyTorch's own bf16 run."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import tvm  # noqa: E402
from tvm import relax  # noqa: E402

import tvm_roller  # noqa: E402
from tvm_roller.hardware import host_target  # noqa: E402
from tvm_roller.hardware.cpu import detect_isa  # noqa: E402
from tvm_roller.integrations.pytorch import import_torch  # noqa: E402
from tvm_roller.tools.examples import hf_models  # noqa: E402

pytestmark = pytest.mark.skipif(not {"amx-bf16"} <= detect_isa(host_target())[1],
                                reason="this CPU has no AMX-BF16")


def _cos(a, b) -> float:
    a, b = a.double().flatten(), b.double().flatten()
    return float(torch.dot(a, b) / (a.norm() * b.norm()))


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama"])
def test_bf16_model_matches_float32(name):
    model, x = hf_models.MODELS[name]("small")
    with torch.no_grad():
        ref = model(x)
        low = model.to(torch.bfloat16)
        torch_bf16 = low(x)
    report: list = []
    ex = tvm_roller.relax.compile(import_torch(low, x), host_target(), report)
    assert not [e for e in report if e["fallback"]], [e["reason"] for e in report if e["fallback"]]
    amx = [e for e in report if (e.get("rtile") or {}).get("tensor_core", "").startswith("amx")]
    assert len(amx) >= 2, [(e["name"], e.get("rtile")) for e in report]
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x.numpy()))
    assert str(out.dtype) == "bfloat16"
    got = torch.from_numpy(out.numpy().view(np.int16)).view(torch.bfloat16)
    ours, theirs = _cos(got, ref), _cos(torch_bf16, ref)
    assert ours >= 0.999 and ours >= theirs - 1e-4, (ours, theirs)
