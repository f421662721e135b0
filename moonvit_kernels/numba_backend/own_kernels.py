"""Bring your own kernel: the numba tower with one of its launchers replaced by yours, to compare with the NumPy
reference stage by stage (`compare.compare_backends`), as notebook 06 shows:

    with own_kernel("rmsnorm", my_rmsnorm):
        numba_model = MoonViT(config, weights, backend="numba")
        report = compare_backends(numba_model, MoonViT(config, weights, backend="numpy"), pixels, grid_thws)
    print(report.first_divergence)

The tower calls each stage through the launcher its module holds (`LAUNCHERS[stage]`: module and name). Yours
takes the same parameters (names checked against the original's signature, so a call by keyword reaches the
right one) and writes its result where the original does (in place, or into `out`); it may call your own
`@cuda.jit` kernel, or wrap the original while you build yours piece by piece.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

# stage -> (module of numba_backend, the launcher the tower calls, the keywords it passes: backend.forward)
LAUNCHERS = {
    "gemm": ("gemm", "gemm", ("epilogue", "residual", "out", "version")),
    "pos_emb": ("pos_emb", "add_position_embedding", ("mode",)),
    "rmsnorm": ("rmsnorm", "rmsnorm", ("out", "rstd")),
    "rope": ("rope", "rope2d", ()),
    "attention": ("attention", "attention", ("version", "out", "lse")),
    "merge": ("merge", "merge_gather", ()),
}


def _module(stage: str) -> tuple[Any, str]:
    if stage not in LAUNCHERS:
        raise ValueError(f"unknown stage {stage!r}; the tower's launchers are {', '.join(LAUNCHERS)}")
    module, name, _ = LAUNCHERS[stage]
    return importlib.import_module(f"{__package__}.{module}"), name


def check_launcher(stage: str, launcher: Callable[..., Any]) -> None:
    """ValueError unless `launcher` takes what the tower passes the launcher it replaces: that one's parameters
    without a default (by name, in order) and the keywords the tower gives it (`LAUNCHERS`)."""
    module, name = _module(stage)
    if not callable(launcher):
        raise ValueError(f"{stage}: your launcher must be a function, got {type(launcher).__name__}")
    params = inspect.signature(getattr(module, name)).parameters
    want = [p for p, v in params.items() if v.default is inspect.Parameter.empty] + list(LAUNCHERS[stage][2])
    try:
        got = inspect.signature(launcher).parameters
    except (TypeError, ValueError):  # a builtin or C function: nothing to check against
        return
    if any(p.kind == p.VAR_KEYWORD for p in got.values()):
        return
    missing = [p for p in want if p not in got]
    if missing:
        raise ValueError(
            f"{stage}: your launcher lacks the parameter(s) {', '.join(missing)} of {module.__name__}.{name}"
            f"{inspect.signature(getattr(module, name))}: take the same parameters, by name"
        )


@contextlib.contextmanager
def own_kernel(stage: str, launcher: Callable[..., Any]) -> Iterator[None]:
    """While active, the numba tower runs `stage` with `launcher` instead of its own (see the module docstring);
    the original is back afterwards, whatever happened."""
    check_launcher(stage, launcher)
    module, name = _module(stage)
    original = getattr(module, name)
    setattr(module, name, launcher)
    try:
        yield
    finally:
        setattr(module, name, original)
