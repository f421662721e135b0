"""`encode-dataset`: a folder / glob / Parquet list of images -> Parquet shards of embeddings, on Ray Data.

    summary = encode_dataset("photos/", weights="ckpt/", out="embeddings/", batch_tokens=16384)

Pipeline (Ray Data, streamed):

    check (driver)     the checkpoint's headers against its config (shapes, dtypes, layers), and DST's
                       `provenance.json` (checkpoint content digest, config digest, preprocessing
                       settings, rows_per_shard): a DST made with another provenance is refused, or
                       with `overwrite` its shards are removed first
    plan (driver)      list the sources in a fixed order, cut them into shards of `rows_per_shard`;
                       shards already in DST (same image ids, same provenance) are skipped, shards
                       numbered past the plan (a longer earlier SRC) removed
    decode (CPU tasks) read + `preprocess.preprocess_images` one image -> float32 patches, grid (1, h, w);
                       an unreadable image becomes an error row, never an exception
    encode (actors)    one `MoonViT` per actor, weights loaded once in the actor; each call packs many
                       images up to `batch_tokens` patches into one forward (block-diagonal attention
                       through grid_thws); one actor per GPU (`num_gpus=1`), or CPU actors on the numpy
                       backend when the cluster has no GPU
    write (driver)     rows are gathered per shard as they stream in; a complete shard is written to
                       `shard-NNNNN.parquet` (temporary name, then renamed: a shard file is complete or
                       absent) with its bad images in `shard-NNNNN.errors.jsonl`

At the end `errors.jsonl` (every bad image with the reason) and `manifest.json` (settings, shards,
counts, throughput) are written, atomically, like every shard. `read_embeddings(DST)` checks every
shard against `provenance.json` before returning anything. Ray runs locally by default (`ray.init`),
or joins the cluster named by `RAY_ADDRESS`; on a cluster `moonvit_kernels` must be installed on every
node and the weights readable from every node (shared storage, or `hf://ORG/REPO`: each node then
fetches the vision tensors once into its cache); DST is written by the driver.

Shard schema (one row per good image): `id` string, `path` string, `width`/`height` int32 (original
size), `grid_thws` fixed_size_list<int64, 3>, `num_tokens` int32, `embedding`
list<fixed_size_list<float32, text_hidden>> (= `[num_tokens, text_hidden]`, the model's dtype kept).
`read_embeddings(DST)` reads them back as NumPy.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import math
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .atomic import atomic_path, write_text

SHARD_PREFIX = "shard-"
MANIFEST = "manifest.json"
ERRORS = "errors.jsonl"
METADATA_KEY = b"moonvit_kernels"
FORMAT = "moonvit_kernels encode-dataset 1"
DEFAULT_ROWS_PER_SHARD = 256
DEFAULT_BATCH_TOKENS = 16384
DECODE_MEMORY = 512 * 2**20  # bytes one decode task may hold (Ray scheduling hint)


def require_ray() -> Any:
    """The `ray` module; ImportError with the install hint when the `[ray]` extra is missing."""
    try:
        import pyarrow  # noqa: F401
        import ray
        import ray.data  # noqa: F401
    except ImportError as e:
        raise ImportError(f"encode-dataset needs Ray Data and pyarrow: pip install -e '.[ray]' ({e})") from None
    return ray


def init_ray(num_cpus: int | None = None, attempts: int = 3) -> None:
    """`ray.init`: the cluster named by `RAY_ADDRESS`, else a local Ray with `num_cpus` CPUs (all by
    default) and no dashboard. A local node that misses Ray's fixed 30 s start-up deadline (a
    heavily loaded machine) is started again, up to `attempts` times."""
    ray = require_ray()
    if os.environ.get("RAY_ADDRESS"):
        ray.init()
        return
    for attempt in range(1, attempts + 1):
        try:
            ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
            return
        except Exception as e:  # noqa: BLE001 — Ray raises a bare Exception for the start-up timeout
            ray.shutdown()
            if attempt == attempts or "timed out during startup" not in str(e):
                raise


# ============================================================================ sources
@dataclass(frozen=True)
class Source:
    """One image to encode: a stable `id`, a `path` (may be empty) and/or its encoded `data` bytes."""

    id: str
    path: str
    data: bytes = b""


def image_extensions() -> set[str]:
    """File suffixes PIL can open (".png", ".jpg", ...), lower case."""
    from PIL import Image

    return {ext.lower() for ext in Image.registered_extensions()}


def list_sources(src: str | os.PathLike) -> list[Source]:
    """SRC -> sources in a fixed order.

    - a folder: every file below it with an image suffix (recursive, sorted), id = relative path;
    - a Parquet file: a `path` and/or `bytes` column (bytes win when both), optional `id` column
      (default: the path, else `row<N>`);
    - otherwise a glob pattern (`**` allowed): the matching files, sorted, id = the path.
    ValueError when SRC names nothing or yields duplicate ids."""
    text = str(src)
    path = Path(text)
    if path.is_dir():
        exts = image_extensions()
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in exts)
        sources = [Source(p.relative_to(path).as_posix(), str(p)) for p in files]
    elif path.is_file() and path.suffix.lower() == ".parquet":
        sources = _parquet_sources(path)
    elif any(ch in text for ch in "*?["):
        sources = [Source(p, p) for p in sorted(glob.glob(text, recursive=True)) if os.path.isfile(p)]
    elif path.is_file():
        raise ValueError(f"{src}: SRC must be a folder of images, a glob pattern or a .parquet file of paths/bytes")
    else:
        raise ValueError(f"{src}: no such folder or Parquet file, and not a glob pattern")
    if not sources:
        raise ValueError(f"{src}: no images found")
    seen: set[str] = set()
    for s in sources:
        if s.id in seen:
            raise ValueError(f"{src}: image id {s.id!r} appears twice; ids must be unique")
        seen.add(s.id)
    return sources


def _parquet_sources(path: Path) -> list[Source]:
    import pyarrow.parquet as pq

    names = pq.read_schema(path).names
    if "path" not in names and "bytes" not in names:
        raise ValueError(f"{path}: a Parquet source needs a 'path' or a 'bytes' column (has {names})")
    table = pq.read_table(path, columns=[c for c in ("id", "path", "bytes") if c in names])
    n = table.num_rows
    paths = [str(p) if p is not None else "" for p in table["path"].to_pylist()] if "path" in names else [""] * n
    data = [b or b"" for b in table["bytes"].to_pylist()] if "bytes" in names else [b""] * n
    if "id" in names:
        ids = [str(i) for i in table["id"].to_pylist()]
    else:
        ids = [p if p else f"row{i}" for i, p in enumerate(paths)]
    return [Source(i, p, d) for i, p, d in zip(ids, paths, data, strict=True)]


# ============================================================================ shard plan
@dataclass(frozen=True)
class Shard:
    """Shard `number` holds the sources `start:stop` of the ordered list; `key` fingerprints its ids + settings."""

    number: int
    start: int
    stop: int
    key: str
    provenance: str = ""

    @property
    def name(self) -> str:
        return f"{SHARD_PREFIX}{self.number:05d}"


def source_digest(source: Source) -> str:
    """sha256 of a source's content (its bytes, else its file's); "unreadable" when the file cannot be read."""
    from .provenance import file_digest

    if source.data:
        return hashlib.sha256(source.data).hexdigest()
    try:
        return file_digest(source.path)
    except OSError:
        return "unreadable"


def plan_shards(
    sources: list[Source], rows_per_shard: int, settings_key: str, digests: list[str] | None = None
) -> list[Shard]:
    """Consecutive shards of `rows_per_shard` sources; each keyed by sha256(settings, its ids and their
    content `digests`), and carrying `settings_key` (the provenance digest) as `provenance`."""
    if rows_per_shard < 1:
        raise ValueError(f"rows_per_shard must be >= 1, got {rows_per_shard}")
    digests = digests if digests is not None else [""] * len(sources)
    shards = []
    for number, start in enumerate(range(0, len(sources), rows_per_shard)):
        stop = min(len(sources), start + rows_per_shard)
        h = hashlib.sha256(settings_key.encode())
        for s, digest in zip(sources[start:stop], digests[start:stop], strict=True):
            h.update(b"\0" + s.id.encode() + b"\0" + digest.encode())
        shards.append(Shard(number, start, stop, h.hexdigest(), settings_key))
    return shards


def shard_is_done(out: Path, shard: Shard, recorded: dict[str, str] | None = None) -> bool:
    """True when `out` holds this shard's Parquet file and errors file, made for the same ids, inputs and
    settings, and (when the earlier manifest lists it: `recorded`, file -> sha256) not altered since."""
    import pyarrow.parquet as pq

    from .provenance import file_digest

    parquet, errors = out / f"{shard.name}.parquet", out / f"{shard.name}.errors.jsonl"
    if not (parquet.is_file() and errors.is_file()):
        return False
    if parquet.name in (recorded or {}) and file_digest(parquet) != recorded[parquet.name]:
        return False
    try:
        meta = pq.read_schema(parquet).metadata or {}
        return json.loads(meta.get(METADATA_KEY, b"{}")).get("key") == shard.key
    except Exception:  # noqa: BLE001 — an unreadable shard is redone
        return False


def made_with(weights_folder: str | os.PathLike, config: Any, settings: Any, rows_per_shard: int) -> dict[str, Any]:
    """What decides DST's contents (its provenance): the checkpoint's content digest, the config's digest,
    the preprocessing settings (a `PreprocessConfig`) and the shard size."""
    import dataclasses

    from .provenance import digest_json
    from .weights import checkpoint_digest

    return {
        "checkpoint": checkpoint_digest(weights_folder, full=True),
        "config": digest_json(config.to_dict()),
        "preprocess": dataclasses.asdict(settings),
        "rows_per_shard": rows_per_shard,
    }


def is_output_file(name: str) -> bool:
    """The files encode-dataset writes in DST (besides provenance.json)."""
    shard = name.startswith(SHARD_PREFIX) and name.endswith((".parquet", ".errors.jsonl"))
    return shard or name in (MANIFEST, ERRORS)


def claim_output(out: Path, provenance_made_with: dict[str, Any], overwrite: bool) -> None:
    """Make DST ours for this provenance: refuse one made otherwise (ValueError naming what differs),
    or with `overwrite` remove its files; then write `provenance.json`. Files of encode-dataset's names
    that it did not write are refused whatever `overwrite` says (never touched)."""
    from . import provenance

    foreign = foreign_outputs(out)
    if foreign:
        raise ValueError(
            f"{out}: holds {', '.join(foreign)} that encode-dataset did not write: it will not touch them; "
            "move them away or choose another output folder"
        )
    for path in provenance.claim(out, FORMAT, provenance_made_with, is_output_file, overwrite, "shards"):
        path.unlink()
    out.mkdir(parents=True, exist_ok=True)
    provenance.write(out, {"format": FORMAT, "made_with": provenance_made_with})


def recorded_shards(out: Path, provenance_made_with: dict[str, Any]) -> dict[str, str]:
    """shard file -> sha256, as DST's manifest.json records them (empty when it has none of this provenance)."""
    try:
        manifest = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    made = json.loads(json.dumps(provenance_made_with))
    if not isinstance(manifest, dict) or manifest.get("made_with") != made:
        return {}
    return {e["file"]: e["sha256"] for e in manifest.get("shards", []) if isinstance(e, dict) and "sha256" in e}


