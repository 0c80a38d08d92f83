"""Group-quantized weights (int8, int4) and roller's integer kernels over them, against float64
references on random data: the format, the activations' quantization, the matmul on the host's
dot-product route (1, primes, odd group counts), the embedding lookup, the Relax rewrite of
constant weights (and its declines), the float32 dequantizing GEMV through the planner, and the
decline of a target without a route (each route on its own: ``test_quant_routes``)."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm.target import codegen

from tvm_roller.backends.cpu.microkernel.quant_dot import pick_quant_route
from tvm_roller.backends.cpu.quant_format import FORMATS, GROUP, dequantize, pack, quantize, \
    shape_reason
from tvm_roller.backends.cpu.quant_linear import gather_rows_kernel, matmul_kernel, \
    quantize_rows_kernel
from tvm_roller.core.errors import UnsupportedError
from tvm_roller.hardware import host_target

from conftest import TARGET, VNNI_TARGET, device, device_for


def _host_route():
    try:
        return pick_quant_route(host_target())
    except UnsupportedError:
        return None


# the kernels run on this host's best route; the Relax test is pinned to the VNNI target
pytestmark = pytest.mark.skipif(_host_route() is None, reason="this CPU has no int8 dot route")
needs_vnni = pytest.mark.skipif(not codegen.target_has_features("avx512vnni", host_target()),
                                reason="this CPU has no AVX-512 VNNI")


def _build(func):
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    return tvm.compile(mod, target=host_target()).mod["main"]


def _t(a):
    return tvm.runtime.tensor(a, tvm.cpu())


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_quantize_codes_and_error_bound(fmt):
    f = FORMATS[fmt]
    rng = np.random.default_rng(3)
    w = rng.standard_normal((48, 96)).astype("float32")
    w[:, 5] *= 15.0  # an outlier column: its groups get a larger scale, the others do not
    codes, scales = quantize(f, w)
    lo, hi = (1, 255) if fmt == "int8" else (0, 15)
    assert codes.min() >= lo and codes.max() <= hi
    err = np.abs(dequantize(f, codes, scales) - w.astype("f8"))
    # round to nearest: within half a step (|scale|; a step at int4's clipped +8 end)
    bound = np.repeat(np.abs(scales.astype("f8")), GROUP, axis=1) * (0.5 if fmt == "int8" else 1.0)
    assert (err <= bound + 1e-6).all()
    assert shape_reason(f, 48, 96) is None and "multiples" in shape_reason(f, 47, 96)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("m,n,k", [(1, 16, 32), (1, 48, 96), (7, 32, 160), (13, 80, 96),
                                   (1, 256, 224), (11, 16, 4864 // 16 * 2)])
def test_matmul_matches_float64(fmt, m, n, k):
    f = FORMATS[fmt]
    rng = np.random.default_rng(m * 1000 + n + k)
    w = rng.standard_normal((n, k)).astype("float32")
    x = (rng.standard_normal((m, k)) * 3).astype("float32")
    codes, scales = quantize(f, w)
    words, sc = pack(f, codes, scales)
    xq, xs, xc = _t(np.zeros((m, k), "int8")), _t(np.zeros((m, k // 32), "float32")), \
        _t(np.zeros((m, k // 32), "int32"))
    route = pick_quant_route(host_target())
    _build(quantize_rows_kernel(f, k, route))(_t(x), xq, xs, xc)
    # the activations: scale max|x| / 127 per group, codes round(x / scale), the correction
    xg = x.astype("f8").reshape(m, k // 32, 32)
    np.testing.assert_allclose(xs.numpy(), np.abs(xg).max(-1) / 127, rtol=1e-6)
    codes_x = xq.numpy().astype("f8").reshape(m, k // 32, 32)
    assert np.abs(codes_x - xg / xs.numpy()[..., None]).max() <= 0.5 + 1e-3
    np.testing.assert_array_equal(xc.numpy(), codes_x.sum(-1) * route.offset(f))
    y = _t(np.zeros((m, n), "float32"))
    _build(matmul_kernel(f, n, k, route))(xq, xs, xc, _t(words), _t(sc), y)
    # exactly the quantized operands' product (float64), and near the float32 activations'
    x_deq = (codes_x * xs.numpy().astype("f8")[..., None]).reshape(m, k)
    w_deq = dequantize(f, codes, scales)
    ref = x_deq @ w_deq.T
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    ref_x = x.astype("f8") @ w_deq.T
    assert np.abs(y.numpy() - ref_x).max() <= 0.02 * np.abs(ref_x).max()


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_gather_rows_is_the_dequantized_table(fmt):
    f = FORMATS[fmt]
    rng = np.random.default_rng(9)
    table = rng.standard_normal((48, 64)).astype("float32")
    codes, scales = quantize(f, table)
    words, sc = pack(f, codes, scales)
    ids = np.array([0, 47, 13, 13, 29], dtype="int64")
    out = _t(np.zeros((5, 64), "float32"))
    _build(gather_rows_kernel(f, 48, 64))(_t(ids), _t(words), _t(sc), out)
    np.testing.assert_allclose(out.numpy(), dequantize(f, codes, scales)[ids], rtol=1e-6,
                               atol=1e-7)


@needs_vnni
@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_relax_compile_quantizes_constant_weights_and_declines_odd_shapes(fmt):
    torch = pytest.importorskip("torch")
    from tvm.relax.frontend.torch import from_exported_program

    import tvm_roller

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(96, 48), torch.nn.Linear(48, 31)

        def forward(self, x):
            return self.b(torch.relu(self.a(x)))

    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(3, 5, 96)
    mod = from_exported_program(torch.export.export(net, (x,)))
    report: list = []
    ex = tvm_roller.relax.compile(mod, VNNI_TARGET, report=report, device=device_for(VNNI_TARGET),
                                  weights=fmt, cache=False)
    out = tvm.relax.VirtualMachine(ex, tvm.cpu())["main"](_t(x.numpy()))
    out = out[0] if not hasattr(out, "numpy") else out
    f = FORMATS[fmt]
    wa = dequantize(f, *quantize(f, net.a.weight.detach().numpy()))
    a_bias, b_w, b_bias = (t.detach().double().numpy() for t in (net.a.bias, net.b.weight,
                                                                 net.b.bias))
    h = np.maximum(x.double().numpy() @ wa.T + a_bias, 0)
    ref = h @ b_w.T + b_bias  # b is [31, 48]: kept float32
    assert np.abs(out.numpy() - ref).max() <= 0.02 * np.abs(ref).max()
    weights = {e["name"]: e for e in report if e["kind"] == "quant-weight"}
    assert weights["weight constant[48x96]"]["status"] == "roller"
    declined = weights["weight constant[31x48]"]
    assert declined["fallback"] == "decline" and "multiples of 16" in declined["reason"]
    assert any(e["kind"] == "quant-linear" and e["status"] == "roller" for e in report)


def test_target_without_a_route_is_declined_with_its_reason():
    from tvm_roller.integrations.relax.passes.quantize_weights import check_target

    old = tvm.target.Target({"kind": "llvm", "mcpu": "nehalem"})  # SSE4.2, no AVX2
    with pytest.raises(UnsupportedError, match="avx2.*fp32"):
        check_target(old, "int4")
    assert check_target({"kind": "llvm", "mcpu": "skylake-avx512"}, "int4").route.name == \
        "avx512bw"
    with pytest.raises(ValueError, match="int8"):
        check_target(host_target(), "int3")


def test_dequantizing_gemv_through_the_planner():
    """Any elementwise decode of a weight inside a reduction (here int8 codes times a group
    scale, read at one byte a weight) is planned and lowered by roller as a GEMV: the group's
    scale stays one value per vector (the lane split is of the innermost reduction axis)."""
    from tvm.script import tirx as T

    import tvm_roller

    n, k = 37, 96

    @T.prim_func(s_tir=True)
    def gemv(x: T.Buffer((1, k), "float32"), q: T.Buffer((n, k), "int8"),
             s: T.Buffer((n, k // 32), "float32"), y: T.Buffer((1, n), "float32")):
        for i, r, g, j in T.grid(1, n, k // 32, 32):
            with T.sblock("mm"):
                vi, vr, vg, vj = T.axis.remap("SSRR", [i, r, g, j])
                with T.init():
                    y[vi, vr] = T.float32(0)
                y[vi, vr] = y[vi, vr] + x[vi, vg * 32 + vj] * (
                    T.Cast("float32", q[vr, vg * 32 + vj]) * s[vr, vg])

    lib = tvm_roller.build(gemv, TARGET, device=device())
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, k)).astype("float32")
    q = rng.integers(-127, 128, (n, k)).astype("int8")
    s = rng.random((n, k // 32)).astype("float32") + 0.1
    y = _t(np.zeros((1, n), "float32"))
    lib(_t(x), _t(q), _t(s), y)
    ref = x.astype("f8") @ (q.astype("f8") * np.repeat(s.astype("f8"), 32, axis=1)).T
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
