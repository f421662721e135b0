"""What a run measures, in which order, and how long each part may take: the full run, `--quick`, `--simulate`.

On a GPU the sizes are the real K3 ones (D = 1024, 12 heads of 128, I = 4096): kernels at
L = 1024 and 4096 tokens (a 448² and an 896² image), the tower on a 448² image, an 896² image
and a packed batch of 8 images of 448²; on an sm_90 GPU the Hopper kernels (gemm_bf16_sm90 at
BN 128 and 256 on the encoder GEMMs, flash_attn_sm90) are timed beside the mma.sync ones, after
their pre-flight. Under `--simulate` everything runs on the CPU (numba's CUDA simulator, the CUDA C
emulator and its Hopper emulator), so the same pipeline runs on `VisionConfig.tiny()` and grids of a
few patches; those numbers time the simulator, never a GPU.

Work is cut into units (`units_for`), each run by a worker process of its own (`worker.py`): the
machine description (and the measured peaks, with the kernels section), the pytest tier, then per
kernel family (CUDA C, the Hopper pre-flight, Hopper, numba) and per tower backend. The order is
CUDA C, then Hopper, then numba, so that a run cut short has measured the kernels that matter most.

Time limits (seconds; see benchmarks/gpu_check_budget.md for how the GPU numbers were sized):
  budgets            per section: a worker starts no item once its section's budget is spent
  total_budget       the watchdog: the run stops (the running item is killed: TIMEOUT) at this time
  item_timeout_s     one kernel item (its first-use build, check and timing) -> TIMEOUT when exceeded
  tower_item_timeout_s   one tower case for one backend
  startup_timeout_s  a worker's imports and set-up before its first item
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from moonvit_kernels.config import VisionConfig

SECTION_NAMES = ("tests", "kernels", "tower")
BACKENDS = ("cuda", "hopper", "numba")  # the order kernel families run in
SECTION_ALIASES = {"a": "tests", "b": "kernels", "c": "tower"}


@dataclass(frozen=True)
class Plan:
    simulate: bool
    quick: bool
    kernel_config: VisionConfig
    kernel_grids: tuple[tuple[int, int, int], ...]  # one single-item grid per kernel size
    repeats: int  # warm windows per kernel
    warmup: int
    inner: int  # calls per warm window (between one pair of events)
    cold_repeats: int  # single calls after an L2 flush
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
    budgets: dict[str, float]  # seconds per section
    total_budget: float  # the watchdog
    item_timeout_s: float
    tower_item_timeout_s: float
    startup_timeout_s: float
    preflight_timeout_s: float
    # CuPy first; each stage file (tests/stages) holds its kernels' gpu tests, CuPy before numba
    test_files: tuple[str, ...] = ("tests/test_cupy_gpu.py", "tests/stages", "tests/test_numba_gpu.py")
    backends: tuple[str, ...] = BACKENDS  # which kernel families sections (b) and (c) run
    hopper_gemm_shapes: tuple[str, ...] = ()
    hopper_block_ns: tuple[int, ...] = (128, 256)
    # the numba versions timed: every one the registry has (a quick run: the newest)
    numba_gemm_versions: tuple[int, ...] = dataclasses.field(default_factory=lambda: every_version("gemm"))
    numba_attention_versions: tuple[int, ...] = dataclasses.field(default_factory=lambda: every_version("attention"))
    torch_tower_baseline: bool = True
    only: tuple[str, ...] = ()  # item-name substrings to keep (empty: all)

    def tokens(self, grid: tuple[tuple[int, int, int], ...]) -> int:
        return int(sum(t * h * w for t, h, w in grid))

    def wanted(self, item: str) -> bool:
        """True when item `item` is run (`--only`)."""
        return not self.only or any(o in item for o in self.only)


ALL_GEMMS = ("patch_embed", "qkv", "wo+residual", "fc0+gelu_tanh", "fc1+residual", "proj0+gelu_erf", "proj2")
ENCODER_GEMMS = ("qkv", "wo+residual", "fc0+gelu_tanh", "fc1+residual")
K3_TOWER_CASES = (
    ("image 448² (32x32 patches)", ((1, 32, 32),)),
    ("image 896² (64x64 patches)", ((1, 64, 64),)),
    ("packed 8 images of 448²", ((1, 32, 32),) * 8),
)


def every_version(stage: str) -> tuple[int, ...]:
    """The numba versions of `stage` in the kernel registry (v1, v2, ...), oldest first."""
    from moonvit_kernels import registry

    return registry.versions("numba", stage)


def _simulated_plan(quick: bool) -> Plan:
    """The plan under --simulate: the tiny config on grids of a few patches (the CPU times the simulator)."""
    tiny = VisionConfig.tiny()
    return Plan(
        simulate=True,
        quick=quick,
        kernel_config=tiny,
        kernel_grids=((1, 2, 4),),
        repeats=1,
        warmup=0,
        inner=1,
        cold_repeats=0,
        seconds_per_item=5.0,
        numba_gemm_shapes=("wo+residual",),
        cuda_gemm_shapes=("qkv", "wo+residual", "proj2") if quick else ALL_GEMMS,
        v1_threads=32,
        tower_config=tiny.replace(vt_num_hidden_layers=1),  # one layer: a few seconds of the simulator
        tower_cases=(
            ("image 2x4 patches (stands in for 448²)", ((1, 2, 4),)),
            ("image 4x4 patches (stands in for 896²)", ((1, 4, 4),)),
            ("packed 3 images of 2x2 patches (stands in for 8 x 448²)", ((1, 2, 2),) * 3),
        )[: 1 if quick else 3],
        tower_check_layers=1,
        tower_repeats=1,
        tower_warmup=0,
        numba_tower_cases=1,
        budgets={"tests": 120.0, "kernels": 240.0, "tower": 240.0},
        total_budget=600.0,
        item_timeout_s=120.0,
        tower_item_timeout_s=180.0,
        startup_timeout_s=120.0,  # a first emulator build takes ~15-60 s of a busy CPU
        preflight_timeout_s=150.0,
        hopper_gemm_shapes=("qkv",) if quick else ("qkv", "wo+residual"),
        numba_gemm_versions=every_version("gemm")[-1:] if quick else every_version("gemm"),
        numba_attention_versions=every_version("attention")[-1:] if quick else every_version("attention"),
        torch_tower_baseline=not quick,
    )


def _gpu_plan(quick: bool) -> Plan:
    """The plan on a GPU: K3 sizes; `quick` (one kernel size, fewer repeats) fits a 6-minute lease, the full run
    a 9-minute one."""
    k3 = VisionConfig.k3()
    return Plan(
        simulate=False,
        quick=quick,
        kernel_config=k3,
        kernel_grids=((1, 32, 32),) if quick else ((1, 32, 32), (1, 64, 64)),
        repeats=5 if quick else 10,
        warmup=2,
        inner=10 if quick else 20,
        cold_repeats=5 if quick else 10,
        seconds_per_item=0.5 if quick else 1.0,
        numba_gemm_shapes=("qkv", "fc1+residual") if quick else ENCODER_GEMMS,
        cuda_gemm_shapes=ALL_GEMMS,
        v1_threads=None,
        tower_config=k3,
        tower_cases=K3_TOWER_CASES,
        tower_check_layers=2 if quick else 4,
        tower_repeats=2 if quick else 3,
        tower_warmup=1,
        numba_tower_cases=1 if quick else 3,
        # quick, measured on an H200 (benchmarks/results/H200-2026-12-04-*): the whole pytest tier 65-68 s, the
        # kernels section 36 s, the tower 47 s, the quick run 150 s in all
        budgets={"tests": 80.0, "kernels": 150.0, "tower": 90.0}
        if quick
        else {"tests": 90.0, "kernels": 230.0, "tower": 170.0},
        # + ~15 s under the 6 (9) minutes for start-up and the last item's overrun
        total_budget=345.0 if quick else 525.0,
        item_timeout_s=45.0 if quick else 60.0,
        tower_item_timeout_s=75.0 if quick else 90.0,
        startup_timeout_s=90.0,
        preflight_timeout_s=60.0,
        hopper_gemm_shapes=("qkv", "fc1+residual") if quick else ENCODER_GEMMS,
    )


def make_plan(simulate: bool, quick: bool, budget_s: float | None = None) -> Plan:
    """The plan for a mode; `budget_s` caps the whole run (sections share it in proportion)."""
    plan = _simulated_plan(quick) if simulate else _gpu_plan(quick)
    if budget_s is not None:
        budget_s = positive_seconds("--budget-s", budget_s)
        scale = min(1.0, budget_s / plan.total_budget)
        plan = dataclasses.replace(plan, budgets={k: v * scale for k, v in plan.budgets.items()}, total_budget=budget_s)
    return plan


def plan_from_options(options: dict[str, Any]) -> Plan:
    """The plan of a run from its command-line options (the parent and every worker build it alike):
    simulate, quick, budget_s, backends, tokens, repeats, only, item_timeout_s. ValueError names a bad one."""
    plan = make_plan(bool(options.get("simulate")), bool(options.get("quick")), options.get("budget_s"))
    changes: dict[str, Any] = {"backends": parse_backends(options.get("backends") or ",".join(BACKENDS))}
    if options.get("tokens"):
        changes["kernel_grids"] = grids_for_tokens(list(options["tokens"]))
    if options.get("repeats") is not None:
        if options["repeats"] < 1:
            raise ValueError(f"--repeats must be >= 1, got {options['repeats']}")
        changes["repeats"] = options["repeats"]
    if options.get("only"):
        changes["only"] = tuple(o.strip() for o in options["only"].split(",") if o.strip())
    if options.get("item_timeout_s") is not None:
        t = positive_seconds("--item-timeout-s", options["item_timeout_s"])
        changes.update(item_timeout_s=t, tower_item_timeout_s=t)
    return dataclasses.replace(plan, **changes)


def positive_seconds(option: str, value: Any) -> float:
    """`value` as seconds when it is a positive finite number; ValueError naming `option` otherwise."""
    seconds = float(value)
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"{option} must be a positive number of seconds, got {value}")
    return seconds


@dataclass(frozen=True)
class Unit:
    """One worker's share of a run: `section` (its place in the report) and `family` (what it runs)."""

    section: str
    family: str

    @property
    def name(self) -> str:
        return f"{self.section}:{self.family}"


