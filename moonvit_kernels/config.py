"""`VisionConfig`: the HF `vision_config` of Kimi K3's vision tower (MoonViT-V2).

Field names are exactly the keys of `config.json -> vision_config`, so a real
checkpoint's config loads with `VisionConfig.from_json(path)`. Values that the
implementation does not support (biases, other norms, other mergers) are
rejected when the config is built, not discovered deep inside a kernel.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

FP32_EPS = 1.1920929e-07  # float32 eps as HF configs write it (8 digits); checks and the exercises use this one

# The RoPE grid limit and theta are hard-coded in the reference source, not in config.json.
ROPE_MAX_SIDE = 512
ROPE_THETA = 10000.0

# No tensor bounds the frame count of a chunk, and every forward builds a sin/cos table
# [init_pos_emb_time, D]: a sane limit keeps a typo from allocating gigabytes (K3: 4).
MAX_POS_EMB_TIME = 1024

# The keys a checkpoint's config.json must state (the released K3 config states them all);
# `vit_norm_eps` is not among them: the reference source hard-codes it.
REQUIRED_IN_FILES = (
    "patch_size",
    "init_pos_emb_height",
    "init_pos_emb_width",
    "init_pos_emb_time",
    "pos_emb_type",
    "pos_emb_interpolation_mode",
    "vt_hidden_size",
    "vt_num_attention_heads",
    "qkv_hidden_size",
    "vt_intermediate_size",
    "vt_num_hidden_layers",
    "norm_type",
    "attn_bias",
    "linear_bias",
    "patch_embed_proj_bias",
    "mlp_type",
    "activation_func",
    "merge_kernel_size",
    "merge_type",
    "mm_projector_type",
    "mm_hidden_size",
    "projector_hidden_act",
    "projector_ln_eps",
    "text_hidden_size",
)

SUPPORTED = {
    "norm_type": ("rmsnorm",),
    "merge_type": ("sd2_tpool",),
    "mm_projector_type": ("patchmergerv2",),
    "pos_emb_interpolation_mode": ("bilinear", "bicubic"),
    "pos_emb_type": ("divided_fixed",),
    "mlp_type": ("mlp2",),
    "activation_func": ("gelu_pytorch_tanh",),
    "projector_hidden_act": ("gelu",),
}


def _int_pair(name: str, value: Any) -> tuple[int, int]:
    """`value` as a tuple of two positive ints, or ValueError naming `name` (no silent rounding)."""
    try:
        items = tuple(value)
    except TypeError:
        raise ValueError(f"{name} must be two positive integers, got {value!r}") from None
    ok = len(items) == 2 and all(isinstance(k, numbers.Integral) and not isinstance(k, (bool, np.bool_)) for k in items)
    if not ok or min(items) <= 0:
        raise ValueError(f"{name} must be two positive integers, got {value!r}")
    return int(items[0]), int(items[1])


@dataclass(frozen=True)
class VisionConfig:
    """Hyper-parameters of the vision tower and its projector (HF `vision_config` keys)."""

    patch_size: int = 14
    init_pos_emb_height: int = 64
    init_pos_emb_width: int = 64
    init_pos_emb_time: int = 4
    pos_emb_type: str = "divided_fixed"
    pos_emb_interpolation_mode: str = "bilinear"
    vt_hidden_size: int = 1024
    vt_num_attention_heads: int = 12
    qkv_hidden_size: int = 1536
    vt_intermediate_size: int = 4096
    vt_num_hidden_layers: int = 27
    norm_type: str = "rmsnorm"
    attn_bias: bool = False
    linear_bias: bool = False
    patch_embed_proj_bias: bool = False
    mlp_type: str = "mlp2"
    activation_func: str = "gelu_pytorch_tanh"
    merge_kernel_size: tuple[int, int] = (2, 2)
    merge_type: str = "sd2_tpool"
    mm_projector_type: str = "patchmergerv2"
    mm_hidden_size: int = 1024
    projector_hidden_act: str = "gelu"
    projector_ln_eps: float = 1e-5
    text_hidden_size: int = 7168
    vit_norm_eps: float = FP32_EPS

    def __post_init__(self) -> None:
        object.__setattr__(self, "merge_kernel_size", _int_pair("merge_kernel_size", self.merge_kernel_size))
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            # numpy integers (e.g. read from an array) become plain ints; bools stay bools so validate() rejects them
            if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
                object.__setattr__(self, f.name, int(value))
        self.validate()

    # ------------------------------------------------------------------ derived sizes
    @property
    def head_dim(self) -> int:
        """Per-head width `hd = qkv_hidden_size // vt_num_attention_heads`."""
        return self.qkv_hidden_size // self.vt_num_attention_heads

    @property
    def merged_hidden_size(self) -> int:
        """Width of one merged token fed to the projector: `kh·kw·D`."""
        kh, kw = self.merge_kernel_size
        return kh * kw * self.vt_hidden_size

    @property
    def patch_dim(self) -> int:
        """Flattened patch length `3·p·p` (order c, ky, kx)."""
        return 3 * self.patch_size * self.patch_size

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        """Raise ValueError naming the first inconsistent or unsupported value."""
        for key, allowed in SUPPORTED.items():
            value = getattr(self, key)
            if value not in allowed:
                raise ValueError(f"unsupported {key}={value!r}; supported: {', '.join(allowed)}")
        for key in ("attn_bias", "linear_bias", "patch_embed_proj_bias"):
            value = getattr(self, key)
            if not isinstance(value, (bool, np.bool_)) or value:
                raise ValueError(f"{key}={value!r} is not supported: the K3 vision tower has no biases (need False)")
        positive = (
            "patch_size",
            "init_pos_emb_height",
            "init_pos_emb_width",
            "init_pos_emb_time",
            "vt_hidden_size",
            "vt_num_attention_heads",
            "qkv_hidden_size",
            "vt_intermediate_size",
            "text_hidden_size",
            "mm_hidden_size",
        )
        for key in positive:
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{key} must be a positive integer, got {value!r}")
        if self.init_pos_emb_time > MAX_POS_EMB_TIME:
            raise ValueError(
                f"init_pos_emb_time={self.init_pos_emb_time} frames per chunk: at most {MAX_POS_EMB_TIME} "
                f"(K3 uses 4; every forward builds a [init_pos_emb_time, D] table)"
            )
        layers = self.vt_num_hidden_layers
        if isinstance(layers, bool) or not isinstance(layers, int) or layers < 0:
            raise ValueError(f"vt_num_hidden_layers must be an integer >= 0, got {self.vt_num_hidden_layers!r}")
        _int_pair("merge_kernel_size", self.merge_kernel_size)
        if self.qkv_hidden_size % self.vt_num_attention_heads:
            raise ValueError(
                f"qkv_hidden_size={self.qkv_hidden_size} is not divisible by "
                f"vt_num_attention_heads={self.vt_num_attention_heads}"
            )
        if self.head_dim % 4:
            raise ValueError(
                f"head_dim={self.head_dim} must be a multiple of 4 for the 2D RoPE (width and height pairs)"
            )
        if self.vt_hidden_size % 2:
            raise ValueError(f"vt_hidden_size={self.vt_hidden_size} must be even for the sin/cos time embedding")
        if self.mm_hidden_size != self.vt_hidden_size:
            raise ValueError(
                f"mm_hidden_size={self.mm_hidden_size} must equal vt_hidden_size={self.vt_hidden_size}: "
                "the projector reads merged encoder tokens"
            )
        for key in ("projector_ln_eps", "vit_norm_eps"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ValueError(f"{key} must be a positive finite number, got {value!r}")

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_dict(cls, d: dict[str, Any], require: tuple[str, ...] = ()) -> VisionConfig:
        """Build from a `vision_config` dict or a whole `config.json` dict holding one.

        Unknown keys are ignored (HF configs carry many); inconsistent values raise ValueError;
        keys missing from `require` too (named), others take K3's values.
        """
        if not isinstance(d, dict):
            raise ValueError(f"expected a dict, got {type(d).__name__}")
        if "vision_config" in d:
            d = d["vision_config"]
            if not isinstance(d, dict):
                raise ValueError("config 'vision_config' entry is not a dict")
        names = {f.name for f in dataclasses.fields(cls)}
        if not names & d.keys():
            raise ValueError("dict holds no vision_config keys (expected e.g. 'vt_hidden_size', 'patch_size')")
        missing = [k for k in require if k not in d]
        if missing:
            raise ValueError(
                f"vision_config lacks {', '.join(missing)}: a checkpoint's config must state its sizes "
                "(K3's values are not assumed)"
            )
        return cls(**{k: v for k, v in d.items() if k in names})

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> VisionConfig:
        """Read a checkpoint's `config.json` (whole model config or a bare vision_config); every key of
        `REQUIRED_IN_FILES` must be there. ValueError naming the file otherwise."""
        if os.path.isdir(path):
            raise ValueError(f"{path}: is a folder, not a config.json file")
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from None
        except OSError as e:
            raise ValueError(f"{path}: cannot read ({e.strerror or e})") from None
        return cls.from_file_data(data, str(path))

    @classmethod
    def from_file_data(cls, data: Any, label: str) -> VisionConfig:
        """`from_dict` for a parsed config file (every `REQUIRED_IN_FILES` key stated), errors prefixed by `label`."""
        try:
            return cls.from_dict(data, require=REQUIRED_IN_FILES)
        except (ValueError, TypeError) as e:
            raise ValueError(f"{label}: {e}") from None

    def to_dict(self) -> dict[str, Any]:
        """The config as a JSON-ready `vision_config` dict."""
        d = dataclasses.asdict(self)
        d["merge_kernel_size"] = list(self.merge_kernel_size)
        return d

    def replace(self, **changes: Any) -> VisionConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def k3(cls) -> VisionConfig:
        """The real Kimi K3 vision_config (docs/model.md)."""
        return cls()

    @classmethod
    def tiny(cls) -> VisionConfig:
        """A small config for the CUDA simulator with every structural feature of K3:
        qkv width != hidden (non-square wo), head_dim a multiple of 4 but not a power of 2,
        a position grid that needs interpolation, a text width unlike the others."""
        return cls(
            patch_size=4,
            init_pos_emb_height=6,
            init_pos_emb_width=6,
            init_pos_emb_time=4,
            vt_hidden_size=32,
            vt_num_attention_heads=2,
            qkv_hidden_size=48,
            vt_intermediate_size=64,
            vt_num_hidden_layers=2,
            mm_hidden_size=32,
            text_hidden_size=40,
        )
