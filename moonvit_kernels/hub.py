"""Fetch only the vision weights of a checkpoint: `hf://ORG/REPO[@REV]`, `https://…/` or a local folder.

A real K3 checkpoint is hundreds of GB of shards; the vision tower and projector are under 1 GB.
`fetch` reads `config.json` and `model.safetensors.index.json` (or the single `model.safetensors`),
then, for each shard that holds `vision_tower.*` / `mm_projector.*` tensors, its safetensors header
(8-byte length + JSON) and **only the byte ranges of the vision tensors** — ranged reads (HTTP Range
requests on the session of fsspec's HTTP file system for `http(s)://`, `huggingface_hub.HfFileSystem`
for `hf://`, the local file system for folders), never a whole shard. It writes a small vision-only
checkpoint:

    DIR/config.json             the source's config, unchanged
    DIR/model.safetensors       the vision tensors in their original dtypes (bit for bit)
    DIR/manifest.json           source, resolved revision, the shards' identities, per tensor: shard,
                                dtype, shape, byte range in the shard, sha256; bytes fetched vs checkpoint size

Nothing is trusted that was not checked:
- the plan records each shard's identity (size, and the server's ETag / Last-Modified, the file's
  mtime and inode, or the Hub's blob id at a pinned commit); every chunk is verified against it before
  it is kept (ranged HTTP reads are conditional, If-Match / If-Unmodified-Since, and their headers are
  compared), and again before the checkpoint is written: a source that changed is never mixed in;
- interrupted fetches resume: each tensor's bytes go to `DIR/.parts/<name>.part`, and a journal
  `<name>.sums` (offset, length, sha256 per kept piece) written after the bytes; a resume
  re-hashes the part against it and keeps only the verified prefix (a half-written or zero-filled
  part is caught), and starts over when the source's identity differs from the plan's;
- every piece of a response goes to its part as it arrives (the journal line with it; both flushed to
  disk at least once a second), so Ctrl-C, a killed process, a dropped or stalled request keep what
  came; chunk sizes follow the link (about 5 s per request); `timeout` (seconds without data, and
  no other limit: aiohttp's 5-minute total is lifted) ends a request; a request the link broke is tried
  again from where it stopped (RETRIES times in a row, pausing 1, 2, 4 s) before the fetch gives up with
  an error naming the URL. Within a run, that keeps the progress even from a server without validators,
  whose bytes a later run cannot vouch for (it starts over);
- `fetch` never writes into its source folder, and refuses an output folder holding a checkpoint it
  did not write unless `force`; its outputs are written atomically (`atomic`).

The Hub token and endpoint come from the usual environment variables (`HF_TOKEN`, `HF_ENDPOINT`);
`load_checkpoint("hf://…")` caches fetched checkpoints under `$MOONVIT_KERNELS_CACHE` (default
`$HF_HOME/moonvit_kernels`, HF_HOME defaulting to `~/.cache/huggingface`). Needs the `hub` extra
(fsspec, aiohttp, huggingface_hub).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shutil
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from .atomic import write_text
from .remote import is_remote
from .weights import FETCH_FORMAT, INDEX_NAME, is_vision_key

MANIFEST_NAME = "manifest.json"
PARTS_DIR = ".parts"
WRITTEN_BY = FETCH_FORMAT
CHUNK_BYTES = 64 * 2**20  # the largest request; sizes adapt below it (`ChunkSizer`)
PIECE_BYTES = 2**16  # bytes handed on from a streaming response at a time
DEFAULT_TIMEOUT = 60.0  # seconds without data before a request is given up
RETRIES = 3  # a request the link broke is tried again this many times in a row (each keeps what came)
RETRY_PAUSE = 1.0  # seconds before the first retry, doubled for each further one
SYNC_SECONDS = 1.0  # the longest received bytes wait in the page cache before an fsync
MAX_HEADER_BYTES = 100 * 2**20
CHECKPOINT_FILES = ("config.json", "model.safetensors", INDEX_NAME, MANIFEST_NAME)

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


class SourceChanged(FetchError):
    """A source file is no longer the one the plan saw: its bytes are not kept."""


class LinkError(FetchError):
    """A request the link broke (no data for `timeout` s, a dropped connection, a short body, HTTP 429 or 5xx):
    worth trying again, from where it stopped."""


def parse_hf(source: str) -> tuple[str, str | None]:
    """`hf://ORG/REPO[@REVISION]` -> (`ORG/REPO`, revision or None)."""
    m = re.fullmatch(r"hf://([\w.-]+/[\w.-]+)(?:@(.+))?/?", source)
    if not m:
        raise FetchError(f"{source}: expected hf://ORG/REPO or hf://ORG/REPO@REVISION")
    return m.group(1), m.group(2)


# ============================================================================ where the files are
# what of a file system's `info` identifies one version of a file (JSON-ready values)
IDENTITY_KEYS = ("size", "mtime", "ino", "blob_id", "lfs", "ETag", "Last-Modified")


@dataclass
class Source:
    """A checkpoint's files behind one fsspec file system (a folder, the Hub): `fs`, the path prefix
    `root`, labels, and the payload bytes read so far (file contents, not protocol overhead)."""

    fs: Any
    root: str
    label: str
    repo: str | None = None
    revision: str | None = None
    bytes_read: int = 0
    _identities: dict[str, dict[str, Any]] = field(default_factory=dict)

    def path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def identity(self, name: str, fresh: bool = False) -> dict[str, Any]:
        """What identifies this version of file `name`: its size and whichever of mtime, inode, blob id,
        LFS sha256, ETag, Last-Modified the file system reports. Cached unless `fresh` — and always for
        the Hub, whose files at a resolved commit (`revision`) cannot change."""
        if (fresh and self.revision is None) or name not in self._identities:
            try:
                info = self.fs.info(self.path(name))
            except FileNotFoundError:
                raise FetchError(f"{self.label}: no file {name} ({self.path(name)})") from None
            except Exception as e:  # unreachable host, refused connection, ...
                raise FetchError(f"{self.label}: cannot reach {name} ({type(e).__name__}: {one_line(e)})") from None
            self._identities[name] = {k: info[k] for k in IDENTITY_KEYS if info.get(k) is not None}
        return self._identities[name]

    def size(self, name: str) -> int:
        return int(self.identity(name)["size"])

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
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise FetchError(f"{self.label}: {name} is not UTF-8 text ({e})") from None

    def read_range(self, name: str, start: int, end: int, expect: dict[str, Any] | None = None) -> bytes:
        """Bytes [start, end) of file `name`; with `expect` (an `identity`), checked to come from that version."""
        pieces: list[bytes] = []
        self.stream_range(name, start, end, expect, pieces.append)
        return b"".join(pieces)

    def stream_range(
        self, name: str, start: int, end: int, expect: dict[str, Any] | None, sink: Callable[[bytes], None]
    ) -> None:
        """Bytes [start, end) of `name` to `sink`, by one ranged read; `SourceChanged` (nothing handed
        on) when the file is no longer the version `expect` describes."""
        if end <= start:
            return
        try:
            with self.fs.open(self.path(name), "rb", block_size=end - start, cache_type="none") as f:
                f.seek(start)
                data = f.read(end - start)
        except FileNotFoundError:
            raise FetchError(f"{self.label}: no file {name} ({self.path(name)})") from None
        except Exception as e:  # a dropped connection or read error, whatever the client library calls it
            raise FetchError(
                f"{self.label}: reading {name} bytes {start}..{end} failed ({type(e).__name__}: {one_line(e)}); "
                "run the fetch again to resume"
            ) from None
        self.bytes_read += len(data)
        if expect is not None and self.identity(name, fresh=True) != expect:
            raise SourceChanged(f"{self.label}: {name} changed while it was read ({self.identity(name)} != {expect})")
        if len(data) != end - start:
            raise FetchError(
                f"{self.label}: asked {name} for bytes {start}..{end} and got {len(data)} (a truncated file?)"
            )
        sink(data)


@dataclass
class HttpSource(Source):
    """A checkpoint folder served over http(s): HEAD for identities, streamed (ranged) GETs on the
    aiohttp session of fsspec's HTTP file system, each read given up after `timeout` s without data."""

    timeout: float = DEFAULT_TIMEOUT

    def url(self, name: str) -> str:
        return self.fs.encode_url(self.path(name))

    def _run(self, name: str, what: str, coroutine: Callable[..., Any], *args: Any) -> Any:
        """Run `coroutine(url, *args)` on fsspec's event loop; errors become one FetchError naming the URL."""
        from fsspec.asyn import sync

        url = self.url(name)
        try:
            return sync(self.fs.loop, coroutine, url, *args)
        except FetchError:
            raise
        except FileNotFoundError:
            raise FetchError(f"{self.label}: no file {name} ({url})") from None
        except TimeoutError:
            raise LinkError(
                f"{self.label}: no data from {url} for {self.timeout:g} s while {what} (--timeout); "
                "run the fetch again to resume"
            ) from None
        except Exception as e:  # refused connection, dropped connection: aiohttp's many kinds
            raise LinkError(
                f"{self.label}: cannot read {name} ({what}: {type(e).__name__}: {one_line(e)}); "
                "run the fetch again to resume"
            ) from None

    def identity(self, name: str, fresh: bool = False) -> dict[str, Any]:
        if fresh or name not in self._identities:
            self._identities[name] = self._run(name, f"asking for {name}'s size", self._head)
        return self._identities[name]

    def read_text(self, name: str) -> str:
        pieces: list[bytes] = []
        self._run(name, f"reading {name}", self._get, None, None, None, pieces.append)
        try:
            return b"".join(pieces).decode("utf-8")
        except UnicodeDecodeError as e:
            raise FetchError(f"{self.label}: {name} is not UTF-8 text ({e})") from None

    def stream_range(
        self, name: str, start: int, end: int, expect: dict[str, Any] | None, sink: Callable[[bytes], None]
    ) -> None:
        if end > start:
            self._run(name, f"reading {name} bytes {start}..{end}", self._get, start, end, expect, sink)

    async def _head(self, url: str) -> dict[str, Any]:
        session = await self.fs.set_session()
        response = await asyncio.wait_for(session.head(url, allow_redirects=True), self.timeout)
        try:
            if response.status == 404:
                raise FileNotFoundError(url)
            if response.status >= 400 and response.status not in (405, 501):
                raise FetchError(f"{self.label}: {url} answered HTTP {response.status} {response.reason}")
            headers = response.headers if response.status < 400 else {}
            identity = {k: headers[k] for k in ("ETag", "Last-Modified") if k in headers}
            size = headers.get("Content-Length")
        finally:
            response.release()
        if size is None:  # no HEAD, or no length in it: the total of a one-byte range
            total: list[int] = []
            await self._get(url, 0, 1, None, lambda _piece: None, total)
            size = total[0]
        return {"size": int(size), **identity}

    async def _get(
        self,
        url: str,
        start: int | None,
        end: int | None,
        expect: dict[str, Any] | None,
        sink: Callable[[bytes], None],
        total: list[int] | None = None,
    ) -> None:
        """GET `url` (bytes [start, end) when given), checked, body streamed to `sink` in pieces."""
        session = await self.fs.set_session()
        headers = {} if start is None else {"Range": f"bytes={start}-{end - 1}"}
        if expect and expect.get("ETag") and not expect["ETag"].startswith("W/"):
            headers["If-Match"] = expect["ETag"]
        elif expect and expect.get("Last-Modified"):
            headers["If-Unmodified-Since"] = expect["Last-Modified"]
        response = await asyncio.wait_for(session.get(url, headers=headers), self.timeout)
        complete = False
        try:
            if response.status == 404:
                raise FileNotFoundError(url)
            if response.status == 412:
                raise SourceChanged(f"{self.label}: {url} changed since the fetch was planned (HTTP 412)")
            if response.status >= 400:
                busy = response.status == 429 or response.status >= 500
                raise (LinkError if busy else FetchError)(
                    f"{self.label}: {url} answered HTTP {response.status} {response.reason}"
                )
            if start is not None:
                if response.status != 206:
                    raise FetchError(
                        f"{self.label}: the server does not support HTTP range requests ({url} answered "
                        f"{response.status} to a Range request)"
                    )
                size = _check_content_range(self.label, url, response.headers.get("Content-Range"), start, end)
                if total is not None:
                    total.append(size)
                if expect is not None:
                    _check_version(self.label, url, response.headers, size, expect)
            got = 0
            while True:
                piece = await asyncio.wait_for(response.content.read(PIECE_BYTES), self.timeout)
                if not piece:
                    break
                got += len(piece)
                self.bytes_read += len(piece)
                sink(piece)
            complete = True
        finally:
            if complete:
                response.release()
            else:
                response.close()  # abandon the body (a server that ignored the Range: a whole shard)
        if start is not None and got != end - start:
            raise LinkError(
                f"{self.label}: asked {url} for bytes {start}..{end} and got {got} bytes; run the fetch again to resume"
            )


