"""The emulator's model of the driver's `cuTensorMapEncodeTiled` (`tensor_map_driver.cpp`), built and loaded.

Its own module so that the emulated device (`device.tensor_map_encoder`) and the Hopper kernels (`hopper`,
which re-exports `encode_tiled_driver`) both reach it without importing each other.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

from moonvit_kernels.cuda_backend import tensor_maps
from moonvit_kernels.tools.emulation import build

HERE = Path(__file__).resolve().parent


class _Encoder:
    """The model's cuTensorMapEncodeTiled (tensor_map_driver.cpp), called like the driver's."""

    def __init__(self, lib: ctypes.CDLL):
        self.fn = lib.emu_cuTensorMapEncodeTiled
        self.fn.argtypes, self.fn.restype = tensor_maps.ENCODE_ARGTYPES, ctypes.c_int
        self.error = lib.emu_tensor_map_error
        self.error.restype = ctypes.c_char_p

    def __call__(self, *args):
        return self.fn(*args)

    def last_error(self) -> str:
        return self.error().decode(errors="replace")


@functools.cache
def encode_tiled_driver() -> _Encoder:
    """The emulator's `cuTensorMapEncodeTiled`, with the driver's signature (`tensor_maps.ENCODE_ARGTYPES`)."""
    files = {"tensor_map_driver.cpp": (HERE / "tensor_map_driver.cpp").read_text(encoding="utf-8")}
    standins = ("prelude.h", "cuda_bf16.h", "hopper.cuh")
    path = build.build_library(files, "tensor_map_driver.cpp", standins=standins, tag="tensor_map")
    return _Encoder(build.load(path))
