"""Which CUDA C kernel runs a GEMM or an attention call: pure decisions, no GPU needed.

The Hopper kernels (gemm_bf16_sm90.cu, flash_attn_sm90.cu) are built for sm_90a, whose code runs on
devices of compute capability 9.0 only (H100, H200), and take their operands through tensor maps:

    gemm       bf16 a, b, K % 8 == 0 (16-byte row pitch), a and b 16-byte aligned, any M, N
               -> gemm_bf16_sm90; else gemm_bf16_tc (bf16) or gemm_fp32_simt (float32)
    attention  bf16 qkv, head_dim a multiple of 8 up to 128
               -> flash_attn_sm90; else flash_attn_bf16 / flash_attn_fp32

Whether the Hopper kernels are considered at all (`hopper_enabled`): the backend's `hopper`
argument (True forces them and needs a 9.0 device, False turns them off), else the environment
variable MOONVIT_HOPPER ("0" turns them off), else the device's compute capability.
A Hopper choice is still subject to its first-use self-check (`selfcheck.FirstUseCheck`).
"""

from __future__ import annotations

from collections.abc import Mapping

HOPPER_CAPABILITY = "90"  # sm_90a code runs on compute capability 9.0 only (not 10.0 or 12.0)
ENV_SWITCH = "MOONVIT_HOPPER"
GEMM_SM90, GEMM_BF16, GEMM_FP32 = "gemm_bf16_sm90", "gemm_bf16_tc", "gemm_fp32_simt"
ATTN_SM90, ATTN_BF16, ATTN_FP32 = "flash_attn_sm90", "flash_attn_bf16", "flash_attn_fp32"
HOPPER_MAX_HEAD_DIM = 128


def hopper_enabled(requested: bool | None, capability: str | None, env: Mapping[str, str]) -> tuple[bool, str]:
    """(consider the Hopper kernels?, the reason in words) for a device of `capability` ("90" for
    sm_90, None when unknown, e.g. on the CPU emulator). `requested` True needs a 9.0 device
    (ValueError otherwise); None means automatic: off when env[MOONVIT_HOPPER] is "0", else on
    exactly on 9.0 devices."""
    if requested not in (None, True, False):
        raise ValueError(f"hopper must be True, False or None (automatic), got {requested!r}")
    if requested is False:
        return False, "off (hopper=False)"
    if requested:
        if capability != HOPPER_CAPABILITY:
            raise ValueError(
                f"hopper=True needs a compute capability 9.0 device (sm_90a code), this one is "
                f"{'unknown' if capability is None else 'sm_' + capability}"
            )
        return True, "on (hopper=True)"
    setting = env.get(ENV_SWITCH, "").strip()
    if setting == "0":
        return False, f"off ({ENV_SWITCH}=0)"
    if capability != HOPPER_CAPABILITY:
        where = "unknown compute capability" if capability is None else f"compute capability sm_{capability}"
        return False, f"off ({where}; the Hopper kernels need 9.0)"
    return True, "on (automatic: compute capability 9.0)"


def choose_gemm(hopper: bool, dtype: str, K: int, aligned: bool) -> str:
    """The GEMM kernel for operands of `dtype` ("bfloat16" or "float32") with inner dimension `K`;
    `aligned`: both operands start at 16-byte aligned addresses; `hopper`: from `hopper_enabled`."""
    if dtype == "float32":
        return GEMM_FP32
    if dtype != "bfloat16":
        raise ValueError(f"gemm dtype must be 'bfloat16' or 'float32', got {dtype!r}")
    return GEMM_SM90 if hopper and K % 8 == 0 and aligned else GEMM_BF16


def choose_attention(hopper: bool, dtype: str, head_dim: int) -> str:
    """The attention kernel for qkv of `dtype` at `head_dim`; `hopper`: from `hopper_enabled`."""
    if dtype == "float32":
        return ATTN_FP32
    if dtype != "bfloat16":
        raise ValueError(f"attention dtype must be 'bfloat16' or 'float32', got {dtype!r}")
    return ATTN_SM90 if hopper and head_dim % 8 == 0 and 8 <= head_dim <= HOPPER_MAX_HEAD_DIM else ATTN_BF16
