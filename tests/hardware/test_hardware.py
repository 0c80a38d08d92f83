"""Tests of tvm_roller.hardware: presets, target completion, models from targets, the cache."""
from __future__ import annotations

import dataclasses
import importlib
import json
import warnings
from pathlib import Path

import pytest
import tvm

from tvm_roller.core.errors import UnsupportedError
from tvm_roller.core.ffi import plain
from tvm_roller.hardware import (CpuTraits, DeviceModel, GpuTraits, MemoryLevel, cache_dir,
                                 calibrate, list_presets, normalize_target, preset,
                                 target_completion_notes)
from tvm_roller.planner import Context
from tvm_roller.hardware.cpu import from_target
from tvm_roller.hardware import calibration_store as hw_cache
from tvm_roller.hardware import cpu as hw_cpu


def device_model(target):
    """The device model of a target, as the planner's context makes it."""
    return Context.make(target).device


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Every test gets an empty calibration cache: results never depend on this machine's."""
    monkeypatch.setenv("TVM_ROLLER_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _attrs(target: tvm.target.Target) -> dict:
    return json.loads(json.dumps(plain(target.export())))


# -- presets ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["x86-avx2", "x86-avx512", "arm-neon"])
def test_preset_round_trips_through_json(name):
    m = preset(name)
    assert DeviceModel.from_json(m.to_json()) == m
    assert m.kind == "cpu" and m.levels[-1].name == "DRAM" and m.levels[-1].shared
    fma = m.cpu.fma_units
    lanes = m.simd_lanes("float32")
    assert m.peak_gflops["float32"] == pytest.approx(m.num_units * m.frequency_ghz * fma * 2 * lanes)
    assert all(l.bandwidth_gbs > 0 and l.capacity_bytes > 0 for l in m.levels)


def _legacy_json(m: DeviceModel, **more) -> str:
    """``m`` as JSON from before the typed traits: one flat ``extra`` dict of floats."""
    d = json.loads(m.to_json())
    traits = d.pop("cpu") or d.pop("gpu")
    d.pop("gpu", None)
    d["extra"] = {k: float(v) for k, v in traits.items()  # (lists, text: fields added since)
                  if v is not None and not isinstance(v, (list, str))}
    d["extra"].update(more)
    return json.dumps(d)


def test_traits_are_typed_frozen_and_kept():
    cpu_m, gpu_m = preset("x86-avx512"), preset("h100")
    assert isinstance(cpu_m.cpu, CpuTraits) and cpu_m.gpu is None
    assert isinstance(gpu_m.gpu, GpuTraits) and gpu_m.cpu is None
    assert (cpu_m.cpu.fma_units, cpu_m.cpu.dram_gbs_single_core) == (2.0, 12.0)
    c = cpu_m.cpu
    assert (c.fma_chains, c.fma_per_cycle, c.loads_per_cycle) == (8.0, 1.0, 2.0)
    g = gpu_m.gpu
    assert (g.cc_major, g.cc_minor, g.warp_size, g.smem_per_block_optin) == (9, 0, 32, 227 * 1024)
    assert all(type(getattr(g, f.name)) is int
               for f in dataclasses.fields(g) if f.name != "boost_ghz")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cpu_m.cpu.fma_units = 1.0
    assert cpu_m.with_units(4).cpu == cpu_m.cpu and gpu_m.with_units(66).gpu == gpu_m.gpu
    # a CPU model built without traits gets the readers' defaults; a GPU model needs its limits
    bare = DeviceModel("c", "cpu", 1, 16, 16, list(cpu_m.levels), {"float32": 1.0})
    assert bare.cpu == CpuTraits() and bare.cpu.dram_gbs_single_core is None
    with pytest.raises(ValueError):
        DeviceModel("g", "gpu", 1, 128, 255, list(gpu_m.levels), {"float32": 1.0})
    with pytest.raises(ValueError):
        DeviceModel("c", "cpu", 1, 16, 16, list(cpu_m.levels), {"float32": 1.0}, gpu=g)


@pytest.mark.parametrize("name", ["x86-avx2", "h200"])
def test_old_json_with_extra_still_loads(name):
    m = preset(name)
    assert DeviceModel.from_json(_legacy_json(m, some_old_key=3.0)) == m
    # a calibrated model as written before the traits (docs/costcheck/dataset.json)
    if m.kind == "cpu":
        cal = dataclasses.replace(m.cpu, estimated_peak_float32=166.153,
                                  calibration_seconds=6.32, calibration_threads=2,
                                  calibration_quick=False, calibration_foreign_cpu_share=0.004,
                                  peak_tile_rows=8, peak_tile_cols=32)
        m2 = dataclasses.replace(m, cpu=cal)
        got = DeviceModel.from_json(_legacy_json(m2))
        assert got == m2 and type(got.cpu.calibration_threads) is int
        assert got.cpu.calibration_quick is False


def test_preset_isa_shapes():
    assert (preset("x86-avx2").simd_bytes, preset("x86-avx2").num_vector_registers) == (32, 16)
    assert (preset("x86-avx512").simd_bytes, preset("x86-avx512").num_vector_registers) == (64, 32)
    assert (preset("arm-neon").simd_bytes, preset("arm-neon").num_vector_registers) == (16, 32)
    assert set(list_presets()) >= {"x86-avx2", "x86-avx512", "arm-neon"}


def test_unknown_preset_lists_known_ones():
    with pytest.raises(UnsupportedError, match="x86-avx512"):
        preset("pdp-11")


# -- normalize_target -------------------------------------------------------------------------
def test_normalize_completes_mcpu_and_cores():
    t = normalize_target({"kind": "llvm"})
    a = _attrs(t)
    assert a["mcpu"] == hw_cpu.host_cpu()
    assert a["num-cores"] == hw_cpu.host_physical_cores() >= 1
    notes = target_completion_notes({"kind": "llvm"})
    assert any("mcpu was not given" in n and hw_cpu.host_cpu() in n for n in notes)
    assert any("num-cores" in n for n in notes)


def test_normalize_keeps_given_values():
    spec = {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 3, "mattr": ["+avx512f"]}
    for form in (spec, json.dumps(spec), tvm.target.Target(spec)):
        a = _attrs(normalize_target(form))
        assert (a["mcpu"], a["num-cores"], a["mattr"]) == ("skylake-avx512", 3, ["+avx512f"])
        assert target_completion_notes(form) == []


def test_normalize_old_cli_string():
    t = normalize_target("llvm -mcpu=haswell -num-cores=4 -mattr=+avx2,+fma")
    a = _attrs(t)
    assert (a["mcpu"], a["num-cores"], a["mattr"]) == ("haswell", 4, ["+avx2", "+fma"])
    assert any("CLI" in n for n in target_completion_notes("llvm -mcpu=haswell -num-cores=4"))
    with pytest.raises(UnsupportedError, match="dict form"):
        normalize_target("llvm -mcpu=haswell -fast-math")


def test_normalize_leaves_other_kinds_alone():
    assert normalize_target("c").kind.name == "c"
    cuda = normalize_target("nvidia/nvidia-h100")
    assert cuda.kind.name == "cuda" and _attrs(cuda)["arch"] == "sm_90a"
    with pytest.raises(UnsupportedError):
        normalize_target({"kind": "no-such-kind"})


def test_normalize_cross_target_not_completed_from_host():
    spec = {"kind": "llvm", "mtriple": "aarch64-linux-gnu"}
    a = _attrs(normalize_target(spec))
    assert "mcpu" not in a and "num-cores" not in a
    assert any("not the host" in n for n in target_completion_notes(spec))


# -- from_target ------------------------------------------------------------------------------
def test_from_target_skylake_avx512():
    m = from_target(normalize_target({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2}))
    assert (m.simd_bytes, m.num_vector_registers, m.isa, m.num_units) == (64, 32, "avx512", 2)
    assert m.source.startswith("estimated")
    fma = m.cpu.fma_units
    assert m.peak_gflops["float32"] == pytest.approx(2 * m.frequency_ghz * fma * 2 * 16, rel=1e-3)
    assert DeviceModel.from_json(m.to_json()) == m


def test_from_target_arm_is_neon():
    m = from_target(normalize_target({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "neoverse-n1",
                     "num-cores": 4}))
    assert (m.isa, m.simd_bytes, m.num_vector_registers, m.num_units) == ("neon", 16, 32, 4)
    assert "float16" in m.peak_gflops


def test_from_target_isa_table_without_llvm_query(monkeypatch):
    def no_query(*args):
        raise RuntimeError("feature query unavailable")

    monkeypatch.setattr(hw_cpu._cg, "llvm_get_cpu_features", no_query)
    assert from_target(normalize_target({"kind": "llvm", "mcpu": "cascadelake", "num-cores": 2})).isa == "avx512"
    assert from_target(normalize_target({"kind": "llvm", "mcpu": "znver2", "num-cores": 2})).simd_bytes == 32
    assert from_target(normalize_target({"kind": "llvm", "mcpu": "x86-64", "num-cores": 2})).simd_bytes == 16


def test_from_target_host_without_sys(monkeypatch, tmp_path):
    monkeypatch.setattr(hw_cpu, "SYS_CPU", tmp_path / "no-sys")
    monkeypatch.setattr(hw_cpu, "PROC_CPUINFO", tmp_path / "no-cpuinfo")
    m = from_target(normalize_target({"kind": "llvm", "num-cores": 2}))  # the host's mcpu, but no /sys, no /proc
    assert m.num_units == 2 and m.levels[-1].name == "DRAM"
    assert all(l.bandwidth_gbs > 0 and l.capacity_bytes > 0 for l in m.levels)
    assert m.frequency_ghz > 0 and m.peak_gflops["float32"] > 0


def test_from_target_gpu_kinds():
    assert device_model("nvidia/nvidia-h100").kind == "gpu"  # a preset, no live GPU
    with pytest.raises(UnsupportedError):
        device_model({"kind": "rocm"})


# -- cache ------------------------------------------------------------------------------------
def _fake_calibrated(cores: int) -> DeviceModel:
    m = from_target(normalize_target({"kind": "llvm", "num-cores": cores}), use_cache=False)
    m.levels = [MemoryLevel(l.name, l.capacity_bytes, l.line_bytes, l.bandwidth_gbs * 0.5, l.shared)
                for l in m.levels]
    return m


def test_cache_dir_follows_env(private_cache):
    assert cache_dir() == private_cache


def test_old_cache_file_with_extra_is_used(private_cache):
    key = hw_cache.calibration_key(hw_cpu.host_cpu(), hw_cpu.host_cpu(), 2)
    fake = _fake_calibrated(2)
    path = hw_cache.save_calibration(key, fake)
    payload = json.loads(path.read_text(encoding="utf-8"))
    payload["model"] = json.loads(_legacy_json(fake, calibration_seconds=1.5))
    path.write_text(json.dumps(payload), encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = from_target(normalize_target({"kind": "llvm", "num-cores": 2}))
    assert got.source == f"calibrated:{path}"
    assert got.cpu == dataclasses.replace(fake.cpu, calibration_seconds=1.5)
    assert got.levels == fake.levels


def test_cache_round_trip_is_used_by_from_target(private_cache):
    key = hw_cache.calibration_key(hw_cpu.host_cpu(), hw_cpu.host_cpu(), 2)
    fake = _fake_calibrated(2)
    path = hw_cache.save_calibration(key, fake)
    assert path.parent.parent == private_cache and not list(path.parent.glob("*.tmp"))
    got = from_target(normalize_target({"kind": "llvm", "num-cores": 2}))
    assert got.source == f"calibrated:{path}"
    assert [l.bandwidth_gbs for l in got.levels] == [l.bandwidth_gbs for l in fake.levels]
    # a different core count is a different key: estimated again
    assert from_target(normalize_target({"kind": "llvm", "num-cores": 3})).source.startswith("estimated")


@pytest.mark.parametrize("content", ["{\"format\": 1, \"key\": \"k\", \"model\": {\"na",
                                     "[]", "{\"format\": 1, \"model\": {\"name\": 3}}", "\xff\xfe"])
def test_corrupted_cache_is_ignored_with_warning(content):
    key = hw_cache.calibration_key(hw_cpu.host_cpu(), hw_cpu.host_cpu(), 2)
    path = hw_cache.save_calibration(key, _fake_calibrated(2))
    path.write_text(content, encoding="latin-1")
    with pytest.warns(UserWarning, match="ignoring unreadable calibration cache"):
        assert hw_cache.load_calibration(key) is None
    with pytest.warns(UserWarning):
        m = from_target(normalize_target({"kind": "llvm", "num-cores": 2}))
    assert m.source.startswith("estimated")


def test_missing_cache_entry_is_silent():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert hw_cache.load_calibration("nothing-here") is None


# -- calibration ------------------------------------------------------------------------------
@pytest.mark.slow
def test_quick_calibration_measures_something(private_cache):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a busy machine warns that its numbers are low
        m = calibrate(quick=True)
    assert m.source.startswith("calibrated:")
    path = Path(m.source.split(":", 1)[1])
    assert path.is_file() and private_cache in path.parents
    assert 1.0 < m.peak_gflops["float32"] < 1e5
    assert all(0.1 < l.bandwidth_gbs < 1e5 for l in m.levels)
    assert from_target(normalize_target({"kind": "llvm", "num-cores": m.num_units})).source == m.source


def test_calibrate_refuses_foreign_targets():
    with pytest.raises(UnsupportedError):
        calibrate({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "neoverse-n1"})
    with pytest.raises(UnsupportedError):
        calibrate("nvidia/nvidia-h100")
    if "amx-tile" not in hw_cpu.detect_isa(normalize_target({"kind": "llvm", "mcpu": hw_cpu.host_cpu()}))[1]:
        # an ISA this host lacks would SIGILL in the kernels: refused before running anything
        with pytest.raises(UnsupportedError, match="lacks"):
            calibrate({"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 1})


# -- calibration on first use ---------------------------------------------------------------------
def _fake_calibration(calls):
    def fake(target=None, quick=False, save=True):
        calls.append((quick, save))
        m = dataclasses.replace(from_target(normalize_target(target), use_cache=False), source="calibrated:fake")
        m.cpu = dataclasses.replace(m.cpu, tile_gflops={"4x1": 100.0})
        if save:
            key = hw_cache.calibration_key(hw_cpu.host_cpu(), _attrs(normalize_target(target))["mcpu"],
                                           m.num_units)
            m.source = f"calibrated:{hw_cache.save_calibration(key, m)}"
        return m
    return fake


def _calibrate_module():
    # ``tvm_roller.hardware.calibrate`` the attribute is the function; the module by name
    return importlib.import_module("tvm_roller.hardware.calibrate")


def test_first_use_calibrates_once_and_caches(private_cache, monkeypatch):
    mod = _calibrate_module()
    calls = []
    monkeypatch.setattr(mod, "measure", _fake_calibration(calls))
    monkeypatch.setenv(mod.CALIBRATE_ENV, "1")
    host = {"kind": "llvm"}
    first = mod.device_model(normalize_target(host))
    assert calls == [(True, True)] and first.source.startswith("calibrated:")
    again = mod.device_model(normalize_target(host))  # the cache answers: no second measurement
    assert calls == [(True, True)] and again.cpu.tile_gflops == {"4x1": 100.0}


def test_first_use_calibration_off_or_foreign_target(private_cache, monkeypatch):
    mod = _calibrate_module()
    calls = []
    monkeypatch.setattr(mod, "measure", _fake_calibration(calls))
    monkeypatch.setenv(mod.CALIBRATE_ENV, "0")
    assert mod.device_model(normalize_target({"kind": "llvm"})).source.startswith("estimated")
    monkeypatch.setenv(mod.CALIBRATE_ENV, "1")
    # not this machine's CPU: nothing to measure it on
    assert mod.device_model(normalize_target({"kind": "llvm", "mcpu": "cortex-a72", "mtriple": "aarch64-linux-gnu",
                             "num-cores": 4})).source.startswith("estimated")
    assert calls == []


def test_first_use_calibration_failure_is_reported(private_cache, monkeypatch):
    mod = _calibrate_module()

    def broken(*a, **k):
        raise RuntimeError("calibration process failed (exit -11)")

    monkeypatch.setattr(mod, "measure", broken)
    monkeypatch.setenv(mod.CALIBRATE_ENV, "1")
    with pytest.warns(UserWarning, match="first use failed.*exit -11"):
        m = mod.device_model(normalize_target({"kind": "llvm"}))
    assert m.source.startswith("estimated")