def foreign_outputs(out: Path) -> list[str]:
    """The files in `out` with encode-dataset's names (`is_output_file`) whose content it did not write:
    a manifest of another format, an errors file whose lines are not its records, a Parquet file without
    its shard metadata."""
    if not out.is_dir():
        return []
    return sorted(p.name for p in out.iterdir() if p.is_file() and is_output_file(p.name) and not _ours(p))


def _ours(path: Path) -> bool:
    import pyarrow.parquet as pq

    try:
        if path.suffix == ".parquet":
            return METADATA_KEY in (pq.read_schema(path).metadata or {})
        text = path.read_text(encoding="utf-8")
        if path.name == MANIFEST:
            return json.loads(text).get("format") == FORMAT
        return all({"id", "shard", "reason"} <= set(json.loads(line)) for line in text.splitlines())
    except Exception:  # noqa: BLE001 — unreadable, not JSON, not Parquet: not ours
        return False


def remove_shards_past(out: Path, count: int) -> None:
    """Remove shard files numbered `count` or more (an earlier, longer SRC's), so DST holds this SRC only."""
    for path in out.glob(f"{SHARD_PREFIX}*"):
        number = path.name.removeprefix(SHARD_PREFIX).split(".")[0]
        if number.isdigit() and int(number) >= count and is_output_file(path.name):
            path.unlink()


