"""Tests of tvm_roller.cache.schedules: hits give the same tiles and correct kernels, keys follow the
target / device constants / version, bad files are misses (never crashes or wrong kernels), and
concurrent writer processes leave only complete files.

conftest's helpers are imported on use (``_h()``): the spawned writer processes import this module,
and importing conftest there would create a session cache directory nobody removes.
"""
from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import time
import warnings
from pathlib import Path
from typing import List

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import te

import tvm_roller
import tvm_roller.core.version
from tvm_roller.cache import keys
from tvm_roller.cache import schedules as sc
from tvm_roller.cache.schedules import CacheWarning, ScheduleCache
from tvm_roller.hardware import normalize_target
from tvm_roller.planner import Context, apply, plan_and_lower


def cached_plan(func, target, topk=1, device=None, cache=None):
    """The planner's plan through a schedule cache."""
    return tvm_roller.plan(func, target, topk, device, cache)


def cached_schedule(func, target, device=None, cache=None):
    """The planner's plan through a schedule cache, its best tile lowered."""
    return plan_and_lower(func, Context.make(target, device, cache))


def _h():
    import conftest

    return conftest


# -- workloads ------------------------------------------------------------------------------------
def _gemm(m: int = 37, n: int = 48, k: int = 29, names=("A", "B", "C")):
    """N whole vectors: one cache entry (an N with a tail is planned as two parts, two entries)"""
    A = te.placeholder((m, k), "float32", name=names[0])
    B = te.placeholder((k, n), "float32", name=names[1])
    r = te.reduce_axis((0, k), "k")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name=names[2])
    return te.create_prim_func([A, B, C]), [(m, k), (k, n)], (m, n), \
        lambda a, b: a @ b


def _rowsum(rows: int = 24, cols: int = 67):
    A = te.placeholder((rows, cols), "float32", name="A")
    r = te.reduce_axis((0, cols), "k")
    R = te.compute((rows,), lambda i: te.sum(A[i, r] * A[i, r], axis=r), name="R")
    return te.create_prim_func([A, R]), [(rows, cols)], (rows,), lambda a: (a * a).sum(axis=1)


WORKLOADS = {"gemm": _gemm, "rowsum": _rowsum}


def _check_kernel(sch, target, in_shapes, out_shape, ref, seed: int = 0) -> None:
    """Build ``sch`` and compare with the float64 numpy reference on random data."""
    h = _h()
    lib = tvm.compile(sch.mod, target=normalize_target(target))
    arrays = [h.rand(s, seed=seed + i) for i, s in enumerate(in_shapes)]
    out = h.run(lib, arrays, out_shape, "float32")
    h.assert_close(out, ref(*[a.astype(np.float64) for a in arrays]), h.F32_TOL)


def _tiles_json(tiles) -> List[str]:
    return [t.to_json() for t in tiles]


def _rewrite(path: Path, mutate) -> None:
    """Edit an entry and give it a valid checksum again (a well-formed but unsuitable entry)."""
    entry = json.loads(path.read_text())
    entry.pop("checksum")
    mutate(entry)
    entry["checksum"] = keys.sha256(keys.canonical(entry))
    path.write_text(json.dumps(entry))


# -- hits ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("wl", sorted(WORKLOADS))
def test_hit_after_put_gives_same_tiles_and_correct_kernel(tmp_path, wl):
    h = _h()
    func, ins, out, ref = WORKLOADS[wl]()
    dev = h.device()
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        first = ScheduleCache(tmp_path)
        p1 = cached_plan(func, h.TARGET, device=dev, cache=first)
        assert first.stats() == {"hits": 0, "misses": 1, "corrupt": 0, "stale": 0, "writes": 1,
                                 "write_errors": 0}
        assert first.path(func, normalize_target(h.TARGET), dev).is_file()

        again = ScheduleCache(tmp_path)  # a new compile (process) reading the same directory
        p2 = cached_plan(func, h.TARGET, device=dev, cache=again)
        assert again.stats()["hits"] == 1 and again.stats()["writes"] == 0
        assert _tiles_json(p2.tiles) == _tiles_json(p1.tiles)
        assert _tiles_json(p2.tiles) == _tiles_json(tvm_roller.plan(func, h.TARGET,
                                                                    device=dev).tiles)
        assert str(p2.target) == str(p1.target) and p2.device == p1.device
        _check_kernel(apply(p2, p2.tiles[0]), h.TARGET, ins, out, ref)

        cs = cached_schedule(func, h.TARGET, device=dev, cache=again)
        assert cs.from_cache
        _check_kernel(cs.schedule, h.TARGET, ins, out, ref, seed=7)


