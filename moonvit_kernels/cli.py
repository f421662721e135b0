"""Command line: `python -m moonvit_kernels <command>` (also installed as `moonvit-kernels`).

run     encode the bundled inputs (one image + one 2-frame video) with the bundled tiny checkpoint
encode  images -> embeddings per image (.npz), on any backend
encode-dataset  a folder / glob / Parquet list of images -> Parquet shards of embeddings, on Ray Data
demo    the whole pipeline on the bundled photograph and tiny checkpoint -> PNG pictures
rope    K3's 2D RoPE frequencies as pictures (PNG) and one interactive page (--html)
golden  inputs and every intermediate stage as .npz files, for people porting MoonViT
info    what a checkpoint holds, from the safetensors headers only (no tensor bytes read)
fetch   only the vision tensors of a (sharded, remote) checkpoint, by ranged reads

Errors (unreadable image, incompatible checkpoint, bad arguments) exit with status 2 and one
line on stderr naming the file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import rope_command
from .bundled import PHOTO, TINY_DIR

# The demo keeps the tiny model (patch 4) to about a thousand patches per image so that the
# whole pipeline runs in about a second on a CPU; K3 itself allows 65536.
DEMO_IN_PATCH_LIMIT = 1024


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


def cmd_run(args: argparse.Namespace) -> int:
    """Load a checkpoint, run the model (NumPy reference by default) on bundled (or given) inputs,
    print shapes and statistics."""
    backend = choose_backend(args.backend, args.simulator)
    ckpt = Path(args.weights)
    config, weights = load_checkpoint_or_fail(ckpt)
    try:
        with np.load(args.inputs) as inputs:
            pixel_values, grid_thws = inputs["pixel_values"], inputs["grid_thws"]
    except (OSError, KeyError, ValueError) as e:
        raise CLIError(f"{args.inputs}: cannot read pixel_values and grid_thws ({one_line(e)})") from None
    model = make_model(config, weights, backend)
    print(
        f"checkpoint {ckpt}: {len(weights)} vision tensors, D={config.vt_hidden_size}, "
        f"layers={config.vt_num_hidden_layers}, text_hidden={config.text_hidden_size}"
    )
    print(f"inputs: pixel_values {tuple(pixel_values.shape)}, grid_thws {grid_thws.tolist()}")
    outputs = model.forward(pixel_values, grid_thws, as_numpy=True)
    for i, ((t, h, w), out) in enumerate(zip(grid_thws.tolist(), outputs, strict=True)):
        kind = "image" if t == 1 else f"video ({t} frames)"
        print(
            f"item {i} {kind} grid (t,h,w)=({t},{h},{w}) -> {tuple(out.shape)} {out.dtype}: "
            f"mean {out.mean():+.5f} std {out.std():.5f} min {out.min():+.5f} max {out.max():+.5f}"
        )
    print(f"backend: {backend_label(model)}")
    return 0


# ============================================================================ encode
def cmd_encode(args: argparse.Namespace) -> int:
    """Preprocess each image, run the model on it, save `image_i [tokens_i, text_hidden]` per image.

    Streamed: one image at a time is preprocessed, encoded and appended to the .npz (written under a
    temporary name, renamed to exactly `--out` when complete), so memory does not grow with the number
    of files. The output place and every image's header are checked before the first forward."""
    import zipfile

    from tqdm import tqdm

    from .atomic import add_npy, atomic_file

    backend = choose_backend(args.backend, args.simulator)
    out = check_output(args.out)
    config, weights = load_checkpoint_or_fail(args.weights)
    settings = preprocess_settings(config, args)
    inspect_images_or_fail(args.images)
    model = make_model(config, weights, backend)
    grids, sizes, lines = [], [], []
    start = time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(out) as f, zipfile.ZipFile(f, "w", allowZip64=True) as archive:
        progress = tqdm(args.images, desc="images", unit="img", disable=args.quiet)
        layers = tqdm(total=config.vt_num_hidden_layers, desc="layers", unit="layer", leave=False, disable=args.quiet)
        for i, path in enumerate(progress):
            progress.set_postfix_str(Path(path).name)
            item = preprocess_one_or_fail(path, settings)
            layers.reset()
            (embedding,) = model.forward(
                item.pixel_values, item.grid_thws, as_numpy=True, on_layer=lambda _block: layers.update()
            )
            embedding = np.asarray(embedding, dtype=np.float32)
            add_npy(archive, f"image_{i}", embedding)
            plan = item.plans[0]
            grids.append(item.grid_thws)
            sizes.append([plan.width, plan.height])
            lines.append(
                f"image_{i}: {path} {plan.width}x{plan.height} -> {plan.new_width}x{plan.new_height} "
                f"(+pad {plan.pad_width}x{plan.pad_height}) grid {item.grid_thws[0].tolist()} -> {embedding.shape}"
            )
            del item, embedding  # the next image is read into the memory these held
        layers.close()
        seconds = time.perf_counter() - start
        add_npy(archive, "grid_thws", np.concatenate(grids))
        add_npy(archive, "sources", np.array([str(p) for p in args.images]))
        add_npy(archive, "image_sizes", np.array(sizes, dtype=np.int64))
    print("\n".join(lines))
    print(f"backend {backend_label(model)}: {len(lines)} image(s) in {seconds:.2f} s; wrote {out}")
    return 0


