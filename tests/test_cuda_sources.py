"""The CUDA C catalogue's host-side choices, on the CPU: which CUDA headers go with which NVRTC, which
attention head dims fit which GPU's shared memory."""

import os

import pytest

from moonvit_kernels import registry
from moonvit_kernels.cuda_backend import sources as kcuda


def fake_include(root, name: str, version: int | None, define: str = "cuda.h") -> str:
    """A directory with cuda_bf16.h and (unless version is None) a header declaring `version`."""
    d = root / name
    d.mkdir(parents=True)
    (d / "cuda_bf16.h").write_text("// bf16\n")
    if version is not None:
        macro = "CUDA_VERSION" if define == "cuda.h" else "CUDART_VERSION"
        (d / define).write_text(f"#pragma once\n#define {macro} {version}\n")
    return str(d)


def test_header_version_from_cuda_h_or_runtime_api(tmp_path):
    assert kcuda.header_cuda_version(fake_include(tmp_path, "a", 12080)) == 12080
    assert kcuda.header_cuda_version(fake_include(tmp_path, "b", 13050, "cuda_runtime_api.h")) == 13050
    assert kcuda.header_cuda_version(fake_include(tmp_path, "c", None)) is None


def test_select_picks_the_headers_of_the_nvrtc_major(tmp_path):
    cu13 = fake_include(tmp_path, "cu13", 13050)
    cu12 = fake_include(tmp_path, "cu12", 12080, "cuda_runtime_api.h")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert kcuda.select_include_dir([str(empty), cu13, cu12], 12) == cu12
    assert kcuda.select_include_dir([cu13, cu12], 13) == cu13
    assert kcuda.select_include_dir([cu12, cu13], None) == cu12  # no NVRTC known: the first with headers


def test_select_never_takes_another_major(tmp_path):
    cu13 = fake_include(tmp_path, "cu13", 13050)
    with pytest.raises(RuntimeError, match=r"no CUDA 12 headers.*cu13 \(CUDA 13\.5\).*MOONVIT_CUDA_INCLUDE"):
        kcuda.select_include_dir([cu13], 12)
    unknown = fake_include(tmp_path, "unknown", None)
    assert kcuda.select_include_dir([cu13, unknown], 12) == unknown  # unreadable version: last resort
    assert kcuda.select_include_dir([unknown, fake_include(tmp_path, "cu12", 12040)], 12).endswith("cu12")


