"""Checkpoint I/O in the real K3 tensor names: safetensors read/write (bf16 included), checks, random weights.

A weights object is a plain `dict[str, np.ndarray]` keyed by the checkpoint names of `docs/model.md`
(`vision_tower.…`, `mm_projector.…`) with the checkpoint shapes, loaded as float32.

Files are read with the `safetensors` library (`safe_open`, memory-mapped), so only the vision
tensors' bytes are ever touched: a real K3 file also holds a text decoder of hundreds of GB.
bfloat16 is `ml_dtypes.bfloat16`. What this module adds to the library: the vision-name filter,
sharded index handling, shape/dtype/NaN checks, and error messages that name the file.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import struct
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from .atomic import atomic_path, write_text
from .config import VisionConfig
from .remote import is_remote

VISION_PREFIXES = ("vision_tower.", "mm_projector.")
INDEX_NAME = "model.safetensors.index.json"

# safetensors dtype tags this loader turns into float32, with their byte widths
READABLE_DTYPES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8}
_SAVE_DTYPES = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
}


# ============================================================================ names and shapes
def expected_shapes(config: VisionConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the tower + projector needs, name -> shape (the table in `docs/model.md`)."""
    D, Q, I = config.vt_hidden_size, config.qkv_hidden_size, config.vt_intermediate_size
    p, K, T = config.patch_size, config.merged_hidden_size, config.text_hidden_size
    shapes: dict[str, tuple[int, ...]] = {
        "vision_tower.patch_embed.proj.weight": (D, 3, p, p),
        "vision_tower.patch_embed.pos_emb.weight": (config.init_pos_emb_height, config.init_pos_emb_width, D),
    }
    for i in range(config.vt_num_hidden_layers):
        b = f"vision_tower.encoder.blocks.{i}."
        shapes[b + "norm0.weight"] = (D,)
        shapes[b + "wqkv.weight"] = (3 * Q, D)
        shapes[b + "wo.weight"] = (D, Q)
        shapes[b + "norm1.weight"] = (D,)
        shapes[b + "mlp.fc0.weight"] = (I, D)
        shapes[b + "mlp.fc1.weight"] = (D, I)
    shapes["vision_tower.encoder.final_layernorm.weight"] = (D,)
    shapes["mm_projector.proj.0.weight"] = (K, K)
    shapes["mm_projector.proj.2.weight"] = (T, K)
    shapes["mm_projector.post_norm.weight"] = (T,)
    return shapes


def parameter_count(config: VisionConfig) -> dict[str, int]:
    """Parameters of the tower, the projector and both together (the sizes of `expected_shapes`,
    counted without building its table, so any layer count is cheap)."""
    D, Q, I = config.vt_hidden_size, config.qkv_hidden_size, config.vt_intermediate_size
    p, K, T = config.patch_size, config.merged_hidden_size, config.text_hidden_size
    block = D + 3 * Q * D + D * Q + D + I * D + D * I
    embed = D * 3 * p * p + config.init_pos_emb_height * config.init_pos_emb_width * D
    tower = embed + config.vt_num_hidden_layers * block + D
    proj = K * K + T * K + T
    return {"vision_tower": tower, "mm_projector": proj, "total": tower + proj}


_BLOCK = re.compile(r"^vision_tower\.encoder\.blocks\.(\d+)\.")


def layers_present(names: Iterable[str]) -> int:
    """Encoder blocks a set of tensor names holds: 1 + the highest block index (0 without blocks)."""
    indices = [int(m.group(1)) for m in map(_BLOCK.match, names) if m]
    return max(indices) + 1 if indices else 0


def check_layer_count(names: Iterable[str], config: VisionConfig, holder: str = "the checkpoint holds") -> None:
    """ValueError when the config asks for more encoder blocks than the tensors hold — checked before
    anything is built per layer, so a typo like 10**9 layers fails at once instead of filling memory."""
    present = layers_present(names)
    if config.vt_num_hidden_layers > present:
        raise ValueError(
            f"config says vt_num_hidden_layers={config.vt_num_hidden_layers} but {holder} {present} encoder "
            f"block(s) (blocks.0 .. blocks.{present - 1})"
        )


def is_vision_key(name: str) -> bool:
    """True for tensors of the vision tower or the projector."""
    return name.startswith(VISION_PREFIXES)


