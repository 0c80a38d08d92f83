"""The importer's missing ops for mixture-of-experts graphs (``integrations.pytorch``):
``histc``, ``_grouped_mm`` (rows grouped over stacked weights, ragged: an empty group, one group
with every row, rows past the last group), ``index_add`` / ``scatter_add`` with repeated
indices, and advanced indexing with index tensors of different ranks. Each module is exported,
imported, compiled by ``tvm_roller.relax.compile`` and compared with PyTorch in float64."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import tvm
from tvm import relax

import tvm_roller
import tvm_roller.relax as rr
from tvm_roller.integrations.pytorch import import_torch

from conftest import TARGET, device, rel_err


def _run(model, *inputs, reference: bool = True):
    """The module through roller (its float inputs float32) and PyTorch (in float64)."""
    mod = import_torch(model, inputs[0]) if len(inputs) == 1 else _import_many(model, inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tvm_roller.FallbackWarning)
        ex = rr.compile(mod, TARGET, [], device(), cache=False)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(x.numpy()) for x in inputs])
    out = out.numpy() if hasattr(out, "numpy") else out[0].numpy()
    if not reference:
        return out, None
    with torch.no_grad():
        ref = model.double()(*[x.double() if x.is_floating_point() else x for x in inputs])
    return out, ref.numpy()


def _import_many(model, inputs):
    from tvm.relax.frontend.torch import from_exported_program

    from tvm_roller.integrations.pytorch import convert_map

    with torch.no_grad():
        ep = torch.export.export(model.eval(), tuple(inputs))
    return from_exported_program(ep, keep_params_as_input=False,
                                 unwrap_unit_return_tuple=True, custom_convert_map=convert_map())


class Histc(torch.nn.Module):
    def __init__(self, bins, lo, hi):
        super().__init__()
        self.bins, self.lo, self.hi = bins, lo, hi

    def forward(self, x):
        return torch.histc(x, bins=self.bins, min=self.lo, max=self.hi)


@pytest.mark.parametrize("shape,bins,lo,hi", [((37,), 8, 0, 7), ((5, 13), 7, -1.0, 1.0),
                                              ((1,), 1, 0, 3), ((11, 3), 5, 0, 0)])
def test_histc_counts_like_torch(shape, bins, lo, hi):
    g = torch.Generator().manual_seed(0)
    if (lo, hi) == (0, 7):  # expert ids, as HF counts them
        x = torch.randint(0, 8, shape, generator=g).float()
    else:  # some values outside [lo, hi] when it is given
        span = (hi - lo) * 1.2 if hi > lo else 2.4
        x = torch.rand(shape, generator=g) * span + (lo - 0.1 * (hi - lo) if hi > lo else -1.2)
    out, ref = _run(Histc(bins, lo, hi), x)
    np.testing.assert_array_equal(out, ref)
    assert ref.sum() > 0


class GroupedRows(torch.nn.Module):
    """HF's call (``transformers::grouped_mm_fallback`` for float32): rows sorted by expert,
    offsets from histc, weights stored [E, N, K]."""

    def __init__(self, experts, n, k, transposed=True):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        shape = (experts, n, k) if transposed else (experts, k, n)
        self.w = torch.nn.Parameter(torch.rand(shape, generator=g) - 0.5)
        self.transposed = transposed

    def forward(self, x, offs):
        from transformers.integrations.moe import _grouped_mm  # (fp32 on CPU: its fallback op)

        w = self.w.transpose(-2, -1) if self.transposed else self.w
        return _grouped_mm(x, w, offs=offs)


@pytest.mark.parametrize("counts,transposed", [([3, 0, 5, 1], True), ([0, 9, 0], True),
                                               ([1], False), ([2, 3, 2, 0, 4], False)])
def test_grouped_mm_reads_each_rows_group(counts, transposed):
    rows, n, k = sum(counts), 13, 7
    model = GroupedRows(len(counts), n, k, transposed)
    x = torch.rand(rows, k, generator=torch.Generator().manual_seed(2)) - 0.5
    offs = torch.tensor(np.cumsum(counts), dtype=torch.int32)
    out, _ = _run(model, x, offs, reference=False)
    ref = np.zeros((rows, n))
    w = model.w.detach().double().numpy()
    start = 0
    for e, c in enumerate(counts):
        we = w[e].T if transposed else w[e]
        ref[start:start + c] = x[start:start + c].double().numpy() @ we
        start += c
    assert rel_err(out, ref) <= 1e-5


def test_grouped_mm_rows_past_the_last_group_are_zero():
    model = GroupedRows(2, 5, 3)
    x = torch.rand(6, 3) + 0.5
    out, _ = _run(model, x, torch.tensor([1, 4], dtype=torch.int32), reference=False)
    assert np.all(out[4:] == 0) and np.all(out[:4] != 0)


class IndexAdd(torch.nn.Module):
    def forward(self, x, idx, src):
        return x.index_add(0, idx, src, alpha=0.5)


class ScatterAdd(torch.nn.Module):
    def forward(self, x, idx, src):
        return x.scatter_add(1, idx, src)


def test_index_add_accumulates_repeated_indices():
    g = torch.Generator().manual_seed(3)
    x, src = torch.rand(7, 5, generator=g), torch.rand(11, 5, generator=g)
    idx = torch.tensor([0, 3, 3, 6, 0, 1, 3, 2, 2, 5, 6])
    out, ref = _run(IndexAdd(), x, idx, src)
    assert rel_err(out, ref) <= 1e-6


def test_scatter_add_over_a_smaller_index():
    g = torch.Generator().manual_seed(4)
    x, src = torch.rand(3, 7, generator=g), torch.rand(3, 9, generator=g)
    idx = torch.randint(0, 7, (3, 5), generator=g)
    out, ref = _run(ScatterAdd(), x, idx, src)
    assert rel_err(out, ref) <= 1e-6


class Index(torch.nn.Module):
    def __init__(self, how):
        super().__init__()
        self.how = how

    def forward(self, x, a, b):
        if self.how == "ranks":        # (5, 1) with (3,): broadcast to (5, 3)
            return x[a[:, None], b]
        if self.how == "slice_first":  # x[:, a, b]: adjacent indexed dims stay in place
            return x[:, a[:, None], b]
        return x[a[:, None], :, b]     # non-adjacent: the broadcast dims go first


@pytest.mark.parametrize("how", ["ranks", "slice_first", "split"])
def test_index_tensor_broadcasts_ranks_like_torch(how):
    g = torch.Generator().manual_seed(5)
    x = torch.rand(7, 6, 5, generator=g)
    a = torch.tensor([0, -1, 3, 2, 4])            # a negative index counts from the end
    b = torch.tensor([1, 0, -2])
    out, ref = _run(Index(how), x, a, b)
    assert rel_err(out, ref) == 0.0


class IndexPut(torch.nn.Module):
    def forward(self, x, a, v):
        y = x.clone()
        y[a[:, None], :, a[:3]] = v                      # non-adjacent, ranks 2 and 1
        return y.index_put((a,), v[0, 0][:, None], accumulate=True)  # repeated rows add up


def test_index_put_scatters_like_torch():
    g = torch.Generator().manual_seed(6)
    x, v = torch.rand(7, 4, 5, generator=g), torch.rand(1, 3, 4, generator=g)
    a = torch.tensor([0, -1, 3, 3, 4])
    out, ref = _run(IndexPut(), x, a, v)
    assert rel_err(out, ref) <= 1e-6


def test_a_routed_product_moves_one_experts_bytes():
    """The roofline of a product whose weight is indexed by a run-time expert id counts one
    expert's slice, not the stacked weights (``analysis.selected``); two fixed slices of one
    buffer count it whole."""
    from tvm import te, tirx

    from tvm_roller.analysis.selected import selected_fraction
    from tvm_roller.integrations.pytorch.moe_ops import routed_matmul
    from tvm_roller.planner.roofline import param_bytes

    a = te.placeholder((1, 64), "float32", name="a")
    w = te.placeholder((8, 96, 64), "float32", name="w")
    e = tirx.Var("e", "int64")
    func = te.create_prim_func([a, w, routed_matmul(a, w, e, True, "float32"), e])
    assert selected_fraction(func)["w"] == 1 / 8
    assert param_bytes(func) == 4 * (64 + 96 * 64 + 96)
    both = te.compute((96, 64), lambda n, k: w[0, n, k] + w[1, n, k], name="both")
    assert selected_fraction(te.create_prim_func([w, both]))["w"] == 1.0
