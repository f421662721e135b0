"""`moonvit-kernels rope`: K3's 2D RoPE as pictures (PNG) and, with --html, one self-contained interactive page.

    moonvit-kernels rope [--head-dim 128] [--grid 64x64] [--out rope.png] [--html]

RoPE has no weights, so this needs no checkpoint: it draws the frequencies `f_i = θ^(−4i/hd)` (θ = 10000)
of the given head dim. It writes `rope.png` (width and height slots of frequencies from the fastest to the
slowest, each over at least one period, the image outlined), `rope_comb.png` (every slot's cos(angle)
against position: the interleaving comb) and `rope_offset.png` (q·k against the (row, column) offset, K3's
convention beside the width/height-swapped one); `--html` adds `rope.html`, the three pictures and an
explorer (sliders for the frequency, the slot, the grid, the offset map's weighting), all in one file
with no network access.
"""

from __future__ import annotations

import argparse
import base64
import html
import json
import re
from pathlib import Path

THETA = 10000.0


def parse_grid(text: str) -> tuple[int, int]:
    """`"64x64"` (or `64×48`, `64,48`) -> (rows, columns), both >= 1; ValueError naming the argument otherwise."""
    m = re.fullmatch(r"\s*(\d+)\s*[x×X,]\s*(\d+)\s*", text)
    if not m or min(int(m[1]), int(m[2])) < 1:
        raise ValueError(f"--grid: expected ROWSxCOLUMNS with both >= 1 (e.g. 64x64), got {text!r}")
    return int(m[1]), int(m[2])


def check_head_dim(head_dim: int) -> int:
    if head_dim < 4 or head_dim % 4:
        raise ValueError(f"--head-dim: 2D RoPE needs a positive multiple of 4 (K3: 128), got {head_dim}")
    return head_dim


# About what drawing may take beyond the interpreter; K3's head_dim 128 on a 64x64 grid takes a few MB.
# It also keeps the comb picture under matplotlib's 2^16 pixels a side (head_dim ~10,900).
MEMORY_LIMIT = 2**30
BYTES_PER_COMB_VALUE = 80  # measured: float64 angles, cos, positions of both directions, the picture's copies
BYTES_PER_COMB_PIXEL = 18  # measured: RGBA and matplotlib's buffers
COMB_WIDTH_PIXELS = 1000  # `plots.rope.plot_rope_comb`: 10 x (0.06·head_dim + 2.2) inches at 100 dpi


def drawing_bytes(head_dim: int, grid: tuple[int, int]) -> int:
    """About the bytes drawing takes: the comb's values (head_dim/2 slots x the grid's longer side) and
    pixels (its picture grows with head_dim); the other pictures have fixed sizes."""
    return _values_bytes(head_dim, grid) + _pixels_bytes(head_dim)