def test_renamed_function_shares_the_entry(tmp_path):
    """global_symbol and buffer/block names are not part of the key; shapes are."""
    h = _h()
    dev = h.device()
    cache = ScheduleCache(tmp_path)
    func = _gemm()[0]
    key = cache.key(func, normalize_target(h.TARGET), dev)
    assert cache.key(func.with_attr("global_symbol", "fused_matmul7"), normalize_target(h.TARGET), dev) == key
    assert cache.key(func.without_attr("global_symbol"), normalize_target(h.TARGET), dev) == key
    assert cache.key(tvm.IRModule({"other": func}), normalize_target(h.TARGET), dev) == key
    renamed = _gemm(names=("X", "W", "Y"))[0]
    assert cache.key(renamed, normalize_target(h.TARGET), dev) == key
    assert cache.key(_gemm(37, 48, 30)[0], normalize_target(h.TARGET), dev) != key
    assert cache.key(func.with_attr("tirx.noalias", False), normalize_target(h.TARGET), dev) != key

    cached_plan(func, h.TARGET, device=dev, cache=cache)
    p = cached_plan(renamed, h.TARGET, device=dev, cache=cache)
    assert cache.stats()["hits"] == 1
    assert p.tiles[0].axes == [a.name for a in p.analysis.axes]


def test_key_follows_target_device_and_version(tmp_path, monkeypatch):
    h = _h()
    dev = h.device()
    cache = ScheduleCache(tmp_path)
    func = _gemm()[0]
    key = cache.key(func, normalize_target(h.TARGET), dev)
    # the same target spelled differently is the same key
    assert cache.key(func, normalize_target(h.TARGET), dev) == key
    assert cache.key(func, normalize_target(json.dumps(h.TARGET)), dev) == key

    assert cache.key(func, normalize_target(dict(h.TARGET, **{"num-cores": 1})), dev) != key
    assert cache.key(func, normalize_target(dict(h.TARGET, mcpu="x86-64-v3")), dev) != key

    dram = dataclasses.replace(dev.levels[-1], bandwidth_gbs=dev.levels[-1].bandwidth_gbs * 1.01)
    assert cache.key(func, normalize_target(h.TARGET), dataclasses.replace(dev, levels=dev.levels[:-1] + [dram])) \
        != key
    peak = {k: v * 0.99 for k, v in dev.peak_gflops.items()}
    assert cache.key(func, normalize_target(h.TARGET), dataclasses.replace(dev, peak_gflops=peak)) != key
    assert cache.key(func, normalize_target(h.TARGET), dataclasses.replace(dev, num_units=dev.num_units + 1)) != key
    # provenance alone is not a device constant
    assert cache.key(func, normalize_target(h.TARGET), dataclasses.replace(dev, source="calibrated:/x.json")) == key

    monkeypatch.setattr(tvm_roller.core.version, "__version__", "99.0.0")
    assert cache.key(func, normalize_target(h.TARGET), dev) != key
    monkeypatch.undo()
    assert cache.key(func, normalize_target(h.TARGET), dev) == key

    # a recalibrated device is a miss, not the old schedule
    cached_plan(func, h.TARGET, device=dev, cache=cache)
    cached_plan(func, h.TARGET, device=dataclasses.replace(dev, peak_gflops=peak), cache=cache)
    assert cache.stats()["hits"] == 0 and cache.stats()["writes"] == 2


def test_topk_entry_serves_smaller_requests_only(tmp_path):
    h = _h()
    dev = h.device()
    cache = ScheduleCache(tmp_path)
    func = _gemm()[0]
    cached_plan(func, h.TARGET, 1, dev, cache)
    p3 = cached_plan(func, h.TARGET, 3, dev, cache)  # the entry has 1 tile: re-plan
    assert cache.stats()["hits"] == 0 and len(p3.tiles) == 3
    p1 = cached_plan(func, h.TARGET, 1, dev, cache)
    p3b = cached_plan(func, h.TARGET, 3, dev, cache)
    assert cache.stats()["hits"] == 2
    assert _tiles_json(p1.tiles) == _tiles_json(p3.tiles[:1])
    assert _tiles_json(p3b.tiles) == _tiles_json(p3.tiles)


