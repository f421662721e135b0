"""The kernel registry (`moonvit_kernels.registry`): every entry points at real code, and every tool's list of
kernels (the CUDA C catalogue, the numba compile tier, the register tables, the X-ray's models and traces)
is derived from it, so adding an entry is all it takes."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from moonvit_kernels import launch_model as lm
from moonvit_kernels import launch_rules, registry
from moonvit_kernels.config import VisionConfig
from moonvit_kernels.cuda_backend import sources
from moonvit_kernels.numba_backend._cuda import cuda, float32  # module-level: the simulator swaps these globals
from moonvit_kernels.numba_backend.registers import registers_for
from moonvit_kernels.tools import compile_check
from moonvit_kernels.tools.xray import catalogue, emulator_trace, jobs_numba

EVERY = registry.entries(registry.ALL_HEAD_DIMS)
CUDA = [e for e in EVERY if e.backend == "cuda"]
NUMBA = [e for e in EVERY if e.backend == "numba"]
ROOT = Path(__file__).resolve().parents[1]


# ============================================================================ entries point at real code
@pytest.mark.parametrize("entry", CUDA, ids=lambda e: e.label)
def test_cuda_entry_names_a_kernel_of_its_source(entry):
    assert (sources.KERNEL_DIR / entry.source).is_file()
    base = re.fullmatch(r"(\w+)<.*>", entry.name).group(1)
    declared = re.search(rf"__global__[^{{;]*?\b{base}\s*\(", sources.load_source(entry.source))
    assert declared, f"{entry.source} declares no __global__ {base}"


@pytest.mark.parametrize("entry", NUMBA, ids=lambda e: e.label)
def test_numba_entry_names_its_kernel_and_signature(entry):
    fn = entry.python_function()
    assert fn.__name__ == entry.label  # cubins, X-ray rows and register tables are named by it
    assert entry.numba_signature().startswith("void(")
    assert callable(fn) and not hasattr(fn, "py_func")


def test_numba_launch_shapes_match_their_modules():
    from moonvit_kernels.numba_backend import attention, gemm, pos_emb, rmsnorm

    by_label = {e.label: e for e in NUMBA}
    v1 = by_label[f"attention_v1_hd128_t{attention.V1_THREADS}"]
    v2 = by_label[f"attention_v2_hd128_q{attention.V2_BLOCK_Q}_k{attention.V2_BLOCK_K}"]
    assert v1.threads == attention.V1_THREADS and v2.threads == attention.V2_BLOCK_Q * attention.V2_BLOCK_K
    assert (v1.max_registers, v2.max_registers) == (attention.register_limit(128), attention.register_limit(512))
    for v in gemm.VERSIONS:
        _, block = gemm.launch_config(v, 100, 100)
        assert {by_label[f"gemm_v{v}_{ep}"].threads for ep in gemm.EPILOGUES} == {block[0] * block[1]}
    assert {e.label for e in NUMBA if e.stage == "rmsnorm"} == {f"rmsnorm_kernel_t{t}" for t in rmsnorm.BLOCK_SIZES}
    assert {e.label for e in NUMBA if e.stage == "pos_emb"} == {f"add_pos_emb_{m}" for m in pos_emb.MODES}


def test_labels_are_unique_within_a_backend():
    for backend in registry.BACKENDS:
        labels = [e.label for e in EVERY if e.backend == backend]
        assert len(labels) == len(set(labels)), backend
    names = [e.name for e in CUDA]
    assert len(names) == len(set(names))


def test_register_bounds_let_the_launch_shape_launch():
    for e in EVERY:
        assert launch_rules.register_problem(e.max_registers, e.threads) is None, e.label
        assert e.check in registry.STAGES and e.stage in registry.STAGES
    for e in NUMBA:  # the launch checks' numbers stay within what the compile tier allows
        assert all(n <= e.max_registers for n in e.registers.values()), e.label


def test_k3_sizes_come_from_the_k3_config():
    k3 = VisionConfig.k3()
    assert (lm.D, lm.Q, lm.HEADS, lm.HD, lm.MLP) == (1024, 1536, 12, 128, 4096) == (
        k3.vt_hidden_size, k3.qkv_hidden_size, k3.vt_num_attention_heads, k3.head_dim, k3.vt_intermediate_size
    )  # fmt: skip
    assert (lm.L, lm.MERGED, lm.MERGED_W, lm.PATCH_K, lm.TEXT) == (4096, 1024, 4096, 588, 7168)
    assert catalogue.L is lm.L and catalogue.GEMM_SHAPES is lm.GEMM_SHAPES


# ============================================================================ what derives from it
def test_cuda_catalogue_is_the_registry():
    for head_dims in ((128,), (128, 24, 240), (64, 136)):
        assert registry.kernel_specs(head_dims) == [e.spec for e in registry.entries(head_dims, "cuda")]
    hopper = registry.hopper_specs((128, 136, 24))
    assert [s.label for s in hopper if s.source == "flash_attn_sm90.cu"] == [
        "flash_attn_sm90_hd128",
        "flash_attn_sm90_hd24",
    ]
    assert registry.specs_for("sm_90a", (128, 136, 24)) == hopper
    with pytest.raises(ValueError, match="multiple of 8 in 8..240"):
        registry.kernel_specs((12,))


def test_every_entry_has_its_catalogue_model():
    for e in EVERY:
        info = catalogue.describe(e.backend, e.label)
        assert (info.family, info.version, info.specialisation) == (e.stage, e.version, e.specialisation), e.label
        assert (info.threads, info.dynamic_shared) == (e.threads, e.dynamic_smem), e.label
        assert dataclasses.asdict(e.model) == {f.name: getattr(info, f.name) for f in dataclasses.fields(lm.Model)}
        assert info.k3 == (info.flops is not None) or e.stage == "rmsnorm", e.label  # rmsnorm t32..128: not K3
    launched = catalogue.describe("cuda", "gemm_bf16_tc_f32_none", 128, 4096)  # a build's own launch shape wins
    assert (launched.threads, launched.dynamic_shared) == (128, 4096)
    unknown = catalogue.describe("cuda", "gemm_bf16_tc_f16_none")
    assert unknown.family == "other" and unknown.flops is None and unknown.threads == 256
    assert registry.find("numba", "flash_attn_bf16_hd24") is None and registry.find("cuda", "flash_attn_bf16_hd24")
    assert registry.find("cuda", "flash_attn_sm90_hd136") is None  # flash_attn_sm90 stops at hd 128


def test_register_tables_cover_every_compiled_numba_kernel():
    labels = {e.label for e in NUMBA}
    for compiler in registry.COMPILERS:
        table = registers_for(compiler)
        assert set(table) == labels and all(isinstance(n, int) and n > 0 for n in table.values())
    assert compile_check.kernel_modules() == sorted({e.module_path for e in NUMBA})
    assert registry._NUMBA_DEFAULT_MAX_REGISTERS == compile_check.DEFAULT_MAX_REGISTERS
    with pytest.raises(ValueError, match="no register table for compiler 'nvcc'"):
        registers_for("nvcc")


def test_trace_jobs_and_registry_name_each_other():
    for backend, jobs in (("numba", jobs_numba.jobs()), ("cuda", emulator_trace.jobs())):
        names = {j.name for j in jobs}
        named = {e.trace_job for e in registry.entries(backend=backend) if e.trace_job}
        assert names == named, backend
        for job in names:
            assert registry.traced_by(backend, job)
    assert registry.traced_by("numba", "attention_v2") == ["attention_v2_hd128_q32_k16"]  # K3's head dim only
    assert registry.traced_by("cuda", "gemm_bf16_tc", ["gemm_bf16_tc_f32_none", "gemm_fp32_simt_none", "x"]) == [
        "gemm_bf16_tc_f32_none"
    ]


def test_adding_an_entry_is_all_it_takes(monkeypatch):
    """One appended entry per backend reaches the CUDA C catalogue, the compile list, the register tables,
    the X-ray's model and its trace job, with no other list edited."""
    cuda_new = registry.KernelEntry(
        "cuda", "rmsnorm", "CUDA v2", "rmsnorm_rows_v2_f32_f32", 128, 96, lm.rmsnorm(4, 4).but(formula="new"),
        source="rmsnorm.cu", name="rmsnorm_rows<float, float>", max_stack=16, trace_job="rmsnorm_rows_f32",
    )  # fmt: skip
    numba_new = registry.KernelEntry(
        "numba", "rope", "v2", "rope2d_kernel_v2", 96, 120, lm.rope(4).but(formula="newer"), module="rope",
        kernel="rope2d_kernel", signature="SIGNATURE", registers={"numba-cuda": 41, "numba-cuda-mlir": 43},
        trace_job="rope",
    )  # fmt: skip
    monkeypatch.setattr(registry, "REGISTRY", [*registry.REGISTRY, numba_new, cuda_new])

    assert cuda_new.spec in registry.kernel_specs() and cuda_new.spec in registry.specs_for("sm_80")
    assert cuda_new.spec not in registry.hopper_specs() and cuda_new.spec.max_stack == 16
    assert registers_for("numba-cuda-mlir")["rope2d_kernel_v2"] == 43
    assert catalogue.describe("cuda", "rmsnorm_rows_v2_f32_f32").formula == "new"
    assert catalogue.describe("numba", "rope2d_kernel_v2").threads == 96
    assert "rmsnorm_rows_v2_f32_f32" in registry.traced_by("cuda", "rmsnorm_rows_f32")
    assert registry.traced_by("numba", "rope", ["rope2d_kernel_v2"]) == ["rope2d_kernel_v2"]

    built = []

    def fake_build(fn, signature, max_registers, module, cc):
        built.append((module, fn.__name__, signature, max_registers))
        return compile_check.KernelReport(module, fn.__name__, signature, max_registers), None

    monkeypatch.setattr(compile_check, "build_kernel", fake_build)
    monkeypatch.setenv("MOONVIT_COMPILE_CACHE", "off")  # every entry reaches the compiler
    compile_check._build_all(["moonvit_kernels.numba_backend.rope"], (9, 0))
    from moonvit_kernels.numba_backend import rope

    assert built == [("rope", "rope2d_kernel", rope.SIGNATURE, 128), ("rope", "rope2d_kernel", rope.SIGNATURE, 120)]


