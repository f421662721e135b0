"""The CUDA C catalogue's host-side choices, on the CPU: which CUDA headers go with which NVRTC."""

import os

import pytest

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
