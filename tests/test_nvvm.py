"""NVVM for numba-cuda (numba_backend/nvvm.py, scripts/prepare_nvvm.py): the prepared folder is packed, checked and
unpacked; `require_nvvm` says in one line what is missing and which wheel fixes it. The real NVVMs (none, 13.0 prepared,
a newer one than nvJitLink) are the target tier's (tests/target/test_target_env.py)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import zipfile
from pathlib import Path

import pytest

from moonvit_kernels.numba_backend import nvvm

ROOT = Path(__file__).resolve().parents[1]


def prepare_module():
    spec = importlib.util.spec_from_file_location("prepare_nvvm", ROOT / "scripts" / "prepare_nvvm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def prepared(tmp_path, monkeypatch):
    """A prepared folder packed by the script from a stand-in wheel of the real layout (small made-up files)."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "tmp").mkdir()
    wheel = tmp_path / "nvidia_nvvm-13.0.88-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl"
    contents = {inside: f"{inside} bytes {i}".encode() * 100 for i, inside in enumerate(prepare_module().WHEEL_FILES)}
    with zipfile.ZipFile(wheel, "w") as z:
        for name, data in contents.items():
            z.writestr(name, data)
        z.writestr("nvidia/cu13/nvvm/bin/cicc", b"not taken")
    out = tmp_path / "gpu_toolchain"
    manifest = prepare_module().pack(wheel, out, preset=0)
    return out, manifest, contents


def test_the_script_packs_two_files_with_their_digests(prepared):
    out, manifest, contents = prepared
    assert manifest["version"] == "13.0.88" and json.loads((out / "nvvm.json").read_text()) == manifest
    assert sorted(manifest["files"]) == ["nvvm/lib64/libnvvm.so.4", "nvvm/libdevice/libdevice.10.bc"]
    want = {f"nvvm/lib64/{Path(k).name}" if k.endswith(".so.4") else "nvvm/libdevice/libdevice.10.bc":
            hashlib.sha256(v).hexdigest() for k, v in contents.items()}  # fmt: skip
    assert manifest["files"] == want


def test_unpacking_checks_the_archive_and_every_file(prepared):
    out, manifest, _ = prepared
    home = nvvm.unpack_prepared(out)
    assert (home / "nvvm/lib64/libnvvm.so.4").is_file() and (home / "nvvm/libdevice/libdevice.10.bc").is_file()
    assert (home.parent.stat().st_mode & 0o777) == 0o700
    (home / "nvvm/lib64/libnvvm.so.4").write_bytes(b"altered after unpacking")  # unpacked again, not used
    assert nvvm.unpack_prepared(out) == home and b"altered" not in (home / "nvvm/lib64/libnvvm.so.4").read_bytes()
    archive = out / manifest["archive"]
    archive.write_bytes(archive.read_bytes()[:-10] + b"0123456789")
    (home / "nvvm/lib64/libnvvm.so.4").unlink()
    with pytest.raises(nvvm.NvvmUnavailable, match="missing or altered"):
        nvvm.unpack_prepared(out)
    assert nvvm.unpack_prepared(out.parent / "nothing here") is None


def test_without_nvvm_one_line_names_the_wheel_of_nvjitlinks_release(monkeypatch, tmp_path):
    monkeypatch.setattr(nvvm, "simulator_on", lambda: False)
    monkeypatch.setattr(nvvm, "nvjitlink_version", lambda: (13, 0))
    monkeypatch.setattr(nvvm, "_nvvm_loads", lambda: "DynamicLibNotFoundError: libnvvm.so.4")
    monkeypatch.setenv(nvvm.PREPARED_ENV, str(tmp_path / "no toolchain"))
    import moonvit_kernels.numba_backend._cuda as cuda_module

    monkeypatch.setattr(cuda_module, "COMPILER", "numba-cuda")
    with pytest.raises(nvvm.NvvmUnavailable) as e:
        nvvm.require_nvvm.__wrapped__()
    line = str(e.value)
    assert "\n" not in line and "no NVVM" in line and "pip install 'nvidia-nvvm==13.0.*'" in line
    assert "scripts/prepare_nvvm.py" in line


def test_the_newest_ptx_an_nvjitlink_takes():
    assert nvvm.max_ptx_isa((13, 0)) == (9, 0) and nvvm.max_ptx_isa((13, 5)) == (9, 5)
    assert nvvm.max_ptx_isa((12, 8)) is None