def test_each_entrys_tiles_and_launch_shape_are_its_modules_constants():
    """The registry's numbers that a kernel module also holds (tiles of the traffic model, block shapes, epilogues,
    versions) are the module's: a kernel edited without its entry fails here."""
    from moonvit_kernels.numba_backend import attention, gemm, rmsnorm

    assert set(registry._NUMBA_GEMM) == set(gemm.VERSIONS) == set(registry.versions("numba", "gemm"))
    for v, (tile_m, tile_n, *_) in registry._NUMBA_GEMM.items():
        assert (tile_m, tile_n) == gemm.TILES[v], v
    assert registry._NUMBA_GEMM_EPILOGUES == gemm.EPILOGUES
    assert registry._NUMBA_V1_THREADS == attention.V1_THREADS
    assert registry._NUMBA_V2_BLOCK == (attention.V2_BLOCK_Q, attention.V2_BLOCK_K)
    assert registry._NUMBA_RMSNORM_THREADS == rmsnorm.BLOCK_SIZES
    for e in NUMBA:  # the launch shape each entry models is the one its launcher uses
        if e.stage == "gemm":
            blocks, threads = gemm.launch_config(int(e.version[1:]), 64, 64)
            assert (threads[0] * threads[1] if isinstance(threads, tuple) else threads) == e.threads, e.label


