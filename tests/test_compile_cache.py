"""compile_cache: a kernel compiles once per key, and any change of what decides its binary compiles it again."""

import dataclasses
import os
import re

import pytest

from moonvit_kernels import compile_cache, registry
from moonvit_kernels.tools import compile_check

real_uid = os.getuid() if hasattr(os, "getuid") else 0


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(compile_cache.ENV_VAR, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_entries_round_trip_and_a_damaged_one_is_a_miss(cache, monkeypatch):
    name = compile_cache.key("t", ["text", ("a", 1), b"\x00bytes"])
    assert compile_cache.load(name) is None
    compile_cache.store(name, {"log": "ptxas info", "lowered": {"k<1>": "_Z1kILi1EEvv"}}, b"\x7fELF\x00cubin")
    assert compile_cache.load(name) == ({"log": "ptxas info", "lowered": {"k<1>": "_Z1kILi1EEvv"}}, b"\x7fELF\x00cubin")
    (cache / name).write_bytes(b"\x05")  # truncated
    assert compile_cache.load(name) is None
    compile_cache.store(name, {"log": ""}, b"\x7fELF\x00cubin")
    data = bytearray((cache / name).read_bytes())
    data[-1] ^= 1  # one bit of the cubin altered: its digest no longer matches
    (cache / name).write_bytes(bytes(data))
    assert compile_cache.load(name) is None
    assert compile_cache.key("t", ["text"]) != compile_cache.key("t", ["text "]) != compile_cache.key("u", ["text"])
    monkeypatch.setenv(compile_cache.ENV_VAR, "off")
    compile_cache.store(name, {}, b"x")
    assert compile_cache.folder() is None and compile_cache.load(name) is None


def test_nvrtc_compiles_once_per_text_names_arch_and_options(cache, monkeypatch):
    pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-bindings (numba-cuda[cu13]) not installed")
    from moonvit_kernels.cuda_backend import nvrtc
    from moonvit_kernels.tools import nvrtc_check

    real = nvrtc._compile_text
    calls = []

    def counted(*args):
        calls.append(args[3])
        return real(*args)

    monkeypatch.setattr(nvrtc, "_compile_text", counted)
    src = 'extern "C" __global__ void k(float* p, int n) { if (threadIdx.x < n) p[threadIdx.x] *= 2.0f; }'
    first = nvrtc_check.compile_text(src, "k.cu", ["k"], "sm_90")
    again = nvrtc_check.compile_text(src, "k.cu", ["k"], "sm_90")
    assert again == first and calls == ["sm_90"]
    nvrtc_check.compile_text(src, "k.cu", ["k"], "sm_80")  # another architecture
    nvrtc_check.compile_text(src.replace("2.0f", "3.0f"), "k.cu", ["k"], "sm_90")  # another text
    nvrtc_check.compile_text(src, "k.cu", ["k"], "sm_90", strict=False)  # other options
    assert calls == ["sm_90", "sm_80", "sm_90", "sm_90"]
    with pytest.raises(nvrtc_check.CompileError):  # a failure is not stored: it fails again
        nvrtc_check.compile_text("not C++", "bad.cu", ["k"], "sm_90")
    assert sum(1 for p in cache.iterdir() if not p.name.startswith(".")) == 4


def test_numba_entries_compile_once_per_entry_and_compiler(cache, monkeypatch):
    built = []

    def fake_build(fn, signature, max_registers, module, cc):
        built.append((fn.__name__, max_registers, cc))
        report = compile_check.KernelReport(module, fn.__name__, signature, max_registers, registers=40)
        return report, b"cubin of " + fn.__name__.encode()

    monkeypatch.setattr(compile_check, "build_kernel", fake_build)
    entry = next(e for e in registry.numba_entries() if e.stage == "rope")
    fn, sig = entry.python_function(), entry.numba_signature()
    first = compile_check._build_entry(entry, fn, sig, (9, 0))
    again = compile_check._build_entry(entry, fn, sig, (9, 0))
    assert again[1] == first[1] and again[0].registers == 40 and again[0].kernel == first[0].kernel
    assert len(built) == 1
    compile_check._build_entry(entry, fn, sig, (8, 0))  # another architecture
    compile_check._build_entry(dataclasses.replace(entry, max_registers=entry.max_registers - 8), fn, sig, (9, 0))
    monkeypatch.setattr(compile_cache, "package_digest", lambda: "an edited package")  # any source edit
    compile_check._build_entry(entry, fn, sig, (9, 0))
    assert len(built) == 4


def test_a_folder_others_can_write_or_own_is_never_read(cache, monkeypatch):
    """The launchers load cached cubins onto the GPU: a folder another user could have filled is a miss."""
    name = compile_cache.key("t", ["x"])
    compile_cache.store(name, {"log": ""}, b"cubin")
    assert compile_cache.load(name) is not None
    assert cache.stat().st_mode & 0o777 == 0o700
    cache.chmod(0o777)
    with pytest.warns(RuntimeWarning, match=f"{re.escape(str(cache))} is open to others .* Fix: remove it"):
        assert compile_cache.load(name) is None
    with pytest.warns(RuntimeWarning, match="open to others"):
        compile_cache.store(compile_cache.key("t", ["y"]), {}, b"planted")
    assert not any(p.name == compile_cache.key("t", ["y"]) for p in cache.iterdir())
    cache.chmod(0o700)
    monkeypatch.setattr(os, "getuid", lambda: real_uid + 1)  # the folder belongs to somebody else
    with pytest.warns(RuntimeWarning, match=f"{re.escape(str(cache))} belongs to user id {real_uid}"):
        assert compile_cache.load(name) is None


def test_the_emulator_refuses_a_library_folder_others_can_write(tmp_path, monkeypatch):
    from moonvit_kernels import private_dirs
    from moonvit_kernels.tools.emulation import build

    if build.compiler() is None:
        pytest.skip("no C++ compiler")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    files = {"unit.cpp": 'extern "C" int answer() { return 42; }\n'}
    lib = build.build_library(files, "unit.cpp", standins=("prelude.h", "cuda_bf16.h"), tag="owner_check")
    assert lib.is_relative_to(tmp_path / "moonvit_kernels" / "emulator")
    assert build.build_library(files, "unit.cpp", standins=("prelude.h", "cuda_bf16.h"), tag="owner_check") == lib
    lib.parent.chmod(0o777)
    with pytest.raises(private_dirs.UnsafeFolder, match=re.escape(str(lib.parent)) + " is open to others .*Fix"):
        build.build_library(files, "unit.cpp", standins=("prelude.h", "cuda_bf16.h"), tag="owner_check")