# -- bad files ----------------------------------------------------------------------------------
def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _garbage(path: Path) -> None:
    path.write_bytes(os.urandom(300))


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _appended(path: Path) -> None:
    path.write_bytes(path.read_bytes() + b"\n{}")


def _not_object(path: Path) -> None:
    path.write_text("[1, 2, 3]")


def _bad_checksum(path: Path) -> None:
    entry = json.loads(path.read_text())
    entry["tiles"][0]["l1"][0] += 1
    path.write_text(json.dumps(entry))


def _wrong_key(path: Path) -> None:
    # a complete, valid entry of another function, stored under this key's name
    h = _h()
    other = ScheduleCache(path.parent / "other")
    func = _gemm(16, 16, 16)[0]
    cached_plan(func, h.TARGET, device=h.device(), cache=other)
    path.write_bytes(other.path(func, normalize_target(h.TARGET), h.device()).read_bytes())


def _foreign_tile(path: Path) -> None:
    _rewrite(path, lambda e: e["tiles"][0].update(surprise=1))


def _future_format(path: Path) -> None:
    _rewrite(path, lambda e: e.update(format=2))


def _tile_does_not_fit(path: Path) -> None:
    # a register tile wider than its L1 tile: a zero split factor, which crashes TVM natively
    # (SIGFPE) if it ever reached apply; the analysis check must stop it
    def mutate(e):
        t = e["tiles"][0]
        t["reg"] = [t["l1"][i] * 2 if k == "S" else 1 for i, k in enumerate(t["axis_kinds"])]
    _rewrite(path, mutate)


def _tile_of_other_shape(path: Path) -> None:
    _rewrite(path, lambda e: e["tiles"][0].update(extents=[36, 48, 29]))


def _tile_fails_to_apply(path: Path) -> None:
    # fits the shape checks; apply raises (packing an operand the function does not have)
    _rewrite(path, lambda e: e["tiles"][0].update(pack=["NoSuchBuffer"]))


BAD = {"truncated": _truncate, "garbage": _garbage, "empty": _empty, "appended": _appended,
       "not_object": _not_object, "bad_checksum": _bad_checksum, "wrong_key": _wrong_key,
       "foreign_tile": _foreign_tile, "future_format": _future_format}
STALE = {"tile_does_not_fit": _tile_does_not_fit, "tile_of_other_shape": _tile_of_other_shape,
         "tile_fails_to_apply": _tile_fails_to_apply}


@pytest.mark.parametrize("damage", sorted(BAD) + sorted(STALE))
def test_bad_entry_is_a_miss_with_a_warning_and_a_correct_kernel(tmp_path, damage):
    h = _h()
    func, ins, out, ref = _gemm()
    dev = h.device()
    cache = ScheduleCache(tmp_path)
    good = cached_plan(func, h.TARGET, device=dev, cache=cache)
    path = cache.path(func, normalize_target(h.TARGET), dev)
    (BAD.get(damage) or STALE[damage])(path)

    with pytest.warns(CacheWarning, match="ignoring schedule cache entry"):
        cs = cached_schedule(func, h.TARGET, device=dev, cache=cache)
    assert not cs.from_cache
    assert _tiles_json(cs.plan.tiles) == _tiles_json(good.tiles)
    _check_kernel(cs.schedule, h.TARGET, ins, out, ref)
    st = cache.stats()
    assert st["corrupt" if damage in BAD else "stale"] == 1
    assert st["hits"] == 0 and st["misses"] == 2 and st["writes"] == 2

    # the entry was rewritten: the next lookup is a clean hit
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        assert _tiles_json(cache.get(func, normalize_target(h.TARGET), dev)) == _tiles_json(good.tiles)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "wrong_key"])
def test_get_on_bad_file_returns_none_and_removes_it(tmp_path, damage):
    h = _h()
    func, dev = _gemm()[0], h.device()
    cache = ScheduleCache(tmp_path)
    cache.put(func, normalize_target(h.TARGET), dev, tvm_roller.plan(func, h.TARGET, device=dev).tiles)
    path = cache.path(func, normalize_target(h.TARGET), dev)
    BAD[damage](path)
    with pytest.warns(CacheWarning):
        assert cache.get(func, normalize_target(h.TARGET), dev) is None
    assert not path.exists()
    assert cache.get(func, normalize_target(h.TARGET), dev) is None  # now a plain miss, no second warning