DOCS = ["README.md", "CONTRIBUTING.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "notebooks").glob("*.py"))]


@pytest.mark.parametrize("doc", DOCS)
def test_no_doc_hard_codes_the_range_of_kernel_versions(doc):
    """Which versions exist is the registry's to say (`registry.versions`): prose that spells a range such as
    "v1 → v3" goes stale when a version is added."""
    ranges = re.findall(r"\bv1\s*(?:→|->|–|\.\.)\s*v\d+\b", (ROOT / doc).read_text(encoding="utf-8"))
    assert not ranges, f"{doc} spells a version range: {ranges}"


def _make_gemm_v4(epilogue: str):
    """A real GEMM v4, as a contributor would write it in numba_backend/gemm.py: v2's shared-memory tiling with
    8 x 8 tiles of 64 threads (a smaller block than every earlier version, so the launch shape is new too)."""
    from moonvit_kernels.numba_backend import gemm
    from moonvit_kernels.numba_backend.launch import jit_named

    EPILOGUE = gemm.EPILOGUE_IDS[epilogue]
    T = 8
    T_PADDED = T + 1  # a shared array's shape must be a constant: `T + 1` inside the kernel does not compile

    def gemm_v4(A, B, R, C, M, N, K):
        a_tile = cuda.shared.array((T, T), float32)
        b_tile = cuda.shared.array((T, T_PADDED), float32)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        m = cuda.blockIdx.y * T + ty
        n = cuda.blockIdx.x * T + tx
        n_load = cuda.blockIdx.x * T + ty
        acc = float32(0.0)
        for k0 in range(0, K, T):
            k = k0 + tx
            a_tile[ty, tx] = A[m, k] if (m < M and k < K) else float32(0.0)
            b_tile[ty, tx] = B[n_load, k] if (n_load < N and k < K) else float32(0.0)
            cuda.syncthreads()
            for kk in range(T):
                acc += a_tile[ty, kk] * b_tile[tx, kk]
            cuda.syncthreads()
        if m < M and n < N:
            C[m, n] = gemm.apply_epilogue(acc, EPILOGUE, R, m, n)

    return jit_named(gemm_v4, f"gemm_v4_{epilogue}")


def test_adding_a_real_gemm_version_is_all_it_takes(monkeypatch, tmp_path):
    """What a contributor changes for GEMM v4: its kernel file (the kernel, VERSIONS, TILES, its launch shape) and
    one registry line. Every derived place picks it up with nothing else edited: the compile tier's list and
    register tables, the SASS budget, the X-ray's model and trace (run for real on the simulator), notebook 01's
    prediction table, and gpu_check's plan and kernel cases (a case run and checked against float64)."""
    from moonvit_kernels.numba_backend import gemm
    from moonvit_kernels.plots import prediction_rows
    from moonvit_kernels.tools.gpu_check import kernels as gpu_kernels
    from moonvit_kernels.tools.gpu_check import plan as gpu_plan

    if not __import__("moonvit_kernels.device", fromlist=["x"]).simulator_enabled():
        pytest.skip("runs the new kernel on numba's simulator")
    # the kernel file's part
    v4 = {ep: _make_gemm_v4(ep) for ep in gemm.EPILOGUES}
    launch_config = gemm.launch_config
    monkeypatch.setattr(gemm, "VERSIONS", (*gemm.VERSIONS, 4))
    monkeypatch.setattr(gemm, "TILES", {**gemm.TILES, 4: (8, 8)})
    monkeypatch.setattr(gemm, "KERNELS", {**gemm.KERNELS, **{(4, ep): k for ep, k in v4.items()}})
    monkeypatch.setattr(
        gemm, "launch_config", lambda v, M, N: ((-(-N // 8), -(-M // 8)), (8, 8)) if v == 4 else launch_config(v, M, N)
    )
    # the registry's line
    blocked = False  # v2's scheme, not register-blocked: no SASS budget per FFMA (the row says so)
    monkeypatch.setitem(
        registry._NUMBA_GEMM, 4, (8, 8, 64, {"numba-cuda": 40, "numba-cuda-mlir": 40}, (16, 16, 48), blocked)
    )
    monkeypatch.setattr(registry, "REGISTRY", [*registry._numba_entries(), *registry._portable_entries(),
                                               *registry._hopper_entries()])  # fmt: skip
    labels = {f"gemm_v4_{ep}" for ep in gemm.EPILOGUES}

    # compiled (the compile tier's list), with its register table; the SASS budget where the row says blocked
    assert labels <= {e.label for e in registry.numba_entries()}
    assert registers_for("numba-cuda")["gemm_v4_none"] == 40 and not labels & registry.hot_loop_labels()
    assert {f"gemm_v3_{ep}" for ep in gemm.EPILOGUES} <= registry.hot_loop_labels()
    built = []
    monkeypatch.setattr(compile_check, "build_kernel", lambda fn, sig, regs, module, cc: built.append(fn.__name__)
                        or (compile_check.KernelReport(module, fn.__name__, sig, regs), None))  # fmt: skip
    monkeypatch.setenv("MOONVIT_COMPILE_CACHE", "off")
    compile_check._build_all(["moonvit_kernels.numba_backend.gemm"], (9, 0))
    assert labels <= set(built)
    # its module's constants agree with its entry
    test_each_entrys_tiles_and_launch_shape_are_its_modules_constants()
    assert registry.find("numba", "gemm_v4_none").threads == 64 == 8 * 8
    # modelled, traced (the real kernel, on the simulator) and predicted in notebook 01
    assert catalogue.describe("numba", "gemm_v4_none").threads == 64
    (job,) = [j for j in jobs_numba.jobs() if j.name == "gemm_v4"]
    traced = jobs_numba.run(job)
    assert traced.error is None and traced.sites, traced.error
    assert ("numba", "gemm_v4_none") in registry.notebook_kernels("01")
    assert any("gemm_v4_none" in " ".join(map(str, row)) for row in prediction_rows("01")[1])
    # timed by gpu_check: in the plan (quick: the newest version) and among its cases, checked against float64
    assert gpu_plan.make_plan(True, False).numba_gemm_versions == (1, 2, 3, 4)
    assert gpu_plan.make_plan(True, True).numba_gemm_versions == (4,)
    grid = __import__("numpy").array([[1, 2, 4]])
    cases = dict(gpu_kernels.numba_cases(VisionConfig.tiny(), grid, ("qkv",), None, (4,), ()))
    name = next(n for n in cases if "v4" in n)
    case = cases[name]()
    err, tol = case.check(case.run)
    assert err <= tol, (name, err, tol)


def test_a_module_that_does_not_import_is_one_report(monkeypatch):
    broken = registry.KernelEntry(
        "numba", "rope", "v9", "rope9_kernel", 128, 64, lm.rope(4), module="no_such_module", kernel="k",
        signature="SIGNATURE", registers={"numba-cuda": 1, "numba-cuda-mlir": 1},
    )  # fmt: skip
    monkeypatch.setattr(registry, "REGISTRY", [broken, dataclasses.replace(broken, label="rope9_kernel_b")])
    (report,) = compile_check.check_all()
    assert report.kernel == "<import>" and "ModuleNotFoundError" in report.error and not report.ok


# ============================================================================ bad entries are refused
def _entry(**changes):
    fields = dict(backend="cuda", stage="gemm", version="v", label="k", threads=128, max_registers=64,
                  model=lm.Model(), source="gemm_fp32.cu", name="gemm_fp32_simt<0>")  # fmt: skip
    return registry.KernelEntry(**{**fields, **changes})


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"backend": "triton"}, r"registry entry k: backend 'triton' is not one of \('numba', 'cuda'\)"),
        ({"stage": "softmax"}, "stage 'softmax' is not one of"),
        ({"label": "gemm/v3"}, "the label must be letters, digits and underscores"),
        ({"label": ""}, r"registry entry \(no label\): the label must be"),
        ({"threads": 0}, "threads=0 must be >= 1, max_registers 1..255"),
        ({"max_registers": 256}, "max_registers 1..255"),
        ({"source": "gemm_fp16.cu"}, "a CUDA C entry needs a source in"),
        ({"name": ""}, "a CUDA C entry needs a source in .* and a C\\+\\+ name"),
        ({"backend": "numba"}, "a numba entry needs its module, kernel and signature attributes"),
        (
            {"backend": "numba", "module": "rope", "kernel": "rope2d_kernel", "signature": "SIGNATURE",
             "registers": {"numba-cuda": 36}},
            "registry entry k: no register count for numba-cuda-mlir",
        ),
    ],
)  # fmt: skip
def test_bad_entries_are_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        _entry(**changes)


