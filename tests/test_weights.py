"""Checkpoint I/O: bf16/fp16/fp32 round trips, sharded files with non-vision tensors, every bad file."""

import json
import struct

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from moonvit_kernels import weights as W
from moonvit_kernels.bundled import TINY_DIR
from moonvit_kernels.config import VisionConfig

CFG = VisionConfig.tiny()


@pytest.fixture
def wts():
    return W.random_weights(CFG, seed=3)


def test_bf16_conversion_matches_ml_dtypes():
    r = np.random.default_rng(0)
    x = np.concatenate(
        [
            r.standard_normal(10000).astype(np.float32) * 10.0 ** r.integers(-30, 30, 10000),
            np.array([0.0, -0.0, np.inf, -np.inf, 3.4e38, 1e-45, 1.00390625, 1.01171875], np.float32),
        ]
    ).astype(np.float32)
    ours = W.float32_to_bf16_bits(x)
    theirs = x.astype(ml_dtypes.bfloat16).view(np.uint16)
    np.testing.assert_array_equal(ours, theirs)
    back = W.bf16_bits_to_float32(ours)
    np.testing.assert_array_equal(back, theirs.view(ml_dtypes.bfloat16).astype(np.float32))
    assert np.isnan(W.bf16_bits_to_float32(W.float32_to_bf16_bits(np.array([np.nan], np.float32))))[0]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_round_trip(tmp_path, wts, dtype):
    W.save_checkpoint(tmp_path, wts, CFG, dtype=dtype)
    got = W.load_weights(tmp_path)
    assert set(got) == set(wts)
    for k, v in wts.items():
        assert got[k].dtype == np.float32 and got[k].shape == v.shape
        if dtype == "float32":
            np.testing.assert_array_equal(got[k], v)
        elif dtype == "float16":
            np.testing.assert_array_equal(got[k], v.astype(np.float16).astype(np.float32))
        else:
            np.testing.assert_array_equal(got[k], v.astype(ml_dtypes.bfloat16).astype(np.float32))
            assert not np.array_equal(got[k], v)  # bf16 really is lossy: the test could fail


def test_independent_reader_and_writer(tmp_path, wts):
    # our writer -> safetensors' reader, and safetensors' writer -> our reader
    W.save_weights(tmp_path / "ours.safetensors", wts, dtype="float32")
    theirs = load_file(tmp_path / "ours.safetensors")
    for k in wts:
        np.testing.assert_array_equal(theirs[k], wts[k])
    save_file({k: v.astype(np.float16) for k, v in wts.items()}, tmp_path / "theirs.safetensors")
    got = W.load_weights(tmp_path / "theirs.safetensors", CFG)
    for k in wts:
        np.testing.assert_array_equal(got[k], wts[k].astype(np.float16).astype(np.float32))


def test_sharded_with_decoder_tensors_never_reads_them(tmp_path, wts, monkeypatch):
    decoder = {
        "language_model.model.layers.0.mlp.up_proj.weight": np.ones((64, 32), np.float32),
        "language_model.lm_head.weight": np.full((40, 32), 2.0, np.float32),
    }
    W.save_checkpoint(tmp_path, wts, CFG, dtype="bfloat16", shards=3, extra_tensors=decoder)
    index = json.loads((tmp_path / W.INDEX_NAME).read_text())
    assert len(set(index["weight_map"].values())) == 3
    read = []
    original = W.SafetensorsFile.read

    def spy(self, name):
        read.append(name)
        return original(self, name)

    monkeypatch.setattr(W.SafetensorsFile, "read", spy)
    got = W.load_weights(tmp_path)
    assert set(got) == set(wts)
    assert sorted(read) == sorted(wts)
    assert not any(n.startswith("language_model") for n in read)


def test_config_from_checkpoint(tmp_path, wts):
    W.save_checkpoint(tmp_path, wts, CFG)
    cfg, got = W.load_checkpoint(tmp_path)
    assert cfg == CFG and set(got) == set(wts)


def test_bundled_tiny_checkpoint_loads():

    tiny = TINY_DIR
    cfg, got = W.load_checkpoint(tiny)
    assert cfg == VisionConfig.tiny()
    assert (tiny / "model.safetensors").stat().st_size < 1_000_000
    header = W.SafetensorsFile(tiny / "model.safetensors")
    assert {header.dtype(k) for k in header.keys()} == {"BF16"}
    inputs = np.load(tiny / "inputs.npz")
    assert inputs["grid_thws"].tolist() == [[1, 6, 8], [2, 4, 4]]


def test_missing_tensor(tmp_path, wts):
    name = "vision_tower.encoder.blocks.1.wo.weight"
    del wts[name]
    W.save_checkpoint(tmp_path, wts, CFG)
    with pytest.raises(KeyError, match=r"blocks\.1\.wo\.weight"):
        W.load_weights(tmp_path)