def test_unreadable_and_unwritable_cache_do_not_crash(tmp_path):
    h = _h()
    func, ins, out, ref = _gemm()
    dev = h.device()
    # a directory where the entry file should be: cannot be read, removed or replaced
    cache = ScheduleCache(tmp_path / "c")
    path = cache.path(func, normalize_target(h.TARGET), dev)
    (path / "x").mkdir(parents=True)
    with pytest.warns(CacheWarning):
        cs = cached_schedule(func, h.TARGET, device=dev, cache=cache)
    _check_kernel(cs.schedule, h.TARGET, ins, out, ref)
    assert cache.stats()["write_errors"] == 1
    # the cache directory is a file
    (tmp_path / "f").write_text("")
    with pytest.warns(CacheWarning, match="cannot write"):
        p = cached_plan(func, h.TARGET, device=dev, cache=ScheduleCache(tmp_path / "f"))
    assert p.tiles


# -- writing --------------------------------------------------------------------------------------
def test_put_leaves_no_temporary_files(tmp_path, monkeypatch):
    h = _h()
    func, dev = _gemm()[0], h.device()
    tiles = tvm_roller.plan(func, h.TARGET, device=dev).tiles
    cache = ScheduleCache(tmp_path)
    shard = cache.path(func, normalize_target(h.TARGET), dev).parent
    shard.mkdir(parents=True)
    old, fresh = shard / ".dead.abc.tmp", shard / ".inflight.def.tmp"
    old.write_text("{")
    fresh.write_text("{")
    two_hours_ago = time.time() - 7200
    os.utime(old, (two_hours_ago, two_hours_ago))
    cache.put(func, normalize_target(h.TARGET), dev, tiles)
    assert not old.exists() and fresh.exists()  # a writer still in flight is left alone
    fresh.unlink()

    def failing_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sc.os, "replace", failing_replace)
    with pytest.raises(OSError):
        cache.put(func, normalize_target(h.TARGET), dev, tiles)
    monkeypatch.undo()
    assert [p.name for p in shard.iterdir()] == [cache.path(func, normalize_target(h.TARGET), dev).name]


def test_fresh_plans_pass_the_tile_check():
    """Otherwise the cache would silently never store them."""
    from tvm import topi

    h = _h()
    X = te.placeholder((2, 9, 11, 5), "float32", name="X")
    Wt = te.placeholder((3, 3, 5, 7), "float32", name="W")
    E = te.placeholder((33, 17), "float32", name="E")
    # (_gemm(37, 24, 40): the vector axis padded from 24 to a register tile of 32 lanes)
    funcs = [_gemm()[0], _rowsum()[0], _gemm(1, 7, 13)[0], _gemm(37, 24, 40)[0],
             te.create_prim_func([X, Wt, topi.nn.conv2d_nhwc(X, Wt, 1, 1, 1,
                                                             out_dtype="float32")]),
             te.create_prim_func([E, te.compute(E.shape, lambda i, j: E[i, j] * 2.0)])]
    for f in funcs:
        p = tvm_roller.plan(f, h.TARGET, topk=3, device=h.device())
        for t in p.tiles:
            p.rule.validate(t, p.analysis, p.device)


# -- concurrency ----------------------------------------------------------------------------------
def _writer(directory: str, target: dict, worker: int, rounds: int, code_digest: str,
            start, results) -> None:
    """One process hammering put/get on two shared keys and an own one (run under spawn)."""
    warnings.simplefilter("error", CacheWarning)  # any damaged file seen is a failure
    # the parent's digest of roller's source: an edit in a shared checkout while the test runs
    # must not put the writers and the parent on different keys
    keys.roller_code_digest = lambda parts=keys.TILE_CODE: code_digest
    from tvm_roller.hardware import preset

    dev = preset("x86-avx512")
    own_dev = dataclasses.replace(dev, peak_gflops={k: v * (1 + worker / 10)
                                                    for k, v in dev.peak_gflops.items()})
    jobs = [(_gemm()[0], dev), (_rowsum()[0], dev), (_gemm()[0], own_dev)]
    expect = [_tiles_json(tvm_roller.plan(f, target, device=d).tiles) for f, d in jobs]
    cache = ScheduleCache(Path(directory))
    start.wait(timeout=120)  # both processes imported and planned: hammer at the same time
    t0 = time.perf_counter()
    seen = 0
    for _ in range(rounds):
        for (f, d), tiles in zip(jobs, expect):
            cache.put(f, normalize_target(target), d, [tvm_roller.RTile.from_json(t) for t in tiles])
            got = cache.get(f, normalize_target(target), d)
            assert got is not None and _tiles_json(got) == tiles
            seen += 1
    results.put({"worker": worker, "checked": seen, "loop_s": round(time.perf_counter() - t0, 2),
                 **cache.stats()})


