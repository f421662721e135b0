"""Outputs are written whole or not at all, and an output place is checked before any compute."""

import os
import stat
import zipfile

import numpy as np
import pytest
from helpers import file_size_limit, read_only_folder, snapshot

from moonvit_kernels import atomic


def test_a_file_appears_only_when_complete(tmp_path):
    target = tmp_path / "out.bin"
    with atomic.atomic_file(target) as f:
        f.write(b"first")
        assert not target.exists()  # nothing under the final name while writing
    assert target.read_bytes() == b"first"
    mode = stat.S_IMODE(target.stat().st_mode)
    umask = os.umask(0)
    os.umask(umask)
    assert mode == 0o666 & ~umask  # the permissions of an ordinary new file, not mkstemp's 0600


def test_a_failure_keeps_the_earlier_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "out.bin"
    target.write_bytes(b"earlier")
    with pytest.raises(RuntimeError, match="midway"):
        with atomic.atomic_file(target) as f:
            f.write(b"half of the new")
            raise RuntimeError("midway")
    assert snapshot(tmp_path) == {"out.bin": b"earlier"}


def test_a_full_disk_keeps_the_earlier_file(tmp_path):
    target = tmp_path / "out.bin"
    target.write_bytes(b"earlier")
    with pytest.raises(OSError) as e, file_size_limit(4096):
        atomic.write_bytes(target, bytes(10_000))
    assert str(target) in str(e.value)
    assert snapshot(tmp_path) == {"out.bin": b"earlier"}


def test_a_path_for_writers_that_want_one(tmp_path):
    target = tmp_path / "arrays.npz"
    with atomic.atomic_path(target) as tmp:
        assert tmp.parent == tmp_path and tmp != target and tmp.suffix == ".npz"  # numpy appends nothing
        np.savez(tmp, a=np.arange(3))
    with np.load(target) as data:
        assert data["a"].tolist() == [0, 1, 2]
    assert [p.name for p in tmp_path.iterdir()] == ["arrays.npz"]


def test_npz_members_written_one_at_a_time_load_with_numpy(tmp_path):
    target = tmp_path / "emb.out"
    rng = np.random.default_rng(0)
    arrays = {"image_0": rng.standard_normal((3, 5)).astype(np.float32), "sources": np.array(["a.png", "b c.jpg"])}
    with atomic.atomic_file(target) as f, zipfile.ZipFile(f, "w", allowZip64=True) as archive:
        for name, array in arrays.items():
            atomic.add_npy(archive, name, array)
    with np.load(target) as data:
        assert sorted(data.files) == sorted(arrays)
        for name, array in arrays.items():
            np.testing.assert_array_equal(data[name], array)


# ============================================================================ checked before compute
def test_a_parent_that_is_a_file_is_named(tmp_path):
    (tmp_path / "plain").write_text("x")
    with pytest.raises(ValueError, match=r"plain is a file, not a folder") as e:
        atomic.check_writable(tmp_path / "plain" / "sub" / "emb.npz")
    assert str(tmp_path / "plain" / "sub" / "emb.npz") in str(e.value)
    with pytest.raises(ValueError, match="is a file, not a folder"):
        atomic.check_writable(tmp_path / "plain", folder=True)
    (tmp_path / "dir").mkdir()
    with pytest.raises(ValueError, match="is a folder, not a file"):
        atomic.check_writable(tmp_path / "dir")
    atomic.check_writable(tmp_path / "new" / "deeper" / "emb.npz")  # folders to be made: fine
    assert not (tmp_path / "new").exists()  # and not made by the check


def test_a_read_only_folder_is_named(tmp_path):
    with read_only_folder(tmp_path / "ro") as folder:
        with pytest.raises(ValueError, match=rf"cannot write in {folder}"):
            atomic.check_writable(folder / "emb.npz")
        with pytest.raises(ValueError, match=rf"cannot write in {folder}"):
            atomic.check_writable(folder / "golden", folder=True)
