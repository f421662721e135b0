# ruff: noqa: E501  (cells hold Markdown tables and prose; the notebooks themselves are linted with E501 on)
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


# ============================================================================ 01 patch embedding = GEMM
def patch_embed_gemm() -> list[nbformat.NotebookNode]:
    return [
        md("""
        # 01 — Patch embedding is one GEMM; the GEMM ladder v1 → v3

        **What the source does.** MoonViT's patch embedding is a `Conv2d(3, D, kernel_size=p, stride=p,
        bias=False)`. But its input is not an image: the processor has already cut the image into
        `p×p` patches, `pixel_values [L, 3, p, p]`. A `p×p` kernel with stride `p` on a `p×p` input has
        exactly one output position, so each output is one dot product of the whole patch with one filter:

        `x[l, d] = Σ_{c, ky, kx} pixel_values[l, c, ky, kx] · W[d, c, ky, kx]`

        — a matrix product `x = P · Wᵀ` with `P = pixel_values.reshape(L, 3·p·p)` and
        `W.reshape(D, 3·p·p)`, both flattened in the order `(c, ky, kx)` (SPEC.md, stage 1). Every linear
        layer of the encoder (`wqkv`, `wo`, `fc0`, `fc1`) and the projector is the same product `A · Bᵀ`
        with the weight in its checkpoint layout `[out, in]`, so this one kernel does most of the model's
        FLOPs. This notebook: the convolution → GEMM step, checked numerically; the NumPy reference;
        three kernels, each changing one thing; checks against NumPy; where the error lands; speed.
        """),
        setup_cell("""
        import inspect
        import time
        from pathlib import Path

        import numpy as np
        from IPython.display import Markdown, display
        from numba import cuda

        from moonvit_kernels import reference
        from moonvit_kernels.config import VisionConfig
        from moonvit_kernels.kernels import gemm as gemm_module
        from moonvit_kernels.kernels.gemm import gemm
        from moonvit_kernels.viz import error_heatmap
        from moonvit_kernels.viz_stages import markdown_table, median_seconds, plot_timings
        from moonvit_kernels.weights import load_checkpoint, random_weights

        DATA = Path("..") / "data"
        rng = np.random.default_rng(0)
        """),
        md("""
        ## Sizes: real on a GPU, tiny on the simulator

        The simulator runs one Python thread per CUDA thread, so there the notebook uses the bundled tiny
        checkpoint (80 patches of 4×4, `D = 32`: a `[80, 48] · [32, 48]ᵀ` product). On a GPU it uses the
        K3 shapes: one 896×896 image, `[4096, 588] · [1024, 588]ᵀ`, with random weights.
        """),
        code("""
        if gpu_available() and not simulator_enabled():
            config = VisionConfig.k3()
            weights = random_weights(config.replace(vt_num_hidden_layers=0), seed=0)  # no encoder blocks needed
            L = 64 * 64
            pixel_values = rng.standard_normal((L, 3, config.patch_size, config.patch_size)).astype(np.float32)
        else:
            config, weights = load_checkpoint(DATA / "tiny")
            pixel_values = np.load(DATA / "tiny" / "inputs.npz")["pixel_values"]
            L = pixel_values.shape[0]
        W = weights["vision_tower.patch_embed.proj.weight"]  # [D, 3, p, p]
        D, p = W.shape[0], config.patch_size
        print(f"{where()}: L = {L} patches of 3×{p}×{p}, D = {D}: a [{L}, {3 * p * p}] · [{D}, {3 * p * p}]ᵀ GEMM")
        """),
        md("""
        ## A convolution with stride = kernel = input size is a matrix product

        A literal convolution, written out as loops (a few patches and filters only: it is slow), against the
        reshape-and-multiply of the reference:
        """),
        code("""
        def conv2d_stride_p(patches, weight):
            \"\"\"Conv2d(kernel=p, stride=p, no padding, no bias), one loop per index; out [n, D, 1, 1].\"\"\"
            n, C, H, Wd = patches.shape
            Dout, _, kh, kw = weight.shape
            out_h, out_w = (H - kh) // kh + 1, (Wd - kw) // kw + 1  # = 1 × 1 here
            out = np.zeros((n, Dout, out_h, out_w))
            for i in range(n):
                for d in range(Dout):
                    for oy in range(out_h):
                        for ox in range(out_w):
                            for c in range(C):
                                for ky in range(kh):
                                    for kx in range(kw):
                                        out[i, d, oy, ox] += patches[i, c, oy * kh + ky, ox * kw + kx] * weight[d, c, ky, kx]
            return out


        few = pixel_values[:3].astype(np.float64)
        conv = conv2d_stride_p(few, W[:5].astype(np.float64))
        as_gemm = reference.patch_embed(few, W[:5].astype(np.float64))
        print("conv output shape", conv.shape, "-> squeeze to", conv[:, :, 0, 0].shape)
        print("max |conv − GEMM| =", np.abs(conv[:, :, 0, 0] - as_gemm).max())
        assert np.allclose(conv[:, :, 0, 0], as_gemm, rtol=1e-12, atol=1e-12)
        """),
        md("""
        **Pitfall: the flattening order.** Both operands must be flattened the same way. The checkpoint's
        weight is `[D, 3, p, p]` (channel first) and the processor's patches are `[L, 3, p, p]`, so a plain
        reshape of both works. Flattening the patches channel-last (`[p, p, 3]`, how images are stored)
        while keeping the weight channel-first silently mixes up pixels:
        """),
        code("""
        hwc = pixel_values.transpose(0, 2, 3, 1).reshape(L, -1)  # patches flattened (ky, kx, c)
        wrong = hwc @ W.reshape(D, -1).T
        right = reference.patch_embed(pixel_values, W)
        print(f"relative error of the channel-last flattening: {np.abs(wrong - right).max() / np.abs(right).max():.2f}")
        """),
        md("""
        ## The NumPy reference

        `reference.patch_embed(pixel_values, proj_weight)` is the two reshapes and `@`. Computed in float64
        it is the oracle every kernel is compared with.
        """),
        code("""
        A = np.ascontiguousarray(pixel_values.reshape(L, -1), dtype=np.float32)  # [M, K]
        B = np.ascontiguousarray(W.reshape(D, -1), dtype=np.float32)  # [N, K]
        M, K = A.shape
        N = B.shape[0]
        ref64 = reference.patch_embed(pixel_values.astype(np.float64), W.astype(np.float64))
        print(inspect.getsource(reference.patch_embed))
        """),
        md("""
        ## The kernels: `moonvit_kernels/kernels/gemm.py`

        The module keeps every version (as in llm.c's `dev/cuda/` and siboehm's SGEMM walk); each changes
        one thing. All compute `C[M, N] = A[M, K] · B[N, K]ᵀ` in float32 and bounds-check M, N, K, so no size
        has to be a tile multiple (80 × 32 × 48 here on the simulator; 588 is not a multiple of 16 either).

        | version | idea | why it is faster |
        |---|---|---|
        | v1 | one thread per output `C[m, n]`, a K-loop over global memory | — the baseline: each A value is read N times from DRAM/L2 |
        | v2 | a 16×16 block stages 16-wide slabs of A and B in **shared memory** | each global load is reused 16 times; `+1` column of padding avoids bank conflicts |
        | v3 | **register blocking**: a block owns 64×64 outputs, each thread 4×4 | per k-step a thread loads 4 + 4 values and does 16 FMAs: more math per load |

        Here is v1 in full — read it next to the formula above; then open the module for v2 and v3:
        """),
        code("""
        print(gemm_module.__doc__.split("Epilogues")[0])
        print(inspect.getsource(gemm_module._make_gemm_v1))
        """),
        md("""
        The launcher `gemm(a, b, epilogue="none", residual=None, out=None, version=3)` checks every argument
        (dtype float32, 2-D, C-contiguous, matching K) and raises a `ValueError` naming the problem —
        numba itself checks nothing at launch. It returns a device array.
        """),
        code("""
        try:
            gemm(A, B[:, :-1])
        except ValueError as e:
            print("ValueError:", e)
        try:
            gemm(A.astype(np.float64), B)
        except ValueError as e:
            print("ValueError:", e)
        """),
        md("""
        ## Check every version against NumPy

        Two cases: the patch embedding itself, and a random product of awkward sizes (no dimension a multiple
        of any tile) where edge handling is tested. The tolerance for an fp32 dot product of length K is a
        small multiple of `eps·√K` relative to the size of the terms (GUIDE.md): the bound below is
        `8·eps·√K · (|A|·|B|ᵀ)`, elementwise. NaN or Inf fails.
        """),
        code("""
        FP32_EPS = float(np.finfo(np.float32).eps)
        m2, n2, k2 = (37, 33, 45) if simulator_enabled() else (1001, 999, 1027)
        cases = {
            "patch embed": (A, B, ref64),
            "awkward random": (
                a2 := rng.standard_normal((m2, k2)).astype(np.float32),
                b2 := rng.standard_normal((n2, k2)).astype(np.float32),
                a2.astype(np.float64) @ b2.astype(np.float64).T,
            ),
        }
        results, first_run_seconds, rows = {}, {}, []
        for case, (a, b, want) in cases.items():
            bound = 8 * FP32_EPS * np.sqrt(a.shape[1]) * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)).T)
            a_d, b_d = cuda.to_device(a), cuda.to_device(b)
            for version in gemm_module.VERSIONS:
                start = time.perf_counter()
                out_d = gemm(a_d, b_d, version=version)
                cuda.synchronize()
                first_run_seconds[case, version] = time.perf_counter() - start
                got = results[case, version] = out_d.copy_to_host()
                err = np.abs(got - want)
                assert np.all(np.isfinite(got)), f"{case} v{version}: NaN/Inf"
                assert np.all(err <= bound), f"{case} v{version}: max error {err.max():.3e} beyond the bound"
                blocks, threads = gemm_module.launch_config(version, *got.shape)
                rows.append([case, str(a.shape), f"v{version}", f"{blocks} × {threads}", err.max(), (err / bound).max()])
        header = ["case", "A", "kernel", "blocks × threads", "max abs error", "error / bound"]
        display(Markdown(markdown_table(header, rows)))
        """),
        md("""
        The same kernels carry the *epilogues* the encoder needs, fused into the store so the output is
        written once: `gelu_tanh` (MLP `fc0`), `gelu_erf` (projector — the two GELUs differ on purpose, a
        pitfall of other ports), and `residual` (`x + o·woᵀ`, `x + fc1(·)`). Checked on an awkward small
        shape:
        """),
        code("""
        m, n, k = 7, 33, 24
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
        r = rng.standard_normal((m, n)).astype(np.float32)
        prod = a.astype(np.float64) @ b.astype(np.float64).T
        expected = {
            "gelu_tanh": reference.gelu_tanh(prod),
            "gelu_erf": reference.gelu_erf(prod),
            "residual": prod + r,
        }
        for epilogue, want in expected.items():
            got = gemm(a, b, epilogue=epilogue, residual=r if epilogue == "residual" else None).copy_to_host()
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=epilogue)
            print(f"{epilogue:9s} max error {np.abs(got - want).max():.2e}")
        tanh_vs_erf = np.abs(expected["gelu_tanh"] - expected["gelu_erf"]).max()
        print(f"and the two GELUs differ by up to {tanh_vs_erf:.1e} on these values: swapping them is a real bug")
        """),
        md("""
        ## Pictures: where does the error land?

        The error of v3 against the float64 reference, per output. It is rounding noise spread over the whole
        matrix — an indexing bug (a wrong tile edge, a swapped operand) would show up as stripes or blocks.
        """),
        code("""
        error_heatmap(results["patch embed", 3], ref64, title=f"gemm v3, [{M}, {K}] · [{N}, {K}]ᵀ")
        """),
        md("""
        And what a real bug looks like: a kernel that drops the last partial K-tile (a classic when K is not a
        multiple of the tile) — simulated with NumPy on the awkward case by ignoring the last `K mod 16`
        columns. Every output is wrong, by an amount that depends on its row and column: a test on sizes that
        are tile multiples would never see it.
        """),
        code("""
        a, b, want = cases["awkward random"]
        k_full = (k2 // 16) * 16
        buggy = a[:, :k_full].astype(np.float64) @ b[:, :k_full].astype(np.float64).T
        print(f"K = {k2}: the last {k2 - k_full} columns dropped")
        error_heatmap(buggy, want, title="dropping the last partial K tile")
        """),
        md("""
        ## FLOPs and time

        A GEMM does `2·M·N·K` FLOPs. On the simulator the times measure Python threads, not a GPU — they are
        printed (labelled with where they ran) only to show the machinery; no GPU number exists there. On a
        GPU each kernel is timed after a warm-up, and compared with cuBLAS (through CuPy) when CuPy is
        installed.
        """),
        code("""
        flops = 2 * M * N * K
        on_gpu = gpu_available() and not simulator_enabled()
        repeat, warmup = 20, 2
        seconds = {}
        A_d, B_d = cuda.to_device(A), cuda.to_device(B)
        for version in gemm_module.VERSIONS:
            if on_gpu:
                t = median_seconds(lambda v=version: gemm(A_d, B_d, version=v), repeat, warmup, cuda.synchronize)
                seconds[f"numba v{version}"] = t["median"]
            else:  # the simulator is far too slow to repeat: reuse the one run of the check above
                seconds[f"numba v{version}"] = first_run_seconds["patch embed", version]
        cublas_note = "no GPU here, so no cuBLAS number exists"
        if on_gpu:
            try:
                import cupy as cp

                A_cp, B_cp = cp.asarray(A), cp.asarray(B)
                t = median_seconds(lambda: A_cp @ B_cp.T, repeat, warmup, cp.cuda.Device().synchronize)
                seconds["cuBLAS (cupy.matmul)"] = t["median"]
                cublas_note = "% of cuBLAS = cuBLAS time / kernel time"
            except ImportError:
                cublas_note = "CuPy is not installed: no cuBLAS number (pip install -e '.[cuda13]')"
        rows = []
        for name, sec in seconds.items():
            share = f"{seconds['cuBLAS (cupy.matmul)'] / sec:.0%}" if "cuBLAS (cupy.matmul)" in seconds else "—"
            rows.append([name, sec * 1e3, flops / sec / 1e12, share])
        print(f"{where()}: M = {M}, N = {N}, K = {K}, 2·M·N·K = {flops:,} FLOP; {cublas_note}")
        display(Markdown(markdown_table(["kernel", "ms", "TFLOP/s", "% of cuBLAS"], rows)))
        """),
        code("""
        plot_timings(seconds, where(), title=f"GEMM [{M}, {K}] · [{N}, {K}]ᵀ")
        """),
        md("""
        ## Exercises

        Each exercise cell holds a worked answer; replace it with your own and rerun — the `assert` checks it.

        **1.** The processor gave you patches flattened channel-last, `hwc = pixel_values.transpose(0, 2, 3, 1)`.
        Rearrange the **weight** (not the patches) so that one GEMM still gives the right embedding.
        """),
        code("""
        hwc = np.ascontiguousarray(pixel_values.transpose(0, 2, 3, 1).reshape(L, -1))
        W_hwc = np.ascontiguousarray(W.transpose(0, 2, 3, 1).reshape(D, -1))  # worked answer

        got = gemm(hwc, W_hwc).copy_to_host()
        np.testing.assert_allclose(got, ref64, rtol=1e-4, atol=1e-4)
        print("channel-last patches × channel-last weight = the embedding")
        """),
        md("""
        **2.** How many times is each element of `A` read from global memory by v1, and by v2 (tile 16)?
        (v1: every thread of output row m reads all of row m of A; v2: once per block column.)
        """),
        code("""
        reads_v1 = N  # worked answer: one read per output column
        reads_v2 = -(-N // gemm_module.TILE)  # once per 16-wide block of columns

        (blocks_x, _), _ = gemm_module.launch_config(2, M, N)
        assert reads_v1 == N and reads_v2 == blocks_x
        print(f"A is read {reads_v1}× by v1 and {reads_v2}× by v2 (N = {N})")
        """),
        md("""
        **3.** The FLOPs of K3's patch embedding for one 896×896 image, as `2·M·N·K` with the right sizes.
        """),
        code("""
        k3 = VisionConfig.k3()
        patch_flops_answer = 2 * (64 * 64) * k3.vt_hidden_size * (3 * 14 * 14)  # worked answer

        from moonvit_kernels.viz_stages import flop_table

        assert patch_flops_answer == flop_table(k3, [[1, 64, 64]])[0].count
        print(f"{patch_flops_answer / 1e9:.2f} GFLOP — under 0.1% of the tower: the encoder GEMMs dominate")
        """),
    ]