# ============================================================================ encode-dataset
def cmd_encode_dataset(args: argparse.Namespace) -> int:
    """Encode a corpus on Ray Data (`moonvit_kernels.dataset`): Parquet shards, errors file, manifest."""
    from .dataset import encode_dataset
    from .remote import is_remote

    if not is_remote(args.weights) and not Path(args.weights).exists():
        raise CLIError(f"{args.weights}: no such checkpoint (expected a directory with config.json and safetensors)")
    try:
        summary = encode_dataset(
            args.src,
            args.weights,
            args.out,
            backend=args.backend,
            batch_tokens=args.batch_tokens,
            rows_per_shard=args.rows_per_shard,
            actors=args.actors,
            num_cpus=args.num_cpus,
            progress=not args.quiet,
            overwrite=args.overwrite,
            **preprocess_limits(args),
        )
    except ImportError as e:
        raise CLIError(one_line(e)) from None
    except (ValueError, KeyError, FileNotFoundError) as e:
        raise CLIError(one_line(e)) from None
    except OSError:
        raise  # a full disk: main names the file
    except Exception as e:  # noqa: BLE001 — Ray reports an actor's failure in hundreds of lines
        from .dataset import pipeline_failure

        raise CLIError(f"encode-dataset: the Ray pipeline failed: {pipeline_failure(e)}") from None
    print(
        f"{summary.images} images: {summary.encoded} encoded, {summary.errors} unreadable (see {summary.errors_file}); "
        f"shards: {summary.written_shards} written, {summary.skipped_shards} already done"
    )
    done = summary.images_per_second
    print(
        f"this run: {summary.tokens} output tokens in {summary.seconds:.1f} s"
        + (f" ({done:.2f} images/s)" if summary.written_shards else "")
        + f"; manifest {summary.manifest}"
    )
    return 0


# ============================================================================ golden
GOLDEN_README = """# Golden values for porting MoonViT (Kimi K3 vision tower)

Written by `python -m moonvit_kernels golden` from the NumPy reference
(`moonvit_kernels.reference.vision_forward`). Checkpoint: `{weights}`.
Load any file with `numpy.load(path)`; every array is C-ordered (row-major).

Sizes here: L = {L} patches, N = {N} media items, D = {D}, head_dim = {hd}, p = {p},
merge {kh}x{kw}, M = {M} merged tokens, text width T = {T}, {layers} encoder layers.
grid_thws = {grid}.

## Files

- `config.json`: the `vision_config` the values were computed with.
- `provenance.json`: what made them (digests of the checkpoint's tensors, the config and the inputs;
  the preprocessing settings) and the sha256 of every file here; `moonvit_kernels.cli.check_golden`
  checks a folder against it.
- `inputs.npz`:
  - `pixel_values [L, 3, p, p]` float32, normalised `(x/255 - 0.5)/0.5`; patches in order
    item, frame, patch row, patch column; inside a patch: channel, pixel row, pixel column.
  - `grid_thws [N, 3]` int64, rows `(t, h, w)`.{sources}
- `extras.npz`:
  - `cu_seqlens [N+1]` int64: token offsets of the packed items.
  - `rope_angles [L, head_dim/2]` float32: complex slot 2i turns by column·f_i, slot 2i+1 by row·f_i.
  - `rope_frequencies [head_dim/4]` float32: `f_i = 10000^(-4i/head_dim)`.
  - `position_term [L, D]` float32: what the position embedding adds (the interpolated grid,
    plus the sin/cos time row for video frames).
{stage_rows}
## Stage keys in each `stages_*.npz`, in order

- `patch_embed [L, D]`: `pixel_values.reshape(L, 3·p·p) @ proj.reshape(D, 3·p·p).T`
- `pos_emb [L, D]`: `patch_embed + position_term`
- `layer_i [L, D]`: the output of encoder block i (i = 0 .. {last})
- `final_norm [L, D]`: rmsnorm of the last block's output (`final_layernorm`)
- `merged [M, kh·kw·D]`: merged tokens, frames averaged, slot-major: slot `a·kw + b` of merged
  token `i·(w/kw) + j` holds patch `(kh·i + a)·w + (kw·j + b)`
- `projected [M, T]`: projector output for all items, concatenated
- `output_n [M_n, T]`: the rows of `projected` belonging to item n

Compare float32 ports against `stages_float32.npz` with a relative tolerance of a few 1e-6 on the
first stages, growing with depth; `stages_float64.npz` (when present) is the same computation in
float64 from the same inputs and weights, the better oracle for judging float32 error.
"""


