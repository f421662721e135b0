"""`VisionConfig`: loading HF configs, the real K3 values of docs/model.md, and every rejection."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from moonvit_kernels.config import VisionConfig
from moonvit_kernels.weights import parameter_count

# docs/model.md, "Configuration", copied as written there.
K3_VISION_CONFIG = {
    "patch_size": 14,
    "init_pos_emb_height": 64,
    "init_pos_emb_width": 64,
    "init_pos_emb_time": 4,
    "pos_emb_type": "divided_fixed",
    "pos_emb_interpolation_mode": "bilinear",
    "vt_hidden_size": 1024,
    "vt_num_attention_heads": 12,
    "qkv_hidden_size": 1536,
    "vt_intermediate_size": 4096,
    "vt_num_hidden_layers": 27,
    "norm_type": "rmsnorm",
    "attn_bias": False,
    "linear_bias": False,
    "patch_embed_proj_bias": False,
    "mlp_type": "mlp2",
    "activation_func": "gelu_pytorch_tanh",
    "merge_kernel_size": [2, 2],
    "merge_type": "sd2_tpool",
    "mm_projector_type": "patchmergerv2",
    "mm_hidden_size": 1024,
    "projector_hidden_act": "gelu",
    "projector_ln_eps": 1e-5,
    "text_hidden_size": 7168,
}

# HF configs carry many keys this package does not use.
UNKNOWN_KEYS = {"model_type": "moonvit", "torch_dtype": "bfloat16", "_attn_implementation": "flash_attention_2"}

WHOLE_CONFIG = {
    "architectures": ["KimiK3ForConditionalGeneration"],
    "model_type": "kimi_k3",
    "text_config": {"hidden_size": 7168, "num_hidden_layers": 61, "vocab_size": 163840},
    "vision_config": {**K3_VISION_CONFIG, **UNKNOWN_KEYS},
    "media_placeholder_token_id": 163605,
}


def test_k3_values_match_spec():
    c = VisionConfig.k3()
    for key, value in K3_VISION_CONFIG.items():
        got = getattr(c, key)
        assert (list(got) if key == "merge_kernel_size" else got) == value, key
    assert c.head_dim == 128
    assert c.merged_hidden_size == 4 * 1024
    assert c.patch_dim == 3 * 14 * 14
    assert c.vit_norm_eps == np.finfo(np.float32).eps


def test_k3_parameter_count_matches_spec():
    counts = parameter_count(VisionConfig.k3())
    assert counts["vision_tower"] == 401_214_464
    assert counts["mm_projector"] == 46_144_512
    assert counts["total"] == 447_358_976 == 401_214_464 + 46_144_512


def test_tiny_keeps_k3_structure():
    t = VisionConfig.tiny()
    assert t.qkv_hidden_size != t.vt_hidden_size  # wo is not square, as in K3
    assert t.head_dim % 4 == 0 and t.head_dim & (t.head_dim - 1) != 0  # RoPE-able, not a power of 2
    assert t.text_hidden_size not in (t.vt_hidden_size, t.merged_hidden_size, t.qkv_hidden_size)
    assert t.vt_num_hidden_layers >= 2
    assert (t.init_pos_emb_height, t.init_pos_emb_width) != (64, 64)


def test_from_dict_vision_config_with_unknown_keys():
    assert VisionConfig.from_dict({**K3_VISION_CONFIG, **UNKNOWN_KEYS}) == VisionConfig.k3()


def test_from_dict_whole_config_json():
    assert VisionConfig.from_dict(WHOLE_CONFIG) == VisionConfig.k3()
    # a vision_config that differs from the defaults is really read, not replaced by them
    other = {**WHOLE_CONFIG, "vision_config": {**K3_VISION_CONFIG, "vt_num_hidden_layers": 3, "patch_size": 16}}
    c = VisionConfig.from_dict(other)
    assert (c.vt_num_hidden_layers, c.patch_size) == (3, 16)


def test_from_json(tmp_path):
    whole = tmp_path / "whole.json"
    whole.write_text(json.dumps(WHOLE_CONFIG))
    assert VisionConfig.from_json(whole) == VisionConfig.k3()
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(VisionConfig.tiny().to_dict()))
    assert VisionConfig.from_json(str(bare)) == VisionConfig.tiny()
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        VisionConfig.from_json(broken)


@pytest.mark.parametrize(
    "config", [VisionConfig.k3(), VisionConfig.tiny(), VisionConfig.tiny().replace(vt_num_hidden_layers=0)]
)
def test_round_trip(config):
    d = config.to_dict()
    assert json.loads(json.dumps(d)) == d  # JSON-ready
    assert VisionConfig.from_dict(d) == config
    assert VisionConfig.from_dict(json.loads(json.dumps(d))) == config
    assert set(d) == {f.name for f in dataclasses.fields(VisionConfig)}


def test_replace_validates_again():
    assert VisionConfig.tiny().replace(vt_num_hidden_layers=5).vt_num_hidden_layers == 5
    with pytest.raises(ValueError, match="qkv_hidden_size"):
        VisionConfig.tiny().replace(qkv_hidden_size=49)


def test_numpy_integers_become_ints():
    c = VisionConfig.from_dict(
        {**VisionConfig.tiny().to_dict(), "patch_size": np.int64(4), "merge_kernel_size": np.array([2, 2])}
    )
    assert c == VisionConfig.tiny()
    assert type(c.patch_size) is int and all(type(k) is int for k in c.merge_kernel_size)


REJECTIONS = [
    # (changes to tiny(), regex the message must match: it names the field)
    ({"qkv_hidden_size": 49}, r"qkv_hidden_size=49 .*vt_num_attention_heads=2"),
    ({"qkv_hidden_size": 36, "vt_num_attention_heads": 2}, r"head_dim=18 .*multiple of 4"),
    ({"norm_type": "layernorm"}, r"norm_type='layernorm'"),
    ({"merge_type": "sd2"}, r"merge_type='sd2'"),
    ({"mm_projector_type": "mlp"}, r"mm_projector_type='mlp'"),
    ({"pos_emb_interpolation_mode": "nearest"}, r"pos_emb_interpolation_mode='nearest'"),
    ({"pos_emb_type": "learned"}, r"pos_emb_type='learned'"),
    ({"mlp_type": "swiglu"}, r"mlp_type='swiglu'"),
    ({"activation_func": "gelu"}, r"activation_func='gelu'"),
    ({"projector_hidden_act": "gelu_pytorch_tanh"}, r"projector_hidden_act='gelu_pytorch_tanh'"),
    ({"attn_bias": True}, r"attn_bias=True"),
    ({"linear_bias": True}, r"linear_bias=True"),
    ({"patch_embed_proj_bias": True}, r"patch_embed_proj_bias=True"),
    ({"attn_bias": "false"}, r"attn_bias='false'"),
    ({"patch_size": 0}, r"patch_size must be a positive integer"),
    ({"vt_hidden_size": -32}, r"vt_hidden_size must be a positive integer"),
    ({"patch_size": 4.0}, r"patch_size must be a positive integer"),
    ({"patch_size": True}, r"patch_size must be a positive integer"),
    ({"vt_num_hidden_layers": -1}, r"vt_num_hidden_layers"),
    ({"vt_num_hidden_layers": True}, r"vt_num_hidden_layers"),
    ({"merge_kernel_size": (2, 0)}, r"merge_kernel_size"),
    ({"merge_kernel_size": (2, 2, 2)}, r"merge_kernel_size"),
    ({"merge_kernel_size": (2.5, 2)}, r"merge_kernel_size"),
    ({"merge_kernel_size": 2}, r"merge_kernel_size"),
    ({"mm_hidden_size": 64}, r"mm_hidden_size=64 must equal vt_hidden_size=32"),
    ({"vt_hidden_size": 33, "mm_hidden_size": 33}, r"vt_hidden_size=33 must be even"),
    ({"projector_ln_eps": 0.0}, r"projector_ln_eps"),
    ({"vit_norm_eps": -1e-6}, r"vit_norm_eps"),
    ({"vit_norm_eps": float("nan")}, r"vit_norm_eps"),
    ({"vit_norm_eps": float("inf")}, r"vit_norm_eps"),
    # no tensor bounds the frame count; the sin/cos table [init_pos_emb_time, D] is built per forward
    ({"init_pos_emb_time": 10**7}, r"init_pos_emb_time=10000000 .*at most 1024"),
]


@pytest.mark.parametrize(("changes", "match"), REJECTIONS, ids=[str(c) for c, _ in REJECTIONS])
def test_rejections_name_the_field(changes, match):
    with pytest.raises(ValueError, match=match):
        VisionConfig.tiny().replace(**changes)
    # the same through from_dict, the path a config.json takes
    with pytest.raises(ValueError, match=match):
        VisionConfig.from_dict({**VisionConfig.tiny().to_dict(), **changes})


def test_from_dict_rejects_non_configs():
    with pytest.raises(ValueError, match="expected a dict"):
        VisionConfig.from_dict([("patch_size", 14)])
    with pytest.raises(ValueError, match="no vision_config keys"):
        VisionConfig.from_dict({"hidden_size": 7168, "vocab_size": 163840})
    with pytest.raises(ValueError, match="'vision_config' entry is not a dict"):
        VisionConfig.from_dict({"vision_config": None})


def test_a_config_file_must_state_every_key_of_the_released_config(tmp_path):
    """A checkpoint's config.json that leaves a size out is refused naming the key; K3's value is not assumed."""
    for missing in ("text_hidden_size", "vt_num_hidden_layers", "init_pos_emb_time", "merge_kernel_size"):
        path = tmp_path / f"{missing}.json"
        path.write_text(json.dumps({"vision_config": {k: v for k, v in K3_VISION_CONFIG.items() if k != missing}}))
        with pytest.raises(ValueError, match=rf"{path}: .*lacks {missing}\b"):
            VisionConfig.from_json(path)
    path = tmp_path / "two.json"
    two = {k: v for k, v in K3_VISION_CONFIG.items() if k not in ("patch_size", "qkv_hidden_size")}
    path.write_text(json.dumps(two))
    with pytest.raises(ValueError, match="lacks patch_size, qkv_hidden_size"):
        VisionConfig.from_json(path)
    # vit_norm_eps is not in the released config (the source hard-codes it): its default is the source's
    assert "vit_norm_eps" not in K3_VISION_CONFIG
    # in code, defaults stay available
    assert VisionConfig.from_dict(two).patch_size == 14


def test_a_config_json_that_is_not_a_readable_file_is_named(tmp_path):
    (tmp_path / "folder.json").mkdir()
    with pytest.raises(ValueError, match=rf"{tmp_path / 'folder.json'}: .*folder"):
        VisionConfig.from_json(tmp_path / "folder.json")
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ValueError, match=rf"{tmp_path / 'binary.json'}: not valid JSON"):
        VisionConfig.from_json(tmp_path / "binary.json")


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        VisionConfig.tiny().patch_size = 8
