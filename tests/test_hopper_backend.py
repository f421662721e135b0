"""CupyBackend's choice of kernels: the pure routing rules, and the whole backend on the CPU emulators
with the Hopper kernels switched on (as on a compute capability 9.0 device), including the fallback
when a Hopper kernel fails its first-use self-check."""

from types import SimpleNamespace

import numpy as np
import pytest
from cuda_kernel_checks import random_pixels, random_weights

from moonvit_kernels.config import VisionConfig
from moonvit_kernels.cuda_backend import routing
from moonvit_kernels.tools.emulation import compiler


# ============================================================================ the switch
@pytest.mark.parametrize(
    "requested, capability, env, on, why",
    [
        (None, "90", {}, True, "automatic: compute capability 9.0"),
        (None, "90", {"MOONVIT_HOPPER": "0"}, False, "MOONVIT_HOPPER=0"),
        (None, "90", {"MOONVIT_HOPPER": "1"}, True, "automatic"),
        (None, "80", {}, False, "sm_80"),
        (None, "100", {}, False, "sm_100"),  # sm_90a code does not run on Blackwell
        (None, None, {}, False, "unknown compute capability"),
        (False, "90", {}, False, "hopper=False"),
        (True, "90", {"MOONVIT_HOPPER": "0"}, True, "hopper=True"),  # the explicit argument wins
    ],
)
def test_hopper_switch(requested, capability, env, on, why):
    got, reason = routing.hopper_enabled(requested, capability, env)
    assert got is on and why in reason


def test_hopper_switch_refuses_what_cannot_work():
    with pytest.raises(ValueError, match="compute capability 9.0.*sm_89"):
        routing.hopper_enabled(True, "89", {})
    with pytest.raises(ValueError, match="unknown"):
        routing.hopper_enabled(True, None, {})
    with pytest.raises(ValueError, match="True, False or None"):
        routing.hopper_enabled("yes", "90", {})


# ============================================================================ per call
@pytest.mark.parametrize(
    "hopper, dtype, K, aligned, kernel",
    [
        (True, "bfloat16", 1024, True, "gemm_bf16_sm90"),
        (True, "bfloat16", 8, True, "gemm_bf16_sm90"),
        (True, "bfloat16", 588, True, "gemm_bf16_tc"),  # K3's patch GEMM: 3·14·14 is not a multiple of 8
        (True, "bfloat16", 1024, False, "gemm_bf16_tc"),
        (False, "bfloat16", 1024, True, "gemm_bf16_tc"),
        (True, "float32", 1024, True, "gemm_fp32_simt"),
        (False, "float32", 7, False, "gemm_fp32_simt"),
    ],
)
def test_gemm_route(hopper, dtype, K, aligned, kernel):
    assert routing.choose_gemm(hopper, dtype, K, aligned) == kernel


@pytest.mark.parametrize(
    "hopper, dtype, head_dim, kernel",
    [
        (True, "bfloat16", 128, "flash_attn_sm90"),
        (True, "bfloat16", 24, "flash_attn_sm90"),
        (True, "bfloat16", 136, "flash_attn_bf16"),  # above the Hopper kernel's 128
        (True, "bfloat16", 12, "flash_attn_bf16"),  # not a multiple of 8
        (False, "bfloat16", 128, "flash_attn_bf16"),
        (True, "float32", 128, "flash_attn_fp32"),
    ],
)
def test_attention_route(hopper, dtype, head_dim, kernel):
    assert routing.choose_attention(hopper, dtype, head_dim) == kernel


def test_routes_reject_unknown_dtypes():
    with pytest.raises(ValueError, match="gemm dtype"):
        routing.choose_gemm(True, "float16", 64, True)
    with pytest.raises(ValueError, match="attention dtype"):
        routing.choose_attention(True, "int8", 64)


# ============================================================================ the backend on the emulators
needs_cxx = pytest.mark.skipif(compiler() is None, reason="no C++ compiler (g++ >= 11) for the CUDA C emulation")


class Sm90Emulation:
    """The portable emulator, presenting itself as a compute capability 9.0 device."""

    def __getattr__(self, name):
        from moonvit_kernels.cuda_backend import launchers
        from moonvit_kernels.tools import emulation

        return getattr(emulation.OnEmulator(launchers), name)

    @staticmethod
    def compute_capability() -> str:
        return "90"


class FaultyHopper:
    """The Hopper emulator with the planted mismatch in its GEMM (B's tensor map 8 elements late)."""

    def __getattr__(self, name):
        from moonvit_kernels.tools.emulation import hopper

        return getattr(hopper, name)

    @staticmethod
    def gemm(a, b, **kwargs):
        from moonvit_kernels.tools.emulation import hopper

        return hopper.gemm(a, hopper.read_late(b), **kwargs)