def _values_bytes(head_dim: int, grid: tuple[int, int]) -> int:
    return BYTES_PER_COMB_VALUE * (head_dim // 2) * max(grid)


def _pixels_bytes(head_dim: int) -> int:
    return BYTES_PER_COMB_PIXEL * COMB_WIDTH_PIXELS * (6 * head_dim + 220)


def check_sizes(head_dim: int, grid: tuple[int, int]) -> None:
    """ValueError naming --head-dim (when it is too large even on a 1x1 grid) or --grid, the estimate and the
    limit when drawing would take more than MEMORY_LIMIT bytes (`drawing_bytes`); nothing is allocated."""
    need = drawing_bytes(head_dim, grid)
    if need <= MEMORY_LIMIT:
        return
    if drawing_bytes(head_dim, (1, 1)) > MEMORY_LIMIT:
        most = _largest_head_dim(max(grid))
        option = f"--head-dim {head_dim}"
        hint = f"--head-dim at most {most:,} with --grid {grid[0]}x{grid[1]}"
        if most < 4:
            hint = f"--head-dim at most {_largest_head_dim(1):,} even on a 1x1 grid"
    else:
        most = (MEMORY_LIMIT - _pixels_bytes(head_dim)) // (BYTES_PER_COMB_VALUE * (head_dim // 2))
        option = f"--grid {grid[0]}x{grid[1]}"
        hint = f"the grid's longer side at most {most:,} with --head-dim {head_dim}"
    raise ValueError(
        f"{option}: drawing would take about {_size(need)}, more than the limit of {_size(MEMORY_LIMIT)} ({hint})"
    )


def _largest_head_dim(side: int) -> int:
    """The largest multiple of 4 whose drawing fits MEMORY_LIMIT with a grid's longer side of `side`."""
    per_head_dim = BYTES_PER_COMB_VALUE * side / 2 + BYTES_PER_COMB_PIXEL * COMB_WIDTH_PIXELS * 6
    return max(0, int((MEMORY_LIMIT - _pixels_bytes(0)) / per_head_dim) // 4 * 4)


def _size(nbytes: float) -> str:
    """1 GiB, 7.5 TiB: a byte count in binary units."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if nbytes < 1024 or unit == "PiB":
            return f"{nbytes:.3g} {unit}"
        nbytes /= 1024
    raise AssertionError("unreachable")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `rope` subcommand's options."""
    parser.add_argument("--head-dim", type=int, default=128, help="head dimension (K3: 128, the default)")
    parser.add_argument("--grid", default="64x64", help="patch grid ROWSxCOLUMNS of the image outlined (default 64x64)")
    parser.add_argument("--out", default="rope.png", help="the maps' PNG; _comb.png, _offset.png beside it")
    parser.add_argument("--html", action="store_true", help="also write one self-contained interactive .html page")


ROPE_FORMAT = "moonvit_kernels rope 1"


def output_paths(out: Path, html: bool) -> list[Path]:
    """The files `rope --out OUT` writes: the maps, comb and offset PNGs, and the page with `html`."""
    pngs = [out, out.with_name(f"{out.stem}_comb.png"), out.with_name(f"{out.stem}_offset.png")]
    return pngs + ([out.with_suffix(".html")] if html else [])


def record_path(out: Path) -> Path:
    """Where rope records the files it wrote for `--out OUT` (hidden, beside them; `file_sets`)."""
    return out.with_name(f".{out.stem}.rope.json")


def write_pictures(head_dim: int, grid: tuple[int, int], out: Path, staging: Path | None = None) -> list[Path]:
    """The three PNGs (maps at `out`, comb and offset beside it, or under their names in `staging`); their
    final paths."""
    from .plots.rope import plot_rope_comb, plot_rope_k3_maps, plot_rope_offset_map  # matplotlib: only when drawing

    out.parent.mkdir(parents=True, exist_ok=True)
    comb, offset = output_paths(out, False)[1:]
    figures = {
        out: plot_rope_k3_maps(head_dim, grid),
        comb: plot_rope_comb(head_dim, max(grid)),
        offset: plot_rope_offset_map(head_dim, min(32, max(grid) // 2 or 1)),
    }
    for path, fig in figures.items():
        fig.savefig(path if staging is None else staging / path.name, dpi=100)
    return list(figures)


def html_page(head_dim: int, grid: tuple[int, int], pictures: list[Path]) -> str:
    """One HTML page: the pictures inlined as data URLs and a canvas explorer computed in the page itself."""
    images = "\n".join(
        f'<figure><img alt="{html.escape(p.stem)}" '
        f'src="data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()}">'
        f"<figcaption>{html.escape(p.name)}</figcaption></figure>"
        for p in pictures
    )
    params = json.dumps({"headDim": head_dim, "theta": THETA, "rows": grid[0], "cols": grid[1]})
    return _PAGE.replace("__IMAGES__", images).replace("__PARAMS__", params).replace("__HD__", str(head_dim))


def run(args: argparse.Namespace) -> int:
    """Write the pictures (and the page); print what was written. 0 on success."""
    head_dim = check_head_dim(args.head_dim)
    grid = parse_grid(args.grid)
    check_sizes(head_dim, grid)
    out = Path(args.out)
    if out.suffix.lower() != ".png":
        raise ValueError(f"--out: the maps are written as PNG, give a .png path (got {out.name!r})")
    from .command_support import output_locked

    with output_locked(out, "rope"):
        written = _write_owned(head_dim, grid, out, args.html)
    for path in written:
        print(f"wrote {path}")
    return 0


def _write_owned(head_dim: int, grid: tuple[int, int], out: Path, html: bool) -> list[Path]:
    """Every file staged beside `out`, then all moved in together, replacing only files rope recorded
    making; ValueError (`file_sets.ForeignFiles`) naming any other in the way, before drawing."""
    import shutil
    import tempfile

    from .file_sets import check_owned, replace_set

    paths = output_paths(out, html)
    check_owned(record_path(out), ROPE_FORMAT, paths)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.stem}-staging-", dir=out.parent))
    try:
        write_pictures(head_dim, grid, out, staging)
        if html:
            pictures = [staging / p.name for p in paths[:3]]
            (staging / paths[3].name).write_text(html_page(head_dim, grid, pictures), encoding="utf-8")
        replace_set(record_path(out), ROPE_FORMAT, {p: staging / p.name for p in paths})
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return paths


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>2D RoPE of Kimi K3's vision tower (head_dim __HD__)</title>
<style>
 body{font:14px system-ui,sans-serif;margin:1.2em;max-width:1200px;color:#222}
 img{max-width:100%;border:1px solid #ddd} figure{margin:1em 0}
 .row{display:flex;gap:2em;flex-wrap:wrap;align-items:flex-start} label{display:block;margin:.4em 0}
 canvas{border:1px solid #aaa;image-rendering:pixelated} code{background:#f4f4f4;padding:0 .2em}
</style></head><body>
<h1>2D RoPE, head_dim __HD__, θ = 10000</h1>
<p>Complex slot <code>j</code> holds dims <code>2j, 2j+1</code>; even slots <code>j = 2i</code> turn by
<code>column·f_i</code> (width), odd slots <code>j = 2i+1</code> by <code>row·f_i</code> (height), with
<code>f_i = θ^(−4i/hd)</code>. Computed in this page; nothing is loaded from the network.</p>
<div class="row">
 <div>
  <h2>One slot over the grid</h2>
  <label>frequency i <input id="fi" type="range" min="0" value="0"> <span id="fiv"></span></label>
  <label>slot <select id="axis"><option value="w">width (even slot: turns with the column)</option>
   <option value="h">height (odd slot: turns with the row)</option></select></label>
  <label>grid side (patches) <input id="side" type="range" min="2" max="512" step="2"> <span id="sidev"></span></label>
  <canvas id="map" width="320" height="320"></canvas>
  <p id="mapinfo"></p>
 </div>
 <div>
  <h2>q·k against the (row, column) offset</h2>
  <label>weight of the width slots <input id="ww" type="range" min="0" max="100" value="100"></label>
  <label>weight of the height slots <input id="hw" type="range" min="0" max="100" value="35"></label>
  <label><input id="swap" type="checkbox"> width/height swapped (the bug: width slots turn by the row)</label>
  <canvas id="off" width="325" height="325"></canvas>
  <p>x: column offset −32…32, y: row offset −32…32; bright = large q·k (q = k, random, fixed).</p>
 </div>
</div>
<h2>Pictures</h2>
__IMAGES__
<script>
const P = __PARAMS__;
const nf = P.headDim / 4;
const f = Array.from({length: nf}, (_, i) => Math.pow(P.theta, -4 * i / P.headDim));
function rdbu(v) {  // v in [-1, 1] -> red (−1) … white … blue (+1)
  const t = (v + 1) / 2;
  const r = t < .5 ? 178 + (255 - 178) * t * 2 : 255 - (255 - 33) * (t - .5) * 2;
  const g = t < .5 ? 24 + (255 - 24) * t * 2 : 255 - (255 - 102) * (t - .5) * 2;
  const b = t < .5 ? 43 + (255 - 43) * t * 2 : 255 - (255 - 172) * (t - .5) * 2;
  return [r, g, b];
}
const $ = id => document.getElementById(id);
$("fi").max = nf - 1; $("side").value = Math.max(P.rows, P.cols);
function drawMap() {
  const i = +$("fi").value, side = +$("side").value, w = $("axis").value === "w";
  const lambda = (2 * Math.PI / f[i]).toFixed(1);
  $("fiv").textContent = i + " (f = " + f[i].toPrecision(3) + " rad/patch, λ = " + lambda + " patches)";
  $("sidev").textContent = side;
  const c = $("map"), ctx = c.getContext("2d"), img = ctx.createImageData(c.width, c.height);
  for (let y = 0; y < c.height; y++) for (let x = 0; x < c.width; x++) {
    const col = Math.floor(x * side / c.width), row = Math.floor(y * side / c.height);
    const [r, g, b] = rdbu(Math.cos((w ? col : row) * f[i]));
    const k = 4 * (y * c.width + x); img.data[k] = r; img.data[k + 1] = g; img.data[k + 2] = b; img.data[k + 3] = 255;
  }
  ctx.putImageData(img, 0, 0);
  const turns = (side - 1) * f[i] / (2 * Math.PI);
  $("mapinfo").textContent = "slot " + (2 * i + (w ? 0 : 1)) + ": cos(angle) over a " + side + "×" + side +
    " grid (x: column, y: row); it turns " + turns.toFixed(3) + " times across it.";
}
let seed = 12345; const rnd = () => (seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648;
const energy = Array.from({length: 2 * nf}, () => { const a = rnd() - .5, b = rnd() - .5; return a * a + b * b; });
function drawOffset() {
  const ww = +$("ww").value / 100, hw = +$("hw").value / 100, swap = $("swap").checked;
  const E = 32, n = 2 * E + 1, vals = [];
  let lo = Infinity, hi = -Infinity;
  for (let dr = -E; dr <= E; dr++) for (let dc = -E; dc <= E; dc++) {
    let s = 0, tot = 0;
    for (let i = 0; i < nf; i++) {
      const ew = energy[2 * i] * ww, eh = energy[2 * i + 1] * hw;
      s += ew * Math.cos((swap ? dr : dc) * f[i]) + eh * Math.cos((swap ? dc : dr) * f[i]); tot += ew + eh;
    }
    const v = tot > 0 ? s / tot : 0; vals.push(v); lo = Math.min(lo, v); hi = Math.max(hi, v);
  }
  const c = $("off"), ctx = c.getContext("2d"), cell = c.width / n;
  vals.forEach((v, k) => {
    const t = hi > lo ? (v - lo) / (hi - lo) : 1;
    ctx.fillStyle = "rgb(" + Math.round(255 * Math.min(1, 1.6 * t)) + "," + Math.round(230 * t * t) + "," +
      Math.round(90 + 120 * t) + ")";
    ctx.fillRect((k % n) * cell, Math.floor(k / n) * cell, cell + .5, cell + .5);
  });
}
["fi", "axis", "side"].forEach(id => $(id).addEventListener("input", drawMap));
["ww", "hw", "swap"].forEach(id => $(id).addEventListener("input", drawOffset));
drawMap(); drawOffset();
</script>
</body></html>
"""