def test_other_bad_requests_are_refused():
    assert _entry().spec.name == "gemm_fp32_simt<0>"
    numba = next(e for e in NUMBA if e.label == "rope2d_kernel")
    with pytest.raises(ValueError, match="rope2d_kernel is a numba kernel: it has no CUDA C KernelSpec"):
        _ = numba.spec
    with pytest.raises(ValueError, match="backend 'cupy' is not one of"):
        registry.entries(backend="cupy")
    with pytest.raises(ValueError, match="peak 'fp16' is not one of"):
        lm.Model(peak="fp16")
    with pytest.raises(ValueError, match="GEMM epilogue 'relu' has no K3 layer"):
        lm.gemm("relu", 4, 4, 64, 64)


def test_every_entry_names_a_check_case_with_a_want():
    for e in registry.entries((128, 24)):
        assert callable(e.want()), e.label
    bad = dataclasses.replace(registry.entries()[0], check="no_such_stage")
    with pytest.raises(ValueError, match="check case 'no_such_stage' has no checks.no_such_stage_want"):
        bad.want()


# ============================================================================ a CUDA C version
def _rmsnorm_v2_source(kernel_dir: Path, scale: str = "") -> str:
    """`kernel_dir`'s rmsnorm.cu with a real second version appended: the same algorithm at 128 threads a block
    (the row's block sum over 4 warps), written as a contributor would; `scale` plants a fault in its store."""
    text = (kernel_dir / "rmsnorm.cu").read_text(encoding="utf-8")
    start = text.index("template <typename InT, typename OutT>")
    v2 = (
        text[start:]
        .replace("__launch_bounds__(256)", "__launch_bounds__(128)")
        .replace("rmsnorm_rows(", "rmsnorm_rows_v2(")
    )
    v2 = v2.replace("v.x * r * g.x,", f"v.x * r * g.x{scale},").replace("* r * w[i]);", f"* r * w[i]{scale});")
    for name in ("float, float", "float, __nv_bfloat16", "__nv_bfloat16, float", "__nv_bfloat16, __nv_bfloat16"):
        assert f"rmsnorm_rows<{name}>" == sources.rmsnorm_name(*[("float32" if t == "float" else "bfloat16")
                                                                  for t in name.split(", ")])  # fmt: skip
    return text + "\n// v2: 128 threads a block (four warps reduce a row)\n" + v2