def check_weights(weights: Mapping[str, Any], config: VisionConfig, finite: bool = True) -> None:
    """Raise if a tensor is missing (KeyError), mis-shaped, not floating, holds NaN or Inf (with
    `finite`), or an unexpected vision tensor is present (ValueError) — each message names the key."""
    if not isinstance(weights, Mapping):
        raise ValueError(f"weights must be a mapping of checkpoint names to arrays, got {type(weights).__name__}")
    check_layer_count(weights, config, "the weights hold")
    shapes = expected_shapes(config)
    missing = [k for k in shapes if k not in weights]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise KeyError(f"missing tensor {missing[0]!r}{more}")
    for name, shape in shapes.items():
        got = tuple(np.shape(weights[name]))
        if got != shape:
            raise ValueError(f"tensor {name!r} has shape {got}, expected {shape}")
        dt = getattr(weights[name], "dtype", None)
        if dt is None or not np.issubdtype(np.dtype(dt), np.floating):
            raise ValueError(f"tensor {name!r} has dtype {dt}, expected a floating dtype")
        if finite and not np.all(np.isfinite(weights[name])):
            raise ValueError(f"tensor {name!r} holds NaN or Inf values")
    extra = sorted(k for k in weights if is_vision_key(k) and k not in shapes)
    if extra:
        raise ValueError(
            f"unexpected vision tensor {extra[0]!r} ({len(extra)} in all): the checkpoint does not match the config "
            f"(vt_num_hidden_layers={config.vt_num_hidden_layers})"
        )