GOLDEN_FORMAT = "moonvit_kernels golden 1"
GOLDEN_FILES = ("inputs.npz", "extras.npz", "stages_float32.npz", "stages_float64.npz", "config.json", "README.md")


def golden_made_with(
    weights_path: str | Path, config: Any, pixel_values: np.ndarray, grid_thws: np.ndarray, settings: Any
) -> dict[str, Any]:
    """What decides golden values: checkpoint content, config, inputs, preprocessing (`--image` only)."""
    import dataclasses

    from .provenance import digest_arrays, digest_json
    from .weights import checkpoint_digest

    return {
        "checkpoint": checkpoint_digest(weights_path),
        "config": digest_json(config.to_dict()),
        "inputs": digest_arrays([np.asarray(pixel_values), np.asarray(grid_thws)]),
        "preprocess": dataclasses.asdict(settings) if settings is not None else None,
    }


def write_golden(
    out: Path,
    weights_path: str,
    config: Any,
    weights: dict[str, np.ndarray],
    pixel_values: np.ndarray,
    grid_thws: np.ndarray,
    float64: bool,
    sources: Sequence[str] | None = None,
    made_with: dict[str, Any] | None = None,
) -> list[Path]:
    """Write inputs, extras, stages (float32, and float64 if asked), config, README and provenance into `out`.

    Every file is first written into a hidden staging folder inside `out`; only when all are complete
    do they replace the earlier ones, golden files of an earlier run that this one does not write are
    removed, and `provenance.json` (with each file's sha256) is written last. A failure (a full disk)
    leaves `out` as it was."""
    import shutil
    import tempfile

    from . import provenance, reference

    pixel_values, grid_thws = reference.validate_inputs(pixel_values, grid_thws, config, np.float32)
    if made_with is None:
        made_with = golden_made_with(weights_path, config, pixel_values, grid_thws, None)
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".golden-staging-", dir=out))
    try:
        names = _write_golden_files(staging, weights_path, config, weights, pixel_values, grid_thws, float64, sources)
        files = {name: provenance.file_digest(staging / name) for name in names}
        (out / provenance.PROVENANCE).unlink(missing_ok=True)  # the folder is unclaimed while files move
        for name in names:
            os.replace(staging / name, out / name)
        for name in GOLDEN_FILES:
            if name not in files:
                (out / name).unlink(missing_ok=True)
        record = {"format": GOLDEN_FORMAT, "made_with": made_with, "weights": str(weights_path), "files": files}
        written = [out / name for name in names] + [provenance.write(out, record)]
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return written


