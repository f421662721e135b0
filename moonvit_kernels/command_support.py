"""What every command of the command line shares: one-line user-facing errors (`CLIError`, exit status 2)
and the checks that turn a bad checkpoint, image, input file, output place or backend into one.

The commands themselves live in their own modules (`encode_commands`, `golden`, `demo`,
`checkpoint_report`, `fetch_command`, `rope_command`); `cli` parses arguments and dispatches to them.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .bundled import TINY_DIR


class CLIError(Exception):
    """A user-facing failure: printed as one line, exit status 2."""


def one_line(message: object) -> str:
    """An exception's message on one line (KeyError's repr quotes removed)."""
    if isinstance(message, KeyError) and message.args:
        message = message.args[0]
    return " ".join(str(message).split())


def load_checkpoint_or_fail(path: str | Path) -> tuple[Any, dict[str, np.ndarray]]:
    """`weights.load_checkpoint`, with any failure turned into a CLIError naming the checkpoint."""
    from .weights import load_checkpoint

    path = Path(path)
    if not path.exists():
        hint = (
            f"; the bundled data ships inside the package ({TINY_DIR.parent}) and this installation lacks it: "
            "reinstall the package (pip install --force-reinstall moonvit_kernels, or pip install -e . in a clone) "
            "or pass --weights"
            if path == TINY_DIR
            else ""
        )
        raise CLIError(f"{path}: no such checkpoint (expected a directory with config.json and safetensors){hint}")
    config_json = (path if path.is_dir() else path.parent) / "config.json"
    if config_json.is_dir():
        raise CLIError(f"{config_json}: is a folder, not a config.json file")
    if not config_json.is_file():
        raise CLIError(f"{path}: no config.json beside the weights (looked for {config_json})")
    try:
        return load_checkpoint(path)
    except (ValueError, KeyError, FileNotFoundError, OSError) as e:
        msg = one_line(e)
        raise CLIError(msg if str(path) in msg else f"{path}: incompatible or unreadable checkpoint: {msg}") from None


SIMULATOR_HINT = (
    "add --simulator to run the numba kernels on numba's CUDA simulator (CPU, slow), or use --backend numpy"
)


def choose_backend(backend: str, simulator: bool) -> str:
    """The backend to build; with `simulator`, switch numba's CUDA simulator on first.

    NUMBA_ENABLE_CUDASIM is read once, when numba is first imported, so `--simulator` must act
    before that: a CLIError says so if numba is already loaded without it."""
    import os

    from .device import simulator_enabled

    if not simulator:
        return backend
    if backend not in ("auto", "numba"):
        raise CLIError(f"--simulator runs the numba kernels on the CPU; it does not apply to backend {backend!r}")
    if not simulator_enabled():
        if "numba" in sys.modules:
            raise CLIError("--simulator came after numba was loaded: set NUMBA_ENABLE_CUDASIM=1 in the environment")
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    return "numba"


def make_model(config: Any, weights: dict[str, np.ndarray], backend: str) -> Any:
    """`MoonViT` on `backend`; a backend that cannot run here becomes a CLIError
    (numba without a GPU and without the simulator says how to use the simulator)."""
    from .device import gpu_available, simulator_enabled
    from .model import MoonViT

    if backend == "numba" and not simulator_enabled() and not gpu_available():
        raise CLIError(
            f"backend 'numba' needs a CUDA GPU and none was found (no working CUDA driver): {SIMULATOR_HINT}"
        )
    try:
        return MoonViT(config, weights, backend=backend)
    except (ValueError, ImportError) as e:
        hint = f"; {SIMULATOR_HINT}" if backend == "numba" and not simulator_enabled() else ""
        raise CLIError(f"backend {backend!r}: {one_line(e)}{hint}") from None


def backend_label(model: Any) -> str:
    """`numpy reference (CPU)`, `numba (CUDA simulator, CPU)`, `cupy (NVIDIA H100 ...)`."""
    from .device import gpu_name, simulator_enabled

    if model.backend_name == "numpy":
        return "numpy reference (CPU)"
    if model.backend_name == "numba" and simulator_enabled():
        return "numba (CUDA simulator, CPU)"
    return f"{model.backend_name} ({gpu_name() or 'GPU'})"


def preprocess_limits(args: argparse.Namespace) -> dict[str, int]:
    """The preprocessing overrides given on the command line (None = keep the default)."""
    return {
        "in_patch_limit": getattr(args, "in_patch_limit", None),
        "patch_limit_on_one_side": getattr(args, "patch_limit_on_one_side", None),
    }


def preprocess_settings(config: Any, args: argparse.Namespace) -> Any:
    """The `PreprocessConfig` for `config` and the command line's limits; CLIError naming a bad limit."""
    from .preprocess import resolve_settings

    try:
        return resolve_settings(config, **preprocess_limits(args))
    except ValueError as e:
        raise CLIError(f"--in-patch-limit / --patch-limit-on-one-side: {one_line(e)}") from None


def load_images_or_fail(paths: Sequence[str], settings: Any) -> list[Any]:
    """Preprocess each image file on its own (`Preprocessed` per file); CLIError naming the file."""
    return [preprocess_one_or_fail(path, settings) for path in paths]


def preprocess_one_or_fail(path: str, settings: Any) -> Any:
    """`preprocess.preprocess_images` of one file with `settings` (a `PreprocessConfig`); CLIError naming the file."""
    from . import preprocess

    try:
        return preprocess.preprocess_images(path, settings)
    except ValueError as e:
        msg = one_line(e)
        raise CLIError(msg if str(path) in msg else f"{path}: {msg}") from None


def inspect_images_or_fail(paths: Sequence[str]) -> None:
    """Every image file opened (headers only, `preprocess.inspect_image`) before any compute."""
    from .preprocess import inspect_image

    for path in paths:
        try:
            inspect_image(path)
        except ValueError as e:
            raise CLIError(one_line(e)) from None


def check_output(path: str | Path, folder: bool = False) -> Path:
    """`atomic.check_writable` as a CLIError: the output place is checked before the compute."""
    from .atomic import check_writable

    try:
        check_writable(path, folder=folder)
    except ValueError as e:
        raise CLIError(one_line(e)) from None
    return Path(path)


@contextlib.contextmanager
def output_locked(out: str | Path, command: str) -> Iterator[None]:
    """`output_lock.output_lock` of `out` for the block, a run already holding it a CLIError naming it."""
    from .output_lock import OutputBusy, output_lock

    try:
        lock = output_lock(out, command)
        lock.__enter__()
    except OutputBusy as e:
        raise CLIError(one_line(e)) from None
    with contextlib.ExitStack() as stack:
        stack.push(lock)
        yield


def read_inputs_or_fail(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """`pixel_values [L, 3, p, p]` and `grid_thws [N, 3]` from an `.npz` (the bundled `inputs.npz` layout);
    CLIError naming the file when it cannot be read or lacks either array."""
    try:
        with np.load(path) as inputs:
            return inputs["pixel_values"], inputs["grid_thws"]
    except (OSError, KeyError, ValueError) as e:
        raise CLIError(f"{path}: cannot read pixel_values and grid_thws ({one_line(e)})") from None
