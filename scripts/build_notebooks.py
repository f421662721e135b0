"""Build the workbook `notebooks/NN_*.ipynb` from the cells written below, and execute it.

    python scripts/build_notebooks.py                 # build and execute every notebook
    python scripts/build_notebooks.py 02_rmsnorm      # only some (names without .ipynb)
    python scripts/build_notebooks.py --no-execute    # write the cells, no outputs

Each notebook is a list of Markdown and code cells (`md`, `code`). After writing a notebook the
script formats it with ruff, then executes it headless (nbclient, kernel "python3", working
directory `notebooks/`) and saves it with its outputs, which is how the committed notebooks are
made: run this on a machine without a GPU so the outputs show the CUDA simulator's small sizes.
Edit the cells here, not in the .ipynb files, so that the two never drift apart.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / "notebooks"


def md(text: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_markdown_cell(textwrap.dedent(text).strip("\n"))


def code(text: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_code_cell(textwrap.dedent(text).strip("\n"))


def setup_cell(extra_imports: str = "") -> nbformat.NotebookNode:
    """The first cell of every notebook: the simulator is switched on before numba is imported."""
    body = """
    # Without a GPU, numba.cuda runs on its CPU simulator; the switch must be set before numba is imported.
    # Figures (matplotlib Figure objects returned by moonvit_kernels.viz*) are drawn inline.
    %matplotlib inline
    from moonvit_kernels.device import gpu_available, simulator_enabled, use_simulator_without_gpu, where

    use_simulator_without_gpu()
    """
    return code(textwrap.dedent(body) + textwrap.dedent(extra_imports) + '\nprint(f"kernels run on: {where()}")')


# ============================================================================ 00 tour
def tour() -> list[nbformat.NotebookNode]:
    return [
        md("""
        # 00 — A tour of MoonViT-V2, the vision tower of Kimi K3

        Kimi K3 reads images and videos with **MoonViT-V2**: a 27-layer vision transformer plus a small
        projector that turns image patches into tokens of the language model's width (7168). This
        workbook rebuilds it stage by stage — first in NumPy (`moonvit_kernels.reference`, the oracle),
        then as `numba.cuda` kernels that are checked against that oracle.

        | notebook | stage |
        |---|---|
        | 00_tour | the whole model: config, parameters, shapes, a real run |
        | 01_patch_embed_gemm | patch embedding = one GEMM; the GEMM ladder v1 → v3 |
        | 02_rmsnorm | the row reduction, and why `eps` matters |
        | 03_rope_2d | 2D rotary position embedding (interleaved pairs) |
        | 04_attention | packed attention, naive and tiled (online softmax) |
        | 05_merge_and_projector | the 2×2 patch merge and the MLP projector |
        | 06_full_encoder | everything together, compared stage by stage |

        **No GPU needed.** On a laptop the kernels run on numba's CUDA *simulator* (one Python thread per
        CUDA thread: correct but slow), so the notebooks pick tiny sizes there and real ones on a GPU.
        The first cell of every notebook decides which. The model's definition is `SPEC.md`; each
        notebook quotes the part it needs.
        """),
        setup_cell("""
        from pathlib import Path

        import numpy as np
        from IPython.display import Markdown, display

        from moonvit_kernels import reference
        from moonvit_kernels.config import VisionConfig
        from moonvit_kernels.preprocess import unpatchify
        from moonvit_kernels.viz_stages import (
            flop_table,
            markdown_table,
            parameter_table,
            plot_architecture,
            stage_shapes,
        )
        from moonvit_kernels.weights import expected_shapes, load_checkpoint, parameter_count

        DATA = Path("..") / "data"
        """),
        md("""
        ## The configuration

        The model is described by the `vision_config` block of the checkpoint's `config.json`.
        `VisionConfig` uses exactly those keys; `VisionConfig.k3()` is the released model.
        Notation used everywhere: `D` hidden width, `Q` width of q/k/v (not equal to `D` in K3!),
        `H` heads, `hd = Q / H`, `p` patch side, `I` MLP width, `T` the language model's width.
        """),
        code("""
        k3 = VisionConfig.k3()
        names = {
            "patch_size": "p",
            "vt_hidden_size": "D",
            "qkv_hidden_size": "Q",
            "vt_num_attention_heads": "H",
            "vt_intermediate_size": "I",
            "vt_num_hidden_layers": "layers",
            "merge_kernel_size": "(kh, kw)",
            "text_hidden_size": "T",
            "init_pos_emb_height": "H0",
            "init_pos_emb_width": "W0",
            "init_pos_emb_time": "max frames",
            "vit_norm_eps": "eps",
            "projector_ln_eps": "projector eps",
        }
        rows = [[key, symbol, getattr(k3, key)] for key, symbol in names.items()]
        rows += [["(derived) head_dim", "hd", k3.head_dim], ["(derived) 3·p·p", "patch_dim", k3.patch_dim]]
        display(Markdown(markdown_table(["config key", "symbol", "K3 value"], rows)))
        """),
        md("""
        ## Where the parameters are

        Every tensor of the checkpoint, with its shape, comes from `weights.expected_shapes(config)`
        (SPEC.md's table). Summed by component:
        """),
        code("""
        rows = parameter_table(k3)
        total = parameter_count(k3)["total"]
        display(Markdown(markdown_table(["component", "parameters", "share", "tensors"],
                                        [[r.component, r.count, f"{r.count / total:.1%}", r.detail] for r in rows])))
        assert sum(r.count for r in rows) == total == 447_358_976  # SPEC.md: 401,214,464 + 46,144,512
        print(f"{len(expected_shapes(k3))} tensors, {total:,} parameters = {total * 2 / 2**20:.0f} MiB in bfloat16")
        """),
        md("""
        ## The architecture, with shapes

        One 896×896 image is a 64×64 grid of 14×14 patches: `L = 4096` tokens. The picture below is drawn
        from the config (`viz_stages.plot_architecture`), so it shows the shapes the code produces.
        Note `qkv` is `[L, 3·Q]` with `Q = 1536 ≠ D = 1024`, so the attention output projection `wo`
        is `[D, Q]` — not square. The 2×2 merge turns 4096 patch tokens into 1024 tokens of width `4·D`.
        """),
        code("""
        plot_architecture(k3, [[1, 64, 64]])
        """),
        md("""
        ## What it costs

        SPEC.md gives the FLOPs: per layer `2·L·D·(3Q + Q + 2I)` for the GEMMs and `4·L²·Q` per media item
        for attention. At 64×64 patches attention is already almost half the work, and it grows with `L²`.
        """),
        code("""
        PEAK_BF16 = 790e12  # H200 dense bf16, FLOP/s (SPEC.md)
        for side in (32, 64, 128):
            rows = flop_table(k3, [[1, side, side]])
            total = sum(r.count for r in rows)
            print(f"{side * 14}×{side * 14} image, L = {side * side:5d}: {total / 1e12:6.2f} TFLOP, "
                  f"attention {rows[2].count / total:5.1%}, floor at peak bf16 {total / PEAK_BF16 * 1e3:6.2f} ms")
        rows = flop_table(k3, [[1, 64, 64]])
        table = [[r.component, r.count, r.detail] for r in rows]
        display(Markdown(markdown_table(["stage", "FLOP", "formula"], table)))
        """),
        md("""
        ## A real run: the bundled tiny checkpoint

        `data/tiny/` holds a checkpoint in the real K3 tensor names (stored in bfloat16, like the real one)
        for a *tiny* config with every structural feature of K3: `Q ≠ D`, a head width that is a multiple
        of 4 but not a power of two, a position grid that needs interpolation. Its inputs pack **two media
        items into one sequence**: a 6×8-patch image and a 2-frame 4×4-patch video. `grid_thws` lists
        `(t, h, w)` per item.
        """),
        code("""
        config, weights = load_checkpoint(DATA / "tiny")
        inputs = np.load(DATA / "tiny" / "inputs.npz")
        pixel_values, grid_thws = inputs["pixel_values"], inputs["grid_thws"]
        print("differs from K3 in:", {k: v for k, v in config.to_dict().items() if v != k3.to_dict()[k]})
        print("pixel_values", pixel_values.shape, pixel_values.dtype, " grid_thws", grid_thws.tolist())
        """),
        md("""
        `pixel_values` are patches already cut out of the media, in the order frame → patch row → patch
        column. `preprocess.unpatchify` puts them back together, so we can look at what the model sees:
        """),
        code("""
        from matplotlib.figure import Figure

        frames = []
        bounds = reference.cu_seqlens(grid_thws)
        for i, (t, h, w) in enumerate(grid_thws.tolist()):
            item = unpatchify(pixel_values[bounds[i] : bounds[i + 1]], (t, h, w))
            frames += [(f"item {i}, frame {f}, grid {h}×{w}", item[f]) for f in range(t)]
        fig = Figure(figsize=(9, 2.6), layout="constrained")
        for ax, (title, img) in zip(fig.subplots(1, len(frames)), frames, strict=True):
            ax.imshow(np.clip(img * 0.5 + 0.5, 0, 1))  # pixels are normalised to [-1, 1]
            ax.set_title(title, fontsize=8)
            ax.set_xticks(np.arange(0, img.shape[1], config.patch_size) - 0.5, [])
            ax.set_yticks(np.arange(0, img.shape[0], config.patch_size) - 0.5, [])
            ax.grid(color="w", lw=0.5)
        fig
        """),
        md("""
        Now the whole tower. `reference.vision_forward(..., return_intermediates=True)` also returns every
        stage's output — the same names the kernel notebooks and `compare` use. The shapes are checked
        against the architecture picture's (`stage_shapes`) for this config and grid.
        """),
        code("""
        outputs, stages = reference.vision_forward(pixel_values, grid_thws, weights, config, return_intermediates=True)
        expected = {s.name: s.shape for s in stage_shapes(config, grid_thws)}
        rows = []
        for name, value in stages.items():
            key = "layer_i" if name.startswith("layer_") else name
            assert value.shape == expected[key], (name, value.shape, expected[key])
            rows.append([name, str(value.shape), float(np.sqrt(np.mean(value**2))), bool(np.all(np.isfinite(value)))])
        display(Markdown(markdown_table(["stage", "shape", "RMS", "finite"], rows)))
        print("outputs per media item:", [o.shape for o in outputs])
        """),
        code("""
        plot_architecture(config, grid_thws)
        """),
        md("""
        ## Exercises

        Each exercise cell holds a worked answer; replace it with your own and rerun the cell —
        the `assert` checks it against the package.

        **1.** A 448×672 image (height × width, already a multiple of 28) goes through K3. How many patch tokens
        `L` does it make, and how many output tokens reach the language model?
        """),
        code("""
        # Your answer (worked): 448/14 = 32 patch rows, 672/14 = 48 columns; the 2×2 merge halves both.
        L_answer = (448 // 14) * (672 // 14)
        out_answer = (448 // 28) * (672 // 28)

        shapes = {s.name: s.shape for s in stage_shapes(k3, [[1, 448 // 14, 672 // 14]])}
        assert (L_answer, out_answer) == (shapes["patch_embed"][0], shapes["projected"][0])
        print(L_answer, "patch tokens ->", out_answer, "tokens of width", shapes["projected"][1])
        """),
        md("""
        **2.** Write the parameter count of one K3 encoder block as a formula in `D`, `Q`, `I`
        (two norms, `wqkv`, `wo`, `fc0`, `fc1`; no biases).
        """),
        code("""
        D, Q, I = k3.vt_hidden_size, k3.qkv_hidden_size, k3.vt_intermediate_size
        block_answer = 2 * D + 3 * Q * D + D * Q + I * D + D * I  # worked answer

        blocks = next(r.count for r in parameter_table(k3) if r.component == "encoder blocks")
        assert block_answer * k3.vt_num_hidden_layers == blocks
        print(f"{block_answer:,} parameters per block")
        """),
        md("""
        **3.** Two 448×448 images packed into one sequence vs one 448×896 image: same number of tokens.
        Which costs more attention FLOPs, and by what factor? (Packed items never attend to each other.)
        """),
        code("""
        n = 32 * 32  # tokens per 448×448 image
        ratio_answer = (2 * n) ** 2 / (2 * n**2)  # worked: one item of 2n tokens vs two items of n

        packed = flop_table(k3, [[1, 32, 32], [1, 32, 32]])[2].count
        single = flop_table(k3, [[1, 32, 64]])[2].count
        assert np.isclose(single / packed, ratio_answer)
        print(f"the single wide image costs {ratio_answer:.0f}× the attention FLOPs of the two packed images")
        """),
    ]


# ============================================================================ registry and main
NOTEBOOKS: dict[str, Callable[[], list[nbformat.NotebookNode]]] = {
    "00_tour": tour,
}


def build(name: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = NOTEBOOKS[name]()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    path = NOTEBOOK_DIR / f"{name}.ipynb"
    nbformat.validate(nb)
    nbformat.write(nb, path)
    ruff = shutil.which("ruff") or "ruff"
    subprocess.run([ruff, "format", "--quiet", str(path)], check=True, cwd=ROOT)
    subprocess.run([ruff, "check", "--quiet", "--fix", str(path)], check=True, cwd=ROOT)
    return path


def execute(path: Path, timeout: int = 900) -> float:
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        record_timing=False,
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()
    nbformat.write(nb, path)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"notebooks to build (default: all of {', '.join(NOTEBOOKS)})")
    parser.add_argument("--no-execute", action="store_true", help="write the cells without running them")
    args = parser.parse_args(argv)
    names = args.names or list(NOTEBOOKS)
    unknown = [n for n in names if n not in NOTEBOOKS]
    if unknown:
        parser.error(f"unknown notebook(s) {unknown}; known: {', '.join(NOTEBOOKS)}")
    NOTEBOOK_DIR.mkdir(exist_ok=True)
    for name in names:
        path = build(name)
        if args.no_execute:
            print(f"wrote {path.relative_to(ROOT)}")
            continue
        seconds = execute(path)
        print(f"wrote and executed {path.relative_to(ROOT)} in {seconds:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