# ============================================================================ bf16 as raw bits
def bf16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 stored as uint16 bits -> float32 (exact: bf16 is the top half of an fp32)."""
    return np.ascontiguousarray(bits, dtype=np.uint16).view(ml_dtypes.bfloat16).astype(np.float32)


def float32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits (uint16), round to nearest even; NaN stays NaN."""
    return np.ascontiguousarray(x, dtype=np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


# ============================================================================ safetensors reading
def _explain(path: Path, error: Exception) -> str:
    """The library's error on a bad file, as one message naming the file and the likely cause.

    safetensors >= 0.5 words its errors ("header too small"), 0.4 names them ("HeaderTooSmall")."""
    msg = str(error).removeprefix("Error while deserializing header: ")
    if "header too small" in msg or "HeaderTooSmall" in msg:
        size = path.stat().st_size
        return f"{path}: not a safetensors file ({size} bytes, too short for a header)"
    if "header too large" in msg or "HeaderTooLarge" in msg:
        return f"{path}: corrupt safetensors header (its length field claims more bytes than the file holds)"
    if "invalid JSON" in msg or "InvalidHeader" in msg:
        return f"{path}: corrupt safetensors header ({msg})"
    if "not fully covered" in msg or "MetadataIncompleteBuffer" in msg:
        return f"{path}: the header's tensors do not cover the data exactly (truncated or padded file?)"
    if "invalid shape, data type, or offset" in msg or "TensorInvalidInfo" in msg:
        return f"{path}: a tensor's byte range does not match its shape and dtype (corrupt header or truncated file)"
    return f"{path}: not a valid safetensors file ({msg})"


class SafetensorsFile:
    """One `.safetensors` file opened with `safetensors.safe_open` (memory-mapped; opening reads
    only the header): its tensor names, dtypes and shapes, and reads of single tensors."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"no such checkpoint file: {self.path}")
        try:
            self._handle = safe_open(str(self.path), framework="np")
        except SafetensorError as e:
            raise ValueError(_explain(self.path, e)) from None
        self.metadata: dict[str, str] = self._handle.metadata() or {}
        self._ranges: dict[str, tuple[int, int]] | None = None
        self.entries: dict[str, dict[str, Any]] = {}
        for name in self._handle.keys():
            piece = self._handle.get_slice(name)
            self.entries[name] = {"dtype": piece.get_dtype(), "shape": tuple(int(s) for s in piece.get_shape())}

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def keys(self) -> list[str]:
        return list(self.entries)

    def dtype(self, name: str) -> str:
        """The safetensors dtype tag ("BF16", "F32", ...)."""
        return self.entries[name]["dtype"]

    def shape(self, name: str) -> tuple[int, ...]:
        return self.entries[name]["shape"]

    def nbytes(self, name: str) -> int | None:
        """Bytes the tensor occupies in the file (None for a dtype this module does not read)."""
        width = READABLE_DTYPES.get(self.dtype(name))
        return None if width is None else width * int(np.prod(self.shape(name)))

    def byte_range(self, name: str) -> tuple[int, int]:
        """Bytes [start, end) of the tensor in the file (the header was checked when the file was opened)."""
        if self._ranges is None:
            with open(self.path, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(n))
            self._ranges = {
                k: (8 + n + int(v["data_offsets"][0]), 8 + n + int(v["data_offsets"][1]))
                for k, v in header.items()
                if k != "__metadata__"
            }
        return self._ranges[name]

    def read(self, name: str) -> np.ndarray:
        """Read one tensor (only its bytes) and return it as float32."""
        dtype = self.dtype(name)
        if dtype not in READABLE_DTYPES:
            raise ValueError(f"{self.path}: tensor {name!r} has unsupported dtype {dtype} (need F32/F16/BF16/F64)")
        try:
            tensor = self._handle.get_tensor(name)
        except SafetensorError as e:
            raise ValueError(f"{self.path}: cannot read tensor {name!r} ({e})") from None
        return tensor.astype(np.float32)


def checkpoint_files(path: str | os.PathLike) -> dict[str, Path]:
    """Map every tensor name of a checkpoint (file, directory, or sharded directory) to its file.

    Names come from the index when there is one, else from the files' headers.
    """
    path = Path(path)
    if path.is_file():
        return {k: path for k in SafetensorsFile(path).keys()}
    if not path.is_dir():
        raise FileNotFoundError(f"no checkpoint at {path}")
    index = path / INDEX_NAME
    if index.exists():
        return {k: path / v for k, v in read_weight_map(index).items()}
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no .safetensors files and no {INDEX_NAME}")
    out: dict[str, Path] = {}
    for f in files:
        for k in SafetensorsFile(f).keys():
            if k in out and is_vision_key(k):
                raise ValueError(
                    f"tensor {k!r} is in both {out[k]} and {f}, and no {INDEX_NAME} says which to use: "
                    "remove one file or add an index"
                )
            out[k] = f
    return out


def parse_weight_map(text: str, label: str) -> dict[str, str]:
    """The `weight_map` (tensor name -> shard file name) of a safetensors index's text; ValueError naming `label`."""
    try:
        weight_map = json.loads(text)["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"{label}: not a valid safetensors index ({type(e).__name__}: {e})") from None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and v for k, v in weight_map.items()
    ):
        raise ValueError(
            f"{label}: not a valid safetensors index (weight_map must map tensor names to file names, "
            f"got {type(weight_map).__name__})"
        )
    return weight_map


def read_weight_map(index: Path) -> dict[str, str]:
    """`parse_weight_map` of an index file."""
    try:
        text = index.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{index}: not a valid safetensors index ({e})") from None
    return parse_weight_map(text, str(index))


def load_weights(path: str | os.PathLike, config: VisionConfig | None = None) -> dict[str, np.ndarray]:
    """Read the vision tower + projector tensors (float32) from a `.safetensors` file or a
    (sharded) checkpoint directory; other tensors are never read. Checked against `config`
    (by default the `config.json` beside the weights)."""
    path = Path(path)
    if config is None:
        config = load_config(path)
    headers = vision_headers(path)
    check_headers(path, config, headers)
    weights: dict[str, np.ndarray] = {}
    for name, file in headers.items():
        tensor = file.read(name)
        if not np.all(np.isfinite(tensor)):
            raise ValueError(f"tensor {name!r} in {file.path.name} holds NaN or Inf values")
        weights[name] = tensor
    check_weights(weights, config, finite=False)
    return weights


def vision_headers(path: str | os.PathLike) -> dict[str, SafetensorsFile]:
    """Every vision tensor of a checkpoint -> its opened file (headers only); KeyError when the index
    names a tensor its file does not hold."""
    where = checkpoint_files(path)
    opened: dict[Path, SafetensorsFile] = {}
    out = {}
    for name in sorted(k for k in where if is_vision_key(k)):
        file = where[name]
        if file not in opened:
            opened[file] = SafetensorsFile(file)
        if name not in opened[file]:
            raise KeyError(f"index names {name!r} in {file.name} but that file does not hold it")
        out[name] = opened[file]
    return out


def check_headers(
    path: str | os.PathLike, config: VisionConfig, headers: Mapping[str, SafetensorsFile] | None = None
) -> None:
    """`check_weights` from the headers alone (no tensor bytes read): layer count, names, shapes, and
    dtypes this loader reads. Same exceptions and messages, prefixed with the checkpoint's path."""
    headers = vision_headers(path) if headers is None else headers
    try:
        check_layer_count(headers, config)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    for name, file in headers.items():
        if file.dtype(name) not in READABLE_DTYPES:
            raise ValueError(
                f"{file.path}: tensor {name!r} has dtype {file.dtype(name)}, which this loader cannot read "
                "(need F32, F16, BF16 or F64)"
            )
    # zero-byte stand-ins with the headers' shapes (broadcast views of one float32 zero)
    stand_ins = {name: np.broadcast_to(np.float32(0), file.shape(name)) for name, file in headers.items()}
    try:
        check_weights(stand_ins, config, finite=False)
    except KeyError as e:
        raise KeyError(f"{path}: {e.args[0]}") from None
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


# ============================================================================ identity
DIGEST_WINDOW = 4096
DIGEST_WINDOWS = 16


def checkpoint_digest(path: str | os.PathLike, full: bool = False) -> str:
    """sha256 over every vision tensor's name, dtype, shape and bytes: all of its bytes up to
    `DIGEST_WINDOWS`·`DIGEST_WINDOW` (64 KiB), else that many 4 KiB windows spread evenly (first and
    last included). At most 64 KiB read per tensor (~11 MB for K3), independent of paths and times:
    a copy has the same digest, a checkpoint re-saved in place with other values another one.
    With `full`, every byte of every vision tensor (a change between the windows is seen too)."""
    digest = hashlib.sha256()
    handles: dict[Path, Any] = {}
    try:
        for name, file in vision_headers(path).items():
            if file.path not in handles:
                handles[file.path] = open(file.path, "rb")
            digest.update(json.dumps([name, file.dtype(name), list(file.shape(name))]).encode())
            start, end = file.byte_range(name)
            if full:
                _hash_range(digest, handles[file.path], start, end)
            else:
                digest.update(_sampled_bytes(handles[file.path], start, end))
    finally:
        for f in handles.values():
            f.close()
    return digest.hexdigest()


def _hash_range(digest: Any, f: Any, start: int, end: int) -> None:
    f.seek(start)
    while start < end:
        piece = f.read(min(2**20, end - start))
        if not piece:
            raise ValueError(f"{f.name}: ends inside a tensor (truncated)")
        digest.update(piece)
        start += len(piece)


def _sampled_bytes(f: Any, start: int, end: int) -> bytes:
    size = end - start
    if size <= DIGEST_WINDOWS * DIGEST_WINDOW:
        f.seek(start)
        return f.read(size)
    step = (size - DIGEST_WINDOW) / (DIGEST_WINDOWS - 1)
    pieces = []
    for i in range(DIGEST_WINDOWS):
        f.seek(start + round(i * step))
        pieces.append(f.read(DIGEST_WINDOW))
    return b"".join(pieces)


def load_config(path: str | os.PathLike) -> VisionConfig:
    """The VisionConfig in the `config.json` of a checkpoint directory (or beside a file)."""
    path = Path(path)
    cfg = (path if path.is_dir() else path.parent) / "config.json"
    if not cfg.exists():
        raise FileNotFoundError(f"no config.json at {cfg}: pass config= explicitly")
    return VisionConfig.from_json(cfg)


def load_checkpoint(path: str | os.PathLike) -> tuple[VisionConfig, dict[str, np.ndarray]]:
    """`(config, weights)` from a local checkpoint directory holding `config.json` (or a file beside one).

    Remote checkpoints (`hf://…`, `http(s)://…`) are `moonvit_kernels.load_checkpoint`'s job
    (`checkpoints.py`, which fetches them with `hub`); here they are a ValueError saying so."""
    if is_remote(path):
        raise ValueError(
            f"{path}: a remote checkpoint; weights.load_checkpoint reads local folders only: use "
            "moonvit_kernels.load_checkpoint, which fetches its vision tensors first"
        )
    config = load_config(path)
    check_fetched(Path(path) if Path(path).is_dir() else Path(path).parent)
    return config, load_weights(path, config)


# ============================================================================ a folder `hub.fetch` wrote
FETCH_MANIFEST = "manifest.json"
FETCH_FORMAT = "moonvit_kernels fetch"


def file_state(path: Path) -> dict[str, Any]:
    """What `check_fetched` compares: a file's size, mtime (ns) and sha256."""
    stat = path.stat()
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for piece in iter(lambda: f.read(2**20), b""):
            digest.update(piece)
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": digest.hexdigest()}


def check_fetched(folder: Path) -> None:
    """ValueError naming the file when a folder `hub.fetch` wrote (its manifest says so) no longer holds
    what the manifest records: each written file's size and mtime, else its full sha256 (`written`; a
    manifest without them: every tensor's sha256). Other folders pass unchecked."""
    try:
        manifest = json.loads((folder / FETCH_MANIFEST).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return
    if not isinstance(manifest, dict) or manifest.get("format") != FETCH_FORMAT:
        return
    written = manifest.get("written")
    if isinstance(written, dict) and written:
        for name, state in written.items():
            _check_written(folder / name, state)
    else:
        _check_tensors(folder / "model.safetensors", manifest.get("tensors") or {})


def _check_written(path: Path, state: dict[str, Any]) -> None:
    changed = f"{path}: changed since fetch wrote it (its sha256 is not the one {FETCH_MANIFEST} records): fetch again"
    try:
        stat = path.stat()
    except FileNotFoundError:
        raise ValueError(f"{path}: missing (listed in {FETCH_MANIFEST}): fetch again") from None
    if stat.st_size != state.get("size"):
        raise ValueError(changed)
    if stat.st_mtime_ns != state.get("mtime_ns") and file_state(path)["sha256"] != state.get("sha256"):
        raise ValueError(changed)


def _check_tensors(path: Path, tensors: dict[str, Any]) -> None:
    file = SafetensorsFile(path)
    with open(path, "rb") as f:
        for name, entry in tensors.items():
            if name not in file:
                raise ValueError(f"{path}: no tensor {name!r} though {FETCH_MANIFEST} lists it: fetch again")
            start, end = file.byte_range(name)
            f.seek(start)
            if hashlib.sha256(f.read(end - start)).hexdigest() != entry.get("sha256"):
                raise ValueError(
                    f"{path}: tensor {name!r} changed since fetch wrote it (not the sha256 {FETCH_MANIFEST} "
                    "records): fetch again"
                )


# ============================================================================ writing
def save_weights(
    path: str | os.PathLike,
    weights: Mapping[str, np.ndarray],
    dtype: str = "bfloat16",
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Write `weights` to one `.safetensors` file in `dtype` ("bfloat16", "float16", "float32"),
    each tensor converted from float32 (round to nearest even), with `safetensors.numpy.save_file`."""
    if dtype not in _SAVE_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_SAVE_DTYPES)}, got {dtype!r}")
    target = _SAVE_DTYPES[dtype]
    tensors = {
        name: np.ascontiguousarray(np.asarray(w, dtype=np.float32).astype(target)) for name, w in weights.items()
    }
    save_tensors(path, tensors, metadata or {"format": "pt"})


def save_tensors(path: str | os.PathLike, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str]) -> None:
    """`safetensors.numpy.save_file`, atomically (a temporary file renamed on success); OSError naming
    `path` when the write fails (a full disk)."""
    with atomic_path(path) as tmp:
        try:
            save_file(dict(tensors), str(tmp), metadata=dict(metadata))
        except SafetensorError as e:
            raise OSError(errno.EIO, f"cannot write {path}: {e}", str(path)) from None


def save_checkpoint(
    directory: str | os.PathLike,
    weights: Mapping[str, np.ndarray],
    config: VisionConfig,
    dtype: str = "bfloat16",
    shards: int = 1,
    extra_tensors: Mapping[str, np.ndarray] | None = None,
) -> None:
    """Write `config.json` and the weights (one file, or `shards` files plus an index).

    `extra_tensors` (e.g. stand-ins for a text decoder) are written alongside, as in real files.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    write_text(directory / "config.json", json.dumps({"vision_config": config.to_dict()}, indent=2) + "\n")
    everything = {**weights, **(extra_tensors or {})}
    if shards == 1:
        save_weights(directory / "model.safetensors", everything, dtype)
        return
    names = sorted(everything)
    groups = [names[i::shards] for i in range(shards)]
    weight_map = {}
    for i, group in enumerate(groups):
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_weights(directory / fname, {k: everything[k] for k in group}, dtype)
        weight_map.update(dict.fromkeys(group, fname))
    write_text(directory / INDEX_NAME, json.dumps({"metadata": {}, "weight_map": weight_map}, indent=2) + "\n")


# ============================================================================ random weights
def random_weights(config: VisionConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 weights in checkpoint names and shapes, scaled so mistakes stay visible:
    linear layers ~ N(0, 1/fan_in), norm weights 1 + 0.25·N(0, 1) (never all ones), position
    embeddings ~ N(0, 0.5²) (comparable to the patch tokens, not tiny)."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, shape in expected_shapes(config).items():
        if len(shape) == 1:
            a = 1.0 + 0.25 * rng.standard_normal(shape)
        elif name.endswith("pos_emb.weight"):
            a = 0.5 * rng.standard_normal(shape)
        else:
            fan_in = int(np.prod(shape[1:]))
            a = rng.standard_normal(shape) / np.sqrt(fan_in)
        out[name] = a.astype(np.float32)
    return out