# ============================================================================ decode (CPU tasks)
def decode_row(row: dict[str, Any], settings: Any) -> dict[str, Any]:
    """One source row -> preprocessed patches (float32 bytes) and its grid, or an `error` reason.

    `settings` is the `preprocess.PreprocessConfig` (patch and merge sizes, limits) made on the driver."""
    from .preprocess import preprocess_images

    out = {k: row[k] for k in ("shard", "index", "id", "path")}
    out.update(width=0, height=0, t=0, h=0, w=0, pixels=b"", error="")
    try:
        if not row["data"] and not Path(row["path"]).is_file():
            raise ValueError(f"{row['path']}: no such image file")
        data = bytes(row["data"]) if row["data"] else Path(row["path"]).read_bytes()
        expected = row.get("digest")
        if expected and hashlib.sha256(data).hexdigest() != expected:  # what is decoded is what was keyed
            out["error"] = (
                f"SourceChanged: {row['path'] or row['id']} changed after this run read its digest; "
                "run encode-dataset again to encode the new content"
            )
            return out
        item = preprocess_images(data, settings)
    except Exception as e:  # noqa: BLE001 — a bad image is recorded, never raised
        out["error"] = f"{type(e).__name__}: {' '.join(str(e).split())}"
        return out
    plan = item.plans[0]
    t, h, w = (int(v) for v in item.grid_thws[0])
    out.update(width=plan.width, height=plan.height, t=t, h=h, w=w, pixels=item.pixel_values.tobytes())
    return out


