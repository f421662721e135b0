"""What a run measures, and how long each section may take: the full run, `--quick`, `--simulate`.

On a GPU the sizes are the real K3 ones (D = 1024, 12 heads of 128, I = 4096): kernels at
L = 1024 and 4096 tokens (a 448² and an 896² image), the tower on a 448² image, an 896² image
and a packed batch of 8 images of 448²; on an sm_90 GPU the Hopper kernels (gemm_bf16_sm90 at
BN 128 and 256 on the encoder GEMMs, flash_attn_sm90) are timed beside the mma.sync ones.
Under `--simulate` everything runs on the CPU (numba's CUDA simulator, the CUDA C emulator and its
Hopper emulator), so the same pipeline runs on `VisionConfig.tiny()` and grids of a few patches;
those numbers time the simulator, never a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import VisionConfig

SECTION_NAMES = ("tests", "kernels", "tower")
BACKENDS = ("numba", "cuda")
SECTION_ALIASES = {"a": "tests", "b": "kernels", "c": "tower"}


@dataclass(frozen=True)
class Plan:
    simulate: bool
    quick: bool
    kernel_config: VisionConfig
    kernel_grids: tuple[tuple[int, int, int], ...]  # one single-item grid per kernel size
    repeats: int
    warmup: int
    seconds_per_item: float  # timed calls are capped to about this much time per measurement
    numba_gemm_shapes: tuple[str, ...]
    cuda_gemm_shapes: tuple[str, ...]
    v1_threads: int | None  # attention v1 block size (None: the launcher's default)
    tower_config: VisionConfig
    tower_cases: tuple[tuple[str, tuple[tuple[int, int, int], ...]], ...]
    tower_check_layers: int
    tower_repeats: int
    tower_warmup: int
    numba_tower_cases: int  # the numba tower runs on the first this-many cases
    budgets: dict[str, float]  # seconds per section; a section stops starting items once its budget is spent,
    # so it can overrun by one item (one kernel measurement, one backend on one tower case)
    total_budget: float
    test_files: tuple[str, ...] = ("tests/test_numba_gpu.py", "tests/test_cupy_gpu.py")
    backends: tuple[str, ...] = BACKENDS  # which kernel families sections (b) and (c) run
    # the Hopper kernels (sm_90 devices; the emulator under --simulate), beside the CUDA C ones in (b)
    hopper_gemm_shapes: tuple[str, ...] = ()
    hopper_block_ns: tuple[int, ...] = (128, 256)

    def tokens(self, grid: tuple[tuple[int, int, int], ...]) -> int:
        return int(sum(t * h * w for t, h, w in grid))


ALL_GEMMS = ("patch_embed", "qkv", "wo+residual", "fc0+gelu_tanh", "fc1+residual", "proj0+gelu_erf", "proj2")
ENCODER_GEMMS = ("qkv", "wo+residual", "fc0+gelu_tanh", "fc1+residual")


def make_plan(simulate: bool, quick: bool, budget_s: float | None = None) -> Plan:
    """The plan for a mode; `budget_s` caps the whole run (sections share it in proportion)."""
    if simulate:
        plan = Plan(
            simulate=True,
            quick=quick,
            kernel_config=VisionConfig.tiny(),
            kernel_grids=((1, 2, 4),),
            repeats=1,
            warmup=0,
            seconds_per_item=5.0,
            numba_gemm_shapes=("wo+residual",),
            cuda_gemm_shapes=ALL_GEMMS,
            v1_threads=32,
            tower_config=VisionConfig.tiny().replace(vt_num_hidden_layers=1),  # the simulator takes ~10 s a layer
            tower_cases=(
                ("image 2x4 patches (stands in for 448²)", ((1, 2, 4),)),
                ("image 4x4 patches (stands in for 896²)", ((1, 4, 4),)),
                ("packed 3 images of 2x2 patches (stands in for 8 x 448²)", ((1, 2, 2),) * 3),
            ),
            tower_check_layers=1,
            tower_repeats=1,
            tower_warmup=0,
            numba_tower_cases=1,
            budgets={"tests": 120.0, "kernels": 240.0, "tower": 240.0},
            total_budget=600.0,
            hopper_gemm_shapes=("qkv", "wo+residual"),
        )
    elif quick:
        plan = Plan(
            simulate=False,
            quick=True,
            kernel_config=VisionConfig.k3(),
            kernel_grids=((1, 32, 32),),
            repeats=5,
            warmup=1,
            seconds_per_item=0.5,
            numba_gemm_shapes=("qkv", "fc1+residual"),
            cuda_gemm_shapes=ALL_GEMMS,
            v1_threads=None,
            tower_config=VisionConfig.k3(),
            tower_cases=(
                ("image 448² (32x32 patches)", ((1, 32, 32),)),
                ("image 896² (64x64 patches)", ((1, 64, 64),)),
                ("packed 8 images of 448²", ((1, 32, 32),) * 8),
            ),
            tower_check_layers=2,
            tower_repeats=2,
            tower_warmup=1,
            numba_tower_cases=3,
            budgets={"tests": 35.0, "kernels": 45.0, "tower": 55.0},  # + ~45 s of slack: imports, overruns
            total_budget=145.0,
            hopper_gemm_shapes=("qkv", "fc1+residual"),
        )
    else:
        plan = Plan(
            simulate=False,
            quick=False,
            kernel_config=VisionConfig.k3(),
            kernel_grids=((1, 32, 32), (1, 64, 64)),
            repeats=20,
            warmup=2,
            seconds_per_item=1.0,
            numba_gemm_shapes=ENCODER_GEMMS,
            cuda_gemm_shapes=ALL_GEMMS,
            v1_threads=None,
            tower_config=VisionConfig.k3(),
            tower_cases=(
                ("image 448² (32x32 patches)", ((1, 32, 32),)),
                ("image 896² (64x64 patches)", ((1, 64, 64),)),
                ("packed 8 images of 448²", ((1, 32, 32),) * 8),
            ),
            tower_check_layers=4,
            tower_repeats=3,
            tower_warmup=1,
            numba_tower_cases=3,
            # kernels: + 20 s for the Hopper rows (sm_90 only: a subprocess self-check, 16 GEMM + 2 attention rows)
            budgets={"tests": 120.0, "kernels": 150.0, "tower": 140.0},  # + ~70 s of slack under 8 min
            total_budget=420.0,
            hopper_gemm_shapes=ENCODER_GEMMS,
        )
    if budget_s is not None:
        if budget_s <= 0:
            raise ValueError(f"--budget-s must be positive, got {budget_s}")
        scale = min(1.0, budget_s / plan.total_budget)
        plan = _replace(plan, budgets={k: v * scale for k, v in plan.budgets.items()}, total_budget=budget_s)
    return plan


def _replace(plan: Plan, **changes: object) -> Plan:
    import dataclasses

    return dataclasses.replace(plan, **changes)


def parse_sections(text: str) -> tuple[str, ...]:
    """`"a,c"` or `"tests,tower"` -> the section names, in report order; ValueError names an unknown one."""
    chosen = set()
    for part in text.split(","):
        name = SECTION_ALIASES.get(part.strip().lower(), part.strip().lower())
        if name not in SECTION_NAMES:
            raise ValueError(f"unknown section {part.strip()!r}; choose from a/tests, b/kernels, c/tower")
        chosen.add(name)
    return tuple(n for n in SECTION_NAMES if n in chosen)


def parse_backends(text: str) -> tuple[str, ...]:
    """`"numba,cuda"` -> the kernel families to run; ValueError names an unknown one."""
    chosen = {part.strip().lower() for part in text.split(",") if part.strip()}
    unknown = chosen - set(BACKENDS)
    if unknown or not chosen:
        raise ValueError(f"unknown backend {', '.join(sorted(unknown)) or '(none)'}; choose from numba, cuda")
    return tuple(b for b in BACKENDS if b in chosen)


def grids_for_tokens(tokens: list[int]) -> tuple[tuple[int, int, int], ...]:
    """Square single-image grids for token counts (L = side², side even so that the 2x2 merge applies)."""
    grids = []
    for L in tokens:
        side = int(round(L**0.5))
        if side * side != L or side % 2:
            raise ValueError(f"--tokens {L} is not the square of an even side (e.g. 1024 = 32², 4096 = 64²)")
        grids.append((1, side, side))
    return tuple(grids)


def grid_array(grid: tuple[tuple[int, int, int], ...]) -> np.ndarray:
    return np.array(grid, dtype=np.int64)
