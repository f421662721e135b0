"""Command line: `python -m moonvit_kernels <command>` (also installed as `moonvit-kernels`).

run     encode the bundled inputs (one image + one 2-frame video) with the bundled tiny checkpoint
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
TINY_DIR = DATA_DIR / "tiny"


def cmd_run(args: argparse.Namespace) -> int:
    """Load a checkpoint, run `vision_forward` on bundled (or given) inputs, print shapes and statistics."""
    from .reference import vision_forward
    from .weights import load_checkpoint

    ckpt = Path(args.weights)
    config, weights = load_checkpoint(ckpt)
    inputs = np.load(args.inputs)
    pixel_values, grid_thws = inputs["pixel_values"], inputs["grid_thws"]
    print(
        f"checkpoint {ckpt}: {len(weights)} vision tensors, D={config.vt_hidden_size}, "
        f"layers={config.vt_num_hidden_layers}, text_hidden={config.text_hidden_size}"
    )
    print(f"inputs: pixel_values {tuple(pixel_values.shape)}, grid_thws {grid_thws.tolist()}")
    outputs = vision_forward(pixel_values, grid_thws, weights, config)
    for i, ((t, h, w), out) in enumerate(zip(grid_thws.tolist(), outputs, strict=True)):
        kind = "image" if t == 1 else f"video ({t} frames)"
        print(
            f"item {i} {kind} grid (t,h,w)=({t},{h},{w}) -> {tuple(out.shape)} {out.dtype}: "
            f"mean {out.mean():+.5f} std {out.std():.5f} min {out.min():+.5f} max {out.max():+.5f}"
        )
    print("backend: numpy reference (CPU)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="moonvit_kernels", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="encode the bundled image + video with the bundled tiny checkpoint")
    run.add_argument("--weights", default=str(TINY_DIR), help="checkpoint directory (config.json + safetensors)")
    run.add_argument("--inputs", default=str(TINY_DIR / "inputs.npz"), help=".npz with pixel_values and grid_thws")
    run.set_defaults(func=cmd_run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, KeyError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