# ============================================================================ encode (actors)
def pipeline_failure(error: BaseException) -> str:
    """The root cause of a Ray pipeline failure in one line: the last `SomethingError: message` line
    of Ray's (often hundreds of lines long) report, else its first line."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    causes = [line for line in lines if re.match(r"^[\w.]*(Error|Exception): ", line)]
    return causes[-1] if causes else (lines[0] if lines else type(error).__name__)


def pack(token_counts: list[int], budget: int) -> list[list[int]]:
    """Greedy packing in order: consecutive indices whose token counts sum to at most `budget`
    (an item larger than the budget goes alone)."""
    groups: list[list[int]] = []
    current: list[int] = []
    used = 0
    for i, n in enumerate(token_counts):
        if current and used + n > budget:
            groups.append(current)
            current, used = [], 0
        current.append(i)
        used += n
    if current:
        groups.append(current)
    return groups


class Encoder:
    """A Ray Data actor: loads the checkpoint once, encodes packed batches of decoded rows."""

    def __init__(self, weights: str, backend: str, batch_tokens: int, allow_nonfinite: bool = False):
        from .checkpoints import load_checkpoint
        from .model import MoonViT

        config, w = load_checkpoint(weights)
        self.model = MoonViT(config, w, backend=backend)
        self.config = config
        self.batch_tokens = batch_tokens
        self.allow_nonfinite = allow_nonfinite
        self._blas = None
        if self.model.computes_on_host:
            # Ray starts actors with OMP_NUM_THREADS = their CPU share (1 here); the CPU encoder is the
            # pipeline's bottleneck and decoding is light, so let BLAS use the node's cores.
            from threadpoolctl import threadpool_limits

            self._blas = threadpool_limits(limits=os.cpu_count() or 1, user_api="blas")

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Rows in, the same rows out with `embedding` (bytes), `dtype`, `num_tokens` added."""
        n = len(batch["id"])
        embeddings: list[bytes] = [b""] * n
        dtypes = [""] * n
        tokens = [0] * n
        errors = [str(e) for e in batch["error"]]
        good = [i for i in range(n) if not errors[i]]
        p = self.config.patch_size
        grids = {i: (int(batch["t"][i]), int(batch["h"][i]), int(batch["w"][i])) for i in good}
        sizes = [int(np.prod(grids[i])) for i in good]
        for group in pack(sizes, self.batch_tokens):
            rows = [good[j] for j in group]
            pixels = [np.frombuffer(batch["pixels"][i], dtype=np.float32).reshape(-1, 3, p, p) for i in rows]
            try:
                outputs = self._forward(pixels, [grids[i] for i in rows])
            except Exception:  # noqa: BLE001 — one bad item must not sink the pack: retry one by one
                outputs = []
                for i, pv in zip(rows, pixels, strict=True):
                    try:
                        outputs += self._forward([pv], [grids[i]])
                    except Exception as e:  # noqa: BLE001
                        errors[i] = f"encode failed: {type(e).__name__}: {' '.join(str(e).split())}"
                        outputs.append(None)
            for i, o in zip(rows, outputs, strict=True):
                if o is not None and not self.allow_nonfinite and not np.all(np.isfinite(o)):
                    errors[i] = "encode failed: the embedding holds NaN or Inf (allow_nonfinite keeps it)"
                elif o is not None:
                    embeddings[i], dtypes[i], tokens[i] = o.tobytes(), str(o.dtype), int(o.shape[0])
        keep = ("shard", "index", "id", "path", "width", "height", "t", "h", "w")
        out = {k: batch[k] for k in keep}
        out["error"] = np.array(errors, dtype=object)
        out["embedding"] = np.array(embeddings, dtype=object)
        out["dtype"] = np.array(dtypes, dtype=object)
        out["num_tokens"] = np.array(tokens, dtype=np.int64)
        out["backend"] = np.array([self.model.backend_name] * n, dtype=object)
        return out

    def _forward(self, pixels: list[np.ndarray], grids: list[tuple[int, int, int]]) -> list[np.ndarray]:
        outputs = self.model(np.concatenate(pixels), np.asarray(grids, dtype=np.int64), as_numpy=True)
        return [np.ascontiguousarray(o) for o in outputs]


