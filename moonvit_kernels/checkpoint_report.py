"""The `info` command: what a checkpoint holds — config, vision tensors, dtypes, parameter count, and
whether they match the config — from the safetensors headers only (no tensor bytes), for a local folder
or file and for `hf://` / `http(s)://` checkpoints (ranged reads through `hub`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from . import command_support as support


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


def config_match(found: dict[str, tuple[str, tuple[int, ...]]], config: Any) -> tuple[list[str], bool]:
    """The report's verdict on vision tensors (name -> (dtype tag, shape)) under `config`: the line
    "matches its config: yes" or "...: NO (n problem(s))" followed by the first 20 problems, and whether
    they match."""
    problems = tensor_problems(found, config)
    if not problems:
        return ["matches its config: yes"], True
    return [f"matches its config: NO ({len(problems)} problem(s))"] + [f"  {p}" for p in problems[:20]], False


def checkpoint_report(path: str | Path) -> tuple[list[str], bool]:
    """Lines describing a checkpoint from its headers alone, and whether it matches its config."""
    from .weights import SafetensorsFile, checkpoint_files, is_vision_key, load_config
    from .weights import parameter_count as expected_parameter_count

    path = Path(path)
    try:
        where = checkpoint_files(path)
        headers = {f: SafetensorsFile(f) for f in sorted(set(where.values()))}
    except (ValueError, KeyError, FileNotFoundError, OSError) as e:
        msg = support.one_line(e)
        raise support.CLIError(msg if str(path) in msg else f"{path}: {msg}") from None
    lines = [f"checkpoint {path}: {len(headers)} safetensors file(s), {len(where)} tensors"]
    try:
        config = load_config(path)
    except (FileNotFoundError, ValueError) as e:
        config = None
        lines.append(f"config: none usable ({support.one_line(e)})")
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
        verdict, ok = config_match(found, config)
        lines += verdict
    return lines, ok


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
        msg = support.one_line(e)
        raise support.CLIError(msg if source in msg else f"{source}: {msg}") from None
    revision = f" at {src.revision}" if src.revision else ""
    lines = [
        f"checkpoint {source}{revision}: {total:,} bytes of safetensors; vision tensors in {len(header_bytes)} shard(s)"
    ]
    lines.append(f"vision tensors: {len(ranges)}")
    lines += [f"  {t.name}  {t.dtype} {list(t.shape)}  bytes {t.start}..{t.end} of {t.shard}" for t in ranges]
    vision_bytes = sum(t.nbytes for t in ranges)
    lines.append(f"vision bytes: {vision_bytes:,} ({100 * vision_bytes / max(total, 1):.3f}% of the checkpoint)")
    verdict, ok = config_match({t.name: (t.dtype, t.shape) for t in ranges}, config)
    lines += verdict
    lines.append(f"read {src.bytes_read:,} bytes (config, index, headers; no tensor bytes)")
    return lines, ok


def cmd_info(args: argparse.Namespace) -> int:
    """Print `checkpoint_report`; exit status 1 when the tensors do not match the config."""
    from .remote import is_remote

    lines, ok = remote_report(args.path) if is_remote(args.path) else checkpoint_report(args.path)
    print("\n".join(lines))
    return 0 if ok else 1
