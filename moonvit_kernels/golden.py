"""Golden values for porters: the inputs and every intermediate stage of the NumPy reference as `.npz`
files with a README and a provenance record (`write_golden`, `check_golden`), and the `golden` command.

The bundled folder (`data/golden_tiny/`) is written by
`python -m moonvit_kernels golden --weights data/tiny --out data/golden_tiny --float64` from a clone's top folder.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import command_support as support

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
  the preprocessing settings) and the sha256 of every file here; `moonvit_kernels.golden.check_golden`
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
PENDING = "moving"  # in provenance.json while a run moves its files in: name -> the sha256s the file may have


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
    allow_nonfinite: bool = False,
) -> list[Path]:
    """Write inputs, extras, stages (float32, and float64 if asked), config, README and provenance into `out`.

    Only files golden recorded making are replaced or removed (`golden_files_in`): a folder holding any
    other file of a golden name, or another program's provenance.json, is refused (ForeignFiles) before any
    compute. Every file is first written into a hidden staging folder inside `out`; only when all are complete
    do they replace the earlier ones, golden files of an earlier run that this one does not write are
    removed, and `provenance.json` (with each file's sha256) is written last. A failure (a full disk) leaves
    `out` as it was; an interruption while files move leaves a record of both runs' files, so a rerun
    finishes the folder."""
    import shutil
    import tempfile

    from . import provenance, reference

    pixel_values, grid_thws = reference.validate_inputs(pixel_values, grid_thws, config, np.float32)
    if made_with is None:
        made_with = golden_made_with(weights_path, config, pixel_values, grid_thws, None)
    earlier = golden_files_in(out)
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".golden-staging-", dir=out))
    try:
        names = _write_golden_files(
            staging, weights_path, config, weights, pixel_values, grid_thws, float64, sources, allow_nonfinite
        )
        files = {name: provenance.file_digest(staging / name) for name in names}
        record = {"format": GOLDEN_FORMAT, "made_with": made_with, "weights": str(weights_path), "files": files}
        moving = {name: sorted({earlier.get(name), files.get(name)} - {None}) for name in {*earlier, *files}}
        provenance.write(out, {**record, "files": {}, PENDING: moving})  # both runs' files stay golden's
        for name in names:
            os.replace(staging / name, out / name)
        for name in earlier:
            if name not in files:
                (out / name).unlink(missing_ok=True)
        written = [out / name for name in names] + [provenance.write(out, record)]
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return written


class NonFinite(ValueError):
    """A stage of the reference holds NaN or Inf: golden values nobody should port against."""


def check_finite(stages: dict[str, np.ndarray], dtype: str) -> None:
    """NonFinite naming the first stage (in the reference's order) that holds NaN or Inf."""
    for name, value in stages.items():
        bad = ~np.isfinite(value)
        if bad.any():
            raise NonFinite(
                f"stage {name} of the {dtype} computation holds {int(bad.sum())} NaN or Inf values (weights or inputs "
                "too large for it?): no golden values written; --allow-nonfinite writes them anyway"
            )


class ForeignFiles(ValueError):
    """An output folder holds files of golden's names that golden did not record writing."""


def golden_files_in(folder: Path) -> dict[str, str]:
    """The files in `folder` that golden recorded making (name -> sha256): listed in its provenance.json
    (or, after an interrupted run, among the files it was moving) under a golden name, with that sha256.

    ForeignFiles naming them when the folder holds any other file of a golden name (a checkpoint's
    config.json or README.md, a file changed since), or a provenance.json golden did not write."""
    from . import provenance

    if not folder.is_dir():
        return {}
    try:
        record = provenance.read(folder)
    except ValueError as e:
        raise ForeignFiles(
            f"{e}: golden did not write it and will not touch it; choose another output folder"
        ) from None
    if record is not None and record.get("format") != GOLDEN_FORMAT:
        raise ForeignFiles(
            f"{folder / provenance.PROVENANCE}: holds {record.get('format')!r} output, not golden files: golden will "
            "not touch it; choose another output folder"
        )
    recorded = _recorded_digests(record or {})
    owned, foreign = {}, []
    for name in GOLDEN_FILES:
        path = folder / name
        if not path.exists():
            continue
        digest = provenance.file_digest(path) if path.is_file() and recorded.get(name) else None
        if digest in recorded.get(name, ()):
            owned[name] = digest
        else:
            foreign.append(name)
    if foreign:
        raise ForeignFiles(
            f"{folder}: holds {', '.join(sorted(foreign))} that golden did not write (not listed with that content "
            f"in a golden {provenance.PROVENANCE}): golden will not touch them; move them away or choose another "
            "output folder"
        )
    return owned


def _recorded_digests(record: dict[str, Any]) -> dict[str, set[str]]:
    """name -> the sha256s a golden record lets that file have (its own, and any an interrupted run moved)."""
    recorded: dict[str, set[str]] = {}
    files, pending = record.get("files"), record.get(PENDING)
    entries = [(name, [digest]) for name, digest in files.items()] if isinstance(files, dict) else []
    if isinstance(pending, dict):
        entries += [(name, digests) for name, digests in pending.items() if isinstance(digests, list)]
    for name, digests in entries:
        recorded.setdefault(name, set()).update(d for d in digests if isinstance(d, str))
    return recorded


def claim_golden(folder: Path, made_with: dict[str, Any], overwrite: bool) -> None:
    """May golden write `folder`? ForeignFiles when files golden did not write are in the way (never
    touched, whatever `overwrite` says); ValueError naming what differs when golden files made otherwise
    are there and not `overwrite`."""
    from . import provenance

    owned = golden_files_in(folder)
    record = provenance.read(folder) if owned else None
    made_with = json.loads(json.dumps(made_with))  # as the record will read back (tuples as lists)
    if record is None or record["made_with"] == made_with or overwrite:
        return
    differs = "; ".join(provenance.differences(record["made_with"], made_with))
    raise ValueError(
        f"{folder}: holds golden files made with another {differs}: pass --overwrite to replace them, "
        "or choose another output folder"
    )


def _write_golden_files(
    out: Path,
    weights_path: str,
    config: Any,
    weights: dict[str, np.ndarray],
    pixel_values: np.ndarray,
    grid_thws: np.ndarray,
    float64: bool,
    sources: Sequence[str] | None,
    allow_nonfinite: bool = False,
) -> list[str]:
    """The golden files themselves, written into `out`; returns their names. NonFinite when a stage holds NaN or
    Inf, unless `allow_nonfinite`."""
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
        if not allow_nonfinite:
            check_finite(stages, dtype)
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
    if PENDING in record:
        raise ValueError(f"{folder}: a golden run was interrupted while moving its files in; run golden again")
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

    The output folder is checked (writable; no file golden did not write in the way; no golden files of
    another provenance unless `--overwrite`) before the stages are computed."""
    out = support.check_output(args.out, folder=True)
    with support.output_locked(out, "golden"):
        return _golden(args, out)


def _golden(args: argparse.Namespace, out: Path) -> int:
    """`cmd_golden` once the output folder is checked and locked."""
    config, weights = support.load_checkpoint_or_fail(args.weights)
    sources = settings = None
    if args.image:
        from .preprocess import Preprocessed

        settings = support.preprocess_settings(config, args)
        items = support.load_images_or_fail(args.image, settings)
        packed: Preprocessed = items[0]
        for item in items[1:]:
            packed = packed + item
        pixel_values, grid_thws, sources = packed.pixel_values, packed.grid_thws, args.image
    else:
        pixel_values, grid_thws = support.read_inputs_or_fail(args.inputs)
    made_with = golden_made_with(args.weights, config, pixel_values, grid_thws, settings)
    try:
        claim_golden(out, made_with, args.overwrite)
    except ValueError as e:
        raise support.CLIError(support.one_line(e)) from None
    try:
        written = write_golden(
            out, args.weights, config, weights, pixel_values, grid_thws, args.float64, sources, made_with,
            allow_nonfinite=args.allow_nonfinite,
        )  # fmt: skip
    except (ForeignFiles, NonFinite) as e:
        raise support.CLIError(support.one_line(e)) from None
    except ValueError as e:
        raise support.CLIError(f"inputs do not fit checkpoint {args.weights}: {support.one_line(e)}") from None
    for path in written:
        print(f"wrote {path}")
    return 0