def _write_golden_files(
    out: Path,
    weights_path: str,
    config: Any,
    weights: dict[str, np.ndarray],
    pixel_values: np.ndarray,
    grid_thws: np.ndarray,
    float64: bool,
    sources: Sequence[str] | None,
) -> list[str]:
    """The golden files themselves, written into `out`; returns their names."""
    from . import reference
    from .atomic import atomic_file, write_text

    written = []

    def save(name: str, **arrays: np.ndarray) -> None:
        with atomic_file(out / name) as f:
            np.savez(f, **arrays)
        written.append(name)

    inputs = {"pixel_values": pixel_values, "grid_thws": grid_thws}
    if sources:
        inputs["sources"] = np.array([str(s) for s in sources])
    save("inputs.npz", **inputs)
    pos_weight = weights["vision_tower.patch_embed.pos_emb.weight"]
    save(
        "extras.npz",
        cu_seqlens=reference.cu_seqlens(grid_thws),
        rope_angles=reference.rope_angles_packed(grid_thws, config.head_dim, np.float32),
        rope_frequencies=reference.rope_frequencies(config.head_dim, dtype=np.float32),
        position_term=reference.position_embedding(grid_thws, pos_weight, config).astype(np.float32),
    )
    dtypes = ["float32", "float64"] if float64 else ["float32"]
    M = 0
    for dtype in dtypes:
        outputs, stages = reference.vision_forward(
            pixel_values, grid_thws, weights, config, dtype, return_intermediates=True
        )
        M = stages["merged"].shape[0]
        save(f"stages_{dtype}.npz", **stages, **{f"output_{n}": o for n, o in enumerate(outputs)})
    write_text(out / "config.json", json.dumps({"vision_config": config.to_dict()}, indent=2) + "\n")
    written.append("config.json")
    rows = "".join(
        f"- `stages_{d}.npz`: every intermediate of `vision_forward` computed in {d} (keys below).\n" for d in dtypes
    )
    kh, kw = config.merge_kernel_size
    readme = GOLDEN_README.format(
        weights=weights_path,
        L=pixel_values.shape[0],
        N=grid_thws.shape[0],
        D=config.vt_hidden_size,
        hd=config.head_dim,
        p=config.patch_size,
        kh=kh,
        kw=kw,
        M=M,
        T=config.text_hidden_size,
        layers=config.vt_num_hidden_layers,
        last=config.vt_num_hidden_layers - 1,
        grid=grid_thws.tolist(),
        sources="\n  - `sources [N]` str: the image files." if sources else "",
        stage_rows=rows,
    )
    write_text(out / "README.md", readme)
    written.append("README.md")
    return written


def check_golden(folder: str | Path) -> dict[str, Any]:
    """The provenance record of a golden folder after checking it: every file it lists is there with
    its sha256, and no golden file it does not list (a stale one) is. ValueError naming the file."""
    from . import provenance

    folder = Path(folder)
    record = provenance.check(folder, GOLDEN_FORMAT, "a golden folder")
    files = record.get("files", {})
    for name, digest in files.items():
        path = folder / name
        if not path.is_file():
            raise ValueError(f"{path}: missing (listed in {provenance.PROVENANCE})")
        if provenance.file_digest(path) != digest:
            raise ValueError(f"{path}: not the file {provenance.PROVENANCE} lists (another run's, or changed)")
    for name in GOLDEN_FILES:
        if name not in files and (folder / name).exists():
            raise ValueError(f"{folder / name}: not written by the run {provenance.PROVENANCE} describes (stale)")
    return record


def cmd_golden(args: argparse.Namespace) -> int:
    """Golden inputs + stages for the bundled inputs (default) or preprocessed `--image` files.

    The output folder is checked (writable; no golden files of another provenance unless
    `--overwrite`) before the stages are computed."""
    from . import provenance

    out = check_output(args.out, folder=True)
    config, weights = load_checkpoint_or_fail(args.weights)
    sources = settings = None
    if args.image:
        from .preprocess import Preprocessed

        settings = preprocess_settings(config, args)
        items = load_images_or_fail(args.image, settings)
        packed: Preprocessed = items[0]
        for item in items[1:]:
            packed = packed + item
        pixel_values, grid_thws, sources = packed.pixel_values, packed.grid_thws, args.image
    else:
        try:
            with np.load(args.inputs) as data:
                pixel_values, grid_thws = data["pixel_values"], data["grid_thws"]
        except (OSError, KeyError, ValueError) as e:
            raise CLIError(f"{args.inputs}: cannot read pixel_values and grid_thws ({one_line(e)})") from None
    made_with = golden_made_with(args.weights, config, pixel_values, grid_thws, settings)
    try:
        provenance.claim(out, GOLDEN_FORMAT, made_with, GOLDEN_FILES.__contains__, args.overwrite, "golden files")
    except ValueError as e:
        raise CLIError(one_line(e)) from None
    try:
        written = write_golden(
            out, args.weights, config, weights, pixel_values, grid_thws, args.float64, sources, made_with
        )
    except ValueError as e:
        raise CLIError(f"inputs do not fit checkpoint {args.weights}: {one_line(e)}") from None
    for path in written:
        print(f"wrote {path}")
    return 0