# ============================================================================ write (driver)
def shard_table(rows: list[dict[str, Any]], text_hidden: int, metadata: dict[str, Any]) -> Any:
    """Good rows (sorted by index) -> the shard's Arrow table (schema in the module docstring)."""
    import pyarrow as pa

    dtype = np.dtype(rows[0]["dtype"]) if rows else np.dtype(np.float32)
    counts = [int(r["num_tokens"]) for r in rows]
    flat = (
        np.concatenate([np.frombuffer(r["embedding"], dtype=dtype) for r in rows]) if rows else np.zeros(0, dtype=dtype)
    )
    per_token = pa.FixedSizeListArray.from_arrays(pa.array(flat), text_hidden)
    offsets = pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
    embedding = pa.ListArray.from_arrays(offsets, per_token)
    grids = np.array([[r["t"], r["h"], r["w"]] for r in rows], dtype=np.int64).reshape(-1)
    table = pa.table(
        {
            "id": pa.array([str(r["id"]) for r in rows], pa.string()),
            "path": pa.array([str(r["path"]) for r in rows], pa.string()),
            "width": pa.array([int(r["width"]) for r in rows], pa.int32()),
            "height": pa.array([int(r["height"]) for r in rows], pa.int32()),
            "grid_thws": pa.FixedSizeListArray.from_arrays(pa.array(grids, pa.int64()), 3),
            "num_tokens": pa.array(counts, pa.int32()),
            "embedding": embedding,
        }
    )
    return table.replace_schema_metadata({METADATA_KEY: json.dumps(metadata).encode()})


def write_shard(out: Path, shard: Shard, rows: list[dict[str, Any]], text_hidden: int) -> dict[str, Any]:
    """Write the shard's errors file, then its Parquet file (each under a temporary name renamed into place)."""
    import pyarrow.parquet as pq

    rows = sorted(rows, key=lambda r: int(r["index"]))
    good = [r for r in rows if not r["error"]]
    bad = [r for r in rows if r["error"]]
    write_text(out / f"{shard.name}.errors.jsonl", "".join(_error_line(r, shard) for r in bad))
    metadata = {
        "shard": shard.number,
        "key": shard.key,
        "provenance": shard.provenance,
        "rows": len(good),
        "errors": len(bad),
    }
    table = shard_table(good, text_hidden, metadata)
    final = out / f"{shard.name}.parquet"
    with atomic_path(final) as tmp:
        pq.write_table(table, tmp)
    return {
        "file": final.name,
        "rows": len(good),
        "errors": len(bad),
        "tokens": int(sum(r["num_tokens"] for r in good)),
    }


def _error_line(row: dict[str, Any], shard: Shard) -> str:
    return (
        json.dumps({"id": str(row["id"]), "path": str(row["path"]), "shard": shard.number, "reason": row["error"]})
        + "\n"
    )