GRID = np.array([[1, 4, 6], [1, 2, 4]])  # an interpolated image and a smaller one, packed


def _backend(hopper_kernels, **kwargs):
    from moonvit_kernels.cuda_backend.backend import CupyBackend

    config = VisionConfig.tiny()
    weights = random_weights(config, 5)
    return CupyBackend(config, weights, "bfloat16", kernels=Sm90Emulation(), hopper_kernels=hopper_kernels, **kwargs)


@needs_cxx
def test_backend_uses_the_hopper_kernels_on_sm90(recwarn):
    """hopper=None on a "9.0 device": Hopper GEMMs and attention after their checks pass, the same result
    as the mma.sync backend within bf16 rounding; odd K and unaligned operands take gemm_bf16_tc."""
    from moonvit_kernels.cuda_backend import launchers
    from moonvit_kernels.tools import emulation
    from moonvit_kernels.tools.emulation import hopper
    from moonvit_kernels.weights import float32_to_bf16_bits

    backend = _backend(hopper)
    plain = _backend(hopper, hopper=False)
    assert "not run yet" in backend.describe()["gemm"] and backend.describe()["hopper"].startswith("on")
    pixels = random_pixels(GRID, backend.config.patch_size, seed=6)
    got = backend.forward(pixels, GRID, as_numpy=True)
    want = plain.forward(pixels, GRID, as_numpy=True)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=3e-2, atol=3e-2 * float(np.max(np.abs(w))))
    assert not [w for w in recwarn.list if "self-check" in str(w.message)]
    layers = backend.config.vt_num_hidden_layers
    assert backend.kernel_calls == {"gemm_bf16_sm90": 3 + 4 * layers, "flash_attn_sm90": layers}
    assert plain.kernel_calls == {"gemm_bf16_tc": 3 + 4 * layers, "flash_attn_bf16": layers}
    info = backend.describe()
    assert "gemm_bf16_sm90 (passed" in info["gemm"] and "flash_attn_sm90 (passed" in info["attention"]
    assert plain.describe()["hopper"] == "off (hopper=False)" and plain.describe()["gemm"] == "gemm_bf16_tc"

    rng = np.random.default_rng(7)
    a, b = (float32_to_bf16_bits(rng.standard_normal(s).astype(np.float32)) for s in ((5, 12), (3, 12)))  # K = 12:
    np.testing.assert_array_equal(backend.gemm(a, b), emulation.run(launchers.gemm, a, b))  # not a multiple of 8
    # an operand 2 bytes past 16-byte alignment (the emulators assume aligned arrays: a recording stand-in)
    shifted = np.empty(5 * 16 + 1, np.uint16)[1:].reshape(5, 16)
    calls = []
    backend.k = SimpleNamespace(gemm=lambda a, b, **kw: calls.append(a.ctypes.data % 16) or "mma.sync")
    assert backend.gemm(shifted, b[:, :16].copy()) == "mma.sync" and calls == [2]
    assert backend.kernel_calls["gemm_bf16_tc"] == 2


@needs_cxx
def test_backend_falls_back_when_a_hopper_kernel_fails_its_check():
    from moonvit_kernels.cuda_backend.selfcheck import SelfCheckWarning

    backend = _backend(FaultyHopper())
    pixels = random_pixels(GRID, backend.config.patch_size, seed=6)
    with pytest.warns(SelfCheckWarning, match="gemm_bf16_sm90: first-use self-check failed"):
        backend.forward(pixels, GRID, as_numpy=True)
    layers = backend.config.vt_num_hidden_layers
    assert backend.kernel_calls == {"gemm_bf16_tc": 3 + 4 * layers, "flash_attn_sm90": layers}
    assert "gemm_bf16_tc (gemm_bf16_sm90 FAILED" in backend.describe()["gemm"]


def test_backend_switch_errors():
    from moonvit_kernels.cuda_backend import launchers
    from moonvit_kernels.cuda_backend.backend import CupyBackend
    from moonvit_kernels.tools import emulation

    config = VisionConfig.tiny()
    weights = random_weights(config, 5)
    with pytest.raises(ValueError, match="dtype 'bfloat16'"):
        CupyBackend(config, weights, "float32", kernels=Sm90Emulation(), hopper=True)
    with pytest.raises(ValueError, match="compute capability 9.0.*unknown"):
        CupyBackend(config, weights, "bfloat16", kernels=emulation.OnEmulator(launchers), hopper=True)
    fp32 = CupyBackend(config, weights, "float32", kernels=Sm90Emulation())
    assert fp32.hopper is False and "float32" in fp32.describe()["hopper"]
    assert fp32.describe()["gemm"] == "gemm_fp32_simt" and fp32.describe()["attention"] == "flash_attn_fp32"