# ============================================================================ info
def tensor_problems(found: dict[str, tuple[str, tuple[int, ...]]], config: Any) -> list[str]:
    """What keeps vision tensors (name -> (dtype tag, shape), from headers) from loading under `config`,
    one line each; the layer count first, so that no table is built for an absurd one."""
    from .weights import READABLE_DTYPES, expected_shapes, layers_present

    problems = []
    present = layers_present(found)
    if config.vt_num_hidden_layers > present:
        problems.append(
            f"config says vt_num_hidden_layers={config.vt_num_hidden_layers} but the checkpoint holds {present} "
            "encoder block(s)"
        )
        config = config.replace(vt_num_hidden_layers=present)
    expected = expected_shapes(config)
    for name, shape in expected.items():
        if name not in found:
            problems.append(f"missing {name} {list(shape)}")
        elif found[name][1] != shape:
            problems.append(f"{name} has shape {list(found[name][1])}, expected {list(shape)}")
        elif found[name][0] not in READABLE_DTYPES:
            problems.append(f"{name} has dtype {found[name][0]}, which cannot be loaded (need F32, F16, BF16 or F64)")
    problems += [f"unexpected {name}" for name in found if name not in expected]
    return problems


def checkpoint_report(path: str | Path) -> tuple[list[str], bool]:
    """Lines describing a checkpoint from its headers alone, and whether it matches its config."""
    from .weights import SafetensorsFile, checkpoint_files, is_vision_key, load_config
    from .weights import parameter_count as expected_parameter_count

    path = Path(path)
    try:
        where = checkpoint_files(path)
        headers = {f: SafetensorsFile(f) for f in sorted(set(where.values()))}
    except (ValueError, KeyError, FileNotFoundError, OSError) as e:
        raise CLIError(one_line(e) if str(path) in one_line(e) else f"{path}: {one_line(e)}") from None
    lines = [f"checkpoint {path}: {len(headers)} safetensors file(s), {len(where)} tensors"]
    try:
        config = load_config(path)
    except (FileNotFoundError, ValueError) as e:
        config = None
        lines.append(f"config: none usable ({one_line(e)})")
    if config is not None:
        kh, kw = config.merge_kernel_size
        lines.append(
            f"config: patch {config.patch_size}, D={config.vt_hidden_size}, heads={config.vt_num_attention_heads} "
            f"(head_dim {config.head_dim}), qkv={config.qkv_hidden_size}, mlp={config.vt_intermediate_size}, "
            f"layers={config.vt_num_hidden_layers}, pos grid {config.init_pos_emb_height}x{config.init_pos_emb_width}"
            f" ({config.pos_emb_interpolation_mode}), merge {kh}x{kw}, text_hidden={config.text_hidden_size}"
        )
    vision = sorted(k for k in where if is_vision_key(k))
    others = len(where) - len(vision)
    found_params = 0
    found_bytes = 0
    lines.append(f"vision tensors: {len(vision)}")
    for name in vision:
        header = headers[where[name]]
        if name not in header.entries:
            lines.append(f"  {name}: listed in the index but missing from {where[name].name}")
            continue
        shape = header.shape(name)
        found_params += int(np.prod(shape))
        found_bytes += header.nbytes(name) or 0
        lines.append(f"  {name}  {header.dtype(name)} {list(shape)}")
    lines.append(f"other tensors: {others} (not read)")
    lines.append(f"vision parameters in the file: {found_params:,} ({found_bytes / 2**20:.1f} MiB)")
    ok = True
    if config is not None:
        counts = expected_parameter_count(config)
        lines.append(
            f"parameters the config needs: {counts['total']:,} "
            f"(tower {counts['vision_tower']:,} + projector {counts['mm_projector']:,})"
        )
        found = {
            name: (headers[where[name]].dtype(name), headers[where[name]].shape(name))
            for name in vision
            if name in headers[where[name]].entries
        }
        problems = tensor_problems(found, config)
        ok = not problems
        lines.append("matches its config: yes" if ok else f"matches its config: NO ({len(problems)} problem(s))")
        lines += [f"  {p}" for p in problems[:20]]
    return lines, ok


