"""Fetch only the vision weights of a checkpoint: `hf://ORG/REPO[@REV]`, `https://…/` or a local folder.

A real K3 checkpoint is hundreds of GB of shards; the vision tower and projector are under 1 GB.
`fetch` reads `config.json` and `model.safetensors.index.json` (or the single `model.safetensors`),
then, for each shard that holds `vision_tower.*` / `mm_projector.*` tensors, its safetensors header
(8-byte length + JSON) and **only the byte ranges of the vision tensors** — ranged reads through an
fsspec file system (`huggingface_hub.HfFileSystem` for `hf://`, fsspec's HTTP file system for
`http(s)://`, the local one for folders), never a whole shard. It writes a small vision-only
checkpoint:

    DIR/config.json             the source's config, unchanged
    DIR/model.safetensors       the vision tensors in their original dtypes (bit for bit)
    DIR/manifest.json           source, resolved revision, per tensor: shard, dtype, shape,
                                byte range in the shard, sha256; bytes fetched vs checkpoint size

Interrupted fetches resume: each tensor's bytes go to `DIR/.parts/<name>.part` in chunks and a
second run continues from what is there. The Hub token and endpoint come from the usual
environment variables (`HF_TOKEN`, `HF_ENDPOINT`); `load_checkpoint("hf://…")` caches fetched
checkpoints under `$MOONVIT_KERNELS_CACHE` (default `$HF_HOME/moonvit_kernels`, HF_HOME defaulting to
`~/.cache/huggingface`). Needs the `hub` extra (fsspec, aiohttp, huggingface_hub).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from .weights import INDEX_NAME, is_vision_key

MANIFEST_NAME = "manifest.json"
PARTS_DIR = ".parts"
CHUNK_BYTES = 64 * 2**20
MAX_HEADER_BYTES = 100 * 2**20

# safetensors dtype tag -> numpy dtype of the stored (little-endian) bytes
STORED_DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}


def one_line(e: object) -> str:
    return " ".join(str(e).split())


class FetchError(Exception):
    """A fetch that cannot proceed: missing file or tensor, a server without range reads, bad data."""


def is_remote(source: str | os.PathLike) -> bool:
    """True for `hf://…`, `http://…` and `https://…` sources."""
    return isinstance(source, str) and re.match(r"^(hf|https?)://", source) is not None


def parse_hf(source: str) -> tuple[str, str | None]:
    """`hf://ORG/REPO[@REVISION]` -> (`ORG/REPO`, revision or None)."""
    m = re.fullmatch(r"hf://([\w.-]+/[\w.-]+)(?:@(.+))?/?", source)
    if not m:
        raise FetchError(f"{source}: expected hf://ORG/REPO or hf://ORG/REPO@REVISION")
    return m.group(1), m.group(2)


# ============================================================================ where the files are
@dataclass
class Source:
    """A checkpoint's files behind one fsspec file system: `fs`, the path prefix `root`, labels."""

    fs: Any
    root: str
    label: str
    repo: str | None = None
    revision: str | None = None
    bytes_read: int = 0  # payload bytes transferred so far (file contents, not HTTP overhead)
    _sizes: dict[str, int] = field(default_factory=dict)

    def path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def size(self, name: str) -> int:
        if name not in self._sizes:
            try:
                self._sizes[name] = int(self.fs.info(self.path(name))["size"])
            except FileNotFoundError:
                raise FetchError(f"{self.label}: no file {name} ({self.path(name)})") from None
            except Exception as e:  # unreachable host, refused connection, ...
                raise FetchError(f"{self.label}: cannot reach {name} ({type(e).__name__}: {one_line(e)})") from None
        return self._sizes[name]

    def exists(self, name: str) -> bool:
        try:
            self.size(name)
        except FetchError:
            return False
        return True

    def read_text(self, name: str) -> str:
        try:
            data = self.fs.cat_file(self.path(name))
        except FileNotFoundError:
            raise FetchError(f"{self.label}: no file {name} ({self.path(name)})") from None
        except Exception as e:
            raise FetchError(f"{self.label}: cannot read {name} ({type(e).__name__}: {one_line(e)})") from None
        self.bytes_read += len(data)
        return data.decode("utf-8")

    def read_range(self, name: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of file `name`, by one ranged read; FetchError if the server ignores ranges."""
        if end <= start:
            return b""
        try:
            with self.fs.open(self.path(name), "rb", block_size=end - start, cache_type="none") as f:
                f.seek(start)
                data = f.read(end - start)
        except FileNotFoundError:
            raise FetchError(f"{self.label}: no file {name} ({self.path(name)})") from None
        except ValueError as e:
            if "range" in str(e).lower():
                raise FetchError(f"{self.label}: the server does not support HTTP range requests ({name})") from None
            raise
        except Exception as e:  # a dropped connection or read error, whatever the client library calls it
            raise FetchError(
                f"{self.label}: reading {name} bytes {start}..{end} failed ({type(e).__name__}: {one_line(e)}); "
                "run the fetch again to resume"
            ) from None
        self.bytes_read += len(data)
        if len(data) != end - start:
            raise FetchError(
                f"{self.label}: asked {name} for bytes {start}..{end} and got {len(data)} bytes "
                "(a server without range support, or a truncated file)"
            )
        return data


def open_source(source: str | os.PathLike, revision: str | None = None) -> Source:
    """A `Source` for `hf://ORG/REPO[@REV]` (revision resolved to a commit), `http(s)://…/` or a folder."""
    try:
        import fsspec
    except ImportError:
        raise FetchError("fetching needs fsspec: pip install 'moonvit_kernels[hub]'") from None

    text = str(source)
    if text.startswith("hf://"):
        repo, rev = parse_hf(text)
        fs, commit = hf_filesystem(repo, revision or rev)
        return Source(fs, f"{repo}@{commit}", text, repo=repo, revision=commit)
    if re.match(r"^https?://", text):
        try:
            fs = fsspec.filesystem("http")
        except ImportError:
            raise FetchError("http(s):// sources need aiohttp: pip install 'moonvit_kernels[hub]'") from None
        return Source(fs, text.rstrip("/"), text)
    folder = Path(text).resolve()
    if not folder.is_dir():
        raise FetchError(f"{text}: not a checkpoint folder, hf://ORG/REPO or http(s):// URL")
    return Source(fsspec.filesystem("file"), folder.as_posix(), text)


def hf_filesystem(repo: str, revision: str | None) -> tuple[Any, str]:
    """(`HfFileSystem`, the commit `revision` resolves to); token/endpoint from the environment."""
    try:
        from huggingface_hub import HfApi, HfFileSystem
    except ImportError:
        raise FetchError("hf:// sources need huggingface_hub: pip install 'moonvit_kernels[hub]'") from None
    try:
        commit = HfApi().model_info(repo, revision=revision).sha
    except Exception as e:  # the library raises several kinds (not found, gated, offline)
        raise FetchError(
            f"hf://{repo}: cannot resolve revision {revision or 'main'} ({type(e).__name__}: {e})"
        ) from None
    return HfFileSystem(), commit


# ============================================================================ headers and plan
@dataclass(frozen=True)
class TensorRange:
    """Where one tensor lies: `shard` file, `dtype` tag, `shape`, bytes [start, end) of the shard."""

    name: str
    shard: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def read_header(source: Source, shard: str) -> tuple[dict[str, Any], int]:
    """(the safetensors header of `shard` without `__metadata__`, bytes before the data), checked."""
    size = source.size(shard)
    if size < 8:
        raise FetchError(f"{source.label}: {shard} is not a safetensors file ({size} bytes)")
    (n,) = struct.unpack("<Q", source.read_range(shard, 0, 8))
    if n > MAX_HEADER_BYTES or 8 + n > size:
        raise FetchError(f"{source.label}: {shard} has a corrupt safetensors header (claims {n} bytes)")
    try:
        header = json.loads(source.read_range(shard, 8, 8 + n).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FetchError(f"{source.label}: {shard} has a corrupt safetensors header ({e})") from None
    if not isinstance(header, dict):
        raise FetchError(f"{source.label}: {shard} has a corrupt safetensors header (not a JSON object)")
    header.pop("__metadata__", None)
    return header, 8 + n


def plan(source: Source) -> tuple[list[TensorRange], dict[str, int], int]:
    """The vision tensors' byte ranges, header bytes read per shard, and the checkpoint's total size."""
    if source.exists(INDEX_NAME):
        try:
            weight_map = json.loads(source.read_text(INDEX_NAME))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise FetchError(f"{source.label}: {INDEX_NAME} is not a valid safetensors index ({e})") from None
    elif source.exists("model.safetensors"):
        weight_map = None
    else:
        raise FetchError(f"{source.label}: neither {INDEX_NAME} nor model.safetensors")
    shards = sorted(set(weight_map.values())) if weight_map else ["model.safetensors"]
    total = sum(source.size(s) for s in shards)
    wanted: dict[str, list[str]] = {}
    if weight_map:
        for name, shard in weight_map.items():
            if is_vision_key(name):
                wanted.setdefault(shard, []).append(name)
    ranges: list[TensorRange] = []
    header_bytes: dict[str, int] = {}
    for shard in shards if weight_map is None else sorted(wanted):
        header, data_start = read_header(source, shard)
        header_bytes[shard] = data_start
        names = wanted.get(shard) if weight_map else [k for k in header if is_vision_key(k)]
        for name in sorted(names or []):
            if name not in header:
                raise FetchError(f"{source.label}: the index puts tensor {name!r} in {shard}, which does not hold it")
            entry = header[name]
            try:
                begin, end = (int(v) for v in entry["data_offsets"])
                shape = tuple(int(s) for s in entry["shape"])
                dtype = entry["dtype"]
            except (KeyError, TypeError, ValueError):
                raise FetchError(f"{source.label}: {shard}: corrupt header entry for {name!r}") from None
            if dtype not in STORED_DTYPES:
                raise FetchError(f"{source.label}: tensor {name!r} has unsupported dtype {dtype}")
            if end - begin != int(np.prod(shape)) * STORED_DTYPES[dtype].itemsize:
                raise FetchError(
                    f"{source.label}: {shard}: tensor {name!r} has {end - begin} bytes for {shape} {dtype}"
                )
            if data_start + end > source.size(shard):
                raise FetchError(f"{source.label}: {shard} is truncated (tensor {name!r} ends past the file)")
            ranges.append(TensorRange(name, shard, dtype, shape, data_start + begin, data_start + end))
    if not ranges:
        raise FetchError(f"{source.label}: no vision_tower.* or mm_projector.* tensors in the checkpoint")
    return ranges, header_bytes, total


# ============================================================================ fetching
def _part_path(out: Path, name: str) -> Path:
    return out / PARTS_DIR / f"{name}.part"


def _download(source: Source, t: TensorRange, out: Path, chunk: int, advance: Callable[[int], None]) -> int:
    """Append the missing bytes of tensor `t` to its part file; returns the bytes transferred."""
    part = _part_path(out, t.name)
    have = part.stat().st_size if part.exists() else 0
    if have > t.nbytes:  # not ours: start again
        part.unlink()
        have = 0
    advance(have)
    fetched = 0
    with open(part, "ab") as f:
        while have < t.nbytes:
            n = min(chunk, t.nbytes - have)
            data = source.read_range(t.shard, t.start + have, t.start + have + n)
            f.write(data)
            f.flush()
            have += n
            fetched += n
            advance(n)
    return fetched


def fetch(
    source: str | os.PathLike,
    out: str | os.PathLike,
    revision: str | None = None,
    progress: bool = True,
    chunk_bytes: int = CHUNK_BYTES,
) -> dict[str, Any]:
    """Fetch the vision tensors of `source` into the folder `out` (see the module docstring);
    returns the manifest. Resumes from `out/.parts`; an `out` already complete for the same
    source and revision is left as it is."""
    from safetensors.numpy import save_file
    from tqdm import tqdm

    from .config import VisionConfig

    out = Path(out)
    src = open_source(source, revision)
    config_text = src.read_text("config.json")
    try:
        config = VisionConfig.from_dict(json.loads(config_text))
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise FetchError(f"{src.label}: config.json holds no usable vision_config ({e})") from None
    ranges, header_bytes, total = plan(src)
    done = out / MANIFEST_NAME
    if done.is_file() and (out / "model.safetensors").is_file():
        old = json.loads(done.read_text())
        same = old.get("source") == str(source) and old.get("revision") == src.revision
        same = same and {k: (e["byte_range"], e["dtype"]) for k, e in old.get("tensors", {}).items()} == {
            t.name: ([t.start, t.end], t.dtype) for t in ranges
        }
        if same:  # already complete: only config, index and headers were read
            return {**old, "bytes_read_this_run": src.bytes_read}
    parts = out / PARTS_DIR
    wanted = {
        "source": str(source),
        "revision": src.revision,
        "tensors": [[t.name, t.shard, t.start, t.end] for t in ranges],
    }
    if parts.is_dir():  # resume only bytes of the same source, revision and layout
        try:
            same = json.loads((parts / "plan.json").read_text()) == wanted
        except (OSError, json.JSONDecodeError):
            same = False
        if not same:
            shutil.rmtree(parts)
    parts.mkdir(parents=True, exist_ok=True)
    (parts / "plan.json").write_text(json.dumps(wanted))
    vision_bytes = sum(t.nbytes for t in ranges)
    bar = tqdm(total=vision_bytes, unit="B", unit_scale=True, desc="vision weights", disable=not progress)
    fetched = 0
    try:
        for t in ranges:
            fetched += _download(src, t, out, chunk_bytes, bar.update)
    finally:
        bar.close()
    tensors, entries = {}, {}
    for t in ranges:
        data = _part_path(out, t.name).read_bytes()
        entries[t.name] = {
            "shard": t.shard,
            "dtype": t.dtype,
            "shape": list(t.shape),
            "byte_range": [t.start, t.end],
            "sha256": hashlib.sha256(data).hexdigest(),
        }
        tensors[t.name] = np.frombuffer(data, dtype=STORED_DTYPES[t.dtype]).reshape(t.shape)
    tmp = out / "model.safetensors.tmp"
    save_file(tensors, str(tmp), metadata={"format": "pt", "source": str(source), "revision": src.revision or ""})
    tmp.replace(out / "model.safetensors")
    (out / "config.json").write_text(config_text)
    manifest = {
        "source": str(source),
        "repo": src.repo,
        "revision": src.revision,
        "config": {"vt_num_hidden_layers": config.vt_num_hidden_layers, "vt_hidden_size": config.vt_hidden_size},
        "checkpoint_bytes": total,
        "header_bytes": header_bytes,
        "vision_bytes": vision_bytes,
        "bytes_read_this_run": src.bytes_read,
        "vision_bytes_fetched_this_run": fetched,
        "tensors": entries,
    }
    done.write_text(json.dumps(manifest, indent=2) + "\n")
    shutil.rmtree(out / PARTS_DIR)
    return manifest


def cache_dir(source: str, revision: str | None = None) -> Path:
    """Where `load_checkpoint(source)` keeps a fetched remote checkpoint."""
    root = os.environ.get("MOONVIT_KERNELS_CACHE") or os.path.join(
        os.environ.get("HF_HOME", os.path.join(os.path.expanduser("~"), ".cache", "huggingface")), "moonvit_kernels"
    )
    key = re.sub(r"[^A-Za-z0-9._@-]+", "--", source.split("://", 1)[1].strip("/"))
    return Path(root) / (key + (f"@{revision}" if revision else ""))


def fetch_cached(source: str, revision: str | None = None, progress: bool = False) -> Path:
    """Fetch `source` into its cache folder (resuming or reusing it) and return that folder."""
    out = cache_dir(source, revision)
    fetch(source, out, revision=revision, progress=progress)
    return out
