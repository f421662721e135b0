"""Registers, spills and shared memory of every kernel binary a worker loaded, and the Hopper ptxas log.

`BinaryRecorder` is installed in a GPU worker before its kernels run. It wraps, for the worker's life:
  - the CUDA C launchers' and the Hopper launchers' kernel look-up (`launchers._kernel`,
    `hopper_launchers._kernel`), keeping each CuPy function they return, whose `attributes` (registers,
    local memory = spills and stack, static/dynamic shared memory, binary version) are read at the end;
  - `nvrtc_check.compile_text`, through which the Hopper kernels are built, keeping its ptxas log
    (`-Xptxas=-v`: registers, spills, barriers per kernel) that the launcher otherwise discards.
numba kernels are read from the numba backend's dispatchers (`get_regs_per_thread`,
`get_local_mem_per_thread`, `get_shared_mem_per_block` per compiled signature).

The wrapped names are the launchers' own; when one is missing (a launcher rewritten), the report says
"not recorded" and why, and nothing else changes. Under --simulate nothing is compiled for a GPU.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

CUPY_ATTRIBUTES = (
    ("num_regs", "registers"),
    ("local_size_bytes", "local B (spills + stack)"),
    ("shared_size_bytes", "static shared B"),
    ("max_dynamic_shared_size_bytes", "dynamic shared B (max)"),
    ("binary_version", "binary sm"),
)


class BinaryRecorder:
    """Keeps the kernels and compile logs a worker's launchers produce (see the module docstring)."""

    def __init__(self) -> None:
        self.kernels: dict[str, Any] = {}  # "module: name" -> CuPy function
        self.logs: list[tuple[str, str]] = []  # (what was compiled, ptxas log)
        self.missing: list[str] = []
        self._restore: list[tuple[Any, str, Any]] = []

    def install(self, module_names: tuple[str, ...] = ("launchers", "hopper_launchers")) -> None:
        for short in module_names:
            try:
                module = importlib.import_module(f"moonvit_kernels.cuda_backend.{short}")
            except Exception as e:
                self.missing.append(f"{short}: does not import ({type(e).__name__})")
                continue
            if not callable(getattr(module, "_kernel", None)):
                self.missing.append(f"{short}: has no _kernel to wrap")
                continue
            self._wrap(module, "_kernel", self._keep_kernel(short))
        try:
            from moonvit_kernels.tools import nvrtc_check

            self._wrap(nvrtc_check, "compile_text", self._keep_log)
        except Exception as e:
            self.missing.append(f"nvrtc_check: {type(e).__name__}: {e}")

    def _wrap(self, module: Any, name: str, make: Callable[[Callable], Callable]) -> None:
        original = getattr(module, name)
        self._restore.append((module, name, original))
        setattr(module, name, make(original))

    def uninstall(self) -> None:
        for module, name, original in reversed(self._restore):
            setattr(module, name, original)
        self._restore.clear()

    def _keep_kernel(self, short: str) -> Callable[[Callable], Callable]:
        def make(original: Callable) -> Callable:
            def wrapped(*args: Any, **kwargs: Any) -> Any:
                result = original(*args, **kwargs)
                kernel = result[0] if isinstance(result, tuple) else result
                strings = [a for a in args if isinstance(a, str)]
                source = next((a for a in strings if a.endswith(".cu")), "")
                name = next((a for a in strings if not a.endswith(".cu")), repr(args))
                self.kernels.setdefault(f"{short}: {source} {name}".strip(), kernel)
                return result

            return wrapped

        return make

    def _keep_log(self, original: Callable) -> Callable:
        def wrapped(text: str, filename: str, names: Any, arch: str, *args: Any, **kwargs: Any) -> Any:
            result = original(text, filename, names, arch, *args, **kwargs)
            self.logs.append((f"{filename} {', '.join(names)} ({arch})", str(result[1])))
            return result

        return wrapped

    def text(self) -> str:
        """The table of recorded kernels' attributes, then the compile logs."""
        lines = []
        if self.kernels:
            lines.append(kernel_table(self.kernels))
        if self.logs:
            lines += ["", "ptxas logs (-Xptxas=-v) of the kernels built through nvrtc_check:"]
            for what, log in self.logs:
                lines += [f"--- {what}", log.strip()]
        if self.missing:
            lines += ["", "not recorded: " + "; ".join(self.missing)]
        return "\n".join(lines) or "no kernel binary was loaded"


def kernel_table(kernels: dict[str, Any]) -> str:
    """One line per CuPy function: its attributes (`CUPY_ATTRIBUTES`), or why they could not be read."""
    lines = ["kernel | " + " | ".join(label for _, label in CUPY_ATTRIBUTES)]
    for name, kernel in sorted(kernels.items()):
        try:
            attrs = kernel.attributes
            lines.append(f"{name} | " + " | ".join(str(attrs.get(key, "?")) for key, _ in CUPY_ATTRIBUTES))
        except Exception as e:
            lines.append(f"{name} | attributes unavailable ({type(e).__name__}: {e})")
    return "\n".join(lines)


def numba_table() -> str:
    """Registers, local memory and shared memory per compiled signature of every numba kernel of the registry
    compiled so far in this process, read through numba-cuda's dispatcher API (`get_regs_per_thread(signature)`
    etc., which take the `Signature` objects of `nopython_signatures`)."""
    from moonvit_kernels import registry

    lines = ["kernel | signature | registers | local B/thread (spills + stack) | shared B/block"]
    seen: set[int] = set()
    for entry in registry.numba_entries():
        try:
            dispatcher = entry.dispatcher()
        except Exception as e:
            lines.append(f"{entry.label} | does not import ({type(e).__name__}: {e})")
            continue
        if id(dispatcher) in seen or not hasattr(dispatcher, "get_regs_per_thread"):
            continue  # one dispatcher serves several entries; the simulator's kernels have no binary
        seen.add(id(dispatcher))
        for sig in list(getattr(dispatcher, "nopython_signatures", [])):
            args = ", ".join(str(a) for a in sig.args)
            try:
                regs = dispatcher.get_regs_per_thread(sig)
                local = dispatcher.get_local_mem_per_thread(sig)
                shared = dispatcher.get_shared_mem_per_block(sig)
                lines.append(f"{entry.label} | ({args}) | {regs} | {local} | {shared}")
            except Exception as e:
                lines.append(f"{entry.label} | ({args}) | unavailable ({type(e).__name__}: {e})")
    return "\n".join(lines) if len(lines) > 1 else "no numba kernel was compiled in this worker"
