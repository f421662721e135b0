"""Compile tier, the NVRTC checker itself (each stage's CUDA C builds: tests/stages, class TestCompile) — no GPU.

Builds the same source text, options and template instantiations the CuPy launchers use
(`moonvit_kernels.registry.kernel_specs`), with front-end warnings as errors, and checks
ptxas's report: no spills, stack frames only where allowed, registers within each kernel's
stated bound, shared memory within the architecture's per-block limit. Attention is built at
the head dims the configs use (K3: 128, tiny: 24), one more, and MAX_HEAD_DIM.
"""

import pytest

pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-bindings (numba-cuda[cu13]) not installed")

from moonvit_kernels import registry
from moonvit_kernels.config import VisionConfig
from moonvit_kernels.cuda_backend import nvrtc as runtime_nvrtc
from moonvit_kernels.cuda_backend import sources as kcuda
from moonvit_kernels.tools import nvrtc_check

pytestmark = pytest.mark.compile

from compile_tier import HEAD_DIMS  # noqa: E402


@pytest.fixture(scope="module")
def reports() -> list[nvrtc_check.KernelReport]:
    """Two stages' instantiations for every arch (each stage's own builds: tests/stages, class TestCompile)."""
    return nvrtc_check.run_checks(nvrtc_check.ARCHS, HEAD_DIMS, workers=2, stages=("rmsnorm", "merge"))


def test_a_stage_filter_builds_that_stage_alone(reports):
    built = {r.spec.source for r in reports}
    assert built == {"rmsnorm.cu", "merge.cu"}, built
    assert {r.arch for r in reports} == {"sm_80", "sm_90"}  # neither stage has an sm_90a kernel
    assert all(r.ok for r in reports), [r.problems for r in reports if not r.ok]


def test_table_has_a_row_per_build(reports):
    table = nvrtc_check.format_table(reports)
    lines = table.splitlines()
    assert [c.strip() for c in lines[0].split(" | ")[:3]] == ["kernel", "arch", "registers"]
    assert "registers" in lines[0] and "spills" in lines[0] and "shared memory" in lines[0]
    assert len(lines) == 2 + len(reports)
    for r in reports:
        assert any(line.startswith(r.spec.name + " ") and f"| {r.arch} " in line for line in lines)


def test_catalogue_holds_every_instantiation_the_backend_launches():
    names = {s.name for s in registry.kernel_specs(HEAD_DIMS)}
    for cfg in (VisionConfig.k3(), VisionConfig.tiny()):
        for act in ("bfloat16", "float32"):
            needed = {
                kcuda.attention_name(cfg.head_dim, act),
                kcuda.rmsnorm_name("float32", act),
                kcuda.rmsnorm_name("float32", "float32"),
                kcuda.rope_name(act),
                kcuda.merge_name("float32", act),
                kcuda.pos_emb_name(cfg.pos_emb_interpolation_mode),
            }
            if act == "bfloat16":
                needed |= {kcuda.gemm_bf16_name(o, e) for o, e in [("float32", "none"), ("float32", "residual")]}
                needed |= {kcuda.gemm_bf16_name("bfloat16", e) for e in ("none", "gelu_tanh", "gelu_erf")}
            else:
                needed |= {kcuda.gemm_fp32_name(e) for e in kcuda.EPILOGUES}
            assert needed <= names, sorted(needed - names)


def test_warnings_fail_the_build():
    src = 'extern "C" __global__ void k(float* out) { int unused = 3; out[0] = 1.0f; }'
    with pytest.raises(nvrtc_check.CompileError, match="never referenced"):
        nvrtc_check.compile_text(src, "warn.cu", [], "sm_90")


def test_judge_flags_stack_frames_and_register_bounds():
    """A dynamically indexed local array lives in local memory: the check must notice."""
    src = """extern "C" __global__ void stacky(float* out, int i) {
      float a[64];
      for (int k = 0; k < 64; ++k) a[k] = out[k];
      for (int k = 0; k < 64; ++k) a[(k * i) & 63] += 1.0f;  // stores at run-time indices
      for (int k = 0; k < 64; ++k) out[k] = a[(k + i) & 63];
    }"""
    _, log, lowered = nvrtc_check.compile_text(src, "stacky.cu", ["stacky"], "sm_90")
    info = nvrtc_check.parse_ptxas_log(log)[lowered["stacky"]]
    assert info.stack_bytes >= 256 and info.registers > 0
    spec = kcuda.KernelSpec("stacky.cu", "stacky", threads=1024, max_registers=1)
    problems = nvrtc_check.judge(spec, info, "sm_90")
    assert any("stack frame" in p for p in problems)
    assert any("> bound 1" in p for p in problems)
    roomy = kcuda.KernelSpec("stacky.cu", "stacky", threads=32, max_registers=255, max_stack=info.stack_bytes)
    assert nvrtc_check.judge(roomy, info, "sm_90") == []
    huge_smem = kcuda.KernelSpec("stacky.cu", "stacky", 32, 255, dynamic_smem=300 * 1024, max_stack=info.stack_bytes)
    assert any("shared memory" in p for p in nvrtc_check.judge(huge_smem, info, "sm_90"))


