"""The encoding commands: `run` (the bundled inputs), `encode` (image files -> one .npz) and
`encode-dataset` (a corpus -> Parquet shards on Ray Data, `dataset`)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from . import command_support as support


def cmd_run(args: argparse.Namespace) -> int:
    """Load a checkpoint, run the model (NumPy reference by default) on bundled (or given) inputs,
    print shapes and statistics."""
    backend = support.choose_backend(args.backend, args.simulator)
    ckpt = Path(args.weights)
    config, weights = support.load_checkpoint_or_fail(ckpt)
    pixel_values, grid_thws = support.read_inputs_or_fail(args.inputs)
    model = support.make_model(config, weights, backend)
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
    print(f"backend: {support.backend_label(model)}")
    return 0


# ============================================================================ encode
def cmd_encode(args: argparse.Namespace) -> int:
    """Preprocess each image, run the model on it, save `image_i [tokens_i, text_hidden]` per image.

    Streamed: one image at a time is preprocessed, encoded and appended to the .npz (written under a
    temporary name, renamed to exactly `--out` when complete), so memory does not grow with the number
    of files. The output place and every image's header are checked before the first forward."""
    backend = support.choose_backend(args.backend, args.simulator)
    out = support.check_output(args.out)
    with support.output_locked(out, "encode"):
        return _encode(args, backend, out)


def _encode(args: argparse.Namespace, backend: str, out: Path) -> int:
    """`cmd_encode` once the output place is checked and locked."""
    import zipfile

    from tqdm import tqdm

    from .atomic import add_npy, atomic_file

    config, weights = support.load_checkpoint_or_fail(args.weights)
    settings = support.preprocess_settings(config, args)
    support.inspect_images_or_fail(args.images)
    model = support.make_model(config, weights, backend)
    grids, sizes, lines = [], [], []
    start = time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(out) as f, zipfile.ZipFile(f, "w", allowZip64=True) as archive:
        progress = tqdm(args.images, desc="images", unit="img", disable=args.quiet)
        layers = tqdm(total=config.vt_num_hidden_layers, desc="layers", unit="layer", leave=False, disable=args.quiet)
        for i, path in enumerate(progress):
            progress.set_postfix_str(Path(path).name)
            item = support.preprocess_one_or_fail(path, settings)
            layers.reset()
            (embedding,) = model.forward(
                item.pixel_values, item.grid_thws, as_numpy=True, on_layer=lambda _block: layers.update()
            )
            embedding = np.asarray(embedding, dtype=np.float32)
            if not args.allow_nonfinite and not np.all(np.isfinite(embedding)):
                stage = first_nonfinite_stage(item, weights, config)
                raise support.CLIError(
                    f"{path}: the embedding holds NaN or Inf (first at stage {stage}); nothing written to {out} "
                    "(--allow-nonfinite writes it anyway)"
                )
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
    print(f"backend {support.backend_label(model)}: {len(lines)} image(s) in {seconds:.2f} s; wrote {out}")
    return 0


def first_nonfinite_stage(item: object, weights: dict[str, np.ndarray], config: object) -> str:
    """The first stage of the NumPy reference (float32) on `item` that holds NaN or Inf, by name."""
    from .reference import vision_forward

    _, stages = vision_forward(
        item.pixel_values, item.grid_thws, weights, config, np.float32, return_intermediates=True
    )
    for name, value in stages.items():
        if not np.all(np.isfinite(value)):
            return name
    return "output (the reference stays finite: the backend differs)"


# ============================================================================ encode-dataset
def cmd_encode_dataset(args: argparse.Namespace) -> int:
    """Encode a corpus on Ray Data (`moonvit_kernels.dataset`): Parquet shards, errors file, manifest."""
    from .dataset import encode_dataset
    from .remote import is_remote

    if not is_remote(args.weights) and not Path(args.weights).exists():
        raise support.CLIError(
            f"{args.weights}: no such checkpoint (expected a directory with config.json and safetensors)"
        )
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
            allow_nonfinite=args.allow_nonfinite,
            **support.preprocess_limits(args),
        )
    except ImportError as e:
        raise support.CLIError(support.one_line(e)) from None
    except (ValueError, KeyError, FileNotFoundError) as e:
        raise support.CLIError(support.one_line(e)) from None
    except OSError:
        raise  # a full disk: main names the file
    except Exception as e:  # noqa: BLE001 — Ray reports an actor's failure in hundreds of lines
        from .dataset import pipeline_failure

        raise support.CLIError(f"encode-dataset: the Ray pipeline failed: {pipeline_failure(e)}") from None
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