def cmd_fetch(args: argparse.Namespace) -> int:
    """Fetch only the vision tensors of a checkpoint (hf://, http(s)://, folder) into `--out`."""
    from .hub import FetchError, fetch

    try:
        manifest = fetch(
            args.source,
            args.out,
            revision=args.revision,
            progress=not args.quiet,
            force=args.force,
            timeout=args.timeout,
        )
    except FetchError as e:
        raise CLIError(one_line(e)) from None
    except OSError as e:
        raise CLIError(f"{args.source}: {one_line(e)}") from None
    revision = f" at {manifest['revision']}" if manifest.get("revision") else ""
    print(
        f"fetched {len(manifest['tensors'])} vision tensors from {args.source}{revision}: "
        f"{manifest['vision_bytes']:,} bytes of a {manifest['checkpoint_bytes']:,}-byte checkpoint; "
        f"{manifest['bytes_read_this_run']:,} bytes read this run (config, index, headers, tensors)"
    )
    print(f"wrote {Path(args.out) / 'model.safetensors'}, config.json, manifest.json")
    return 0


def remote_report(source: str) -> tuple[list[str], bool]:
    """`checkpoint_report` for hf:// and http(s):// checkpoints: config, index and the vision shards'
    headers are read (ranged reads), no tensor bytes."""
    from .hub import FetchError, open_source, plan, read_config

    try:
        src = open_source(source)
        planned = plan(src)
        ranges, header_bytes, total = planned.ranges, planned.header_bytes, planned.total
        config = read_config(src)
    except (FetchError, ValueError, KeyError, TypeError) as e:
        raise CLIError(one_line(e) if source in one_line(e) else f"{source}: {one_line(e)}") from None
    revision = f" at {src.revision}" if src.revision else ""
    lines = [
        f"checkpoint {source}{revision}: {total:,} bytes of safetensors; vision tensors in {len(header_bytes)} shard(s)"
    ]
    lines.append(f"vision tensors: {len(ranges)}")
    lines += [f"  {t.name}  {t.dtype} {list(t.shape)}  bytes {t.start}..{t.end} of {t.shard}" for t in ranges]
    vision_bytes = sum(t.nbytes for t in ranges)
    lines.append(f"vision bytes: {vision_bytes:,} ({100 * vision_bytes / max(total, 1):.3f}% of the checkpoint)")
    problems = tensor_problems({t.name: (t.dtype, t.shape) for t in ranges}, config)
    ok = not problems
    lines.append("matches its config: yes" if ok else f"matches its config: NO ({len(problems)} problem(s))")
    lines += [f"  {p}" for p in problems[:20]]
    lines.append(f"read {src.bytes_read:,} bytes (config, index, headers; no tensor bytes)")
    return lines, ok


def cmd_info(args: argparse.Namespace) -> int:
    """Print `checkpoint_report`; exit status 1 when the tensors do not match the config."""
    from .remote import is_remote

    lines, ok = remote_report(args.path) if is_remote(args.path) else checkpoint_report(args.path)
    print("\n".join(lines))
    return 0 if ok else 1


