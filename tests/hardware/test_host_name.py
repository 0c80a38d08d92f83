"""The host CPU's LLVM name is checked against the ISA /proc/cpuinfo reports."""
from tvm_roller.hardware.host_name import host_cpu_name, resolve_host_cpu

_TRIPLE = "x86_64-pc-linux-gnu"
# A Sapphire Rapids guest's flags (abridged), as a hypervisor that reports CPUID model 167 shows them.
_SPR_FLAGS = ("flags : fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 avx512f avx512dq avx512ifma "
              "avx512cd avx512bw avx512vl avx_vnni avx512_bf16 avx512vbmi avx512_vbmi2 gfni vaes "
              "vpclmulqdq avx512_vnni avx512_bitalg avx512_vpopcntdq amx_bf16 avx512_fp16 amx_tile "
              "amx_int8\n")
_ZEN4_FLAGS = ("flags : fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 avx512f avx512dq avx512ifma "
               "avx512cd avx512bw avx512vl avx512_bf16 avx512vbmi avx512_vbmi2 gfni vaes vpclmulqdq "
               "avx512_vnni avx512_bitalg avx512_vpopcntdq\n")


def test_misnamed_guest_gets_the_cpu_with_its_isa():
    r = resolve_host_cpu("rocketlake", _TRIPLE, _SPR_FLAGS)
    assert r.llvm_name == "rocketlake"
    assert r.name in ("sapphirerapids", "emeraldrapids")
    assert "amxtile" in r.reason and "avx512bf16" in r.reason


def test_a_name_that_covers_the_host_stands():
    r = resolve_host_cpu("znver4", _TRIPLE, _ZEN4_FLAGS)
    assert (r.name, r.reason) == ("znver4", None)
    # the host lacking what the name has (a masked extension) never upgrades the name
    r = resolve_host_cpu("sapphirerapids", _TRIPLE, _ZEN4_FLAGS)
    assert (r.name, r.reason) == ("sapphirerapids", None)


def test_no_cpuinfo_or_not_x86_keeps_llvms_name():
    assert resolve_host_cpu("rocketlake", _TRIPLE, None).name == "rocketlake"
    assert resolve_host_cpu("neoverse-n1", "aarch64-linux-gnu", "Features : fp asimd\n").reason is None


def test_this_host_name_is_valid_for_llvm():
    from tvm.target import codegen

    got = host_cpu_name()
    assert codegen.llvm_is_valid_cpu(got.name, str(codegen.llvm_get_system_triple()))
    assert (got.reason is None) == (got.name == got.llvm_name)