# ============================================================================ 02 RMSNorm
def rmsnorm_notebook() -> list[nbformat.NotebookNode]:
    return [
        md("""
        # 02 — RMSNorm: a row reduction, and why `eps` matters

        **What the source does.** Every encoder block normalises its input twice (`norm0` before attention,
        `norm1` before the MLP), the tower ends with `final_layernorm`, and the projector ends with
        `post_norm`. All four are RMSNorm (SPEC.md, stage 3):

        `rmsnorm(x, g) = x · rsqrt(mean(x², over the row) + eps) · g`, computed in float32.

        No `eps` is passed in the source, so PyTorch's default applies — and that default **changed**:
        current torch uses `finfo(float32).eps = 1.19e-7` even for bf16 inputs, older torch used
        `finfo(bfloat16).eps = 2⁻⁷ ≈ 0.0078`. Ports that copied the older behaviour differ on rows of small
        magnitude. Here eps is the config field `vit_norm_eps` (default 1.19e-7); the projector's norm uses
        `projector_ln_eps = 1e-5` — a third value, another pitfall.

        On a GPU this is a *memory-bound* kernel: it reads each element once and writes it once, with a
        reduction in between. Its design is one thread block per row.
        """),
        setup_cell("""
        import inspect
        import time
        from pathlib import Path

        import numpy as np
        from IPython.display import Markdown, display
        from numba import cuda

        from moonvit_kernels import reference
        from moonvit_kernels.config import FP32_EPS, VisionConfig
        from moonvit_kernels.kernels import rmsnorm as rmsnorm_module
        from moonvit_kernels.kernels.rmsnorm import rmsnorm
        from moonvit_kernels.viz import error_heatmap
        from moonvit_kernels.viz_stages import (
            markdown_table,
            median_seconds,
            plot_eps_effect,
            plot_timings,
            rmsnorm_output_rms,
        )
        from moonvit_kernels.weights import load_checkpoint

        DATA = Path("..") / "data"
        rng = np.random.default_rng(0)
        on_gpu = gpu_available() and not simulator_enabled()
        """),
        md("""
        ## Sizes

        On a GPU: the K3 shape, 4096 tokens × `D = 1024`. On the simulator the kernel's tree reduction runs
        one Python thread per CUDA thread with a barrier per step, so rows are few and short — and awkward
        (1, 7 and 13 rows; widths that are no power of two).
        """),
        code("""
        if on_gpu:
            shapes = [(1, 1000), (7, 1024), (33, 1000), (4096, 1024)]
        else:
            shapes = [(1, 24), (7, 37), (13, 40)]
        print(f"{where()}: shapes {shapes}")
        """),
        md("""
        ## The NumPy reference

        `reference.rmsnorm(x, weight, eps, return_rstd=True)` also returns the per-row
        `rstd = rsqrt(mean(x²) + eps)` — a side output kept by kernels (a backward pass needs it), and
        checked here too (GUIDE.md: check side outputs where they exist).
        """),
        code("""
        print(inspect.getsource(reference.rmsnorm))
        """),
        md("""
        ## The kernel: `moonvit_kernels/kernels/rmsnorm.py`

        One block per row, in three steps:

        1. each thread sums the squares of a strided subset of the row (`j = tid, tid + THREADS, …`);
        2. the block adds its partial sums by a **tree reduction** in shared memory — half the threads add
           the other half's values, `syncthreads`, repeat: `log2(THREADS)` steps. (On a GPU one would finish
           the last 32 with warp shuffles; the simulator lacks them, so this kernel uses shared memory only);
        3. every thread scales its columns by `rstd · weight[j]`.

        The block size is a power of two baked into each compiled specialisation:
        """),
        code("""
        print(inspect.getsource(rmsnorm_module.kernel_for))
        """),
        md("""
        ## Check against NumPy — output and rstd

        Random rows with a different scale each (never ones: a kernel that forgot to divide by `cols` passes on
        ones-like data of the right size) and a random weight. Tolerance: an fp32 sum of `cols` squares,
        so `8·eps·√cols` relative.
        """),
        code("""
        config = VisionConfig.k3()
        eps = config.vit_norm_eps
        rows_table, checked = [], {}
        for rows, cols in shapes:
            x = (rng.standard_normal((rows, cols)) * rng.uniform(0.1, 3.0, (rows, 1))).astype(np.float32)
            w = (1 + 0.25 * rng.standard_normal(cols)).astype(np.float32)
            start = time.perf_counter()
            out_d, rstd_d = rmsnorm(x, w, eps, return_rstd=True)
            out, rstd = out_d.copy_to_host(), rstd_d.copy_to_host()
            seconds = time.perf_counter() - start
            want, want_rstd = reference.rmsnorm(x.astype(np.float64), w.astype(np.float64), eps, return_rstd=True)
            rtol = 8 * FP32_EPS * np.sqrt(cols)
            np.testing.assert_allclose(out, want, rtol=rtol, atol=rtol * np.abs(want).max(), err_msg="out")
            np.testing.assert_allclose(rstd, want_rstd, rtol=rtol, err_msg="rstd")
            checked[rows, cols] = (x, w, out, want)
            rel = np.abs(out - want).max() / np.abs(want).max()
            rows_table.append([f"{rows} × {cols}", rmsnorm_module.threads_for(cols), rel,
                               (np.abs(rstd - want_rstd) / want_rstd).max(), seconds * 1e3])
        header = ["x", "threads/block", "out rel. error", "rstd rel. error", "ms (first call)"]
        display(Markdown(markdown_table(header, rows_table)))
        """),
        md("""
        The launcher also computes in place (`out=x`) — each thread reads its columns before writing them,
        after the barrier that ends the reduction — and rejects bad input with a `ValueError`:
        """),
        code("""
        x, w, _, want = checked[shapes[1]]
        x_d = cuda.to_device(x)
        rmsnorm(x_d, w, eps, out=x_d)
        np.testing.assert_allclose(x_d.copy_to_host(), want, rtol=1e-5, atol=1e-6)
        print("in place: ok")
        for bad in (lambda: rmsnorm(x, w[:-1], eps), lambda: rmsnorm(x, w, -1.0), lambda: rmsnorm(x.T, w, eps)):
            try:
                bad()
            except ValueError as e:
                print("ValueError:", e)
        """),
        code("""
        x, w, out, want = checked[shapes[-1]]
        error_heatmap(out, want, title=f"rmsnorm kernel vs float64, {x.shape[0]} × {x.shape[1]}")
        """),
        md("""
        ## Pictures: why eps matters

        For a row of RMS `r` and weight 1 the output has RMS `r / √(r² + eps)`: 1 when `r ≫ √eps`, shrinking
        towards 0 when `r` approaches `√eps`. With the fp32 eps that threshold is `3.5e-4`; with `2⁻⁷` it is
        `0.088` — inside the range of real activations. The curves are `viz_stages.rmsnorm_output_rms`; the
        dots are the **kernel** run on random rows of chosen RMS, once with each eps.
        """),
        code("""
        eps_values = {"fp32 eps (current torch)": FP32_EPS, "2⁻⁷ (bf16 eps, older torch)": 2.0**-7}
        row_rms = np.logspace(-4.5, 0.5, 10 if not on_gpu else 40)
        cols = 32
        x = rng.standard_normal((len(row_rms), cols))
        x = (x * (row_rms / np.sqrt(np.mean(x**2, axis=1)))[:, None]).astype(np.float32)
        ones = np.ones(cols, dtype=np.float32)
        measured = {}
        for label, e in eps_values.items():
            y = rmsnorm(x, ones, e).copy_to_host()
            got = np.sqrt(np.mean(y.astype(np.float64) ** 2, axis=1))
            np.testing.assert_allclose(got, rmsnorm_output_rms(row_rms, e), rtol=1e-4)
            measured[f"kernel, {label.split(' (')[0]}"] = (row_rms, got)
        plot_eps_effect(eps_values, measured=measured)
        """),
        md("""
        Does it matter for the model? Run the bundled tiny checkpoint with both eps values and compare the
        outputs. (Its activations are of order 1, so the effect is modest there; real activations of
        low-variance tokens — flat image regions — sit closer to the threshold.)
        """),
        code("""
        tiny, weights = load_checkpoint(DATA / "tiny")
        inputs = np.load(DATA / "tiny" / "inputs.npz")
        pv, grid = inputs["pixel_values"], inputs["grid_thws"]
        runs = {e: np.concatenate(reference.vision_forward(pv, grid, weights, tiny.replace(vit_norm_eps=e)))
                for e in eps_values.values()}
        a, b = runs.values()
        print(f"tiny model output, eps 2⁻⁷ vs fp32 eps: max |Δ| / max |out| = {np.abs(a - b).max() / np.abs(a).max():.2e}")
        print("(for scale: one bfloat16 rounding is up to 2⁻⁸ = 3.9e-03 relative, one fp32 rounding 2⁻²⁴ = 6.0e-08)")
        """),
        md("""
        ## Speed

        RMSNorm moves `2·rows·cols·4` bytes (read x, write out) and does almost no maths, so its yardstick is
        memory bandwidth (GB/s), not FLOP/s; on a GPU the baseline is a device-to-device copy of the same
        bytes. On the simulator the times measure Python threads, and no GPU number exists.
        """),
        code("""
        rows, cols = shapes[-1]
        x = rng.standard_normal((rows, cols)).astype(np.float32)
        w = rng.standard_normal(cols).astype(np.float32)
        x_d, w_d, o_d = cuda.to_device(x), cuda.to_device(w), cuda.device_array_like(x)
        repeat, warmup = (50, 3) if on_gpu else (1, 0)
        seconds = {"rmsnorm kernel": median_seconds(lambda: rmsnorm(x_d, w_d, eps, out=o_d), repeat, warmup,
                                                    cuda.synchronize)["median"]}
        if on_gpu:
            seconds["device-to-device copy"] = median_seconds(lambda: o_d.copy_to_device(x_d), repeat, warmup,
                                                              cuda.synchronize)["median"]
        moved = 2 * rows * cols * 4
        for name, sec in seconds.items():
            print(f"{where()}: {name:22s} {sec * 1e3:9.3f} ms  {moved / sec / 1e9:9.3f} GB/s  ({moved:,} bytes moved)")
        plot_timings(seconds, where(), title=f"RMSNorm {rows} × {cols}")
        """),
        md("""
        ## Exercises

        Each exercise cell holds a worked answer; replace it with your own and rerun — the `assert` checks it.

        **1.** Below which row RMS does the fp32 eps shrink a row's output RMS by more than 1%?
        (Solve `r / √(r² + eps) = 0.99` for `r`.)
        """),
        code("""
        r_answer = np.sqrt(FP32_EPS * 0.99**2 / (1 - 0.99**2))  # worked answer

        assert np.isclose(rmsnorm_output_rms(r_answer, FP32_EPS), 0.99)
        r_bf16 = np.sqrt(2**-7 * 0.99**2 / (1 - 0.99**2))
        print(f"rows with RMS below {r_answer:.2e} lose more than 1% (with eps = 2⁻⁷: below {r_bf16:.2f})")
        """),
        md("""
        **2.** The kernel returns `rstd` per row. Recover each row's mean square `mean(x²)` from it.
        """),
        code("""
        x, w, _, _ = checked[shapes[1]]
        _, rstd_d = rmsnorm(x, w, eps, return_rstd=True)
        rstd = rstd_d.copy_to_host().astype(np.float64)
        mean_square_answer = 1 / rstd**2 - eps  # worked answer

        np.testing.assert_allclose(mean_square_answer, np.mean(x.astype(np.float64) ** 2, axis=1), rtol=1e-5)
        print(mean_square_answer)
        """),
        md("""
        **3.** Use the kernel for the projector's final norm (`mm_projector.post_norm`) of the tiny checkpoint.
        Which eps? The projector output must match `reference.projector`.
        """),
        code("""
        _, stages = reference.vision_forward(pv, grid, weights, tiny, return_intermediates=True)
        h = stages["merged"] @ weights["mm_projector.proj.0.weight"].T
        h = np.ascontiguousarray(reference.gelu_erf(h) @ weights["mm_projector.proj.2.weight"].T, dtype=np.float32)
        eps_answer = tiny.projector_ln_eps  # worked answer: not vit_norm_eps

        got = rmsnorm(h, weights["mm_projector.post_norm.weight"], eps_answer).copy_to_host()
        np.testing.assert_allclose(got, stages["projected"], rtol=1e-4, atol=1e-5)
        print("projector output reproduced with eps =", eps_answer)
        """),
    ]


