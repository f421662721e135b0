"""Checkpoint I/O: bf16/fp16/fp32 round trips, sharded files with non-vision tensors, every bad file,
and a multi-GB (sparse) fake decoder that loading must never touch."""

import json
import struct
import time
from pathlib import Path

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


def test_bf16_bits_take_any_layout():
    x = np.random.default_rng(1).standard_normal((5, 7)).astype(np.float32)
    bits = W.float32_to_bf16_bits(x.T)  # not contiguous
    assert bits.dtype == np.uint16 and bits.shape == (7, 5)
    np.testing.assert_array_equal(W.bf16_bits_to_float32(bits[:, ::2]), x.T[:, ::2].astype(ml_dtypes.bfloat16))


def test_independent_reader_and_writer(tmp_path, wts):
    # our writer -> safetensors' plain reader, and safetensors' writer -> our reader
    W.save_weights(tmp_path / "ours.safetensors", wts, dtype="float32", metadata={"who": "test"})
    theirs = load_file(tmp_path / "ours.safetensors")
    for k in wts:
        np.testing.assert_array_equal(theirs[k], wts[k])
    assert W.SafetensorsFile(tmp_path / "ours.safetensors").metadata == {"who": "test"}
    W.save_weights(tmp_path / "bf16.safetensors", wts)
    header = W.SafetensorsFile(tmp_path / "bf16.safetensors")
    assert {header.dtype(k) for k in header.keys()} == {"BF16"}
    name = "mm_projector.proj.2.weight"
    assert header.nbytes(name) == 2 * wts[name].size
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
        (b"", "not a safetensors file"),
        (struct.pack("<Q", 2) + b"[]", "corrupt safetensors header"),
        (
            struct.pack("<Q", 40) + b'{"a": {"dtype": "F32", "shape": [2]}}   ',
            "corrupt safetensors header",
        ),
    ],
)
def test_corrupt_file(tmp_path, payload, match):
    (tmp_path / "bad.safetensors").write_bytes(payload)
    with pytest.raises(ValueError, match=match) as e:
        W.load_weights(tmp_path / "bad.safetensors", CFG)
    assert str(tmp_path / "bad.safetensors") in str(e.value)


def test_padded_file(tmp_path, wts):
    W.save_weights(tmp_path / "m.safetensors", wts)
    with open(tmp_path / "m.safetensors", "ab") as f:
        f.write(bytes(16))
    with pytest.raises(ValueError, match=r"m\.safetensors: the header's tensors do not cover the data exactly"):
        W.load_weights(tmp_path / "m.safetensors", CFG)


def test_bad_index(tmp_path, wts):
    W.save_checkpoint(tmp_path, wts, CFG, shards=2)
    (tmp_path / W.INDEX_NAME).write_text('{"metadata": {}}')
    with pytest.raises(ValueError, match=r"index\.json: not a valid safetensors index"):
        W.load_weights(tmp_path)