def _check_content_range(label: str, url: str, header: str | None, start: int, end: int) -> int:
    """The file size a `Content-Range: bytes a-b/size` header states, after checking a-b is what was asked."""
    m = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+)", (header or "").strip())
    if not m or (int(m.group(1)), int(m.group(2)) + 1) != (start, end):
        raise FetchError(f"{label}: {url} sent Content-Range {header!r} for bytes {start}..{end}")
    return int(m.group(3))


def _check_version(label: str, url: str, headers: Any, size: int, expect: dict[str, Any]) -> None:
    """SourceChanged when a response's size, ETag or Last-Modified differ from the planned identity."""
    seen = {"size": size, **{k: headers[k] for k in ("ETag", "Last-Modified") if k in headers}}
    changed = [k for k in ("size", "ETag", "Last-Modified") if k in expect and seen.get(k) != expect[k]]
    if changed:
        what = ", ".join(f"{k} {expect[k]} -> {seen.get(k)}" for k in changed)
        raise SourceChanged(f"{label}: {url} changed since the fetch was planned ({what})")


def open_source(source: str | os.PathLike, revision: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> Source:
    """A `Source` for `hf://ORG/REPO[@REV]` (revision resolved to a commit), `http(s)://…/` or a folder."""
    try:
        import fsspec
    except ImportError:
        raise FetchError("fetching needs fsspec: pip install 'moonvit_kernels[hub]'") from None

    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise FetchError(f"timeout must be a positive number of seconds, got {timeout!r}")
    text = str(source)
    if text.startswith("hf://"):
        repo, rev = parse_hf(text)
        fs, commit = hf_filesystem(repo, revision or rev)
        return Source(fs, f"{repo}@{commit}", text, repo=repo, revision=commit)
    if re.match(r"^https?://", text):
        try:
            fs = fsspec.filesystem("http", client_kwargs={"timeout": _no_total_timeout()})  # carries our requests
        except ImportError:
            raise FetchError("http(s):// sources need aiohttp: pip install 'moonvit_kernels[hub]'") from None
        return HttpSource(fs, text.rstrip("/"), text, timeout=float(timeout))
    folder = Path(text).resolve()
    if not folder.is_dir():
        raise FetchError(f"{text}: not a checkpoint folder, hf://ORG/REPO or http(s):// URL")
    return Source(fsspec.filesystem("file"), folder.as_posix(), text)


def _no_total_timeout() -> Any:
    """aiohttp limits without a total (its default gives up on any request after 5 minutes): every wait
    is bounded by `timeout` instead (HttpSource)."""
    import aiohttp

    return aiohttp.ClientTimeout(total=None, connect=None, sock_connect=None, sock_read=None)


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
    """(the safetensors header of `shard` without `__metadata__`, bytes before the data), checked;
    read from the version of the file `source.identity(shard)` describes."""
    version = source.identity(shard)
    size = source.size(shard)
    if size < 8:
        raise FetchError(f"{source.label}: {shard} is not a safetensors file ({size} bytes)")
    (n,) = struct.unpack("<Q", source.read_range(shard, 0, 8, version))
    if n > MAX_HEADER_BYTES or 8 + n > size:
        raise FetchError(f"{source.label}: {shard} has a corrupt safetensors header (claims {n} bytes)")
    try:
        header = json.loads(source.read_range(shard, 8, 8 + n, version).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FetchError(f"{source.label}: {shard} has a corrupt safetensors header ({e})") from None
    if not isinstance(header, dict):
        raise FetchError(f"{source.label}: {shard} has a corrupt safetensors header (not a JSON object)")
    header.pop("__metadata__", None)
    return header, 8 + n


@dataclass
class Plan:
    """What to fetch: the vision tensors' byte ranges, the header bytes read per shard, the
    checkpoint's total size, and the identity (`Source.identity`) of each shard the tensors are in."""

    ranges: list[TensorRange]
    header_bytes: dict[str, int]
    total: int
    files: dict[str, dict[str, Any]]


def read_config(source: Source) -> Any:
    """The source's `config.json` as a `VisionConfig` (every key of the released config stated)."""
    return read_config_text(source, source.read_text("config.json"))


def read_config_text(source: Source, text: str) -> Any:
    """`read_config` of text already read."""
    from .config import VisionConfig

    try:
        return VisionConfig.from_file_data(json.loads(text), f"{source.label}: config.json")
    except json.JSONDecodeError as e:
        raise FetchError(f"{source.label}: config.json is not valid JSON ({e})") from None
    except ValueError as e:
        raise FetchError(f"{one_line(e)}") from None


def plan(source: Source) -> Plan:
    """The vision tensors' byte ranges in the checkpoint (index, then each vision shard's header)."""
    from .weights import parse_weight_map

    if source.exists(INDEX_NAME):
        try:
            weight_map = parse_weight_map(source.read_text(INDEX_NAME), f"{source.label}: {INDEX_NAME}")
        except ValueError as e:
            raise FetchError(one_line(e)) from None
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
    return Plan(ranges, header_bytes, total, {shard: source.identity(shard) for shard in header_bytes})


# ============================================================================ fetching
@dataclass
class ChunkSizer:
    """Request sizes that follow the link: each aims at `target_seconds` at the rate the last one
    achieved, changing at most 4x a step, within [`minimum`, `maximum`] (starting at 1 MiB)."""

    maximum: int
    minimum: int = 256 * 1024
    target_seconds: float = 5.0
    size: int = 0

    def __post_init__(self) -> None:
        self.minimum = min(self.minimum, self.maximum)
        self.size = self.size or min(self.maximum, max(self.minimum, 2**20))

    def update(self, nbytes: int, seconds: float) -> None:
        """Record a request that moved `nbytes` in `seconds` (a failed one too: what it delivered)."""
        want = nbytes / max(seconds, 1e-3) * self.target_seconds
        self.size = int(min(self.maximum, max(self.minimum, self.size / 4, min(self.size * 4, want))))


class Part:
    """The bytes of one tensor fetched so far: `.parts/<name>.part`, and `.parts/<name>.sums` with one
    line per kept piece (offset, length, sha256), appended only after the piece is on disk."""

    def __init__(self, parts: Path, name: str):
        self.data = parts / f"{name}.part"
        self.sums = parts / f"{name}.sums"

    def verified(self, nbytes: int) -> int:
        """The bytes on disk that the journal vouches for (re-hashed), after cutting off anything else:
        a piece whose hash does not match (a zero-filled or half-written part) and all after it."""
        good, lines = 0, []
        if self.data.is_file() and self.sums.is_file():
            with open(self.data, "rb") as f:
                for line in self.sums.read_text(errors="replace").splitlines():
                    try:
                        offset, length, digest = line.split()
                        offset, length = int(offset), int(length)
                    except ValueError:
                        break
                    if offset != good or length <= 0 or good + length > nbytes:
                        break
                    f.seek(offset)
                    if hashlib.sha256(f.read(length)).hexdigest() != digest:
                        break
                    good += length
                    lines.append(line + "\n")
        if not self.data.is_file() or self.data.stat().st_size != good:
            with open(self.data, "ab") as f:
                f.truncate(good)
            write_text(self.sums, "".join(lines))
        return good

    def append(self, data: bytes, sync: bool = True) -> None:
        """Add a verified piece: its bytes first, then its journal line; `sync` flushes both to disk. Unsynced,
        they survive the process being killed (the page cache holds them), not a power cut (the resume
        re-hashes, so a piece that did not land is cut off)."""
        with open(self.data, "ab") as f:
            offset = f.tell()
            f.write(data)
            f.flush()
            if sync:
                os.fsync(f.fileno())
        with open(self.sums, "a") as f:
            f.write(f"{offset} {len(data)} {hashlib.sha256(data).hexdigest()}\n")
            f.flush()
            if sync:
                os.fsync(f.fileno())

    def sync(self) -> None:
        """Flush the part and its journal to disk."""
        for path in (self.data, self.sums):
            with open(path, "rb") as f:
                os.fsync(f.fileno())


class PieceWriter:
    """The sink of one request: appends each piece to the part as it arrives, synced at least every
    SYNC_SECONDS and at `close`; pieces after `close` (a request still running after Ctrl-C) are dropped."""

    def __init__(self, part: Part):
        self.part, self.bytes = part, 0
        self.closed = False
        self.synced = time.monotonic()
        self.lock = threading.Lock()

    def __call__(self, piece: bytes) -> None:
        with self.lock:
            if self.closed or not piece:
                return
            now = time.monotonic()
            sync = now - self.synced >= SYNC_SECONDS
            self.part.append(piece, sync=sync)
            self.bytes += len(piece)
            self.synced = now if sync else self.synced

    def close(self) -> None:
        with self.lock:
            if not self.closed and self.bytes:
                self.part.sync()
            self.closed = True


def _download(
    source: Source,
    t: TensorRange,
    parts: Path,
    sizer: ChunkSizer,
    version: dict[str, Any],
    advance: Callable[[int], None],
) -> int:
    """Append the missing bytes of tensor `t` to its part, chunk by chunk, each verified to come from
    the planned `version` of its shard; what a failing request delivered is kept, and a request the link
    broke (`LinkError`) is tried again from there, up to RETRIES times in a row, the next range sized by
    what the link delivered. Returns bytes fetched."""
    part = Part(parts, t.name)
    have = part.verified(t.nbytes)
    advance(have)
    fetched, failures = 0, 0
    while have < t.nbytes:
        n = min(sizer.size, t.nbytes - have)
        sink = PieceWriter(part)
        began = time.monotonic()
        failure = None
        try:
            source.stream_range(t.shard, t.start + have, t.start + have + n, version, sink)
        except SourceChanged:
            raise  # nothing of a changed file reaches the sink
        except FetchError as e:
            failure = e
        finally:  # Ctrl-C included: what came is on disk
            sink.close()
        have += sink.bytes
        fetched += sink.bytes
        advance(sink.bytes)
        sizer.update(sink.bytes, time.monotonic() - began)
        failures = 0 if sink.bytes else failures
        if isinstance(failure, LinkError) and failures < RETRIES:
            time.sleep(RETRY_PAUSE * 2**failures)
            failures += 1
            continue
        if failure is not None:
            raise (LinkError(f"{one_line(failure)} (tried {failures + 1} times)") if failures else failure) from None
        if not sink.bytes:
            raise FetchError(f"{source.label}: {t.shard} sent no bytes for {t.name}; run the fetch again to resume")
    return fetched


def _fetched_source(out: Path) -> str | None:
    """The source of the fetch whose files are in `out`, or None: the plan of an unfinished one (a replacement
    under way), else what the manifest or model.safetensors say."""
    from .weights import SafetensorsFile

    for path in (out / PARTS_DIR / "plan.json", out / MANIFEST_NAME):
        try:
            record = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue
        if isinstance(record, dict) and isinstance(record.get("source"), str):
            return record["source"]
    try:
        return SafetensorsFile(out / "model.safetensors").metadata.get("source")
    except (OSError, ValueError):
        return None


def _same_source(a: str, b: str) -> bool:
    """Do two source strings name the same checkpoint (a folder however it is spelled)?"""
    if is_remote(a) or is_remote(b):
        return a.rstrip("/") == b.rstrip("/")
    return Path(a).resolve() == Path(b).resolve()


def _fetched_here(out: Path) -> bool:
    """Did `fetch` write what is in `out`? Its manifest, its model.safetensors' metadata, or its plan say so."""
    from .weights import SafetensorsFile

    try:
        manifest = json.loads((out / MANIFEST_NAME).read_text())
        if isinstance(manifest, dict) and "source" in manifest and "tensors" in manifest:
            return True
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        pass
    try:
        metadata = SafetensorsFile(out / "model.safetensors").metadata
        if metadata.get("written_by") == WRITTEN_BY or {"source", "revision"} <= set(metadata):
            return True
    except (OSError, ValueError):
        pass
    try:
        return "source" in json.loads((out / PARTS_DIR / "plan.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, TypeError):
        return False


def _foreign_files(out: Path) -> list[Path]:
    """Checkpoint files in `out` that would be replaced or would shadow what fetch writes."""
    if not out.is_dir():
        return []
    names = set(CHECKPOINT_FILES) | {p.name for p in out.glob("*.safetensors")}
    return sorted(out / n for n in names if (out / n).exists())


def _check_place(source: str | os.PathLike, out: Path) -> None:
    """Refuse to write into the source folder, or where no folder can be made."""
    from .atomic import check_writable

    if not is_remote(source) and Path(source).resolve() == out.resolve():
        raise FetchError(f"{out}: is the source folder: fetch never writes into its source; choose another --out")
    try:
        check_writable(out, folder=True)
    except ValueError as e:
        raise FetchError(one_line(e)) from None


def _check_output(source: str | os.PathLike, out: Path, force: bool) -> list[Path]:
    """Refuse to write over a checkpoint fetch did not write, or over another source's fetch (unless `force`:
    then that fetch's parts are removed, never resumed); returns the files of a checkpoint fetch did not
    write that would shadow ours (removed once ours is in)."""
    earlier = _fetched_source(out) if out.is_dir() else None
    if earlier is not None and not _same_source(earlier, str(source)):
        if not force:
            raise FetchError(
                f"{out}: holds a fetch of {earlier}, not of {source}: pass --force (force=True) to replace it, "
                "or choose another --out"
            )
        shutil.rmtree(out / PARTS_DIR, ignore_errors=True)  # nothing of the other source is resumed
    present = _foreign_files(out)
    if not present or _fetched_here(out):
        return []
    if not force:
        raise FetchError(
            f"{out}: holds a checkpoint that fetch did not write ({', '.join(p.name for p in present)}): "
            "pass --force (force=True) to replace it, or choose another --out"
        )
    return [p for p in present if p.name not in ("config.json", "model.safetensors", MANIFEST_NAME)]


def fetch(
    source: str | os.PathLike,
    out: str | os.PathLike,
    revision: str | None = None,
    progress: bool = True,
    chunk_bytes: int = CHUNK_BYTES,
    force: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    wait: bool = False,
) -> dict[str, Any]:
    """Fetch the vision tensors of `source` into the folder `out` (see the module docstring);
    returns the manifest. Resumes from `out/.parts`; an `out` already complete for the same source,
    revision and shard identities is left as it is. `chunk_bytes` caps a request's size, `timeout`
    the seconds a request may go without data; `force` replaces a checkpoint fetch did not write.
    One fetch at a time per `out`: another one running is a FetchError naming it (`wait`: waits for it)."""
    from .output_lock import OutputBusy, output_lock

    out = Path(out)
    _check_place(source, out)  # before the lock, which creates the folder that holds `out`
    try:
        with output_lock(out, f"fetch {source}", wait=wait):
            return _fetch(source, out, revision, progress, chunk_bytes, force, timeout)
    except OutputBusy as e:
        raise FetchError(one_line(e)) from None


def _fetch(
    source: str | os.PathLike,
    out: Path,
    revision: str | None,
    progress: bool,
    chunk_bytes: int,
    force: bool,
    timeout: float,
) -> dict[str, Any]:
    """`fetch` with the output folder locked."""
    from tqdm import tqdm

    from .weights import file_state, save_tensors

    shadowing = _check_output(source, out, force)
    src = open_source(source, revision, timeout)
    config_text = src.read_text("config.json")
    config = read_config_text(src, config_text)
    planned = plan(src)
    ranges = planned.ranges
    done = out / MANIFEST_NAME
    try:
        old = json.loads(done.read_text()) if done.is_file() and (out / "model.safetensors").is_file() else None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        old = None  # a truncated manifest: fetch again
    if isinstance(old, dict) and not shadowing:
        same = old.get("source") == str(source) and old.get("revision") == src.revision
        same = same and old.get("files") == planned.files and _verifiable(planned.files)
        same = same and {k: (e.get("byte_range"), e.get("dtype")) for k, e in old.get("tensors", {}).items()} == {
            t.name: ([t.start, t.end], t.dtype) for t in ranges
        }
        if same and not _intact(out):
            same = False  # changed since it was written: fetched again (the folder is fetch's own)
        if same:  # already complete: only config, index and headers were read
            return {**old, "bytes_read_this_run": src.bytes_read}
    parts = out / PARTS_DIR
    wanted = {
        "source": str(source),
        "revision": src.revision,
        "files": planned.files,
        "tensors": [[t.name, t.shard, t.start, t.end] for t in ranges],
    }
    if parts.is_dir():  # resume only bytes of the same source, revision, shard versions and layout
        try:
            same = json.loads((parts / "plan.json").read_text()) == wanted and _verifiable(planned.files)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            same = False
        if not same:
            shutil.rmtree(parts)
    parts.mkdir(parents=True, exist_ok=True)
    write_text(parts / "plan.json", json.dumps(wanted))
    vision_bytes = sum(t.nbytes for t in ranges)
    bar = tqdm(total=vision_bytes, unit="B", unit_scale=True, desc="vision weights", disable=not progress)
    sizer = ChunkSizer(maximum=max(1, int(chunk_bytes)))
    fetched = 0
    try:
        for t in ranges:
            fetched += _download(src, t, parts, sizer, planned.files[t.shard], bar.update)
        for shard, version in planned.files.items():  # the source is still what the plan saw
            if src.identity(shard, fresh=True) != version:
                raise SourceChanged(f"{src.label}: {shard} changed during the fetch")
    except SourceChanged as e:
        raise FetchError(
            f"{one_line(e)}: nothing of the new version was kept; run the fetch again to start over"
        ) from None
    finally:
        bar.close()
    tensors, entries = {}, {}
    for t in ranges:
        data = (parts / f"{t.name}.part").read_bytes()
        if len(data) != t.nbytes:
            raise FetchError(f"{out}: the part of {t.name} holds {len(data)} bytes, expected {t.nbytes}")
        entries[t.name] = {
            "shard": t.shard,
            "dtype": t.dtype,
            "shape": list(t.shape),
            "byte_range": [t.start, t.end],
            "sha256": hashlib.sha256(data).hexdigest(),
        }
        tensors[t.name] = np.frombuffer(data, dtype=STORED_DTYPES[t.dtype]).reshape(t.shape)
    metadata = {"format": "pt", "source": str(source), "revision": src.revision or "", "written_by": WRITTEN_BY}
    save_tensors(out / "model.safetensors", tensors, metadata)
    for path in shadowing:  # a replaced checkpoint's index and other shards would hide ours
        path.unlink()
    write_text(out / "config.json", config_text)
    manifest = {
        "written": {name: file_state(out / name) for name in ("model.safetensors", "config.json")},
        "format": WRITTEN_BY,
        "source": str(source),
        "repo": src.repo,
        "revision": src.revision,
        "files": planned.files,
        "config": {"vt_num_hidden_layers": config.vt_num_hidden_layers, "vt_hidden_size": config.vt_hidden_size},
        "checkpoint_bytes": planned.total,
        "header_bytes": planned.header_bytes,
        "vision_bytes": vision_bytes,
        "bytes_read_this_run": src.bytes_read,
        "vision_bytes_fetched_this_run": fetched,
        "tensors": entries,
    }
    write_text(done, json.dumps(manifest, indent=2) + "\n")
    shutil.rmtree(parts)
    return manifest


def _intact(out: Path) -> bool:
    """Does `out` still hold what its manifest records (`weights.check_fetched`)?"""
    from .weights import check_fetched

    try:
        check_fetched(out)
    except (ValueError, OSError):
        return False
    return True


def _verifiable(files: dict[str, dict[str, Any]]) -> bool:
    """True when every shard's identity says more than its size (a validator: mtime, ETag, blob id, ...),
    so that bytes from an earlier run can be trusted to come from the same version."""
    return all(set(identity) - {"size"} for identity in files.values())


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
    fetch(source, out, revision=revision, progress=progress, force=True, wait=True)  # the cache folder is ours
    return out