@pytest.mark.skipif(
    __import__("moonvit_kernels.tools.emulation", fromlist=["x"]).compiler() is None,
    reason="no C++ compiler (g++ >= 11) for the CUDA C emulator",
)
def test_adding_a_cuda_c_version_is_all_it_takes(monkeypatch, tmp_path):
    """What a contributor changes for a CUDA C rmsnorm v2: its kernel file (the kernel appended to rmsnorm.cu) and
    one registry entry that `replaces` v1's fp32 -> bf16 instantiation. From that alone: the compile tier's list,
    notebook 02's prediction table, the launcher (it runs v2 at 128 threads, checked against the reference on the
    emulated device; a fault planted in v2 fails) and gpu_check's case (named by v2's label, run and checked)."""
    import numpy as np

    from moonvit_kernels import reference
    from moonvit_kernels.cuda_backend import launchers
    from moonvit_kernels.tools import emulation
    from moonvit_kernels.tools.emulation import device
    from moonvit_kernels.tools.gpu_check import kernels as gpu_kernels
    from moonvit_kernels.weights import bf16_bits_to_float32

    kernel_dir = sources.KERNEL_DIR

    def with_kernel_file(text: str) -> None:
        folder = tmp_path / f"kernels{len(list(tmp_path.iterdir()))}"
        folder.mkdir()
        for path in kernel_dir.glob("*.cu*"):
            (folder / path.name).write_bytes(path.read_bytes())
        (folder / "rmsnorm.cu").write_text(text, encoding="utf-8")
        monkeypatch.setattr(sources, "KERNEL_DIR", folder)
        launchers._kernel.cache_clear()
        launchers._module.cache_clear()

    v1_name = sources.rmsnorm_name("float32", "bfloat16")
    v2 = registry.KernelEntry(
        "cuda", "rmsnorm", "CUDA v2", "rmsnorm_rows_v2_f32_bf16", 128, registry.REG_SMALL, lm.rmsnorm(4, 2),
        specialisation="f32->bf16", source="rmsnorm.cu", name=v1_name.replace("rmsnorm_rows<", "rmsnorm_rows_v2<"),
        notebook="02", replaces="rmsnorm_rows_f32_bf16",
    )  # fmt: skip
    monkeypatch.setattr(registry, "REGISTRY", [*registry.REGISTRY, v2])
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((5, 1000)) * 2 + 0.3).astype(np.float32)
    w = rng.uniform(0.5, 1.5, 1000).astype(np.float32)
    want = reference.rmsnorm(x.astype(np.float64), w.astype(np.float64), 1e-6)

    def launched() -> np.ndarray:
        return bf16_bits_to_float32(emulation.run(launchers.rmsnorm, x, w, 1e-6, out_dtype="bfloat16"))

    try:
        # compiled and budgeted (the compile tier's list) and predicted in notebook 02
        assert v2.spec in registry.specs_for("sm_90") and v2.spec in registry.specs_for("sm_80")
        assert ("cuda", v2.label) in registry.notebook_kernels("02")
        assert registry.running("rmsnorm_rows_f32_bf16") is v2
        assert registry.running("rmsnorm_rows_f32_f32").label == "rmsnorm_rows_f32_f32"
        # run by the launcher at its launch shape, on the emulated device, against the reference
        with_kernel_file(_rmsnorm_v2_source(kernel_dir))
        with device.activated():
            kernel, spec = launchers._kernel(launchers._device_key(), "rmsnorm.cu", v1_name)
        assert (spec.name, spec.threads) == (v2.name, 128)
        assert np.max(np.abs(launched() - want)) <= 2.0**-8 * np.max(np.abs(want))
        # gpu_check times it under its own label, and its check passes
        grid = np.array([[1, 4, 6]])
        cases = dict(gpu_kernels.cuda_cases(emulation.OnEmulator(launchers), VisionConfig.tiny(), grid, ("qkv",)))
        case = cases["cuda rmsnorm"]
        assert case.info.model[0] == v2.label
        run, check, _ = case.arrays()
        err, tol = check(run)
        assert err <= tol, (err, tol)
        # a fault planted in v2 reaches the launcher's output
        with_kernel_file(_rmsnorm_v2_source(kernel_dir, scale=" * 2.0f"))
        assert np.max(np.abs(launched() - want)) > 0.5 * np.max(np.abs(want))
    finally:
        launchers._kernel.cache_clear()
        launchers._module.cache_clear()