# ============================================================================ demo
def demo_crop_box(width: int, height: int) -> tuple[int, int, int, int]:
    """The demo's second item: a square of half the photograph's width (at least one pixel), from a
    quarter of the width and an eighth of the height; PIL box (left, top, right, bottom)."""
    side = max(1, width // 2)
    left, top = width // 4, height // 8
    return left, top, left + side, top + side


def run_demo(out: Path, image: Path, backend: str, in_patch_limit: int) -> list[Path]:
    """The whole pipeline on a photograph and the tiny checkpoint; returns the PNGs written.

    Two media items are packed (the photograph and a crop of it) so the attention mask has blocks.
    """
    from . import plots, reference
    from .preprocess import load_image, preprocess_images

    config, weights = load_checkpoint_or_fail(TINY_DIR)
    try:
        photo = load_image(image).convert("RGB")
    except ValueError as e:
        raise CLIError(one_line(e)) from None
    w0, h0 = photo.size
    crop = photo.crop(demo_crop_box(w0, h0))
    batch = preprocess_images([photo, crop], config, in_patch_limit=in_patch_limit)
    p = config.patch_size
    (_, h, w), (_, hc, wc) = batch.grid_thws.tolist()
    print(
        f"demo: tiny checkpoint (patch {p}, D={config.vt_hidden_size}, {config.vt_num_hidden_layers} layers), "
        f"image {image.name} {w0}x{h0} -> grid {h}x{w}, crop -> grid {hc}x{wc}; "
        f"in_patch_limit={in_patch_limit} (K3 uses 65536) keeps it fast on a CPU"
    )
    model = make_model(config, weights, backend)
    start = time.perf_counter()
    outputs, stages = model.forward(batch.pixel_values, batch.grid_thws, return_intermediates=True, as_numpy=True)
    seconds = time.perf_counter() - start
    print(f"backend {model.backend_name}: {batch.pixel_values.shape[0]} patches in {seconds:.2f} s")
    ref64 = reference.vision_forward(batch.pixel_values, batch.grid_thws, weights, config, np.float64)
    features = np.asarray(stages["final_norm"])[: h * w]
    padded = batch.frames[0][0]
    plan = batch.plans[0]
    figures = {
        "01_patch_grid.png": plots.patch_grid_overlay(
            padded, p, config.merge_kernel_size, (plan.new_width, plan.new_height)
        ),
        "02_rope_frequency_maps.png": plots.plot_rope_k3_maps(128, (h, w)),  # K3's RoPE: no weights needed
        "03_rope_offset_invariance.png": plots.plot_rope_offset_map(128),
        "04_merge_index_map.png": plots.merge_index_map(6, 8, config.merge_kernel_size),  # small: numbers readable
        "05_attention_mask.png": plots.attention_mask_picture(batch.grid_thws),
        "06_pca_features.png": plots.pca_overlay(features, (h, w), padded, p),
        "07_error_vs_float64.png": plots.error_heatmap(
            np.concatenate([np.asarray(o) for o in outputs]),
            np.concatenate(ref64),
            title=f"projected output, {model.backend_name} float32 vs NumPy float64",
        ),
    }
    from .atomic import atomic_path

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, fig in figures.items():
        with atomic_path(out / name) as tmp:  # the temporary name keeps ".png": savefig's format
            fig.savefig(tmp, dpi=110)
        written.append(out / name)
    return written


def cmd_demo(args: argparse.Namespace) -> int:
    backend = choose_backend(args.backend, args.simulator)
    out = check_output(args.out, folder=True)
    written = run_demo(out, Path(args.image), backend, args.in_patch_limit)
    for path in written:
        print(f"wrote {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="moonvit_kernels", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def simulator_flag(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--simulator",
            action="store_true",
            help="run the numba kernels on numba's CUDA simulator (CPU, no GPU needed, slow; implies --backend numba)",
        )

    run = sub.add_parser("run", help="encode the bundled image + video with the bundled tiny checkpoint")
    run.add_argument("--weights", default=str(TINY_DIR), help="checkpoint directory (config.json + safetensors)")
    run.add_argument("--inputs", default=str(TINY_DIR / "inputs.npz"), help=".npz with pixel_values and grid_thws")
    run.add_argument("--backend", default="numpy", help="numpy (default, the reference), numba, cupy or auto")
    simulator_flag(run)
    run.set_defaults(func=cmd_run)

    def limits(p: argparse.ArgumentParser) -> None:
        p.add_argument("--in-patch-limit", type=int, help="most patches per image before shrinking (K3: 65536)")
        p.add_argument("--patch-limit-on-one-side", type=int, help="most patches along one side (K3: 512)")

    enc = sub.add_parser("encode", help="images -> embeddings per image (.npz)")
    enc.add_argument("images", nargs="+", metavar="IMAGE", help="image files (any format PIL reads)")
    enc.add_argument("--weights", default=str(TINY_DIR), help="checkpoint directory (default: bundled tiny)")
    enc.add_argument("--backend", default="auto", help="auto, numpy, numba or cupy (default auto)")
    enc.add_argument("--out", default="embeddings.npz", help="output .npz (default embeddings.npz)")
    enc.add_argument("--quiet", action="store_true", help="no progress bar")
    simulator_flag(enc)
    limits(enc)
    enc.set_defaults(func=cmd_encode)

    ds = sub.add_parser("encode-dataset", help="a folder / glob / Parquet list of images -> Parquet shards (Ray)")
    ds.add_argument("src", metavar="SRC", help="a folder of images, a glob pattern, or a .parquet of path/bytes")
    ds.add_argument("--weights", default=str(TINY_DIR), help="checkpoint folder every Ray node can read, or hf://")
    ds.add_argument("--out", required=True, help="output folder of Parquet shards (DST); rerun to resume")
    ds.add_argument("--backend", default="auto", help="auto (cupy on GPU actors, else numpy), numpy, numba, cupy")
    ds.add_argument("--batch-tokens", type=int, default=16384, help="most patches packed into one forward")
    ds.add_argument("--rows-per-shard", type=int, default=256, help="images per output shard (default 256)")
    ds.add_argument("--actors", type=int, help="encoder actors (default: one per GPU, or 1 on CPUs)")
    ds.add_argument("--num-cpus", type=int, help="CPUs of the local Ray (ignored with RAY_ADDRESS)")
    ds.add_argument("--quiet", action="store_true", help="no progress bar")
    ds.add_argument(
        "--overwrite", action="store_true", help="replace shards in --out made with another checkpoint or settings"
    )
    limits(ds)
    ds.set_defaults(func=cmd_encode_dataset)

    demo = sub.add_parser("demo", help="pictures of the whole pipeline on a bundled photograph (no GPU needed)")
    demo.add_argument("--out", default="demo_out", help="output folder (default ./demo_out)")
    demo.add_argument("--image", default=str(PHOTO), help="photograph (default: the bundled one)")
    demo.add_argument("--backend", default="auto", help="auto, numpy, numba or cupy (default auto)")
    demo.add_argument("--in-patch-limit", type=int, default=DEMO_IN_PATCH_LIMIT, help=f"default {DEMO_IN_PATCH_LIMIT}")
    simulator_flag(demo)
    demo.set_defaults(func=cmd_demo)

    rope = sub.add_parser("rope", help="K3's 2D RoPE as PNG maps (and --html: one interactive page); no weights")
    rope_command.add_arguments(rope)
    rope.set_defaults(func=rope_command.run)

    gold = sub.add_parser("golden", help="inputs and every intermediate stage as .npz, for porters")
    gold.add_argument("--weights", default=str(TINY_DIR), help="checkpoint directory (default: bundled tiny)")
    gold.add_argument("--out", required=True, help="output folder")
    gold.add_argument("--image", nargs="+", help="image files to preprocess (default: the bundled inputs.npz)")
    gold.add_argument("--inputs", default=str(TINY_DIR / "inputs.npz"), help=".npz with pixel_values, grid_thws")
    gold.add_argument("--float64", action="store_true", help="also write the stages computed in float64")
    gold.add_argument(
        "--overwrite", action="store_true", help="replace golden files made from other weights, config or inputs"
    )
    limits(gold)
    gold.set_defaults(func=cmd_golden)

    info = sub.add_parser("info", help="what a checkpoint holds (headers only)")
    info.add_argument("path", help="checkpoint directory, one .safetensors file, hf://ORG/REPO[@REV] or http(s):// URL")
    info.set_defaults(func=cmd_info)

    fetch = sub.add_parser("fetch", help="only the vision weights of a checkpoint (hf://ORG/REPO, https://, folder)")
    fetch.add_argument("source", help="hf://ORG/REPO[@REVISION], an http(s):// checkpoint folder URL, or a folder")
    fetch.add_argument("--out", required=True, help="output folder (config.json, model.safetensors, manifest.json)")
    fetch.add_argument("--revision", help="branch, tag or commit (hf:// only; default main)")
    fetch.add_argument("--force", action="store_true", help="replace a checkpoint in --out that fetch did not write")
    fetch.add_argument(
        "--timeout", type=float, default=60.0, help="seconds an http(s) request may go without data (default 60)"
    )
    fetch.add_argument("--quiet", action="store_true", help="no progress bar")
    fetch.set_defaults(func=cmd_fetch)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except CLIError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (ValueError, KeyError, FileNotFoundError) as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    except OSError as e:  # a full disk, a folder that cannot be written: named by the atomic writers
        reason = e.strerror or one_line(e)
        named = e.filename is None or str(e.filename) in reason
        print(f"error: {one_line(reason if named else f'{e.filename}: {reason}')}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