def test_concurrent_writers_leave_complete_files(tmp_path):
    h = _h()
    rounds = 80
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), h.TARGET, w, rounds,
                                               keys.roller_code_digest(), start, results))
             for w in (1, 2)]
    t0 = time.perf_counter()
    for pr in procs:
        pr.start()
    for pr in procs:
        pr.join(timeout=180)
    assert [pr.exitcode for pr in procs] == [0, 0]  # a failed assert or warning exits with 1
    stats = [results.get(timeout=5) for _ in procs]
    print(f"\n2 spawned writers, {rounds} rounds x 3 keys each: {time.perf_counter() - t0:.1f} s "
          f"(incl. process start); {stats}")
    for r in stats:
        assert r["checked"] == 3 * rounds and r["corrupt"] == 0 and r["hits"] == 3 * rounds

    leftovers = [p for p in tmp_path.rglob("*") if p.is_file() and p.suffix != ".json"]
    assert leftovers == []
    files = sorted(tmp_path.rglob("*.json"))
    assert len(files) == 4  # gemm + rowsum shared, one own gemm key per worker

    dev = h.device()
    cache = ScheduleCache(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        for wl in ("gemm", "rowsum"):
            func, ins, out, ref = WORKLOADS[wl]()
            cs = cached_schedule(func, h.TARGET, device=dev, cache=cache)
            assert cs.from_cache
            assert _tiles_json(cs.plan.tiles) == _tiles_json(
                tvm_roller.plan(func, h.TARGET, device=dev).tiles)
            _check_kernel(cs.schedule, h.TARGET, ins, out, ref)
        for w in (1, 2):
            own = dataclasses.replace(dev, peak_gflops={k: v * (1 + w / 10)
                                                        for k, v in dev.peak_gflops.items()})
            assert cache.get(_gemm()[0], normalize_target(h.TARGET), own) is not None
    assert cache.stats()["corrupt"] == 0


# -- timing ---------------------------------------------------------------------------------------
def test_hit_is_faster_than_planning(tmp_path):
    h = _h()
    dev = h.device()

    def best(fn, n=5) -> float:
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    lines = []
    for name, func in [("gemm 37x48x29", _gemm()[0]), ("gemm 256x256x256", _gemm(256, 256, 256)[0]),
                       ("rowsum 24x67", _rowsum()[0])]:
        plan_s = best(lambda: tvm_roller.plan(func, h.TARGET, device=dev))
        miss_s = best(lambda: cached_plan(func, h.TARGET, device=dev,
                                          cache=ScheduleCache(tmp_path / f"m{time.time_ns()}")))
        cache = ScheduleCache(tmp_path / "hit")
        cached_plan(func, h.TARGET, device=dev, cache=cache)
        hit_s = best(lambda: cached_plan(func, h.TARGET, device=dev, cache=cache))
        assert cache.stats()["hits"] == 5
        lines.append(f"{name}: plan {plan_s * 1e3:.2f} ms, miss (plan + put) {miss_s * 1e3:.2f} ms,"
                     f" hit {hit_s * 1e3:.2f} ms")
    print("\n" + "\n".join(lines))


# -- a CUDA target --------------------------------------------------------------------------------
def _gemm_nt(m: int = 96, n: int = 64, k: int = 40):
    """C = A . B^T: no contiguous output vector on a CPU (a reduction there), tiled on a GPU."""
    A = te.placeholder((m, k), "float32", name="A")
    B = te.placeholder((n, k), "float32", name="B")
    r = te.reduce_axis((0, k), "k")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r] * B[j, r], axis=r), name="C")
    return te.create_prim_func([A, B, C])


