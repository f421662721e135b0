"""The small files shipped with the package, found from any working directory.

They live in the repository's top-level `data/` folder; a wheel installs them as the package data
`moonvit_kernels/data/` (pyproject.toml maps the one onto the other). `find_data_dir` looks in the
installed place first, then in the clone this package was imported from (an editable install, or
`PYTHONPATH=.` in a checkout).

- `TINY_DIR`: a tiny bf16 checkpoint in the real K3 tensor names (`config.json`, `model.safetensors`) and
  `inputs.npz` (an image 1×6×8 and a 2-frame video 2×4×4, packed); made by `scripts/make_tiny_checkpoint.py`.
- `GOLDEN_DIR`: every stage's values on those inputs, float32 and float64 (made by the `golden` command).
- `PHOTO`: a public-domain photograph for the demo.
"""

from __future__ import annotations

from pathlib import Path

MARKER = Path("tiny") / "config.json"  # a data folder without it is not the bundled one


def find_data_dir(package_dir: str | Path) -> Path:
    """The bundled data folder for the package in `package_dir`: `package_dir/data` (an installed wheel)
    when it holds the tiny checkpoint, else `data/` beside `package_dir` when that folder is a clone (it
    holds `pyproject.toml`) and has it, else `package_dir/data` (missing: the command line says where
    it was expected and how to reinstall)."""
    package_dir = Path(package_dir).resolve()
    installed = package_dir / "data"
    clone = package_dir.parent
    for candidate in (installed, clone / "data"):
        if (candidate / MARKER).is_file() and (candidate == installed or (clone / "pyproject.toml").is_file()):
            return candidate
    return installed


DATA_DIR = find_data_dir(Path(__file__).parent)
TINY_DIR = DATA_DIR / "tiny"
GOLDEN_DIR = DATA_DIR / "golden_tiny"
PHOTO = DATA_DIR / "photo" / "grace_hopper.jpg"
