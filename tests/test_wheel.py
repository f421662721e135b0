"""A built (non-editable) wheel, installed into a fresh virtual environment, runs `run` and `demo` from any
directory; an editable install of a copy of the clone finds the top-level `data/` the same way.

The wheel is built from a copy of the package sources and the top-level `data/` (pip wheel, no build
isolation, no network); the fresh venv sees this environment's dependencies through a `.pth` line but not
the editable install of the checkout, and every command runs in isolated mode (`-I`) from an unrelated
folder, so the package and its bundled data must come from the wheel (or from the copy, when editable).
"""

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _run(cmd: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "NUMBA_ENABLE_CUDASIM"))}
    env["PYTHONNOUSERSITE"] = "1"
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]


def _copy_sources(base: Path) -> Path:
    """What a clone needs to build: pyproject.toml, README.md, the package and the top-level data/."""
    src = base / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for folder in ("moonvit_kernels", "data"):
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return src


def _fresh_venv(base: Path) -> Path:
    """The python of a new venv without pip that sees this environment's dependencies (not its .pth files,
    where the checkout's editable install lives) through one .pth line."""
    venv = base / "venv"
    r = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], base)
    assert r.returncode == 0, r.stderr
    python = venv / "bin" / "python"
    site = Path(
        _run(
            [str(python), "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], base
        ).stdout.strip()
    )
    deps = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    (site / "zz_parent_dependencies.pth").write_text("\n".join(deps) + "\n")
    return python


def _install(python: Path, target: list[str], base: Path) -> None:
    r = _run(
        [*PIP, "--python", str(python), "install", "--no-deps", "--no-index", "--no-build-isolation", *target], base
    )
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory) -> tuple[Path, Path]:
    """(python of a fresh venv holding only the wheel, a scratch folder to run in)."""
    base = tmp_path_factory.mktemp("wheel")
    src = _copy_sources(base)
    r = _run(
        [*PIP, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(base / "dist"), str(src)], base
    )
    assert r.returncode == 0, r.stderr[-3000:]
    (wheel,) = (base / "dist").glob("moonvit_kernels-*.whl")
    shutil.rmtree(src)  # nothing may come from the sources the wheel was built from
    python = _fresh_venv(base)
    _install(python, [str(wheel)], base)
    scratch = base / "elsewhere"
    scratch.mkdir()
    return python, scratch


def test_wheel_holds_the_bundled_data(wheel_venv):
    python, _ = wheel_venv
    (wheel,) = (python.parents[2] / "dist").glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in (
        "moonvit_kernels/data/__init__.py",
        "moonvit_kernels/data/tiny/model.safetensors",
        "moonvit_kernels/data/tiny/config.json",
        "moonvit_kernels/data/tiny/inputs.npz",
        "moonvit_kernels/data/photo/grace_hopper.jpg",
        "moonvit_kernels/cuda_backend/__init__.py",
        "moonvit_kernels/tools/emulation/__init__.py",
        "moonvit_kernels/tools/emulation/launch_entry.h",
        "moonvit_kernels/tools/emulation/tensor_map_driver.cpp",
    ):
        assert needed in names, f"the wheel lacks {needed}"
    assert any(n.startswith("moonvit_kernels/data/golden_tiny/") for n in names)
    assert any(n.startswith("moonvit_kernels/cuda_backend/") and n.endswith(".cu") for n in names)
    # every exercise's solution, so that `exercises.solution(name)` works from the wheel
    solutions = Path(__file__).resolve().parents[1] / "moonvit_kernels" / "exercises" / "solutions"
    for path in solutions.iterdir():
        if path.suffix in (".py", ".cu"):
            assert f"moonvit_kernels/exercises/solutions/{path.name}" in names, f"the wheel lacks solution {path.name}"


def test_installed_package_comes_from_the_wheel(wheel_venv):
    python, scratch = wheel_venv
    r = _run([str(python), "-I", "-c", "import moonvit_kernels; print(moonvit_kernels.__file__)"], scratch)
    assert r.returncode == 0, r.stderr
    where = Path(r.stdout.strip())
    assert python.parents[1] in where.parents, f"imported from {where}, not from the fresh venv"
    assert ROOT not in where.parents


def test_wheel_run_and_demo_from_another_folder(wheel_venv):
    python, scratch = wheel_venv
    r = _run([str(python), "-I", "-m", "moonvit_kernels", "run"], scratch)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "item 1 video (2 frames)" in r.stdout and "backend: numpy reference" in r.stdout
    assert str(python.parents[1]) in r.stdout  # the checkpoint path printed is inside the venv
    out = scratch / "demo"
    r = _run(
        [str(python), "-I", "-m", "moonvit_kernels", "demo", "--out", str(out), "--in-patch-limit", "128"], scratch
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert len(list(out.glob("*.png"))) == 7
    script = python.parent / "moonvit-kernels"
    assert script.is_file(), "the console script was not installed"


def test_wheel_console_script_runs_from_another_folder(wheel_venv):
    python, scratch = wheel_venv
    r = _run([str(python.parent / "moonvit-kernels"), "run"], scratch)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"checkpoint {python.parents[1]}" in r.stdout and "/moonvit_kernels/data/tiny" in r.stdout
    assert "item 0 image grid (t,h,w)=(1,6,8) -> (12, 40)" in r.stdout


def test_an_editable_install_finds_the_top_level_data(tmp_path):
    src = _copy_sources(tmp_path)
    python = _fresh_venv(tmp_path)  # its .pth line brings setuptools, which the editable build needs
    _install(python, ["-e", str(src)], tmp_path)
    scratch = tmp_path / "elsewhere"
    scratch.mkdir()
    where = "import moonvit_kernels.bundled as b, moonvit_kernels.data as d; print(b.DATA_DIR); print(d.__file__)"
    r = _run([str(python), "-I", "-c", where], scratch)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == [str(src / "data"), str(src / "data" / "__init__.py")]
    r = _run([str(python.parent / "moonvit-kernels"), "run"], scratch)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"checkpoint {src / 'data' / 'tiny'}:" in r.stdout and "backend: numpy reference" in r.stdout