def test_a_replacement_must_take_over_a_kernel_of_its_own_stage_and_file(monkeypatch):
    with pytest.raises(ValueError, match="a numba version is chosen by its number"):
        registry.KernelEntry("numba", "rope", "v2", "r2", 64, 64, lm.rope(4), module="rope", kernel="k",
                             signature="S", registers={"numba-cuda": 1, "numba-cuda-mlir": 1},
                             replaces="x")  # fmt: skip

    def with_entry(**changes):
        base = dict(backend="cuda", stage="rmsnorm", version="CUDA v2", label="rmsnorm_rows_v2_f32_f32", threads=128,
                    max_registers=64, model=lm.rmsnorm(4, 4), source="rmsnorm.cu", name="rmsnorm_rows_v2<float, float>",
                    replaces="rmsnorm_rows_f32_f32")  # fmt: skip
        monkeypatch.setattr(
            registry, "REGISTRY", [*registry._portable_entries(), registry.KernelEntry(**{**base, **changes})]
        )

    with_entry(replaces="no_such_kernel")
    with pytest.raises(ValueError, match="replaces 'no_such_kernel': no CUDA C entry has that label"):
        registry.running("rmsnorm_rows_f32_f32")
    with_entry(source="merge.cu")
    with pytest.raises(ValueError, match=r"a version replaces one of its own stage and file \(rmsnorm, rmsnorm.cu\)"):
        registry.running("rmsnorm_rows_f32_f32")
    with_entry()
    assert registry.running("rmsnorm_rows_f32_f32").label == "rmsnorm_rows_v2_f32_f32"
    rival = dataclasses.replace(registry.REGISTRY[-1], label="rmsnorm_rows_v3_f32_f32")
    monkeypatch.setattr(registry, "REGISTRY", [*registry.REGISTRY, rival])
    with pytest.raises(ValueError, match="rmsnorm_rows_v2_f32_f32 replaces it too"):
        registry.running("rmsnorm_rows_f32_f32")
    with pytest.raises(ValueError, match="no CUDA C kernel is called 'nothing'"):
        registry.running("nothing")


def test_the_tools_reach_a_numba_kernel_only_through_its_registry_entry():
    """One access protocol: the compile tier, the X-ray, gpu_check's builds take a numba kernel from
    `KernelEntry.dispatcher()` / `python_function()`, never from a kernel module's own attribute (a dict of
    versions, a factory, the kernel itself), so a new entry is reached the same way as every other."""
    import ast

    attributes = {e.kernel for e in registry.numba_entries()}
    tools = Path(registry.__file__).parent / "tools"
    found = [
        f"{path.relative_to(tools)}:{node.lineno} .{node.attr}"
        for path in sorted(tools.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Attribute) and node.attr in attributes
    ]
    assert attributes >= {"KERNELS", "attention_v1_kernel", "rope2d_kernel"} and found == []