def test_environment_switch_turns_the_backend_off(monkeypatch):
    from moonvit_kernels.cuda_backend.backend import CupyBackend

    config = VisionConfig.tiny()
    monkeypatch.setenv("MOONVIT_HOPPER", "0")
    backend = CupyBackend(config, random_weights(config, 5), "bfloat16", kernels=Sm90Emulation())
    assert backend.hopper is False and backend.describe()["hopper"] == "off (MOONVIT_HOPPER=0)"


@needs_cxx
def test_hopper_checks_cover_both_tile_widths_and_attention():
    """The checks gpu_check runs in a subprocess, here on the emulators: all pass; with the planted
    mismatch both GEMM widths fail, each named, and attention still passes."""
    from moonvit_kernels.cuda_backend import launchers, selfcheck
    from moonvit_kernels.tools import emulation
    from moonvit_kernels.tools.emulation import hopper

    trusted = emulation.OnEmulator(launchers)
    checks = selfcheck.hopper_checks(np, hopper, trusted, head_dim=24)
    assert sorted(checks) == ["flash_attn_sm90", "gemm_bf16_sm90 bn128", "gemm_bf16_sm90 bn256"]
    assert all(c.check() for c in checks.values()), {k: c.error for k, c in checks.items()}
    bad = selfcheck.hopper_checks(np, FaultyHopper(), trusted, head_dim=24)
    with pytest.warns(selfcheck.SelfCheckWarning) as caught:
        verdicts = {k: c.check() for k, c in bad.items()}
    assert verdicts == {"gemm_bf16_sm90 bn128": False, "gemm_bf16_sm90 bn256": False, "flash_attn_sm90": True}
    names = sorted(str(w.message).split(":")[0] for w in caught)
    assert names == ["gemm_bf16_sm90", "gemm_bf16_sm90 (BN 256)"]


def test_gpu_launchers_refuse_bad_arguments_before_the_gpu():
    """hopper_launchers' host-side checks (run before CuPy is even imported): each names its problem."""
    from moonvit_kernels.cuda_backend import hopper_launchers as hl

    a, b = np.zeros((5, 24), np.uint16), np.zeros((7, 24), np.uint16)
    ok = {"epilogue": "none", "residual": None, "out": None, "out_dtype": "float32", "block_n": 128}
    hl.check_gemm_args(a, b, **ok)
    cases = [
        ((a.astype(np.float32), b), {}, "bf16 arrays"),
        ((a, np.zeros((7, 16), np.uint16)), {}, "inner dimensions differ"),
        ((np.zeros((5, 12), np.uint16), np.zeros((7, 12), np.uint16)), {}, "K % 8 == 0"),
        ((a, b), {"epilogue": "relu"}, "unknown epilogue"),
        ((a, b), {"block_n": 64}, "not 64"),
        ((a, b), {"epilogue": "residual"}, "residual must be given"),
        ((a, b), {"residual": np.zeros((5, 7), np.float32)}, "residual must be given"),
        (
            (a, b),
            {"epilogue": "residual", "residual": np.zeros((5, 7), np.uint16)},
            r"residual must be .*\[5, 7\] float32",
        ),
        ((a, b), {"out": np.zeros((7, 5), np.float32)}, r"out must be C-contiguous \[5, 7\]"),
        ((a, b), {"out_dtype": "float16"}, "out_dtype"),
    ]
    for args, change, message in cases:
        with pytest.raises(ValueError, match=message):
            hl.check_gemm_args(*args, **{**ok, **change})
    qkv = np.zeros((9, 3 * 2 * 16), np.uint16)
    assert hl.check_attention_args(qkv, [0, 4, 9], 2, 16).tolist() == [0, 4, 9]
    for args, message in [
        ((qkv, [0, 9], 2, 12), "head dims"),
        ((qkv, [0, 9], 2, 136), "head dims"),
        ((qkv, [0, 9], 3, 16), "columns"),
        ((qkv, [0, 8], 2, 16), "from 0 to L=9"),
        ((qkv, [0, 5, 4, 9], 2, 16), "from 0 to L=9"),
        ((qkv[:, ::2].copy().astype(np.float32), [0, 9], 1, 16), "bf16 arrays"),
    ]:
        with pytest.raises(ValueError, match=message):
            hl.check_attention_args(*args)
