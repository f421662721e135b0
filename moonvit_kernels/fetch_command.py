"""The `fetch` command: only the vision tensors of a checkpoint (`hub.fetch`) into a folder, and a
two-line report of what was read."""

from __future__ import annotations

import argparse
from pathlib import Path

from . import command_support as support


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
        raise support.CLIError(support.one_line(e)) from None
    except OSError as e:
        raise support.CLIError(f"{args.source}: {support.one_line(e)}") from None
    revision = f" at {manifest['revision']}" if manifest.get("revision") else ""
    print(
        f"fetched {len(manifest['tensors'])} vision tensors from {args.source}{revision}: "
        f"{manifest['vision_bytes']:,} bytes of a {manifest['checkpoint_bytes']:,}-byte checkpoint; "
        f"{manifest['bytes_read_this_run']:,} bytes read this run (config, index, headers, tensors)"
    )
    print(f"wrote {Path(args.out) / 'model.safetensors'}, config.json, manifest.json")
    return 0