def test_parse_ptxas_log():
    log = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z4testPf' for 'sm_90'
ptxas info    : Function properties for _Z4testPf
ptxas         .     8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 77 registers, used 1 barriers, 2048 bytes smem, 368 bytes cmem[0]
ptxas info    : Compiling entry function 'plain' for 'sm_90'
ptxas info    : Function properties for plain
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 9 registers, used 0 barriers, 360 bytes cmem[0]"""
    infos = nvrtc_check.parse_ptxas_log(log)
    a, b = infos["_Z4testPf"], infos["plain"]
    assert (a.registers, a.stack_bytes, a.spill_stores, a.spill_loads, a.static_smem) == (77, 8, 4, 12, 2048)
    assert (b.registers, b.stack_bytes, b.spill_stores, b.spill_loads, b.static_smem) == (9, 0, 0, 0, 0)
    spec = kcuda.KernelSpec("t.cu", "test", threads=256, max_registers=128, max_stack=8)
    assert any("spills" in p for p in nvrtc_check.judge(spec, a, "sm_90"))


def test_load_source_inlines_local_headers_once():
    text = kcuda.load_source("attention.cu")
    assert '#include "' not in text
    assert '#line 1 "common.cuh"' in text and '#line 1 "ptx.cuh"' in text
    assert text.count("__device__ __forceinline__ float warp_sum(float v)") == 1
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in text
    with pytest.raises(ValueError, match="unknown kernel source"):
        kcuda.load_source("nope.cu")


@pytest.mark.parametrize("head_dim", [8, 24, 128, 144, 240])
def test_supported_head_dims(head_dim):
    kcuda.check_head_dim(head_dim)


@pytest.mark.parametrize("head_dim", [0, 4, 12, 130, 248, 256, 264, "128"])
def test_unsupported_head_dims_are_rejected(head_dim):
    with pytest.raises(ValueError, match="head_dim"):
        kcuda.check_head_dim(head_dim)


def test_shared_memory_formula_matches_the_kernel_configs():
    """attention_smem_bytes mirrors AttnBf16Cfg/AttnFp32Cfg::SMEM_BYTES: compile both and compare."""
    # a static_assert per head dim: compiles only when the Python formula agrees
    src = kcuda.load_source("attention.cu") + "\n".join(
        f'static_assert(AttnBf16Cfg<{hd}>::SMEM_BYTES == {kcuda.attention_smem_bytes(hd, "bfloat16")}, "bf16 {hd}");\n'
        f'static_assert(AttnFp32Cfg<{hd}>::SMEM_BYTES == {kcuda.attention_smem_bytes(hd, "float32")}, "fp32 {hd}");'
        for hd in HEAD_DIMS
    )
    nvrtc_check.compile_text(src, "smem_check.cu", [], "sm_90")


def test_cli_prints_the_table_and_exit_status(monkeypatch, capsys, reports):
    monkeypatch.setattr(nvrtc_check, "run_checks", lambda archs, head_dims, workers: reports)
    assert nvrtc_check.main([]) == 0
    out = capsys.readouterr().out
    assert "registers" in out and "kernel builds within limits" in out


# ============================================================================ cubins for inspection
EM_CUDA = 190  # ELF e_machine of a CUDA cubin


@pytest.fixture(scope="module")
def cubins_sm90() -> list[tuple[str, bytes, nvrtc_check.KernelReport]]:
    return nvrtc_check.build_cubins("sm_90", (24,), workers=2)


def test_build_cubins_one_file_per_instantiation(cubins_sm90, reports):
    specs = registry.specs_for("sm_90", (24,))
    assert [r.spec for _, _, r in cubins_sm90] == specs
    names = [f for f, _, _ in cubins_sm90]
    assert len(set(names)) == len(names)
    assert "gemm_bf16_tc_bf16_gelu_tanh.sm_90.cubin" in names and "flash_attn_bf16_hd24.sm_90.cubin" in names
    mangled = {r.mangled for _, _, r in cubins_sm90}
    assert len(mangled) == len(specs) and "" not in mangled
    by_name = {(r.spec.name, r.arch): r for r in reports}
    for filename, cubin, r in cubins_sm90:
        assert r.ok, (filename, r.problems)
        assert cubin[:4] == b"\x7fELF" and int.from_bytes(cubin[18:20], "little") == EM_CUDA, filename
        # the file holds this kernel and no other instantiation
        assert r.mangled.encode() in cubin
        assert not [m for m in mangled - {r.mangled} if m.encode() + b"\0" in cubin], filename
        # built alone or with its file's other instantiations: the same binary figures
        if (r.spec.name, "sm_90") in by_name:
            assert r.info == by_name[(r.spec.name, "sm_90")].info, filename
    assert sum((r.spec.name, "sm_90") in by_name for _, _, r in cubins_sm90) >= 4  # rmsnorm and merge, 4 each


def test_write_cubins_and_manifest(cubins_sm90, tmp_path):
    import json

    written = nvrtc_check.write_cubins(cubins_sm90, tmp_path / "cubins")
    assert len(written) == len(cubins_sm90) + 1
    manifest = json.loads((tmp_path / "cubins" / "manifest.json").read_text())
    assert [m["file"] for m in manifest] == [f for f, _, _ in cubins_sm90]
    for m, (filename, cubin, r) in zip(manifest, cubins_sm90, strict=True):
        assert (tmp_path / "cubins" / filename).read_bytes() == cubin
        assert m["mangled"] == r.mangled and m["ptxas"]["registers"] == r.info.registers and m["problems"] == []


def test_cubin_cli(monkeypatch, capsys, cubins_sm90, tmp_path):
    calls = []

    def fake_build(arch, head_dims, workers):
        calls.append((arch, tuple(head_dims)))
        return cubins_sm90

    monkeypatch.setattr(nvrtc_check, "build_cubins", fake_build)
    assert nvrtc_check.main(["--cubin-dir", str(tmp_path), "--head-dims", "24"]) == 0
    assert calls == [("sm_90", (24,))]  # sm_90 only unless --arch says otherwise
    assert (tmp_path / "flash_attn_f32_hd24.sm_90.cubin").exists()
    assert f"wrote {len(cubins_sm90)} cubins" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        nvrtc_check.main(["--cubin-dir", str(tmp_path), "--arch", "sm_99"])
    assert "unknown architecture 'sm_99'" in capsys.readouterr().err


def test_build_cubins_for_sm89_and_unknown_arch():
    spec = next(s for s in registry.kernel_specs() if s.label == "rmsnorm_rows_bf16_f32")
    cubin, report = nvrtc_check.build_cubin(spec, "sm_89")
    assert report.ok and cubin[:4] == b"\x7fELF"
    with pytest.raises(ValueError, match="unknown architecture"):
        nvrtc_check.build_cubins("sm_12")


def test_labels_are_unique_file_names():
    specs = registry.kernel_specs(HEAD_DIMS)
    labels = [s.label for s in specs]
    assert len(set(labels)) == len(labels)
    assert all(label and label.replace("_", "").isalnum() for label in labels)


# ============================================================================ one option set
def test_compile_check_uses_the_launchers_options_with_ftz():
    """CuPy appends -ftz=true to every compile; the shared options carry it, so the check measures CuPy's binary."""
    opts = kcuda.compile_options()
    assert kcuda.FTZ_OPTION == "-ftz=true" and kcuda.FTZ_OPTION in opts
    assert nvrtc_check.nvrtc_options("sm_90")[: len(opts)] == list(opts)