TOWER_BACKENDS = ("CUDA C fp32", "CUDA C bf16", "CUDA C bf16 hopper=False", "numba fp32")


def units_for(plan: Plan, sections: tuple[str, ...]) -> list[Unit]:
    """The units of a run, in the order they run."""
    units = [Unit("machine", "machine")]
    hopper = "hopper" in plan.backends
    preflight = Unit("kernels", "Hopper pre-flight")  # before anything runs a Hopper kernel
    if "tests" in sections:
        units.append(Unit("tests", "pytest"))
    if "kernels" in sections:
        for b in plan.backends:
            units += {"cuda": [Unit("kernels", "CUDA C")], "hopper": [preflight, Unit("kernels", "Hopper")],
                      "numba": [Unit("kernels", "numba")]}[b]  # fmt: skip
    if "tower" in sections:
        if hopper and preflight not in units:
            units.append(preflight)
        units.append(Unit("tower", "reference"))
        if plan.torch_tower_baseline:
            units.append(Unit("tower", "torch"))
        for name in TOWER_BACKENDS:
            if name.startswith("CUDA C") and "cuda" not in plan.backends:
                continue
            if name.endswith("hopper=False") and not (hopper and "cuda" in plan.backends):
                continue
            if name.startswith("numba") and "numba" not in plan.backends:
                continue
            units.append(Unit("tower", name))
    return units


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
    """`"numba,cuda"` -> the kernel families to run, in run order; ValueError names an unknown one."""
    chosen = {part.strip().lower() for part in text.split(",") if part.strip()}
    unknown = chosen - set(BACKENDS)
    if unknown or not chosen:
        raise ValueError(f"unknown backend {', '.join(sorted(unknown)) or '(none)'}; choose from cuda, hopper, numba")
    return tuple(b for b in BACKENDS if b in chosen)


def grids_for_tokens(tokens: list[int]) -> tuple[tuple[int, int, int], ...]:
    """Square single-image grids for token counts (L = side², side even so that the 2x2 merge applies)."""
    grids = []
    for L in tokens:
        if L < 4:
            raise ValueError(f"--tokens {L}: a token count is a positive square of an even side (4, 16, ..., 1024)")
        side = math.isqrt(L)
        if side * side != L or side % 2:
            raise ValueError(f"--tokens {L} is not the square of an even side (e.g. 1024 = 32², 4096 = 64²)")
        grids.append((1, side, side))
    return tuple(grids)