# ============================================================================ 03 RoPE 2D
def rope_notebook() -> list[nbformat.NotebookNode]:
    return [
        md("""
        # 03 — 2D RoPE: interleaved pairs, width on even slots, height on odd

        **What the source does.** Before attention, q and k of every head are rotated by the position of
        their patch (SPEC.md, stage 4). Per head the `hd` values form `hd/2` consecutive pairs
        `(x[2j], x[2j+1])`, each turned as a complex number by an angle that depends on the patch:

        - frequencies `f_i = 10000^(−4i/hd)` for `i < hd/4` (computed in float32 in the source);
        - complex slot `j = 2i` (even) turns by `column · f_i` — **width**;
        - complex slot `j = 2i + 1` (odd) turns by `row · f_i` — **height**;
        - in real dims: `(4i, 4i+1)` by `c·f_i`, `(4i+2, 4i+3)` by `r·f_i`;
        - every frame of a video reuses the same 2D table (no rotation over time); `h, w ≤ 512`.

        **Pitfalls other ports hit:** the *rotate-half* convention (pairs `(j, j + hd/2)`, from 1-D LLM RoPE)
        instead of interleaved pairs; and swapping width and height because the source's **docstring says
        the opposite** of what its code does. The code wins. Both mistakes produce plausible-looking numbers,
        so each gets a demonstration below.
        """),
        setup_cell("""
        import inspect

        import numpy as np
        from IPython.display import Markdown, display
        from numba import cuda

        from moonvit_kernels import reference
        from moonvit_kernels.config import FP32_EPS, VisionConfig
        from moonvit_kernels.kernels import rope as rope_module
        from moonvit_kernels.kernels.launch import cu_seqlens_table, grid_table
        from moonvit_kernels.kernels.rope import rope2d
        from moonvit_kernels.viz import error_heatmap, rope_frequency_maps, rope_offset_invariance
        from moonvit_kernels.viz_stages import markdown_table, plot_rope_pairing, rope_pairs

        rng = np.random.default_rng(0)
        on_gpu = gpu_available() and not simulator_enabled()
        """),
        md("""
        ## Sizes

        On a GPU: K3's 12 heads of `hd = 128`, an 896×896 image packed with a 4-frame 224×224 video.
        On the simulator: 2 heads of `hd = 24` (a multiple of 4, not a power of two), a 3×5 image and a
        2-frame 2×3 video — 27 tokens, one CUDA block each.
        """),
        code("""
        if on_gpu:
            heads, hd = 12, 128
            grid_thws = np.array([[1, 64, 64], [4, 16, 16]])
        else:
            heads, hd = 2, 24
            grid_thws = np.array([[1, 3, 5], [2, 2, 3]])
        L = int(np.prod(grid_thws, axis=1).sum())
        Q = heads * hd
        print(f"{where()}: {heads} heads × hd {hd}, items {grid_thws.tolist()}, L = {L}, qkv [{L}, {3 * Q}]")
        """),
        md("""
        ## Which dims rotate together

        Each arc joins two dims that rotate as one complex number; blue arcs turn with the column, orange with
        the row; the number is the frequency index `i`. K3 (top) pairs neighbours; rotate-half (bottom, *not*
        K3) pairs dim `j` with `j + hd/2`. The picture is drawn from `viz_stages.rope_pairs`, which the tests
        check against what `reference.apply_rope` actually rotates.
        """),
        code("""
        plot_rope_pairing(24)
        """),
        md("""
        The angle table of the reference, `reference.rope_angles(h, w, hd)` → `[h·w, hd/2]`: for one token, at
        row 2, column 4 of a 3×5 grid, the even slots hold `4·f_i` and the odd slots `2·f_i`:
        """),
        code("""
        h, w = 3, 5
        angles = reference.rope_angles(h, w, 24, dtype=np.float64)
        f = reference.rope_frequencies(24, dtype=np.float64)
        token = 2 * w + 4
        rows = [[j, "width" if j % 2 == 0 else "height", j // 2, angles[token, j], (4 if j % 2 == 0 else 2) * f[j // 2]]
                for j in range(12)]
        display(Markdown(markdown_table(["slot j", "axis", "i", "angle", "expected (col or row)·f_i"], rows)))
        """),
        md("""
        ## The NumPy reference

        `reference.apply_rope(x [L, heads, hd], angles [L, hd/2])` with the angles of
        `reference.rope_angles_packed(grid_thws, hd)` (every frame of a video reuses its item's 2D table):
        """),
        code("""
        print(inspect.getsource(reference.apply_rope))
        print(inspect.getsource(reference.rope_angles_packed))
        """),
        md("""
        ## The kernel: `moonvit_kernels/kernels/rope.py`

        It rotates q and k **in place** inside the packed `qkv [L, 3·Q]` buffer that the `wqkv` GEMM wrote
        (column `s·Q + head·hd + d`, s = q, k, v), so no copy of q and k is made. One block per token: the
        block finds the token's media item from `cu_seqlens`, its row and column within its frame, then each
        thread rotates one `(s, head, i)` quad — the width pair and the height pair:
        """),
        code("""
        print(inspect.getsource(rope_module.rope2d_kernel.py_func))
        """),
        md("""
        ## Check against NumPy

        q, k and v random; the reference runs in float64 on the same input. The kernel computes angles in
        float32, whose error grows with the angle (`|angle|·eps`), so the bound is
        `8·eps·(1 + max angle)·max|x|`. v must come back bit-for-bit untouched.
        """),
        code("""
        qkv = rng.standard_normal((L, 3 * Q)).astype(np.float32)
        grid32, cu32 = grid_table(grid_thws), cu_seqlens_table(grid_thws)
        got = rope2d(qkv.copy(), grid32, cu32, heads, hd).copy_to_host()

        ang64 = reference.rope_angles_packed(grid_thws, hd, dtype=np.float64)
        x64 = qkv.astype(np.float64)
        want = x64.copy()
        for s in (0, 1):  # q, k
            part = x64[:, s * Q : (s + 1) * Q].reshape(L, heads, hd)
            want[:, s * Q : (s + 1) * Q] = reference.apply_rope(part, ang64).reshape(L, Q)
        tol = 8 * FP32_EPS * (1 + ang64.max()) * np.abs(x64).max()
        err = np.abs(got - want)
        assert np.all(np.isfinite(got)) and err.max() <= tol, (err.max(), tol)
        assert np.array_equal(got[:, 2 * Q :], qkv[:, 2 * Q :]), "v was modified"
        print(f"q, k max error {err[:, : 2 * Q].max():.2e} (bound {tol:.1e}); v untouched")
        """),
        code("""
        error_heatmap(got[:, : 2 * Q], want[:, : 2 * Q], title="rope2d kernel, q | k columns")
        """),
        md("""
        **Frames share positions.** Give both frames of the video the same q, k vectors: after RoPE they are
        still identical — there is no rotation over time (videos get their time signal from the position
        embedding, not from RoPE).
        """),
        code("""
        t, vh, vw = grid_thws[-1]
        start = L - t * vh * vw
        same = qkv.copy()
        same[start + vh * vw : start + 2 * vh * vw] = same[start : start + vh * vw]  # frame 1 := frame 0
        out = rope2d(same, grid32, cu32, heads, hd).copy_to_host()
        assert np.array_equal(out[start : start + vh * vw], out[start + vh * vw : start + 2 * vh * vw])
        print("frame 0 and frame 1 rotated identically")
        """),
        md("""
        ## Pictures: RoPE frequency maps

        For each complex slot, `cos(angle)` over the patch grid (`viz.rope_frequency_maps`): width slots vary
        along columns only, height slots along rows only; low `i` turn fast (fine position), high `i` barely
        turn (coarse position). Here `hd = 32` on a 12×16 grid (16 slots):
        """),
        code("""
        rope_frequency_maps(12, 16, 32)
        """),
        md("""
        ## Pictures: why rotate — q·k depends only on the offset

        Rotating q at position `a` and k at position `b` by angles linear in position makes
        `rope(q, a) · rope(k, b)` a function of `b − a` only: attention sees *relative* positions, in both
        axes. Four start positions, one curve each — they coincide (`viz.rope_offset_invariance`):
        """),
        code("""
        rope_offset_invariance(32)
        """),
        md("""
        ## The two pitfalls, measured

        A port that trusts the docstring (width on odd slots, height on even) and one that uses rotate-half,
        both compared with the kernel's output on the same input:
        """),
        code("""
        def rotate_half(x, angles):  # the 1-D LLM convention: pairs (j, j + hd/2) — NOT K3
            half = x.shape[-1] // 2
            cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
            a, b = x[..., :half], x[..., half:]
            return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


        swapped = ang64.copy()
        swapped[:, 0::2], swapped[:, 1::2] = ang64[:, 1::2], ang64[:, 0::2]
        q64 = x64[:, :Q].reshape(L, heads, hd)
        q_kernel = got[:, :Q].reshape(L, heads, hd)
        ports = {
            "width/height swapped (the docstring)": reference.apply_rope(q64, swapped),
            "rotate-half pairs": rotate_half(q64, ang64),
            "the reference (interleaved, width even)": reference.apply_rope(q64, ang64),
        }
        for name, q_port in ports.items():
            print(f"{name:42s} max |kernel − port| / max|q| = {np.abs(q_kernel - q_port).max() / np.abs(q64).max():.2e}")
        """),
        md("""
        ## Exercises

        Each exercise cell holds a worked answer; replace it with your own and rerun — the `assert` checks it.

        **1.** With `hd = 24`, what angle does complex slot `j = 5` get for the token at row 3, column 7?
        """),
        code("""
        i = 5 // 2  # slot 5 is odd: height, frequency index 2
        angle_answer = 3 * 10000.0 ** (-4 * i / 24)  # worked answer: row · f_i

        table = reference.rope_angles(8, 10, 24, dtype=np.float64)
        assert np.isclose(angle_answer, table[3 * 10 + 7, 5])
        print(f"{angle_answer:.6f} rad")
        """),
        md("""
        **2.** Which two real dims does the *height* rotation of frequency `i = 4` touch?
        """),
        code("""
        dims_answer = (4 * 4 + 2, 4 * 4 + 3)  # worked answer

        assert dims_answer == next(p.dims for p in rope_pairs(24) if p.axis == "height" and p.freq_index == 4)
        print(dims_answer)
        """),
        md("""
        **3.** A library only offers rotate-half RoPE. Find a permutation of the head dims such that
        `rotate_half(x[..., perm], angles)` equals K3's `apply_rope(x, angles)[..., perm]` — the trick used to
        convert weights between the two conventions.
        """),
        code("""
        perm = np.concatenate([np.arange(0, hd, 2), np.arange(1, hd, 2)])  # worked answer: evens, then odds

        x = rng.standard_normal((L, heads, hd))
        np.testing.assert_allclose(rotate_half(x[..., perm], ang64), reference.apply_rope(x, ang64)[..., perm], atol=1e-12)
        print("perm =", perm.tolist())
        """),
    ]


