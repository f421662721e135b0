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
line on stderr naming the file; Ctrl-C exits with status 130 and one line, `interrupted`.
"""

from __future__ import annotations

import argparse
import sys

from . import checkpoint_report, demo, encode_commands, fetch_command, golden, rope_command
from .bundled import PHOTO, TINY_DIR
from .command_support import CLIError, one_line


def build_parser() -> argparse.ArgumentParser:
    """Every command's options; each subcommand's `func` is the function (in its own module) that runs it."""
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
    run.set_defaults(func=encode_commands.cmd_run)

    def limits(p: argparse.ArgumentParser) -> None:
        p.add_argument("--in-patch-limit", type=int, help="most patches per image before shrinking (K3: 65536)")
        p.add_argument("--patch-limit-on-one-side", type=int, help="most patches along one side (K3: 512)")

    enc = sub.add_parser("encode", help="images -> embeddings per image (.npz)")
    enc.add_argument("images", nargs="+", metavar="IMAGE", help="image files (any format PIL reads)")
    enc.add_argument("--weights", default=str(TINY_DIR), help="checkpoint directory (default: bundled tiny)")
    enc.add_argument("--backend", default="auto", help="auto, numpy, numba or cupy (default auto)")
    enc.add_argument("--out", default="embeddings.npz", help="output .npz (default embeddings.npz)")
    enc.add_argument("--quiet", action="store_true", help="no progress bar")
    enc.add_argument(
        "--allow-nonfinite", action="store_true", help="write embeddings holding NaN or Inf instead of refusing"
    )
    simulator_flag(enc)
    limits(enc)
    enc.set_defaults(func=encode_commands.cmd_encode)

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
    ds.add_argument(
        "--allow-nonfinite", action="store_true", help="keep embeddings holding NaN or Inf (default: an error row)"
    )
    limits(ds)
    ds.set_defaults(func=encode_commands.cmd_encode_dataset)

    pictures = sub.add_parser("demo", help="pictures of the whole pipeline on a bundled photograph (no GPU needed)")
    pictures.add_argument("--out", default="demo_out", help="output folder (default ./demo_out)")
    pictures.add_argument("--image", default=str(PHOTO), help="photograph (default: the bundled one)")
    pictures.add_argument("--backend", default="auto", help="auto, numpy, numba or cupy (default auto)")
    limit = demo.DEMO_IN_PATCH_LIMIT
    pictures.add_argument("--in-patch-limit", type=int, default=limit, help=f"default {limit}")
    simulator_flag(pictures)
    pictures.set_defaults(func=demo.cmd_demo)

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
    gold.add_argument(
        "--allow-nonfinite", action="store_true", help="write stages holding NaN or Inf instead of refusing"
    )
    limits(gold)
    gold.set_defaults(func=golden.cmd_golden)

    info = sub.add_parser("info", help="what a checkpoint holds (headers only)")
    info.add_argument("path", help="checkpoint directory, one .safetensors file, hf://ORG/REPO[@REV] or http(s):// URL")
    info.set_defaults(func=checkpoint_report.cmd_info)

    fetch = sub.add_parser("fetch", help="only the vision weights of a checkpoint (hf://ORG/REPO, https://, folder)")
    fetch.add_argument("source", help="hf://ORG/REPO[@REVISION], an http(s):// checkpoint folder URL, or a folder")
    fetch.add_argument("--out", required=True, help="output folder (config.json, model.safetensors, manifest.json)")
    fetch.add_argument("--revision", help="branch, tag or commit (hf:// only; default main)")
    fetch.add_argument("--force", action="store_true", help="replace a checkpoint in --out that fetch did not write")
    fetch.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds an http(s) request may go without data (default 60); then it is retried from where it "
        "stopped, 3 times, before the fetch stops (run it again to resume)",
    )
    fetch.add_argument("--quiet", action="store_true", help="no progress bar")
    fetch.set_defaults(func=fetch_command.cmd_fetch)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` (default: sys.argv), run the command, and return its exit status: 0, 1 where a command
    reports a mismatch (`info`), 2 for a user-facing error printed as one line on stderr, 130 (the shells'
    status for SIGINT) when interrupted (Ctrl-C), with one line `interrupted` and no traceback."""
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
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
