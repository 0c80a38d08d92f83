"""Transposes and permutes (weight transposes, attention's head split): roller's 2-D blocked copy,
including rows a page apart (the cache-set aliasing case), odd, prime and size-1 shapes."""
from __future__ import annotations

import numpy as np
import pytest
from tvm import te, topi

import tvm_roller
from conftest import TARGET, build_and_check, device


@pytest.mark.parametrize("shape", [(768, 3072), (37, 1024), (33, 65), (16, 17), (1, 64), (1024, 1)])
def test_transpose_2d(shape):
    A = te.placeholder(shape, "float32", name="A")
    B = topi.transpose(A, (1, 0))
    build_and_check([A, B], lambda a: a.T)


@pytest.mark.parametrize("shape,axes", [((2, 128, 12, 64), (0, 2, 1, 3)),
                                        ((3, 17, 5, 16), (0, 3, 2, 1)),
                                        ((4, 7, 29), (2, 0, 1))])
def test_permute(shape, axes):
    A = te.placeholder(shape, "float32", name="A")
    B = topi.transpose(A, axes)
    build_and_check([A, B], lambda a: np.transpose(a, axes))


def test_transpose_is_blocked():
    """A transposing copy gets 2-D blocks (two vector-sized inner loops), not row-by-row gathers."""
    A = te.placeholder((256, 512), "float32", name="A")
    func = te.create_prim_func([A, topi.transpose(A, (1, 0))])
    sch = tvm_roller.schedule(func, TARGET, device=device())
    text = sch.mod.script()
    assert "T.vectorized" in text and "T.unroll" in text, text


def test_transpose_float64():
    A = te.placeholder((40, 96), "float64", name="A")
    build_and_check([A, topi.transpose(A, (1, 0))], lambda a: a.T)
