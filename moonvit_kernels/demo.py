"""The `demo` command: the whole pipeline on the bundled photograph (and a crop of it, packed beside it)
with the tiny checkpoint, drawn as PNG pictures (patch grid, RoPE maps, merge order, attention mask, PCA
of the features, error against float64)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from . import command_support as support
from .bundled import TINY_DIR

# The demo keeps the tiny model (patch 4) to about a thousand patches per image so that the
# whole pipeline runs in about a second on a CPU; K3 itself allows 65536.
DEMO_IN_PATCH_LIMIT = 1024
DEMO_FILES = (
    "01_patch_grid.png",
    "02_rope_frequency_maps.png",
    "03_rope_offset_invariance.png",
    "04_merge_index_map.png",
    "05_attention_mask.png",
    "06_pca_features.png",
    "07_error_vs_float64.png",
)
DEMO_RECORD = "demo_files.json"  # the pictures demo wrote here, with their sha256 (`file_sets`)
DEMO_FORMAT = "moonvit_kernels demo 1"


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

    config, weights = support.load_checkpoint_or_fail(TINY_DIR)
    try:
        photo = load_image(image).convert("RGB")
    except ValueError as e:
        raise support.CLIError(support.one_line(e)) from None
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
    model = support.make_model(config, weights, backend)
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
        "06_pca_features.png": plots.pca_overlay(
            features,
            (h, w),
            padded,
            p,
            weights_note="features of the bundled tiny checkpoint, whose weights are random: the colours follow "
            "pixel statistics and position, not learned content (a real K3 checkpoint shows parts and objects)",
        ),  # fmt: skip
        "07_error_vs_float64.png": plots.error_heatmap(
            np.concatenate([np.asarray(o) for o in outputs]),
            np.concatenate(ref64),
            title=f"projected output, {model.backend_name} float32 vs NumPy float64",
        ),
    }
    import shutil
    import tempfile

    from .file_sets import replace_set

    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".demo-staging-", dir=out))
    try:
        for name, fig in figures.items():
            fig.savefig(staging / name, dpi=110)
        replace_set(out / DEMO_RECORD, DEMO_FORMAT, {out / name: staging / name for name in figures})
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return [out / name for name in figures]


def cmd_demo(args: argparse.Namespace) -> int:
    """`run_demo` on `--image` into `--out` (checked before any compute); prints each picture written."""
    backend = support.choose_backend(args.backend, args.simulator)
    out = support.check_output(args.out, folder=True)
    from .file_sets import ForeignFiles, check_owned

    with support.output_locked(out, "demo"):
        try:
            check_owned(out / DEMO_RECORD, DEMO_FORMAT, [out / name for name in DEMO_FILES])
            written = run_demo(out, Path(args.image), backend, args.in_patch_limit)
        except ForeignFiles as e:
            raise support.CLIError(support.one_line(e)) from None
    for path in written:
        print(f"wrote {path}")
    return 0