# ============================================================================ 04 attention
def attention_notebook() -> list[nbformat.NotebookNode]:
    return [
        md("""
        # 04 — Attention over packed media: naive, then tiled with an online softmax

        **What the source does.** Each encoder block runs multi-head softmax attention (SPEC.md, stage 3):
        `o = softmax(q·kᵀ / √hd) · v` per head, **non-causal**, with the softmax in float32. Several media
        items (images, video chunks) are packed into one sequence of `L` tokens, described by `cu_seqlens`
        (`[0, n₀, n₀+n₁, …]`), and **an item never attends to another** — the mask is block-diagonal.
        The source calls a variable-length flash-attention kernel for this; here it is built in two steps.

        **Pitfalls other ports hit:** attention leaking across packed items (one softmax over all `L`
        tokens); materialising the `L×L` score matrix (at 16k tokens and 12 heads that is 12 GiB in fp32).

        | version | one block per | scores kept | K/V read from global memory |
        |---|---|---|---|
        | v1 naive | (query row, head) | the whole row of its item, in shared memory (≤ 8192 keys) | once per query row |
        | v2 tiled, online softmax | (tile of query rows, head) | one `block_q × block_k` tile | once per query tile |

        Both also return the **log-sum-exp** `lse = log Σ_j exp(s_j)` per (row, head) — the side output a
        backward pass needs, and a sharp check of the softmax.
        """),
        setup_cell("""
        import inspect
        import math
        import time

        import numpy as np
        from IPython.display import Markdown, display
        from numba import cuda

        from moonvit_kernels import reference
        from moonvit_kernels.config import FP32_EPS, VisionConfig
        from moonvit_kernels.kernels import attention as attention_module
        from moonvit_kernels.kernels.attention import attention, pack_qkv
        from moonvit_kernels.viz import attention_mask_picture, error_heatmap
        from moonvit_kernels.viz_stages import (
            attention_memory_table,
            markdown_table,
            median_seconds,
            online_softmax_trace,
            plot_online_softmax,
            plot_timings,
        )

        rng = np.random.default_rng(0)
        on_gpu = gpu_available() and not simulator_enabled()
        """),
        md("""
        ## Sizes

        On a GPU: K3's 12 heads of `hd = 128`, an 896×896 image (4096 tokens) packed with a 4-frame 224×224
        video chunk (1024 tokens) and a small 112×112 image. On the simulator: 2 heads of `hd = 24`, three
        items of 10, 6 and 2 tokens; v1 with 8 threads (several keys per thread) and v2 with 8×4 tiles, so
        an item spans several query and key tiles.
        """),
        code("""
        if on_gpu:
            heads, hd = 12, 128
            grid_thws = np.array([[1, 64, 64], [4, 16, 16], [1, 8, 8]])
            launches = {"v1": dict(version=1), "v2": dict(version=2)}
        else:
            heads, hd = 2, 24
            grid_thws = np.array([[1, 2, 5], [2, 1, 3], [1, 1, 2]])
            launches = {"v1": dict(version=1, threads=8), "v2": dict(version=2, block_q=8, block_k=4)}
        cu_seqlens = reference.cu_seqlens(grid_thws).astype(np.int32)
        lengths = np.diff(cu_seqlens)
        L, Q = int(cu_seqlens[-1]), heads * hd
        print(f"{where()}: items of {lengths.tolist()} tokens, L = {L}, {heads} heads × hd {hd}; launches {launches}")
        """),
        md("""
        ## The mask: one block per media item

        `viz.attention_mask_picture` draws which key (column) each query (row) may see. Everything off the
        diagonal blocks is forbidden — the kernels never even compute those scores: each query row looks up
        its item in `cu_seqlens` and loops over that item's keys only.
        """),
        code("""
        attention_mask_picture(grid_thws if not on_gpu else np.array([[1, 6, 8], [2, 4, 4], [1, 2, 2]]))
        """),
        md("""
        ## Memory per approach

        Score memory for K3 (12 heads) on a few inputs — the naive `L×L` matrix, one item's `n×n` at a time, and
        the single tile a v2 thread block holds (`viz_stages.attention_memory_table`). Output and lse
        (`L·H·(hd + 1)` floats) are the same for all and not counted.
        """),
        code("""
        k3 = VisionConfig.k3()
        inputs = {
            "896×896 image": [4096],
            "1792×1792 image": [16384],
            "4 images 896×896 packed": [4096] * 4,
            "video, 4 chunks of 4 frames 448²": [4 * 1024] * 4,
        }
        bq, bk = attention_module.V2_BLOCK_Q, attention_module.V2_BLOCK_K
        rows = []
        for name, lens in inputs.items():
            table = {r.approach: r for r in attention_memory_table(lens, k3.vt_num_attention_heads, k3.head_dim, bq, bk)}
            rows.append([name, sum(lens)] + [f"{table[a].nbytes / 2**20:,.3f} MiB" for a in table])
        display(Markdown(markdown_table(["input", "L", *table], rows)))
        shared = attention_module.v2_shared_bytes(k3.head_dim, bq, bk)
        print(f"v2 with {bq}×{bk} tiles at hd = {k3.head_dim}: {shared:,} bytes of shared memory per block "
              f"(Q tile, K tile, V tile, scores) — the same for any L")
        """),
        md("""
        ## The online softmax

        v2 never sees a whole row of scores. It keeps, per query row, the running max `m`, the running sum
        `l = Σ exp(s_j − m)` and an unnormalised output `acc = Σ exp(s_j − m)·v_j`. When a new key tile raises
        the max to `m'`, the old sum and output are rescaled by `exp(m − m')`:

        `l ← l·exp(m − m') + Σ_tile exp(s_j − m')`,  `acc ← acc·exp(m − m') + Σ_tile exp(s_j − m')·v_j`

        and at the end `o = acc / l`, `lse = m + log l`. Nothing is approximated: after the last tile the
        result is the softmax exactly (up to rounding). One row of 29 random scores in tiles of 8
        (`viz_stages.online_softmax_trace`, a NumPy transcription of this recurrence):
        """),
        code("""
        s = rng.standard_normal(29) * 2
        vals = rng.standard_normal((29, 4))
        trace = online_softmax_trace(s, 8, vals)
        p = np.exp(s - s.max())
        print("running max per tile:", np.round(trace["running_max"], 3))
        print("final lse", trace["lse"][-1], " direct", math.log(np.exp(s).sum()))
        print("final output", np.round(trace["output"][-1], 6), " direct", np.round(p @ vals / p.sum(), 6))
        plot_online_softmax(s, 8)
        """),
        md("""
        ## The NumPy reference

        `reference.attention(q, k, v, cu_seqlens, return_lse=True)` loops over items; within an item it
        processes query rows in chunks so that no `L×L` array exists even in NumPy:
        """),
        code("""
        print(inspect.getsource(reference.attention))
        """),
        md("""
        ## The kernels: `moonvit_kernels/kernels/attention.py`

        Both read q, k, v straight from the packed `qkv [L, 3·Q]` buffer the `wqkv` GEMM and the RoPE kernel
        produced (no transposes), and write `o [L, Q]` in the layout the `wo` GEMM reads. The module header
        says what each version changes:
        """),
        code("""
        print(attention_module.__doc__)
        """),
        md("""
        ## Check against NumPy — output and log-sum-exp

        q, k, v random and non-uniform (rows of different magnitudes, so some softmaxes are peaked). The
        tolerance follows the fp32 rounding of a score, `4·eps·Σ|q_d·k_d|/√hd`, which `exp` turns into a
        relative error of each probability; NaN fails.
        """),
        code("""
        row_scale = np.exp(rng.uniform(0, math.log(4), (L, 1, 1)))
        q = (rng.standard_normal((L, heads, hd)) * row_scale).astype(np.float32)
        k = (rng.standard_normal((L, heads, hd)) * rng.uniform(0.5, 2.0, (1, heads, hd))).astype(np.float32)
        v = (rng.standard_normal((L, heads, hd)) * 1.5 + rng.uniform(-1, 1, (1, heads, hd))).astype(np.float32)
        qkv = pack_qkv(q, k, v)
        ref_o, ref_lse = reference.attention(*(a.astype(np.float64) for a in (q, k, v)), cu_seqlens, return_lse=True)
        ref_o = ref_o.reshape(L, Q)

        bounds = list(zip(cu_seqlens[:-1], cu_seqlens[1:], strict=True))
        abs_terms = max(float((np.abs(q[a:b, h]) @ np.abs(k[a:b, h]).T).max()) for a, b in bounds for h in range(heads))
        score_err = 4 * FP32_EPS * abs_terms / math.sqrt(hd)
        rtol = 8 * FP32_EPS * math.sqrt(lengths.max())
        qkv_d = cuda.to_device(qkv)
        outputs, first_run_seconds, rows = {}, {}, []
        for name, launch in launches.items():
            start = time.perf_counter()
            o_d, lse_d = attention(qkv_d, cu_seqlens, heads, **launch)
            cuda.synchronize()
            first_run_seconds[name] = time.perf_counter() - start
            o, lse = o_d.copy_to_host(), lse_d.copy_to_host()
            assert np.all(np.isfinite(o)) and np.all(np.isfinite(lse)), name
            np.testing.assert_allclose(o, ref_o, rtol=rtol, atol=(score_err + rtol) * np.abs(v).max(), err_msg=name)
            np.testing.assert_allclose(lse, ref_lse, rtol=rtol, atol=score_err, err_msg=name + " lse")
            outputs[name] = o
            rows.append([name, str(launch), np.abs(o - ref_o).max(), np.abs(lse - ref_lse).max()])
        display(Markdown(markdown_table(["kernel", "launch", "o: max abs error", "lse: max abs error"], rows)))
        """),
        md("""
        ## Pictures: where the error lands

        The error of v2 for every (token, head·dim): rounding noise everywhere. A tile-edge or item-boundary
        bug would show up as a band of rows (one query tile, one item) or of columns (one head).
        """),
        code("""
        error_heatmap(outputs["v2"], ref_o, title="attention v2 vs float64, o [L, Q]")
        """),
        md("""
        ## No leaks between items

        Change every key and value of the *last* item and run again: the outputs of all other items must not
        change in a single bit. Then the pitfall: one softmax over the whole packed sequence (`cu_seqlens =
        [0, L]`), as a port without the mask computes it.
        """),
        code("""
        a, b = bounds[-1]
        changed = qkv.copy()
        changed[a:b, Q:] = rng.standard_normal((b - a, 2 * Q)).astype(np.float32)
        for name, launch in launches.items():
            o2 = attention(changed, cu_seqlens, heads, **launch)[0].copy_to_host()
            assert np.array_equal(o2[:a], outputs[name][:a]), f"{name}: item {len(bounds) - 1} leaked into the others"
            assert not np.array_equal(o2[a:], outputs[name][a:])
        print("changing the last item's k, v left every other item's output bit-for-bit unchanged")

        leaky = reference.attention(q, k, v, np.array([0, L]))
        print(f"one softmax over all L tokens: max |o − o_packed| = {np.abs(leaky.reshape(L, Q) - ref_o).max():.2f}")
        """),
        md("""
        ## Speed

        Attention does `4·n²·Q` FLOPs per item (two matrix products per head). On the simulator the times
        measure Python threads — no GPU number exists there. On a GPU, compare v1 and v2: v2 reads K and V once
        per tile of `block_q` rows instead of once per row.
        """),
        code("""
        flops = 4 * int(np.sum(lengths.astype(np.int64) ** 2)) * Q
        seconds = {}
        for name, launch in launches.items():
            if on_gpu:
                t = median_seconds(lambda launch=launch: attention(qkv_d, cu_seqlens, heads, **launch), 10, 2, cuda.synchronize)
                seconds[f"attention {name}"] = t["median"]
            else:
                seconds[f"attention {name}"] = first_run_seconds[name]
        for name, sec in seconds.items():
            print(f"{where()}: {name}  {sec * 1e3:10.2f} ms  {flops / sec / 1e12:10.3g} TFLOP/s  (4·Σn²·Q = {flops:,} FLOP)")
        plot_timings(seconds, where(), title=f"attention, items {lengths.tolist()}")
        """),
        md("""
        ## Exercises

        Each exercise cell holds a worked answer; replace it with your own and rerun — the `assert` checks it.

        **1.** Two halves of a row's keys were processed separately, giving `(m₁, l₁, o₁)` and `(m₂, l₂, o₂)`
        (max, sum of `exp(s − m)`, normalised output). Combine them into the full row's output — the rule
        split-K flash attention uses.
        """),
        code("""
        s = rng.standard_normal(20) * 3
        vals = rng.standard_normal((20, 5))
        h1, h2 = online_softmax_trace(s[:9], 9, vals[:9]), online_softmax_trace(s[9:], 11, vals[9:])
        (m1, l1, o1), (m2, l2, o2) = ((h["running_max"][-1], h["running_sum"][-1], h["output"][-1]) for h in (h1, h2))

        m = max(m1, m2)  # worked answer
        w1, w2 = l1 * np.exp(m1 - m), l2 * np.exp(m2 - m)
        combined_answer = (w1 * o1 + w2 * o2) / (w1 + w2)

        p = np.exp(s - s.max())
        np.testing.assert_allclose(combined_answer, p @ vals / p.sum(), rtol=1e-12)
        print(combined_answer)
        """),
        md("""
        **2.** From the kernel's `lse`, recover the attention probabilities of query row 0, head 0 (without
        recomputing a max or a sum) — then they must sum to 1.
        """),
        code("""
        _, lse_d = attention(qkv, cu_seqlens, heads, **launches["v2"])
        lse = lse_d.copy_to_host()
        a, b = bounds[0]
        scores = (q[0, 0].astype(np.float64) @ k[a:b, 0].astype(np.float64).T) / math.sqrt(hd)
        probs_answer = np.exp(scores - lse[0, 0])  # worked answer

        assert abs(probs_answer.sum() - 1) < 1e-5
        print(np.round(probs_answer, 4))
        """),
        md("""
        **3.** How many MiB would the naive fp32 `L×L` score matrix take, all 12 heads, for one 1792×1792 image?
        """),
        code("""
        L_big = (1792 // 14) ** 2
        mib_answer = 12 * L_big**2 * 4 / 2**20  # worked answer

        naive = attention_memory_table([L_big], 12, 128, bq, bk)[0]
        assert mib_answer == naive.nbytes / 2**20
        print(f"{mib_answer:,.0f} MiB (versus {attention_memory_table([L_big], 12, 128, bq, bk)[2].nbytes:,} bytes per v2 tile)")
        """),
    ]