def test_cuda_include_dir_finds_the_cuda12_wheel_beside_the_cuda13_one(tmp_path, monkeypatch):
    """The `cuda12` extra: CuPy's NVRTC 12, while numba-cuda[cu13] brought CUDA 13 headers as well."""
    site = tmp_path / "site-packages"
    cu13 = fake_include(site / "nvidia" / "cu13", "include", 13050)
    cu12 = fake_include(site / "nvidia" / "cuda_runtime", "include", 12080, "cuda_runtime_api.h")
    monkeypatch.setattr("sys.path", [str(site)])
    monkeypatch.delenv("MOONVIT_CUDA_INCLUDE", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    pathfinder = pytest.importorskip("cuda.pathfinder", reason="cuda-pathfinder not installed")
    monkeypatch.setattr(pathfinder, "find_nvidia_header_directory", lambda lib: cu13)  # it finds 13 first
    kcuda.cuda_include_dir.cache_clear()
    try:
        assert kcuda.cuda_include_dir(12) == cu12
        assert kcuda.cuda_include_dir(13) == cu13
        assert f"-I{cu12}" in kcuda.compile_options(12)
        monkeypatch.setenv("MOONVIT_CUDA_INCLUDE", cu13)  # an explicit directory of the wrong major is passed over
        kcuda.cuda_include_dir.cache_clear()
        assert kcuda.cuda_include_dir(12) == cu12
        monkeypatch.setattr(kcuda, "nvrtc_major_of_bindings", lambda: 13)
        assert kcuda.cuda_include_dir() == cu13  # the compile check asks cuda-bindings' NVRTC
    finally:
        kcuda.cuda_include_dir.cache_clear()


def test_real_headers_match_the_installed_nvrtc():
    major = kcuda.nvrtc_major_of_bindings()
    if major is None:
        pytest.skip("cuda-bindings' NVRTC not installed")
    include = kcuda.cuda_include_dir()
    assert os.path.isfile(os.path.join(include, "cuda_bf16.h"))
    version = kcuda.header_cuda_version(include)
    assert version is None or version // 1000 == major


# ============================================================================ head dims per architecture
def test_head_dim_table_follows_the_shared_memory_formula():
    assert set(kcuda.SUPPORTED_HEAD_DIMS) == set(kcuda.OPTIN_SMEM_PER_BLOCK)
    for arch, limit in kcuda.OPTIN_SMEM_PER_BLOCK.items():
        bf16, fp32 = kcuda.SUPPORTED_HEAD_DIMS[arch]
        assert (kcuda.max_attention_head_dim("bfloat16", limit), kcuda.max_attention_head_dim("float32", limit)) == (
            bf16,
            fp32,
        ), arch
        for dtype, top in (("bfloat16", bf16), ("float32", fp32)):
            assert kcuda.attention_smem_bytes(top, dtype) <= limit
            if top < kcuda.MAX_HEAD_DIM:
                assert kcuda.attention_smem_bytes(top + 8, dtype) > limit
    # the figures the kernel review quoted
    assert kcuda.attention_smem_bytes(128, "bfloat16") == 87_040
    assert kcuda.attention_smem_bytes(248, "bfloat16") == kcuda.attention_smem_bytes(256, "bfloat16") == 168_960
    assert kcuda.SUPPORTED_HEAD_DIMS["sm_80"][0] == 240 and kcuda.SUPPORTED_HEAD_DIMS["sm_89"][0] == 144


def test_attention_that_does_not_fit_is_refused_with_the_limit():
    a100 = kcuda.OPTIN_SMEM_PER_BLOCK["sm_80"]
    kcuda.check_attention_fits(240, "bfloat16", a100, "an A100")
    kcuda.check_attention_fits(240, "float32", 99 * 1024, "an L4")
    with pytest.raises(ValueError, match=r"head_dim=152 \(bfloat16\) needs 107,520 B .* 101,376 B an L4 .* is 144"):
        kcuda.check_attention_fits(152, "bfloat16", 99 * 1024, "an L4")
    with pytest.raises(ValueError, match="multiple of 8 in 8..240"):
        kcuda.check_attention_fits(256, "bfloat16", 10**6, "a big GPU")
    assert kcuda.max_attention_head_dim("bfloat16", 1000) == 0


def test_hopper_specs_build_for_sm90a_only():
    """The sm_90a files are built for sm_90a and nothing else; the portable ones for every other arch."""
    specs = registry.kernel_specs((128, 24, 240))
    hopper = [s for s in specs if s.source in kcuda.HOPPER_SOURCES]
    assert hopper == registry.specs_for("sm_90a", (128, 24, 240))
    assert {s.source for s in registry.specs_for("sm_90", (128,))} == set(kcuda.PORTABLE_SOURCES)
    assert not [s for s in specs if s.source in kcuda.HOPPER_SOURCES and s.builds_for("sm_90")]
    assert kcuda.SOURCES == kcuda.PORTABLE_SOURCES + kcuda.HOPPER_SOURCES
    # attention at the head dims it supports only (240 > 128), both GEMM widths for each launched pair
    assert [s.label for s in hopper if s.source == "flash_attn_sm90.cu"] == [
        "flash_attn_sm90_hd128",
        "flash_attn_sm90_hd24",
    ]
    gemms = [s for s in hopper if s.source == "gemm_bf16_sm90.cu"]
    assert len(gemms) == 2 * len(kcuda.HOPPER_GEMM_USES) and {s.threads for s in gemms} == {384}
    for s in hopper:
        assert s.archs == ("sm_90a",) and s.dynamic_smem <= kcuda.OPTIN_SMEM_PER_BLOCK["sm_90a"], s.label


def test_hopper_catalogue_holds_what_the_backend_launches():
    from moonvit_kernels.cuda_backend import hopper_launchers as hl

    names = {s.name for s in registry.specs_for("sm_90a", (128,))}
    for bn in (128, 256):  # CupyBackend.forward's (output, epilogue) pairs
        for out, epi in [("float32", "none"), ("float32", "residual"), ("bfloat16", "none"),
                         ("bfloat16", "gelu_tanh"), ("bfloat16", "gelu_erf")]:  # fmt: skip
            assert hl.gemm_name(out, epi, bn) in names
    assert hl.attention_name(128) in names
    assert hl.gemm_smem_bytes(256) == kcuda.gemm_sm90_smem_bytes(256) == 4 * (128 + 256) * 128 + 64
