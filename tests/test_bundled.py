"""The bundled data is found in a clone (top-level `data/`) and in an installed wheel (`moonvit_kernels/data/`),
from any working directory; the installed copy wins, and a folder that is not a clone is never taken for one."""

import shutil
from pathlib import Path

from moonvit_kernels import bundled
from moonvit_kernels.bundled import find_data_dir

ROOT = Path(__file__).resolve().parents[1]


def _data(folder: Path) -> Path:
    (folder / "tiny").mkdir(parents=True)
    (folder / "tiny" / "config.json").write_text("{}")
    return folder


def test_this_checkout_finds_its_top_level_data():
    assert bundled.DATA_DIR == (ROOT / "data").resolve()
    assert (bundled.TINY_DIR / "model.safetensors").is_file() and (bundled.TINY_DIR / "inputs.npz").is_file()
    assert (bundled.GOLDEN_DIR / "provenance.json").is_file() and bundled.PHOTO.is_file()


def test_an_installed_package_uses_its_own_data(tmp_path):
    package = tmp_path / "site-packages" / "moonvit_kernels"
    package.mkdir(parents=True)
    installed = _data(package / "data")
    _data(tmp_path / "site-packages" / "data")  # another distribution's top-level "data": never used
    assert find_data_dir(package) == installed


def test_a_clone_uses_the_top_level_data(tmp_path):
    clone = tmp_path / "clone"
    (clone / "moonvit_kernels").mkdir(parents=True)
    (clone / "pyproject.toml").write_text("")
    top = _data(clone / "data")
    assert find_data_dir(clone / "moonvit_kernels") == top
    inside = _data(clone / "moonvit_kernels" / "data")  # the installed place wins when both exist
    assert find_data_dir(clone / "moonvit_kernels") == inside
    shutil.rmtree(clone / "data")
    assert find_data_dir(clone / "moonvit_kernels") == inside


def test_a_folder_that_is_not_a_clone_or_data_without_the_checkpoint_is_not_taken(tmp_path):
    site = tmp_path / "site-packages"
    (site / "moonvit_kernels").mkdir(parents=True)
    _data(site / "data")  # beside the package, but no pyproject.toml: not a clone
    assert find_data_dir(site / "moonvit_kernels") == site / "moonvit_kernels" / "data"
    clone = tmp_path / "clone"
    (clone / "moonvit_kernels").mkdir(parents=True)
    (clone / "pyproject.toml").write_text("")
    (clone / "data" / "photo").mkdir(parents=True)  # no tiny/config.json: not the bundled data
    assert find_data_dir(clone / "moonvit_kernels") == clone / "moonvit_kernels" / "data"