# ============================================================================ 05 merge and projector
def merge_projector_notebook() -> list[nbformat.NotebookNode]:
    return [
        md("""
        # 05 — The patch merge and the projector

        **What the source does.** After the final norm, `tpool_patch_merger` (SPEC.md, stage 5) turns every
        `kh × kw` (2×2 in K3) block of neighbouring patches into one token, and averages over the frames of a
        video. For an item `(t, h, w)`: view the tokens as `[t, h/kh, kh, w/kw, kw, D]`, permute to
        `[t, h/kh, w/kw, kh, kw, D]`, mean over `t` → `[(h/kh)·(w/kw), kh·kw, D]`. So merged token
        `m = i·(w/kw) + j` holds, in slot `a·kw + b`, source patch `(kh·i + a)·w + (kw·j + b)`.

        The projector `PatchMergerMLPV2` (stage 6) flattens each merged token slot-major to `kh·kw·D`, then:
        `Linear(kh·kw·D → kh·kw·D) → GELU (exact erf) → Linear(→ T) → rmsnorm(eps = projector_ln_eps)`.
        No biases, no pre-norm. The output rows are the image tokens the language model reads.

        **Pitfalls other ports hit:** wrong merge order (slot order, or rows and columns swapped); the tanh
        GELU of the encoder used here (the projector's is the exact erf one); the encoder's eps in the final
        norm. The kernels are one gather (`kernels/merge.py`) and, for the projector, the GEMM and RMSNorm
        kernels of notebooks 01 and 02 — the erf GELU is a GEMM epilogue.
        """),
        setup_cell("""
        import inspect
        from pathlib import Path

        import numpy as np
        from IPython.display import Markdown, display
        from matplotlib.figure import Figure
        from numba import cuda

        from moonvit_kernels import reference
        from moonvit_kernels.config import FP32_EPS, VisionConfig
        from moonvit_kernels.kernels import merge as merge_module
        from moonvit_kernels.kernels.gemm import gemm
        from moonvit_kernels.kernels.launch import item_table
        from moonvit_kernels.kernels.merge import merge_gather
        from moonvit_kernels.kernels.rmsnorm import rmsnorm
        from moonvit_kernels.viz import error_heatmap, merge_index_map, merge_index_table
        from moonvit_kernels.viz_stages import flop_table, markdown_table, merged_to_grid
        from moonvit_kernels.weights import load_checkpoint, random_weights

        DATA = Path("..") / "data"
        rng = np.random.default_rng(0)
        on_gpu = gpu_available() and not simulator_enabled()
        """),
        md("""
        ## Which source patch lands in which merged slot

        `viz.merge_index_map` runs the reference merge on the patch numbers themselves and shows, for every
        patch of a 6×8 grid, the merged token it joins (left) and its slot inside it (right): 2×2 squares,
        numbered row by row; inside each, slots 0 1 / 2 3.
        """),
        code("""
        merge_index_map(6, 8)
        """),
        md("""
        ## Sizes

        On a GPU: K3 (`D = 1024`, `T = 7168`) with random weights, an 896×896 image packed with a 4-frame
        448×448 video. On the simulator: the bundled tiny checkpoint (`D = 32`, `T = 40`) and its inputs, a
        6×8 image and a 2-frame 4×4 video.
        """),
        code("""
        if on_gpu:
            config = VisionConfig.k3()
            weights = random_weights(config.replace(vt_num_hidden_layers=0), seed=0)  # the projector is what we need
            grid_thws = np.array([[1, 64, 64], [4, 32, 32]])
            L = int(np.prod(grid_thws, axis=1).sum())
            x = rng.standard_normal((L, config.vt_hidden_size)).astype(np.float32)  # stands in for final_norm
        else:
            config, weights = load_checkpoint(DATA / "tiny")
            inputs = np.load(DATA / "tiny" / "inputs.npz")
            grid_thws = inputs["grid_thws"]
            _, stages = reference.vision_forward(inputs["pixel_values"], grid_thws, weights, config, return_intermediates=True)
            x = stages["final_norm"]
        L, D = x.shape
        kh, kw = config.merge_kernel_size
        M = int(sum((h // kh) * (w // kw) for _, h, w in grid_thws.tolist()))
        print(f"{where()}: x [{L}, {D}], items {grid_thws.tolist()}")
        print(f"merged [{M}, {kh * kw * D}] -> projected [{M}, {config.text_hidden_size}]")
        """),
        md("""
        ## The NumPy reference
        """),
        code("""
        print(inspect.getsource(reference.tpool_patch_merger))
        print(inspect.getsource(reference.projector))
        """),
        md("""
        ## The merge kernel: `moonvit_kernels/kernels/merge.py`

        One block per merged token. The block finds its media item in a small int32 table
        (`launch.item_table`: `t, h, w`, first token, first merged token per item), and each thread owns
        output columns `slot·D + d`: it sums the `t` frames of the source patch and divides by `t`. The output
        is already the row-major `[M, kh·kw·D]` input of the projector's first GEMM — no reshape, no copy.
        """),
        code("""
        items = item_table(grid_thws, (kh, kw))
        print("item table (t, h, w, token_offset, merged_offset):", items.tolist())
        print(inspect.getsource(merge_module.merge_gather_kernel.py_func))
        """),
        md("""
        ## Check the merge against NumPy

        A gather and a mean of at most 4 values: the result must match the float64 reference to a few fp32
        roundings. Random data first (awkward width `D = 5`, an image, a 3-frame video and a tall item), then
        the model's own `final_norm` tokens.
        """),
        code("""
        awkward_grid = np.array([[1, 4, 6], [3, 2, 4], [1, 6, 2]])
        xr = rng.standard_normal((int(np.prod(awkward_grid, axis=1).sum()), 5)).astype(np.float32)
        for name, (xs, grid) in {"random, D = 5": (xr, awkward_grid), "final_norm tokens": (x, grid_thws)}.items():
            got = merge_gather(xs, item_table(grid, (kh, kw)), (kh, kw)).copy_to_host()
            want = np.concatenate([m.reshape(m.shape[0], -1)
                                   for m in reference.tpool_patch_merger(xs.astype(np.float64), grid, (kh, kw))])
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
            print(f"{name:18s} merged {got.shape}: max error {np.abs(got - want).max():.1e}")
        merged = got
        """),
        md("""
        ## Pictures: the temporal mean and the slot order

        Feed the kernel "tokens" we can look at: each patch's mean colour (`D = 3`). Laying the merged tokens
        back on the grid (`viz_stages.merged_to_grid`) must give the image back, and for the video the mean of
        its frames. A port with rows and columns swapped inside the merged token (slot `b·kh + a` instead of
        `a·kw + b`) scrambles each 2×2 block:
        """),
        code("""
        pv = np.load(DATA / "tiny" / "inputs.npz")["pixel_values"]
        tiny_grid = np.array([[1, 6, 8], [2, 4, 4]])
        colours = np.ascontiguousarray(pv.mean(axis=(2, 3)) * 0.5 + 0.5, dtype=np.float32)  # [L, 3] in [0, 1]
        merged_colours = merge_gather(colours, item_table(tiny_grid, (2, 2)), (2, 2)).copy_to_host()

        fig = Figure(figsize=(11, 4.6), layout="constrained")
        axes = fig.subplots(2, 4)
        start, m0 = 0, 0
        for row, (t, h, w) in enumerate(tiny_grid.tolist()):
            frames = colours[start : start + t * h * w].reshape(t, h, w, 3)
            m = merged_colours[m0 : m0 + (h // 2) * (w // 2)]
            good = merged_to_grid(m, h, w)
            swapped = m.reshape(-1, 2, 2, 3).transpose(0, 2, 1, 3).reshape(m.shape)  # slot b·kh + a
            assert np.allclose(good, frames.mean(axis=0), atol=1e-6)
            panels = [(f"frame {f}", frames[f]) for f in range(t)] + [("", None)] * (2 - t)
            panels += [("merged (mean over frames)", good), ("slots transposed: wrong", merged_to_grid(swapped, h, w))]
            for ax, (title, img) in zip(axes[row], panels, strict=True):
                ax.set_axis_off()
                if img is not None:
                    ax.imshow(np.clip(img, 0, 1), interpolation="nearest")
                    ax.set_title(f"item {row}: {title}", fontsize=8)
            start, m0 = start + t * h * w, m0 + len(m)
        fig
        """),
        md("""
        ## The projector from kernels

        `merged @ proj.0ᵀ` with the erf-GELU epilogue, `@ proj.2ᵀ`, then RMSNorm with `projector_ln_eps` — three
        launches, checked step by step against the reference in float64.
        """),
        code("""
        merged_d = cuda.to_device(np.ascontiguousarray(merged, dtype=np.float32))
        w0, w2 = weights["mm_projector.proj.0.weight"], weights["mm_projector.proj.2.weight"]
        post = weights["mm_projector.post_norm.weight"]
        h_d = gemm(merged_d, w0, epilogue="gelu_erf")
        y_d = gemm(h_d, w2)
        out = rmsnorm(y_d, post, config.projector_ln_eps).copy_to_host()

        m64 = merged.astype(np.float64)
        h64 = reference.gelu_erf(m64 @ w0.astype(np.float64).T)
        y64 = h64 @ w2.astype(np.float64).T
        want = reference.projector(m64, {k: v.astype(np.float64) for k, v in weights.items()}, config)
        rows = []
        for name, got_d, ref in (("proj.0 + GELU(erf)", h_d, h64), ("proj.2", y_d, y64), ("post_norm", out, want)):
            got = got_d if isinstance(got_d, np.ndarray) else got_d.copy_to_host()
            rel = np.abs(got - ref).max() / np.abs(ref).max()
            assert np.all(np.isfinite(got)) and rel < 8 * FP32_EPS * np.sqrt(w0.shape[1]), (name, rel)
            rows.append([name, str(got.shape), rel])
        display(Markdown(markdown_table(["step", "shape", "max rel. error vs float64"], rows)))
        """),
        code("""
        error_heatmap(out, want, title="projector output (kernels) vs float64 reference")
        """),
        md("""
        ## The pitfalls, measured

        Each line is a plausible port with one mistake, compared with the reference projector output:
        """),
        code("""
        def projector_port(merged, gelu, eps):
            y = gelu(merged @ w0.astype(np.float64).T) @ w2.astype(np.float64).T
            return reference.rmsnorm(y, post.astype(np.float64), eps)


        def swap_slots(a):  # rows and columns swapped inside each merged token
            return a.reshape(a.shape[0], kh, kw, -1).transpose(0, 2, 1, 3).reshape(a.shape)


        ports = {
            "tanh GELU (the encoder's) in the projector": projector_port(m64, reference.gelu_tanh, config.projector_ln_eps),
            "encoder eps in the post norm": projector_port(m64, reference.gelu_erf, config.vit_norm_eps),
            "merge slots transposed": projector_port(swap_slots(m64), reference.gelu_erf, config.projector_ln_eps),
        }
        for name, y in ports.items():
            print(f"{name:44s} max rel. difference {np.abs(y - want).max() / np.abs(want).max():.1e}")
        """),
        md("""
        The eps difference is small at these activation sizes (the projector's rows have RMS ≫ √eps) —
        a reminder that a test passing on one input proves little: the RMSNorm notebook shows where it bites.
        """),
        md("""
        ## Exercises

        Each exercise cell holds a worked answer; replace it with your own and rerun — the `assert` checks it.

        **1.** On a 6×8 patch grid, which source patch (row-major index) sits in merged token 5, slot 3?
        """),
        code("""
        i, j = divmod(5, 8 // 2)  # merged token 5 = (i, j) on the 3×4 merged grid
        a, b = divmod(3, 2)  # slot 3 = (a, b) inside the 2×2 block
        patch_answer = (2 * i + a) * 8 + (2 * j + b)  # worked answer

        merged_of, slot_of = merge_index_table(6, 8)
        assert (merged_of.ravel()[patch_answer], slot_of.ravel()[patch_answer]) == (5, 3)
        print("patch", patch_answer)
        """),
        md("""
        **2.** The projector's FLOPs per merged token, in terms of `K = kh·kw·D` and `T` (K3 numbers).
        """),
        code("""
        k3 = VisionConfig.k3()
        K, T = k3.merged_hidden_size, k3.text_hidden_size
        per_token_answer = 2 * K * K + 2 * K * T  # worked answer

        assert per_token_answer == flop_table(k3, [[1, 2, 2]])[3].count  # a 2×2 grid has one merged token
        print(f"{per_token_answer / 1e6:.1f} MFLOP per output token")
        """),
        md("""
        **3.** A 4-frame video whose frames are all the same: is its merged output that of the single frame?
        Run the kernel on both and compare.
        """),
        code("""
        frame = rng.standard_normal((4 * 6, 7)).astype(np.float32)
        video = np.ascontiguousarray(np.tile(frame, (4, 1)))
        as_video = merge_gather(video, item_table([[4, 4, 6]], (2, 2)), (2, 2)).copy_to_host()
        as_image = merge_gather(frame, item_table([[1, 4, 6]], (2, 2)), (2, 2)).copy_to_host()
        same_answer = True  # worked answer: the mean of equal frames is the frame

        assert same_answer == bool(np.allclose(as_video, as_image, rtol=1e-6, atol=1e-6))
        print("identical frames merge like one image:", same_answer)
        """),
    ]