def test_ftz_changes_the_binary_and_cupys_second_ftz_is_harmless(monkeypatch):
    """-ftz=true builds another binary (flushing multiply) and NVRTC accepts it twice, as CuPy passes it."""
    src = 'extern "C" __global__ void k(float* p) { p[0] = p[1] * p[2] + p[3] / p[4]; }'
    with_ftz, _, _ = runtime_nvrtc.compile_text(src, "ftz.cu", ["k"], "sm_90")
    base = runtime_nvrtc.nvrtc_options
    monkeypatch.setattr(runtime_nvrtc, "nvrtc_options", lambda arch, strict=True: [*base(arch, strict), "-ftz=true"])
    twice, _, _ = runtime_nvrtc.compile_text(src, "ftz.cu", ["k"], "sm_90")
    monkeypatch.setattr(
        runtime_nvrtc, "nvrtc_options", lambda arch, strict=True: [o for o in base(arch, strict) if o != "-ftz=true"]
    )
    without, _, _ = runtime_nvrtc.compile_text(src, "ftz.cu", ["k"], "sm_90")
    assert twice == with_ftz
    assert without != with_ftz


@pytest.mark.parametrize("arch", sorted(kcuda.OPTIN_SMEM_PER_BLOCK))
def test_every_listed_architecture_builds(arch):
    spec = next(s for s in registry.kernel_specs() if s.label == "rmsnorm_rows_f32_bf16")
    cubin, report = nvrtc_check.build_cubin(spec, arch)
    assert report.ok and cubin[:4] == b"\x7fELF", report.problems


def test_judge_refuses_head_dims_beyond_the_architectures_shared_memory():
    info = nvrtc_check.PtxasInfo(registers=200)
    for arch, (bf16_max, _) in kcuda.SUPPORTED_HEAD_DIMS.items():
        fits = next(s for s in registry.kernel_specs((bf16_max,)) if s.label == f"flash_attn_bf16_hd{bf16_max}")
        assert nvrtc_check.judge(fits, info, arch) == [], arch
        if bf16_max < kcuda.MAX_HEAD_DIM:
            big = next(s for s in registry.kernel_specs((bf16_max + 8,)) if s.label.startswith("flash_attn_bf16"))
            assert any("shared memory" in p for p in nvrtc_check.judge(big, info, arch)), arch
