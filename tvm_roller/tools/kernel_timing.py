"""Timing the kernels inside a model: each PrimFunc a Relax VM runs (its instrument), and the
floor under every parallel kernel (an empty parallel region's fork and join). What
``tvm-roller profile-model`` measures, and the model benchmarks in ``python/`` share."""
from __future__ import annotations

import collections
import time
from typing import Dict, Tuple


def kernel_calls(vm, arg, calls: int, func: str = "main") -> Dict[str, Tuple[float, int]]:
    """(seconds, invocations) per call of the model of each PrimFunc the VM runs for
    ``vm[func](arg)`` (a tuple ``arg``: the arguments; a kernel the model calls in every layer
    runs several times)."""
    from tvm import relax

    acc: Dict[str, float] = collections.defaultdict(float)
    count: Dict[str, int] = collections.defaultdict(int)
    start: Dict[str, float] = {}
    args = arg if isinstance(arg, tuple) else (arg,)

    def instrument(func, name, before_run, ret_value, *rest):
        if before_run:
            start[name] = time.perf_counter()
        else:
            acc[name] += time.perf_counter() - start[name]
            count[name] += 1
        return relax.VMInstrumentReturnKind.NO_OP

    vm[func](*args)  # untimed: the first call allocates
    vm.set_instrument(instrument)
    for _ in range(calls):
        vm[func](*args)
    vm.set_instrument(None)
    return {name: (t / calls, count[name] // calls) for name, t in acc.items()}


def fork_join_s(target, cores: int) -> float:
    """Seconds one parallel region with nothing to do costs on ``target`` (TVM's thread pool
    waking ``cores`` workers and joining them): the floor under every parallel kernel."""
    import numpy as np
    import tvm
    from tvm import te

    a = te.placeholder((cores, 16), name="a")
    b = te.compute((cores, 16), lambda i, j: a[i, j] + 1.0, name="b")
    sch = tvm.s_tir.Schedule(te.create_prim_func([a, b]))
    sch.parallel(sch.get_loops(sch.get_sblock("b"))[0])
    lib = tvm.tirx.build(sch.mod, target=target)
    dev = tvm.cpu()
    x, y = (tvm.runtime.tensor(np.ones((cores, 16), "float32"), dev) for _ in range(2))
    timer = lib.time_evaluator(lib.entry_name, dev, number=2000, repeat=5)
    return float(min(timer(x, y).results))