def _hgemm(m: int = 128, n: int = 128, k: int = 64):
    A = te.placeholder((m, k), "float16", name="A")
    B = te.placeholder((k, n), "float16", name="B")
    r = te.reduce_axis((0, k), "k")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r].astype("float32") * B[r, j].astype(
        "float32"), axis=r), name="C")
    return te.create_prim_func([A, B, C])


@pytest.mark.parametrize("make", [lambda: _gemm()[0], lambda: _rowsum()[0], _gemm_nt, _hgemm],
                         ids=["gemm", "rowsum", "gemm_nt", "hgemm"])
def test_cuda_target_hits_without_replanning(tmp_path, make):
    """A CUDA plan's tiles come back from the cache through the same rule (the GPU's kind of the
    function, not the CPU analysis's): a hit, no warning, the same tiles and the same kernel."""
    from tvm_roller.hardware import preset

    target, dev = tvm.target.Target("nvidia/nvidia-h100"), preset("h100")
    cache = ScheduleCache(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        first = cached_schedule(make(), target, device=dev, cache=cache)
        again = cached_schedule(make(), target, device=dev, cache=cache)
    assert not first.from_cache and again.from_cache
    assert cache.stats()["hits"] == 1 and cache.stats()["stale"] == 0
    assert again.plan.rule is first.plan.rule and again.plan.tiles[0].backend == "cuda"
    assert _tiles_json(again.plan.tiles) == _tiles_json(first.plan.tiles)
    assert tvm_ffi.structural_equal(again.schedule.mod, first.schedule.mod)


def test_cuda_cached_tile_that_does_not_fit_is_replanned(tmp_path):
    from tvm_roller.hardware import preset

    target, dev = tvm.target.Target("nvidia/nvidia-h100"), preset("h100")
    cache = ScheduleCache(tmp_path)
    func = _gemm_nt()
    fresh = cached_schedule(func, target, device=dev, cache=cache)
    path = cache.path(func, normalize_target(target), dev)
    _rewrite(path, lambda e: e["tiles"][0].update(threads=0))  # no threads: not a block tile
    with pytest.warns(CacheWarning, match="does not fit"):
        got = cached_schedule(func, target, device=dev, cache=cache)
    assert not got.from_cache and _tiles_json(got.plan.tiles) == _tiles_json(fresh.plan.tiles)


# -- functions with symbolic extents ----------------------------------------------------------------
def test_symbolic_function_hits_the_cache_on_its_second_compile(tmp_path):
    """Each bucket's tiles are stored under the bucket; a second compile of the function reads
    every bucket back (no policy run) and builds the same dispatching kernel."""
    from tvm_roller.planner import schedule_function

    h = _h()
    n = te.var("n", "int64")
    A = te.placeholder((n, 40), "float32", name="A")
    B = te.placeholder((40, 24), "float32", name="B")
    r = te.reduce_axis((0, 40), "k")
    func = te.create_prim_func([A, B, te.compute((n, 24), lambda i, j: te.sum(
        A[i, r] * B[r, j], axis=r), name="C")])
    kernels = []
    for compile_no in range(2):
        cache = ScheduleCache(tmp_path)
        ctx = Context.make(h.TARGET, h.device(), cache)
        res = schedule_function(func, ctx, options=dynamic_options({"n": (1, 64)}))
        assert res.error is None and res.entry.buckets
        if compile_no == 0:
            assert not res.entry.cached and cache.stats()["writes"] > 0
            writes = cache.stats()["writes"]
        else:
            assert res.entry.cached and cache.stats()["writes"] == 0
            assert cache.stats()["hits"] >= writes
        kernels.append(res.kernel)
    assert tvm_ffi.structural_equal(kernels[0], kernels[1])
    for size in (1, 13, 64, 97):  # the last kernel also takes larger values
        a, b = h.rand((size, 40), seed=size), h.rand((40, 24), seed=1)
        out = h.run(res.executable, [a, b], (size, 24), "float32")
        h.assert_close(out, a.astype(np.float64) @ b.astype(np.float64), h.F32_TOL)


def dynamic_options(bounds):
    from tvm_roller.planner import ScheduleOptions

    return ScheduleOptions(bounds=bounds)