# ============================================================================ 06 full encoder
def full_encoder_notebook() -> list[nbformat.NotebookNode]:
    return [
        md("""
        # 06 — The full encoder: every kernel together, compared stage by stage

        `MoonViT(config, weights, backend=...)` assembles the stages of the previous notebooks:
        `"numpy"` is the reference (CPU), `"numba"` runs the numba.cuda kernels (a GPU, or the simulator),
        `"cupy"` the CUDA C kernels (GPU only), `"auto"` picks CuPy on a GPU and NumPy otherwise. With
        `return_intermediates=True` every backend returns the same stage dict — `patch_embed`, `pos_emb`,
        `layer_0 …`, `final_norm`, `merged`, `projected` — so `compare.compare_stages` can say **where** a
        port first goes wrong, not just that its output differs.

        This notebook: the one stage without its own notebook (the position embedding), then the assembled
        model, its stage-by-stage comparison against a float64 reference (table and plot), how the
        comparison pinpoints a bug, and timings labelled with where they ran.
        """),
        setup_cell("""
        import time
        from pathlib import Path

        import numpy as np
        from IPython.display import Markdown, display
        from numba import cuda

        from moonvit_kernels import backend_numba, reference
        from moonvit_kernels.compare import compare_stages, tolerance_for
        from moonvit_kernels.config import VisionConfig
        from moonvit_kernels.kernels.launch import item_table
        from moonvit_kernels.kernels.pos_emb import add_position_embedding, time_table
        from moonvit_kernels.model import MoonViT, cupy_importable
        from moonvit_kernels.preprocess import patchify, unpatchify
        from moonvit_kernels.viz_stages import (
            flop_table,
            markdown_table,
            median_seconds,
            plot_position_grids,
            plot_stage_report,
            plot_timings,
        )
        from moonvit_kernels.weights import load_checkpoint, random_weights

        DATA = Path("..") / "data"
        rng = np.random.default_rng(0)
        on_gpu = gpu_available() and not simulator_enabled()
        """),
        md("""
        ## Sizes

        On the simulator a whole forward pass launches ~30 kernels, each one Python thread per CUDA thread, so
        the bundled tiny checkpoint runs on a cropped copy of its inputs: the top 2×4 patches of the image and
        the top-left 2×2 of both video frames (16 tokens). On a GPU: K3's dimensions with random weights, the
        first 4 of its 27 layers (so that the float64 NumPy reference stays quick), on a 448×448 image packed
        with a 4-frame 224×224 video chunk (2048 tokens).
        """),
        code("""
        if on_gpu:
            config = VisionConfig.k3().replace(vt_num_hidden_layers=4)
            weights = random_weights(config, seed=0)
            grid_thws = np.array([[1, 32, 32], [4, 16, 16]])
            L = int(np.prod(grid_thws, axis=1).sum())
            pixel_values = rng.uniform(-1, 1, (L, 3, config.patch_size, config.patch_size)).astype(np.float32)
        else:
            config, weights = load_checkpoint(DATA / "tiny")
            inputs = np.load(DATA / "tiny" / "inputs.npz")
            pv, p = inputs["pixel_values"], config.patch_size
            image = unpatchify(pv[:48], (1, 6, 8))[:, : 2 * p, : 4 * p]  # top 2×4 patches
            video = unpatchify(pv[48:], (2, 4, 4))[:, : 2 * p, : 2 * p]  # top-left 2×2 of each frame
            (a, grid_a), (b, grid_b) = patchify(np.ascontiguousarray(image), p), patchify(np.ascontiguousarray(video), p)
            pixel_values, grid_thws = np.concatenate([a, b]), np.array([grid_a, grid_b])
        L = pixel_values.shape[0]
        print(f"{where()}: {config.vt_num_hidden_layers} layers, D = {config.vt_hidden_size}, items {grid_thws.tolist()}, L = {L}")
        """),
        md("""
        ## The position embedding (SPEC.md, stage 2)

        The checkpoint holds a learned `H0 × W0` grid (64×64 in K3, 6×6 in the tiny model). An item of `h × w`
        patches gets the grid resized to `h × w` — `F.interpolate(mode="bilinear", align_corners=False)`:
        source coordinate `s = (d + 0.5)·(in/out) − 0.5`, clamped; same size is exactly the identity. A video
        frame `f` also gets the sin/cos row `time[f]` (computed, never stored; frame 0 gets +1 on the cos
        half, an image nothing). Pitfalls: the half-pixel offset, and the bicubic coefficient (−0.75, not −0.5).
        One channel of the tiny model's grid, as learned and resized to this run's items:
        """),
        code("""
        pos_weight = weights["vision_tower.patch_embed.pos_emb.weight"]
        plot_position_grids(pos_weight, [(6, 8), (2, 4), (2, 2)] if not on_gpu else [(32, 32), (16, 16)], channel=0)
        """),
        md("""
        The kernel (`kernels/pos_emb.py`, one block per token, adding in place) against the reference, on
        random tokens:
        """),
        code("""
        x = rng.standard_normal((L, config.vt_hidden_size)).astype(np.float32)
        table = time_table(config.vt_hidden_size, config.init_pos_emb_time)
        got = add_position_embedding(x.copy(), pos_weight, table, item_table(grid_thws)).copy_to_host()
        want = reference.add_position_embedding(x.astype(np.float64), grid_thws, pos_weight.astype(np.float64), config)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        print(f"position embedding kernel: max error {np.abs(got - want).max():.1e}")
        """),
        md("""
        ## The assembled model

        The numba backend keeps activations on the device from the patch GEMM to the projector's norm;
        residual additions are fused into the GEMMs (`x = o·woᵀ + x` in one launch), RoPE works in place in the
        `qkv` buffer. Its stage order, from the module:
        """),
        code("""
        print(backend_numba.__doc__)
        """),
        code("""
        models = {
            "numpy float64": MoonViT(config, weights, backend="numpy", dtype="float64"),
            "numpy float32": MoonViT(config, weights, backend="numpy"),
            "numba": MoonViT(config, weights, backend="numba"),
        }
        if on_gpu and cupy_importable():
            models["cupy float32"] = MoonViT(config, weights, backend="cupy", dtype="float32")
            models["cupy bfloat16"] = MoonViT(config, weights, backend="cupy", dtype="bfloat16")

        runs, first_seconds = {}, {}
        for name, model in models.items():
            start = time.perf_counter()
            outputs, stages = model.forward(pixel_values, grid_thws, return_intermediates=True, as_numpy=True)
            first_seconds[name] = time.perf_counter() - start
            runs[name] = (outputs, stages)
            print(f"{name:14s} outputs {[tuple(o.shape) for o in outputs]}  first call {first_seconds[name]:8.2f} s")
        """),
        md("""
        ## Stage by stage: numba against the float64 reference

        For each stage: max abs error, relative error `max|a − b| / max|b|`, and the tolerance. The tolerance
        grows by 1.15× per stage (`compare.tolerance_for`) because every layer adds rounding — a fixed bound
        would flag the late stages of a correct port. The float32 NumPy reference shows how much of the
        difference is plain fp32 rounding.
        """),
        code("""
        reference64 = runs["numpy float64"][1]
        compute_dtype = {name: "bfloat16" if "bfloat16" in name else "float32" for name in models}
        reports = {
            name: compare_stages(runs[name][1], reference64, dtype=compute_dtype[name], names=(name, "numpy float64"))
            for name in models
            if name != "numpy float64"
        }
        print(reports["numba"].table())
        rows = [[s.stage, str(s.shape)] + [reports[n].rows[i].max_rel for n in reports] + [s.tolerance, s.ok]
                for i, s in enumerate(reports["numba"].rows)]
        display(Markdown(markdown_table(["stage", "shape", *(f"{n}: rel. error" for n in reports), "fp32 tolerance", "numba ok"], rows)))
        assert reports["numba"].ok, reports["numba"].first_divergence
        """),
        code("""
        plot_stage_report(reports["numba"], title=f"numba ({where()}) vs numpy float64, stage by stage")
        """),
        md("""
        ## What a bug looks like in this report

        A port with one mistake — here `fc1` of block 1 loaded 1% too large (a wrong scale, a bf16 mishap) —
        run through the same comparison. Everything before `layer_1` is exact to rounding; the report names the
        first stage beyond tolerance, which is where to start looking.
        """),
        code("""
        broken = dict(weights)
        name = "vision_tower.encoder.blocks.1.mlp.fc1.weight" if config.vt_num_hidden_layers > 1 else "mm_projector.proj.2.weight"
        broken[name] = weights[name] * 1.01
        _, broken_stages = MoonViT(config, broken, backend="numpy").forward(pixel_values, grid_thws, return_intermediates=True)
        report = compare_stages(broken_stages, reference64, names=("numpy, fc1 of block 1 off by 1%", "numpy float64"))
        print(report.table())
        plot_stage_report(report)
        """),
        md("""
        ## Time, labelled with where it ran

        The NumPy reference always runs on the CPU; the numba backend runs on `where()`. On the simulator
        the numba time measures Python threads: it says nothing about GPU speed. On a GPU the first call
        compiles every kernel, so the GPU backends are timed after a warm-up, median of several calls.
        """),
        code("""
        seconds = {}
        for name, model in models.items():
            place = "CPU" if name.startswith("numpy") else where()
            if on_gpu and not name.startswith("numpy"):
                if name == "numba":
                    sync = cuda.synchronize
                else:
                    import cupy

                    sync = cupy.cuda.Device().synchronize
                t = median_seconds(lambda model=model: model.forward(pixel_values, grid_thws), 5, 1, sync)["median"]
            else:
                t = first_seconds[name]  # includes returning the intermediates
            seconds[f"{name} ({place})"] = t
        total_flops = sum(r.count for r in flop_table(config, grid_thws))
        for label, sec in seconds.items():
            print(f"{label:40s} {sec * 1e3:10.1f} ms  {total_flops / sec / 1e12:10.4g} TFLOP/s")
        print(f"({total_flops:,} FLOP per forward, from SPEC.md's cost formulas)")
        plot_timings(seconds, f"{where()} and CPU", unit="ms", title="one forward pass")
        """),
        md("""
        ## Exercises

        Each exercise cell holds a worked answer; replace it with your own and rerun — the `assert` checks it.

        **1.** Break the model yourself: scale one weight by 1.01 and predict the first stage the report will
        flag. (Worked answer: the final norm's weight only affects `final_norm` and later.)
        """),
        code("""
        weight_to_break = "vision_tower.encoder.final_layernorm.weight"  # worked answer
        predicted_first_divergence = "final_norm"

        broken = {**weights, weight_to_break: weights[weight_to_break] * 1.01}
        _, s = MoonViT(config, broken, backend="numpy").forward(pixel_values, grid_thws, return_intermediates=True)
        assert compare_stages(s, reference64).first_divergence == predicted_first_divergence
        print("first divergence:", predicted_first_divergence)
        """),
        md("""
        **2.** The tolerance of stage `k` (0-based, in the reference's order) is `base · 1.15**k`. What is the
        tolerance of `final_norm` for a float32 backend?
        """),
        code("""
        base, growth = tolerance_for("float32")
        k = list(reference64).index("final_norm")
        tolerance_answer = base * growth**k  # worked answer

        assert np.isclose(tolerance_answer, next(r.tolerance for r in reports["numba"].rows if r.stage == "final_norm"))
        print(f"final_norm is stage {k}: tolerance {tolerance_answer:.2e}")
        """),
        md("""
        **3.** The full K3 tower on one 896×896 image: how long would it take at the H200's ≈ 790 TFLOP/s dense
        bf16 peak? (SPEC.md calls it the physical floor.)
        """),
        code("""
        k3 = VisionConfig.k3()
        floor_ms_answer = sum(r.count for r in flop_table(k3, [[1, 64, 64]])) / 790e12 * 1e3  # worked answer

        assert 7.0 < floor_ms_answer < 8.5  # SPEC.md: ≈ 7.7 ms
        print(f"{floor_ms_answer:.2f} ms")
        """),
    ]


# ============================================================================ registry and main
NOTEBOOKS: dict[str, Callable[[], list[nbformat.NotebookNode]]] = {
    "00_tour": tour,
    "01_patch_embed_gemm": patch_embed_gemm,
    "02_rmsnorm": rmsnorm_notebook,
    "03_rope_2d": rope_notebook,
    "04_attention": attention_notebook,
    "05_merge_and_projector": merge_projector_notebook,
    "06_full_encoder": full_encoder_notebook,
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