def test_wrong_byte_count_and_dtype(tmp_path):
    header = json.dumps({"vision_tower.x": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}).encode()
    (tmp_path / "a.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(8))
    with pytest.raises(ValueError, match=r"a\.safetensors: a tensor's byte range does not match its shape"):
        W.SafetensorsFile(tmp_path / "a.safetensors")
    header = json.dumps({"vision_tower.x": {"dtype": "I8", "shape": [3], "data_offsets": [0, 3]}}).encode()
    (tmp_path / "b.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(3))
    with pytest.raises(ValueError, match="unsupported dtype I8"):
        W.SafetensorsFile(tmp_path / "b.safetensors").read("vision_tower.x")
    assert W.SafetensorsFile(tmp_path / "b.safetensors").nbytes("vision_tower.x") is None


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


# ============================================================================ a multi-GB decoder is never read
DECODER = "language_model.model.embed_tokens.weight"


def write_sparse_checkpoint(directory: Path, weights: dict, decoder_shape: tuple[int, int]) -> Path:
    """config.json + one model.safetensors whose F32 decoder tensor (between two halves of the
    vision tensors) is a hole in the file: gigabytes on paper, no disk blocks, zeros if read."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({"vision_config": CFG.to_dict()}))
    names = sorted(weights)
    order = names[: len(names) // 2] + [DECODER] + names[len(names) // 2 :]
    header, offset = {}, 0
    for name in order:
        shape = decoder_shape if name == DECODER else weights[name].shape
        size = 4 * int(np.prod(shape))
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path = directory / "model.safetensors"
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        start = f.tell()
        for name in names:
            f.seek(start + header[name]["data_offsets"][0])
            f.write(np.ascontiguousarray(weights[name], dtype="<f4").tobytes())
        f.truncate(start + offset)
    return path


def peak_rss_since_reset() -> int | None:
    """Reset the kernel's peak-resident-memory mark (Linux `clear_refs` 5); later read it with `peak_rss()`."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return None
    return peak_rss()


def peak_rss() -> int:
    """VmHWM of this process in bytes (peak resident set since the last reset)."""
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmHWM"))
    return int(line.split()[1]) * 1024


def test_multi_gigabyte_decoder_is_never_read(tmp_path, wts):
    decoder_rows = 3 * 2**30 // (4 * 1024)  # 3 GiB of float32
    path = write_sparse_checkpoint(tmp_path / "ck", wts, (decoder_rows, 1024))
    size = path.stat().st_size
    assert size > 3 * 2**30
    if path.stat().st_blocks * 512 > 64 * 2**20:
        pytest.skip("this filesystem does not keep sparse files sparse")
    before = peak_rss_since_reset()
    if before is None:
        pytest.skip("cannot reset the peak-memory mark (/proc/self/clear_refs): not Linux?")
    start = time.perf_counter()
    got = W.load_weights(tmp_path / "ck")
    seconds = time.perf_counter() - start
    growth = peak_rss() - before
    assert set(got) == set(wts) and DECODER not in got
    for k, v in wts.items():
        np.testing.assert_array_equal(got[k], v)
    assert seconds < 2.0, f"loading took {seconds:.1f} s: the decoder bytes were read?"
    assert growth < 64 * 2**20, f"peak memory grew by {growth / 2**20:.0f} MiB: the decoder bytes were read?"

    # the measurement can fail: reading 96 MiB of the decoder shows up
    before = peak_rss_since_reset()
    header = W.SafetensorsFile(path)
    assert header.shape(DECODER) == (decoder_rows, 1024) and header.nbytes(DECODER) == decoder_rows * 4096
    part = header._handle.get_slice(DECODER)[: 24 * 1024]
    assert part.nbytes == 96 * 2**20 and not part.any()
    assert peak_rss() - before > 64 * 2**20


# ============================================================================ issue: nothing silently wrong
def test_the_same_tensor_in_two_unindexed_files_names_both(tmp_path, wts):
    W.save_weights(tmp_path / "a.safetensors", wts)
    W.save_weights(tmp_path / "b.safetensors", {"vision_tower.encoder.final_layernorm.weight": np.ones(32, np.float32)})
    (tmp_path / "config.json").write_text(json.dumps({"vision_config": CFG.to_dict()}))
    with pytest.raises(ValueError, match=r"final_layernorm\.weight.*a\.safetensors.*b\.safetensors") as e:
        W.load_weights(tmp_path)
    assert str(tmp_path / "a.safetensors") in str(e.value) and str(tmp_path / "b.safetensors") in str(e.value)


@pytest.mark.parametrize("weight_map", [[["vision_tower.x", "m.safetensors"]], {"vision_tower.x": 3}, "m"])
def test_an_index_whose_weight_map_is_not_names_to_files(tmp_path, wts, weight_map):
    W.save_checkpoint(tmp_path, wts, CFG, shards=2)
    (tmp_path / W.INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    with pytest.raises(ValueError, match=r"index\.json: not a valid safetensors index.*weight_map"):
        W.load_weights(tmp_path)


def test_a_config_json_that_is_a_folder(tmp_path, wts):
    W.save_weights(tmp_path / "model.safetensors", wts)
    (tmp_path / "config.json").mkdir()
    with pytest.raises(ValueError, match=r"config\.json: is a folder"):
        W.load_checkpoint(tmp_path)


def test_check_weights_rejects_nan_like_load_weights(wts):
    wts["mm_projector.proj.0.weight"][1, 2] = np.nan
    with pytest.raises(ValueError, match=r"mm_projector\.proj\.0\.weight.*NaN or Inf"):
        W.check_weights(wts, CFG)


@pytest.fixture
def bounded_expected_shapes(monkeypatch):
    """Fail loudly if anything builds the tensor table of a config with absurdly many layers."""
    real = W.expected_shapes

    def guarded(config):
        assert config.vt_num_hidden_layers <= 1000, "expected_shapes built for an unbounded layer count"
        return real(config)

    monkeypatch.setattr(W, "expected_shapes", guarded)


def test_a_config_with_more_layers_than_the_checkpoint_holds(tmp_path, wts, bounded_expected_shapes):
    W.save_checkpoint(tmp_path, wts, CFG.replace(vt_num_hidden_layers=10**9))
    with pytest.raises(ValueError, match=r"vt_num_hidden_layers=1000000000 but the checkpoint holds 2 encoder"):
        W.load_weights(tmp_path)
    with pytest.raises(ValueError, match=r"vt_num_hidden_layers=1000000000 but the weights hold 2 encoder"):
        W.check_weights(wts, CFG.replace(vt_num_hidden_layers=10**9))
    assert W.parameter_count(CFG.replace(vt_num_hidden_layers=10**9))["total"] > 10**12  # arithmetic, no table


def test_a_misshaped_checkpoint_is_refused_from_its_headers(tmp_path, wts, monkeypatch):
    wts["vision_tower.patch_embed.proj.weight"] = np.zeros((32, 3, 6, 6), np.float32)
    W.save_checkpoint(tmp_path, wts, CFG)

    def no_reading(self, name):
        raise AssertionError(f"read the bytes of {name} before checking the shapes")

    monkeypatch.setattr(W.SafetensorsFile, "read", no_reading)
    with pytest.raises(ValueError, match=r"proj\.weight.*\(32, 3, 6, 6\), expected \(32, 3, 4, 4\)"):
        W.load_weights(tmp_path)
    with pytest.raises(ValueError, match=r"proj\.weight.*\(32, 3, 6, 6\)"):
        W.check_headers(tmp_path, CFG)


def test_checkpoint_digest_follows_the_values_not_the_names(tmp_path, wts):
    """Same names, shapes and sizes re-saved in place with other values: another digest."""
    W.save_checkpoint(tmp_path / "a", wts, CFG)
    first = W.checkpoint_digest(tmp_path / "a")
    W.save_checkpoint(tmp_path / "copy", wts, CFG, shards=1)
    assert W.checkpoint_digest(tmp_path / "copy") == first  # content, not path or time
    other = W.random_weights(CFG, seed=99)
    W.save_checkpoint(tmp_path / "a", other, CFG)
    assert (tmp_path / "a" / "model.safetensors").stat().st_size == (
        tmp_path / "copy" / "model.safetensors"
    ).stat().st_size
    assert W.checkpoint_digest(tmp_path / "a") != first
    # tensors up to 64 KiB (all of the tiny model's) are hashed whole: one changed value shows
    changed = {**wts, "mm_projector.proj.2.weight": wts["mm_projector.proj.2.weight"].copy()}
    changed["mm_projector.proj.2.weight"][0, 0] += 1.0
    W.save_checkpoint(tmp_path / "b", changed, CFG)
    assert W.checkpoint_digest(tmp_path / "b") != first
    # larger ones by 16 windows of 4 KiB: a bounded read per tensor, whatever its size
    blob = tmp_path / "blob"
    blob.write_bytes(np.random.default_rng(0).bytes(2**20 + 3))
    with open(blob, "rb") as f:
        sample = W._sampled_bytes(f, 3, 2**20 + 3)
    data = blob.read_bytes()
    assert len(sample) == 64 * 1024 and sample[:4096] == data[3:4099] and sample[-4096:] == data[-4096:]


def test_a_full_disk_keeps_the_earlier_checkpoint(tmp_path, wts):
    from helpers import file_size_limit, snapshot

    W.save_checkpoint(tmp_path, wts, CFG, dtype="bfloat16")
    before = snapshot(tmp_path)
    with pytest.raises(OSError), file_size_limit(8192):
        W.save_checkpoint(tmp_path, W.random_weights(CFG, seed=4), CFG, dtype="float32")
    assert snapshot(tmp_path) == before