def read_embeddings(out: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every embedding in DST's shards: id -> `[num_tokens, text_hidden]` array (dtype as written).
    ValueError when DST has no `provenance.json`, no manifest of that provenance (an unfinished run), a
    shard the manifest lists is missing or not the file it records (sha256), a shard it does not list is
    there, or a shard was made with another provenance."""
    import pyarrow.parquet as pq

    from . import provenance

    record = provenance.check(out, FORMAT, "an encode-dataset output")
    expected = provenance.digest_json(record["made_with"])
    result = {}
    for path in checked_shards(Path(out), record["made_with"]):
        try:
            meta = json.loads((pq.read_schema(path).metadata or {}).get(METADATA_KEY, b"{}"))
        except Exception as e:  # noqa: BLE001 — pyarrow's errors for a file that is not Parquet
            raise ValueError(f"{path}: not a readable shard ({type(e).__name__}: {e})") from None
        if meta.get("provenance") != expected:
            raise ValueError(f"{path}: made with other settings than {Path(out) / provenance.PROVENANCE} describes")
        table = pq.read_table(path, columns=["id", "embedding"])
        column = table["embedding"].combine_chunks()
        width = column.type.value_type.list_size
        for i, image_id in enumerate(table["id"].to_pylist()):
            values = column[i].values.flatten().to_numpy(zero_copy_only=False)
            result[image_id] = values.reshape(-1, width)
    return result


def checked_shards(out: Path, provenance_made_with: dict[str, Any]) -> list[Path]:
    """The shard files DST's manifest lists, each checked to be there with the sha256 it records;
    ValueError naming the problem (no manifest, a missing, altered or unlisted shard)."""
    from .provenance import PROVENANCE, file_digest

    recorded = recorded_shards(out, provenance_made_with)
    if not recorded:
        raise ValueError(
            f"{out / MANIFEST}: missing, or not of the run {PROVENANCE} describes (an unfinished run?): "
            "run encode-dataset again to finish it"
        )
    for name, digest in sorted(recorded.items()):
        path = out / name
        if not path.is_file():
            raise ValueError(f"{path}: missing (listed in {MANIFEST}): run encode-dataset again to redo it")
        if file_digest(path) != digest:
            raise ValueError(
                f"{path}: altered since it was written (not the sha256 {MANIFEST} records): run encode-dataset "
                "again to redo it"
            )
    unlisted = sorted(p.name for p in out.glob(f"{SHARD_PREFIX}*.parquet") if p.name not in recorded)
    if unlisted:
        raise ValueError(
            f"{out}: holds shards {MANIFEST} does not list ({', '.join(unlisted)}): run encode-dataset again"
        )
    return [out / name for name in sorted(recorded)]


# ============================================================================ the run
@dataclass
class Summary:
    """What a run did: counts over the whole of DST (images, encoded, errors), this run's work
    (shards written, output tokens, images handled, seconds), and where the manifest and errors are."""

    images: int
    encoded: int
    errors: int
    skipped_shards: int
    written_shards: int
    tokens: int
    run_images: int
    seconds: float
    manifest: Path
    errors_file: Path

    @property
    def images_per_second(self) -> float:
        """Images (good or bad) this run handled, per second of this run."""
        return self.run_images / self.seconds if self.seconds > 0 else 0.0


def encode_dataset(
    src: str | os.PathLike,
    weights: str | os.PathLike,
    out: str | os.PathLike,
    backend: str = "auto",
    batch_tokens: int = DEFAULT_BATCH_TOKENS,
    rows_per_shard: int = DEFAULT_ROWS_PER_SHARD,
    actors: int | None = None,
    num_cpus: int | None = None,
    in_patch_limit: int | None = None,
    patch_limit_on_one_side: int | None = None,
    progress: bool = True,
    overwrite: bool = False,
    allow_nonfinite: bool = False,
) -> Summary:
    """Encode every image of `src` into Parquet shards under `out` (see the module docstring).

    `actors`: encoder actors (default: one per GPU, or 1 CPU actor without GPUs); `num_cpus`: CPUs of
    the local Ray started when none is running and `RAY_ADDRESS` is unset (default: all); `overwrite`:
    replace the shards of a DST made with another provenance instead of refusing it; `allow_nonfinite`:
    keep embeddings holding NaN or Inf (by default such an image is an error row). One run at a time
    per DST: another one running is a ValueError (`output_lock.OutputBusy`) naming it."""
    from .atomic import check_writable
    from .checkpoints import local_checkpoint
    from .model import BACKENDS
    from .output_lock import output_lock
    from .preprocess import resolve_settings
    from .weights import check_headers, load_config

    require_ray()  # the install hint before any work
    if backend != "auto" and backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)} or 'auto'")
    if batch_tokens < 1:
        raise ValueError(f"batch_tokens must be >= 1, got {batch_tokens}")
    check_resources(actors, num_cpus, backend)
    weights = str(weights)
    folder = local_checkpoint(weights)  # hf:// or http(s)://: fetched once into this node's cache
    config = load_config(folder)
    check_headers(folder, config)  # a mis-shaped checkpoint fails here, not in every actor
    limits = {"in_patch_limit": in_patch_limit, "patch_limit_on_one_side": patch_limit_on_one_side}
    limits = {k: v for k, v in limits.items() if v is not None}
    preprocess_settings = resolve_settings(config, **limits)
    sources = list_sources(src)
    out = Path(out)
    check_writable(out, folder=True)
    with output_lock(out, "encode-dataset"):
        return _encode_dataset(
            src, weights, folder, out, config, preprocess_settings, sources, limits, backend, batch_tokens,
            rows_per_shard, actors, num_cpus, progress, overwrite, allow_nonfinite,
        )  # fmt: skip


def _encode_dataset(
    src: str | os.PathLike,
    weights: str,
    folder: Any,
    out: Path,
    config: Any,
    preprocess_settings: Any,
    sources: list[Source],
    limits: dict[str, int],
    backend: str,
    batch_tokens: int,
    rows_per_shard: int,
    actors: int | None,
    num_cpus: int | None,
    progress: bool,
    overwrite: bool,
    allow_nonfinite: bool,
) -> Summary:
    """`encode_dataset` once its arguments are checked and DST is locked."""
    from tqdm import tqdm

    from .provenance import digest_json

    ray = require_ray()
    made = made_with(folder, config, preprocess_settings, rows_per_shard)
    settings = {"weights": weights, "limits": limits, "rows_per_shard": rows_per_shard}
    digests = [source_digest(s) for s in sources]
    shards = plan_shards(sources, rows_per_shard, digest_json(made), digests)
    claim_output(out, made, overwrite)
    remove_shards_past(out, len(shards))
    recorded = recorded_shards(out, made)
    pending = [s for s in shards if not shard_is_done(out, s, recorded)]

    started_ray = bool(pending) and not ray.is_initialized()  # nothing to do: no Ray at all
    if started_ray:
        init_ray(num_cpus)
    start = time.perf_counter()
    written: dict[int, dict[str, Any]] = {}
    backends: list[str] = []
    try:
        if pending:
            written, backends = _run_pipeline(
                ray, sources, digests, pending, out, weights, backend, batch_tokens, actors, limits, config, progress,
                tqdm, allow_nonfinite,
            )  # fmt: skip
    finally:
        if started_ray:
            ray.shutdown()
    seconds = time.perf_counter() - start
    run = {"backend": backend, "backends_used": backends, "batch_tokens": batch_tokens, "seconds": seconds}
    return _finish(src, out, shards, written, settings, config, run, len(sources), made)


def check_resources(actors: int | None, num_cpus: int | None, backend: str) -> None:
    """ValueError naming --actors or --num-cpus when they cannot run (Ray would wait for CPUs forever):
    fewer than one of either, or (numpy backend, a local Ray of --num-cpus CPUs) more actors than CPUs."""
    if num_cpus is not None and num_cpus < 1:
        raise ValueError(f"--num-cpus {num_cpus}: a local Ray needs at least 1 CPU to run anything")
    if actors is not None and actors < 1:
        raise ValueError(f"--actors {actors}: at least 1 encoder actor is needed")
    if num_cpus is not None and backend == "numpy" and not os.environ.get("RAY_ADDRESS"):
        plan_cpus(num_cpus, actors or 1, "the local Ray (--num-cpus)")


def plan_cpus(cpus: float, actors: int, where: str) -> tuple[float, float]:
    """The CPUs each encoder actor and each decode task ask for, on `cpus` CPUs: half of them (whole,
    at least 1) shared by the actors and 1 per decode task when that leaves one for decoding; else an
    equal fraction each, so that all `actors` and one decode task run at once (a 1-CPU machine: 0.5 each).
    ValueError naming --actors when there are more actors than CPUs (`where` names the Ray)."""
    if actors > cpus:
        raise ValueError(
            f"--actors {actors} needs at least {actors} CPUs (one per encoder actor), {where} has {cpus:g}: "
            f"pass --actors {max(1, int(cpus))} or fewer, or run on more CPUs"
        )
    if cpus >= actors + 1:
        return max(1, int(cpus) // 2 // actors), 1
    share = math.floor(cpus / (actors + 1) * 10**4) / 10**4  # Ray counts CPUs in steps of 1/10000
    return share, share


def _run_pipeline(
    ray: Any,
    sources: list[Source],
    digests: list[str],
    pending: list[Shard],
    out: Path,
    weights: str,
    backend: str,
    batch_tokens: int,
    actors: int | None,
    limits: dict[str, Any],
    config: Any,
    progress: bool,
    tqdm: Any,
    allow_nonfinite: bool = False,
) -> tuple[dict[int, dict[str, Any]], list[str]]:
    """Run decode -> encode for the pending shards; write each shard as soon as all its rows are in. A source
    is decoded from the bytes whose sha256 (`digests`, the shard keys' part) is checked, read once.
    Returns the written shards' summaries and the backends the actors ran."""
    import ray.data

    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False  # ours counts images; Ray Data's count blocks per operator
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    items = [
        {
            "shard": s.number,
            "index": i,
            "id": sources[i].id,
            "path": sources[i].path,
            "data": sources[i].data,
            "digest": digests[i],
        }
        for s in pending
        for i in range(s.start, s.stop)
    ]
    resources = ray.cluster_resources()
    gpus = int(resources.get("GPU", 0))
    cpus = float(resources.get("CPU", 0))
    use_gpu = gpus > 0 and backend != "numpy"
    if use_gpu:
        if actors is not None and actors > gpus:
            raise ValueError(
                f"--actors {actors} needs {actors} GPUs (one per encoder actor), the Ray cluster has {gpus}"
            )
        encoder_cpus, decode_cpus = plan_cpus(cpus, actors or gpus, "the Ray cluster")
        encode_resources = {"num_gpus": 1, "num_cpus": min(1, encoder_cpus)}  # a GPU actor's host work
        pool = ray.data.ActorPoolStrategy(size=actors or gpus)
    else:
        if backend == "auto":
            backend = "numpy"
        encoder_cpus, decode_cpus = plan_cpus(cpus, actors or 1, "the Ray cluster")
        encode_resources = {"num_cpus": encoder_cpus}
        pool = ray.data.ActorPoolStrategy(size=actors or 1)
    ds = ray.data.from_items(items, override_num_blocks=max(1, min(len(items), 4 * int(cpus))))
    # The memory request (a decoded photograph and its float32 patches) also makes the decode map's
    # resources differ from the encoder's, so Ray Data does not fuse decoding into the encoder actors:
    # it stays in CPU tasks of its own (spread over the nodes, Ray Data's default for tasks).
    from .preprocess import resolve_settings

    settings = resolve_settings(config, **limits)
    ds = ds.map(decode_row, fn_kwargs={"settings": settings}, num_cpus=decode_cpus, memory=DECODE_MEMORY)
    ds = ds.map_batches(
        Encoder,
        fn_constructor_kwargs={
            "weights": weights,
            "backend": backend,
            "batch_tokens": batch_tokens,
            "allow_nonfinite": allow_nonfinite,
        },
        batch_size=32,
        batch_format="numpy",
        compute=pool,
        **encode_resources,
    )
    expected = {s.number: s.stop - s.start for s in pending}
    by_number = {s.number: s for s in pending}
    gathered: dict[int, list[dict[str, Any]]] = {s.number: [] for s in pending}
    written = {}
    backends: set[str] = set()
    bar = tqdm(total=len(items), desc="images", unit="img", disable=not progress)
    for row in _rows(ds):
        number = int(row["shard"])
        gathered[number].append(row)
        backends.add(str(row["backend"]))
        bar.update(1)
        if len(gathered[number]) == expected[number]:
            written[number] = write_shard(out, by_number[number], gathered.pop(number), config.text_hidden_size)
            bar.set_postfix_str(f"{len(written)}/{len(pending)} shards")
    bar.close()
    return written, sorted(backends)


def _rows(ds: Any) -> Iterator[dict[str, Any]]:
    for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
        n = len(batch["id"])
        for i in range(n):
            yield {k: v[i] for k, v in batch.items()}


def _finish(
    src: Any,
    out: Path,
    shards: list[Shard],
    written: dict[int, dict[str, Any]],
    settings: dict[str, Any],
    config: Any,
    run: dict[str, Any],
    images: int,
    provenance_made_with: dict[str, Any],
) -> Summary:
    """Merge the shards' errors into errors.jsonl and write manifest.json (both atomically), with each
    shard's sha256 (`read_embeddings` checks them)."""
    import pyarrow.parquet as pq

    from .provenance import file_digest

    seconds = run["seconds"]
    entries = []
    error_lines = []
    for s in shards:
        errors_text = (out / f"{s.name}.errors.jsonl").read_text()
        error_lines.append(errors_text)
        meta = json.loads((pq.read_schema(out / f"{s.name}.parquet").metadata or {})[METADATA_KEY])
        entries.append(
            {
                "file": f"{s.name}.parquet",
                "first": s.start,
                "stop": s.stop,
                "rows": meta["rows"],
                "errors": meta["errors"],
                "key": s.key,
                "sha256": file_digest(out / f"{s.name}.parquet"),
                "status": "written" if s.number in written else "skipped (already done)",
            }
        )
    errors_file = out / ERRORS
    write_text(errors_file, "".join(error_lines))
    encoded = sum(e["rows"] for e in entries)
    errors = sum(e["errors"] for e in entries)
    run_images = sum(w["rows"] + w["errors"] for w in written.values())
    tokens = sum(w["tokens"] for w in written.values())
    manifest = {
        "format": FORMAT,
        "source": str(src),
        "settings": settings,
        "made_with": provenance_made_with,
        "vision_config": config.to_dict(),
        "backend": run["backend"],
        "backends_used_this_run": run["backends_used"],
        "batch_tokens": run["batch_tokens"],
        "embedding": {"column": "embedding", "shape": ["num_tokens", config.text_hidden_size]},
        "images": images,
        "encoded": encoded,
        "errors": errors,
        "errors_file": ERRORS,
        "shards": entries,
        "last_run": {
            "shards_written": len(written),
            "shards_skipped": len(shards) - len(written),
            "images": run_images,
            "output_tokens": tokens,
            "seconds": round(seconds, 3),
            "images_per_second": round(run_images / seconds, 3) if seconds > 0 else None,
        },
    }
    manifest_path = out / MANIFEST
    write_text(manifest_path, json.dumps(manifest, indent=2) + "\n")
    return Summary(
        images=images,
        encoded=encoded,
        errors=errors,
        skipped_shards=len(shards) - len(written),
        written_shards=len(written),
        tokens=tokens,
        run_images=run_images,
        seconds=seconds,
        manifest=manifest_path,
        errors_file=errors_file,
    )
