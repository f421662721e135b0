"""Throughput of `encode-dataset` (Ray Data, local) against the single-process loop `encode` runs.

    python benchmarks/bench_encode_dataset.py [--images 120] [--num-cpus 2] [--batch-tokens 16384] [--backend numpy]

Writes `--images` random photographs-sized images (seeded; sides 64..384 px, JPEG and PNG) into a
temporary folder, then times (1) `dataset.encode_dataset` on a fresh local Ray with `--num-cpus`
CPUs, Ray start-up excluded and reported apart, and (2) the single-process loop: load, preprocess and
encode each image alone with `MoonViT`. Prints images/s and patches/s for both, labelled with the
machine (CPU count, load average) and the checkpoint (default: the bundled tiny one, so the numbers
measure the pipeline's overhead and the tiny model, not K3's cost per image).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from moonvit_kernels import dataset, load_checkpoint  # local or hf:// / https:// (fetched first)
from moonvit_kernels.bundled import TINY_DIR
from moonvit_kernels.model import MoonViT
from moonvit_kernels.preprocess import preprocess_images


def make_images(folder: Path, count: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for i in range(count):
        w, h = (int(v) for v in rng.integers(64, 385, size=2))
        base = rng.integers(0, 256, size=(h // 8 + 1, w // 8 + 1, 3), dtype=np.uint8)  # blocky: JPEG-like content
        pixels = np.repeat(np.repeat(base, 8, axis=0), 8, axis=1)[:h, :w]
        Image.fromarray(pixels).save(folder / f"{i:05d}.{'jpg' if i % 2 else 'png'}")


def single_process(folder: Path, weights: str, backend: str) -> tuple[float, int]:
    config, w = load_checkpoint(weights)
    model = MoonViT(config, w, backend=backend)
    start = time.perf_counter()
    patches = 0
    for path in sorted(folder.iterdir()):
        item = preprocess_images(path, config)
        model(item.pixel_values, item.grid_thws, as_numpy=True)
        patches += item.pixel_values.shape[0]
    return time.perf_counter() - start, patches


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=120)
    p.add_argument("--num-cpus", type=int, default=2)
    p.add_argument("--batch-tokens", type=int, default=dataset.DEFAULT_BATCH_TOKENS)
    p.add_argument("--backend", default="numpy")
    p.add_argument("--weights", default=str(TINY_DIR))
    p.add_argument("--json", type=Path, help="also write the numbers here")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder, out = Path(tmp) / "images", Path(tmp) / "out"
        folder.mkdir()
        make_images(folder, args.images)
        start = time.perf_counter()
        dataset.init_ray(num_cpus=args.num_cpus)
        ray_start = time.perf_counter() - start
        try:
            summary = dataset.encode_dataset(
                folder, args.weights, out, backend=args.backend, batch_tokens=args.batch_tokens, progress=False
            )
        finally:
            import ray

            ray.shutdown()
        import pyarrow.parquet as pq

        patches = 0
        for shard in sorted(out.glob("shard-*.parquet")):
            grids = pq.read_table(shard, columns=["grid_thws"])["grid_thws"].combine_chunks()
            patches += int(np.prod(grids.flatten().to_numpy().reshape(-1, 3), axis=1).sum())
        single_seconds, single_patches = single_process(folder, args.weights, args.backend)
    label = (
        f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.1f}), backend {args.backend}, checkpoint {Path(args.weights).name}"
    )
    result = {
        "where": label,
        "images": args.images,
        "ray_start_seconds": round(ray_start, 2),
        "encode_dataset": {
            "num_cpus": args.num_cpus,
            "seconds": round(summary.seconds, 2),
            "images_per_second": round(args.images / summary.seconds, 2),
            "patches_per_second": round(patches / summary.seconds, 1),
        },
        "single_process": {
            "seconds": round(single_seconds, 2),
            "images_per_second": round(args.images / single_seconds, 2),
            "patches_per_second": round(single_patches / single_seconds, 1),
        },
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
