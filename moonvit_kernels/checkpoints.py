"""Open a checkpoint wherever it lives: the package's `load_checkpoint`.

A local checkpoint (a folder with `config.json` and safetensors, sharded or not) is read by `weights`; a
remote one (`hf://ORG/REPO[@REVISION]`, an `http(s)://` checkpoint URL; `remote.is_remote`) is first
fetched by `hub` — only its vision tensors, by ranged reads — into a cache folder, once, and read from
there. `weights` never imports `hub`: this module is the only place that joins them.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from . import weights
from .config import VisionConfig
from .remote import is_remote


def local_checkpoint(path: str | os.PathLike) -> str | os.PathLike | Path:
    """`path` itself when it is local; for a remote checkpoint, the cache folder `hub.fetch_cached` fills
    with its vision tensors (fetched on the first call, reused or resumed afterwards)."""
    if not is_remote(path):
        return path
    from .hub import fetch_cached  # fsspec & co. load only when something remote is asked for

    return fetch_cached(str(path))


def load_checkpoint(path: str | os.PathLike) -> tuple[VisionConfig, dict[str, np.ndarray]]:
    """`(config, weights)` of a checkpoint folder holding `config.json`, or of `hf://ORG/REPO[@REVISION]` /
    an `http(s)://` checkpoint URL (only the vision tensors fetched, into `hub.cache_dir(path)`); float32
    arrays in the real K3 tensor names, as `weights.load_checkpoint` returns them."""
    return weights.load_checkpoint(local_checkpoint(path))