def test_misshaped_tensor(tmp_path, wts):
    name = "mm_projector.proj.2.weight"
    wts[name] = np.zeros((39, 128), np.float32)
    W.save_checkpoint(tmp_path, wts, CFG)
    with pytest.raises(ValueError, match=r"proj\.2\.weight.*\(39, 128\).*\(40, 128\)"):
        W.load_weights(tmp_path)


def test_extra_vision_tensor(tmp_path, wts):
    wts["vision_tower.encoder.blocks.2.norm0.weight"] = np.ones(32, np.float32)
    W.save_checkpoint(tmp_path, wts, CFG)
    with pytest.raises(ValueError, match=r"unexpected vision tensor.*blocks\.2\.norm0"):
        W.load_weights(tmp_path)


def test_config_mismatch_is_named(tmp_path, wts):
    W.save_checkpoint(tmp_path, wts, CFG)
    with pytest.raises(ValueError, match=r"patch_embed\.proj\.weight.*shape"):
        W.load_weights(tmp_path, CFG.replace(patch_size=5))


def test_truncated_file(tmp_path, wts):
    W.save_weights(tmp_path / "m.safetensors", wts)
    data = (tmp_path / "m.safetensors").read_bytes()
    (tmp_path / "m.safetensors").write_bytes(data[:-100])
    with pytest.raises(ValueError, match="truncated"):
        W.load_weights(tmp_path / "m.safetensors", CFG)


@pytest.mark.parametrize(
    "payload, match",
    [
        (b"\x01\x02", "not a safetensors file"),
        (struct.pack("<Q", 10**12) + b"{}", "corrupt safetensors header"),
        (struct.pack("<Q", 6) + b"{not j", "corrupt safetensors header"),
        (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
        (struct.pack("<Q", 40) + b'{"a": {"dtype": "F32", "shape": [2]}}   ', "corrupt safetensors header entry"),
    ],
)
def test_corrupt_file(tmp_path, payload, match):
    (tmp_path / "bad.safetensors").write_bytes(payload)
    with pytest.raises(ValueError, match=match):
        W.load_weights(tmp_path / "bad.safetensors", CFG)


def test_wrong_byte_count_and_dtype(tmp_path):
    header = json.dumps({"vision_tower.x": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}).encode()
    (tmp_path / "a.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(8))
    with pytest.raises(ValueError, match="8 bytes for shape"):
        W.SafetensorsFile(tmp_path / "a.safetensors")
    header = json.dumps({"vision_tower.x": {"dtype": "I8", "shape": [3], "data_offsets": [0, 3]}}).encode()
    (tmp_path / "b.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(3))
    with pytest.raises(ValueError, match="unsupported dtype I8"):
        W.SafetensorsFile(tmp_path / "b.safetensors").read("vision_tower.x")


def test_missing_paths(tmp_path, wts):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        W.load_weights(tmp_path / "nope", CFG)
    with pytest.raises(FileNotFoundError, match="no .safetensors"):
        W.load_weights(tmp_path, CFG)
    with pytest.raises(FileNotFoundError, match="config.json"):
        W.load_weights(tmp_path)
    W.save_checkpoint(tmp_path, wts, CFG, shards=2)
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="00002"):
        W.load_weights(tmp_path)


def test_random_weights_scales():
    a, b = W.random_weights(CFG, 7), W.random_weights(CFG, 7)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(
        a["vision_tower.patch_embed.proj.weight"], W.random_weights(CFG, 8)["vision_tower.patch_embed.proj.weight"]
    )
    norm = a["vision_tower.encoder.blocks.0.norm0.weight"]
    assert norm.std() > 0.1 and abs(norm.mean() - 1) < 0.3
    assert 0.3 < a["vision_tower.patch_embed.pos_emb.weight"].std() < 0.7
    W.check_weights(a, CFG)


def test_parameter_count_tiny_matches_tensors():
    w = W.random_weights(CFG, 0)
    assert W.parameter_count(CFG)["total"] == sum(v.size for v in w.values())


def test_check_weights_rejects_integer_and_non_mapping(wts):
    wts["vision_tower.encoder.final_layernorm.weight"] = np.ones(32, np.int32)
    with pytest.raises(ValueError, match="final_layernorm.*dtype int32"):
        W.check_weights(wts, CFG)
    with pytest.raises(ValueError, match="mapping"):
        W.check_weights([1, 2], CFG)


def test_non_finite_tensor_in_file(tmp_path, wts):
    wts["vision_tower.encoder.blocks.0.wqkv.weight"][3, 4] = np.nan
    W.save_checkpoint(tmp_path, wts, CFG)
    with pytest.raises(ValueError, match=r"blocks\.0\.wqkv\.weight.*NaN or Inf"):
        W.load_weights(tmp_path)
