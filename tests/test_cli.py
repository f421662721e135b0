"""The command line end to end on bundled data: exit codes, files written, one-line errors."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_close, file_size_limit, fp32_rtol, read_only_folder, snapshot
from PIL import Image

from moonvit_kernels import cli, command_support, demo, golden
from moonvit_kernels.bundled import PHOTO as BUNDLED_PHOTO
from moonvit_kernels.bundled import TINY_DIR
from moonvit_kernels.config import VisionConfig
from moonvit_kernels.preprocess import preprocess_images
from moonvit_kernels.provenance import file_digest
from moonvit_kernels.reference import vision_forward
from moonvit_kernels.weights import (
    SafetensorsFile,
    expected_shapes,
    load_checkpoint,
    parameter_count,
    random_weights,
    save_checkpoint,
)

ROOT = Path(__file__).resolve().parents[1]
TINY = TINY_DIR
PHOTO = BUNDLED_PHOTO


def error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("error: ")
    return err[0]


@pytest.fixture(scope="module")
def second_image(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("img") / "noise.png"
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (37, 53, 3), dtype=np.uint8)).save(path)
    return path


# ============================================================================ run
def test_run_in_process(capsys):
    assert cli.main(["run"]) == 0
    out = capsys.readouterr().out
    assert "item 0 image grid (t,h,w)=(1,6,8)" in out
    assert "item 1 video (2 frames)" in out


def test_run_as_module_in_a_subprocess():
    r = subprocess.run(
        [sys.executable, "-m", "moonvit_kernels", "run"], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert "backend: numpy reference (CPU)" in r.stdout


# ============================================================================ encode
def test_encode_writes_embeddings_per_image(tmp_path, second_image, capsys):
    out = tmp_path / "sub" / "emb.npz"
    argv = ["encode", str(PHOTO), str(second_image), "--weights", str(TINY), "--backend", "numpy"]
    rc = cli.main([*argv, "--out", str(out), "--in-patch-limit", "200", "--quiet"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert str(out) in printed and "backend numpy" in printed
    config, weights = load_checkpoint(TINY)
    with np.load(out) as data:
        assert sorted(data.files) == ["grid_thws", "image_0", "image_1", "image_sizes", "sources"]
        assert data["sources"].tolist() == [str(PHOTO), str(second_image)]
        assert data["image_sizes"].tolist() == [[256, 300], [53, 37]]
        for i, path in enumerate([PHOTO, second_image]):
            item = preprocess_images(path, config, in_patch_limit=200)
            np.testing.assert_array_equal(data["grid_thws"][i], item.grid_thws[0])
            (ref,) = vision_forward(item.pixel_values, item.grid_thws, weights, config, np.float64)
            t, h, w = item.grid_thws[0]
            assert data[f"image_{i}"].shape == (h * w // 4, config.text_hidden_size)
            assert_close(data[f"image_{i}"], ref, rtol=fp32_rtol(config.merged_hidden_size, 64), atol=1e-5)


def test_encode_names_a_missing_or_unreadable_image(tmp_path, capsys):
    missing = tmp_path / "missing.png"
    assert cli.main(["encode", str(PHOTO), str(missing), "--out", str(tmp_path / "e.npz"), "--quiet"]) == 2
    line = error_line(capsys)
    assert str(missing) in line and "no such image file" in line
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"\xff\xd8 not really a jpeg")
    assert cli.main(["encode", str(broken), "--out", str(tmp_path / "e.npz"), "--quiet"]) == 2
    line = error_line(capsys)
    assert str(broken) in line and "cannot read as an image" in line
    assert not (tmp_path / "e.npz").exists()


def test_encode_rejects_a_checkpoint_missing_a_tensor(tmp_path, capsys):
    config = VisionConfig.tiny()
    weights = random_weights(config, seed=3)
    del weights["vision_tower.encoder.blocks.1.wo.weight"]
    save_checkpoint(tmp_path / "ckpt", weights, config)
    assert cli.main(["encode", str(PHOTO), "--weights", str(tmp_path / "ckpt"), "--quiet"]) == 2
    line = error_line(capsys)
    assert str(tmp_path / "ckpt") in line and "blocks.1.wo.weight" in line


def test_encode_rejects_a_patch_size_mismatch(tmp_path, capsys):
    """Weights cut for patch 6 under a config.json that says patch 4."""
    config = VisionConfig.tiny()
    save_checkpoint(tmp_path / "ckpt", random_weights(config.replace(patch_size=6), seed=4), config)
    assert cli.main(["encode", str(PHOTO), "--weights", str(tmp_path / "ckpt"), "--quiet"]) == 2
    line = error_line(capsys)
    assert "patch_embed.proj.weight" in line and "(32, 3, 6, 6)" in line and str(tmp_path / "ckpt") in line


def test_encode_names_a_missing_checkpoint_or_config(tmp_path, capsys):
    assert cli.main(["encode", str(PHOTO), "--weights", str(tmp_path / "none"), "--quiet"]) == 2
    assert f"{tmp_path / 'none'}: no such checkpoint" in error_line(capsys)
    (tmp_path / "empty").mkdir()
    assert cli.main(["encode", str(PHOTO), "--weights", str(tmp_path / "empty"), "--quiet"]) == 2
    assert "no config.json" in error_line(capsys)


def test_encode_reports_an_unknown_backend(capsys, tmp_path):
    assert cli.main(["encode", str(PHOTO), "--backend", "tpu", "--out", str(tmp_path / "e.npz"), "--quiet"]) == 2
    assert "unknown backend 'tpu'" in error_line(capsys)


# ============================================================================ --simulator
def _env_without_simulator() -> dict:
    return {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}


@pytest.fixture(scope="module")
def small_image(tmp_path_factory) -> Path:
    """8x8 pixels: 2x2 patches of the tiny model, one merged token (the simulator is slow)."""
    path = tmp_path_factory.mktemp("small") / "small.png"
    Image.fromarray(np.random.default_rng(4).integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(path)
    return path


def test_numba_without_gpu_or_simulator_says_use_the_simulator(monkeypatch, capsys, tmp_path, small_image):
    from moonvit_kernels import device

    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "0")
    monkeypatch.setattr(device, "gpu_available", lambda: False)
    assert cli.main(["encode", str(small_image), "--backend", "numba", "--out", str(tmp_path / "e.npz")]) == 2
    line = error_line(capsys)
    assert "backend 'numba' needs a CUDA GPU" in line and "--simulator" in line
    assert not (tmp_path / "e.npz").exists()


def test_numba_without_gpu_in_a_fresh_process(tmp_path, small_image):
    from moonvit_kernels.device import gpu_available

    if gpu_available():
        pytest.skip("a GPU is present: the no-GPU message cannot be seen here")
    r = subprocess.run(
        [sys.executable, "-m", "moonvit_kernels", "encode", str(small_image), "--backend", "numba", "--quiet"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_env_without_simulator(),
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "add --simulator" in r.stderr and "Traceback" not in r.stderr


def test_simulator_flag_switches_the_simulator_on_before_numba_loads(tmp_path):
    script = (
        "from moonvit_kernels import command_support as s; b = s.choose_backend('auto', True); "
        "import numba; from numba import cuda; print(b, numba.config.ENABLE_CUDASIM, cuda.is_available())"
    )
    r = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=_env_without_simulator(), timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["numba", "1", "True"]


def test_simulator_flag_errors(monkeypatch, capsys, tmp_path, small_image):
    out = str(tmp_path / "e.npz")
    assert cli.main(["encode", str(small_image), "--simulator", "--backend", "cupy", "--out", out]) == 2
    assert "does not apply to backend 'cupy'" in error_line(capsys)
    assert cli.main(["run", "--simulator", "--backend", "numpy"]) == 2
    assert "does not apply to backend 'numpy'" in error_line(capsys)
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "0")
    monkeypatch.setitem(sys.modules, "numba", sys.modules.get("numba", object()))
    with pytest.raises(command_support.CLIError, match="after numba was loaded: set NUMBA_ENABLE_CUDASIM=1"):
        command_support.choose_backend("numba", True)


@pytest.mark.slow
def test_encode_on_the_simulator_matches_numpy(tmp_path, small_image):
    out = tmp_path / "sim.npz"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "moonvit_kernels",
            "encode",
            str(small_image),
            "--simulator",
            "--quiet",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_env_without_simulator(),
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "backend numba (CUDA simulator, CPU)" in r.stdout
    config, weights = load_checkpoint(TINY)
    item = preprocess_images(small_image, config)
    (want,) = vision_forward(item.pixel_values, item.grid_thws, weights, config, np.float64)
    with np.load(out) as data:
        got = data["image_0"]
    assert got.shape == want.shape == (1, config.text_hidden_size)
    assert_close(got, want, rtol=fp32_rtol(config.merged_hidden_size, 64), atol=1e-5, name="simulator encode")


# ============================================================================ golden
def test_golden_default_inputs_and_float64(tmp_path, capsys):
    out = tmp_path / "golden"
    assert cli.main(["golden", "--out", str(out), "--float64"]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "README.md",
        "config.json",
        "extras.npz",
        "inputs.npz",
        "provenance.json",
        "stages_float32.npz",
        "stages_float64.npz",
    ]
    config, weights = load_checkpoint(TINY)
    bundled = np.load(TINY / "inputs.npz")
    with np.load(out / "inputs.npz") as inputs:
        np.testing.assert_array_equal(inputs["pixel_values"], bundled["pixel_values"])
        np.testing.assert_array_equal(inputs["grid_thws"], bundled["grid_thws"])
    for dtype in ("float32", "float64"):
        outputs, stages = vision_forward(
            bundled["pixel_values"], bundled["grid_thws"], weights, config, dtype, return_intermediates=True
        )
        with np.load(out / f"stages_{dtype}.npz") as saved:
            assert list(saved.files) == [*stages, "output_0", "output_1"]
            for key, value in stages.items():
                assert saved[key].dtype == np.dtype(dtype), key
                np.testing.assert_array_equal(saved[key], value, err_msg=key)
            np.testing.assert_array_equal(saved["output_1"], outputs[1])
    with np.load(out / "extras.npz") as extras:
        assert extras["cu_seqlens"].tolist() == [0, 48, 80]
        assert extras["rope_angles"].shape == (80, config.head_dim // 2)
        assert extras["position_term"].shape == (80, config.vt_hidden_size)
    readme = (out / "README.md").read_text()
    for name in names[1:]:
        assert f"`{name}`" in readme, name
    assert "layer_i [L, D]" in readme and "i = 0 .. 1" in readme
    assert VisionConfig.from_json(out / "config.json") == config
    assert capsys.readouterr().out.count("wrote ") == 7


def test_golden_from_an_image(tmp_path, second_image):
    out = tmp_path / "g"
    argv = ["golden", "--out", str(out), "--image", str(second_image), "--in-patch-limit", "64"]
    assert cli.main(argv) == 0
    config, _ = load_checkpoint(TINY)
    item = preprocess_images(second_image, config, in_patch_limit=64)
    with np.load(out / "inputs.npz") as inputs:
        np.testing.assert_array_equal(inputs["pixel_values"], item.pixel_values)
        assert inputs["sources"].tolist() == [str(second_image)]
    assert not (out / "stages_float64.npz").exists()


def test_golden_rejects_inputs_that_do_not_fit(tmp_path, capsys):
    bad = tmp_path / "bad.npz"
    np.savez(bad, pixel_values=np.zeros((5, 3, 4, 4), np.float32), grid_thws=np.array([[1, 2, 2]]))
    assert cli.main(["golden", "--out", str(tmp_path / "g"), "--inputs", str(bad)]) == 2
    assert "needs sum(t*h*w) = 4" in error_line(capsys)


# ============================================================================ Ctrl-C
def test_an_interrupt_is_one_line_and_exit_status_130(monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.rope_command, "run", interrupted)
    assert cli.main(["rope"]) == 130
    captured = capsys.readouterr()
    assert captured.err == "interrupted\n" and captured.out == ""


def test_an_interrupted_subprocess_exits_130_without_a_traceback(tmp_path):
    code = (
        "import os, signal, sys; from moonvit_kernels import rope_command, cli\n"
        "rope_command.run = lambda args: os.kill(os.getpid(), signal.SIGINT)\n"
        "sys.exit(cli.main(['rope']))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 130 and r.stderr == "interrupted\n", r.stderr


# ============================================================================ info
def test_info_reads_headers_only(monkeypatch, capsys):
    def no_reading(self, name):
        raise AssertionError(f"info read the bytes of {name}")

    monkeypatch.setattr(SafetensorsFile, "read", no_reading)
    assert cli.main(["info", str(TINY)]) == 0
    out = capsys.readouterr().out
    config = VisionConfig.tiny()
    total = parameter_count(config)["total"]
    assert f"vision parameters in the file: {total:,}" in out
    assert f"parameters the config needs: {total:,}" in out
    assert f"vision tensors: {len(expected_shapes(config))}" in out
    assert "vision_tower.encoder.blocks.0.wqkv.weight  BF16 [144, 32]" in out
    assert "other tensors: 0 (not read)" in out
    assert "matches its config: yes" in out


def test_info_on_a_sharded_checkpoint_with_decoder_tensors(tmp_path, capsys):
    config = VisionConfig.tiny()
    weights = random_weights(config, seed=5)
    weights["vision_tower.encoder.blocks.0.wo.weight"] = np.zeros((32, 40), np.float32)  # wrong shape
    extra = {f"language_model.layers.{i}.w": np.ones((3, 3), np.float32) for i in range(4)}
    save_checkpoint(tmp_path / "ck", weights, config, shards=3, extra_tensors=extra)
    assert cli.main(["info", str(tmp_path / "ck")]) == 1
    out = capsys.readouterr().out
    assert "3 safetensors file(s)" in out
    assert "other tensors: 4 (not read)" in out
    assert "matches its config: NO (1 problem(s))" in out
    assert "blocks.0.wo.weight has shape [32, 40], expected [32, 48]" in out


def test_info_on_a_missing_path(tmp_path, capsys):
    assert cli.main(["info", str(tmp_path / "nothing")]) == 2
    assert str(tmp_path / "nothing") in error_line(capsys)


# ============================================================================ demo
def test_demo_writes_pictures(tmp_path, capsys):
    out = tmp_path / "demo"
    assert cli.main(["demo", "--out", str(out), "--in-patch-limit", "256"]) == 0
    printed = capsys.readouterr().out
    pngs = sorted(out.glob("*.png"))
    assert [p.name for p in pngs] == [
        "01_patch_grid.png",
        "02_rope_frequency_maps.png",
        "03_rope_offset_invariance.png",
        "04_merge_index_map.png",
        "05_attention_mask.png",
        "06_pca_features.png",
        "07_error_vs_float64.png",
    ]
    for png in pngs:
        assert f"wrote {png}" in printed
        with Image.open(png) as im:
            assert im.format == "PNG" and min(im.size) > 100
    assert "in_patch_limit=256" in printed


def test_bad_command_line_exits_with_status_2(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["encode"])
    assert e.value.code == 2


def test_missing_bundled_data_says_how_to_get_it(monkeypatch):
    from pathlib import Path

    monkeypatch.setattr(command_support, "TINY_DIR", Path("/nonexistent/data/tiny"))
    with pytest.raises(command_support.CLIError, match=r"no such checkpoint.*ships inside the package.*reinstall") as e:
        command_support.load_checkpoint_or_fail(command_support.TINY_DIR)
    assert "/nonexistent/data" in str(e.value) and "--weights" in str(e.value)
    with pytest.raises(command_support.CLIError) as e:  # a user's own missing checkpoint gets no reinstall hint
        command_support.load_checkpoint_or_fail(Path("/nonexistent/mine"))
    assert "reinstall" not in str(e.value)


# ============================================================================ outputs: atomic, checked first, as named
@pytest.fixture
def no_compute(monkeypatch):
    """Fail the test if the model is built: the checks under test must come before any compute."""

    def refuse(*args, **kwargs):
        raise AssertionError("the model was built before the output was checked")

    monkeypatch.setattr(command_support, "make_model", refuse)


def test_encode_writes_exactly_the_file_named(tmp_path, small_image, capsys):
    out = tmp_path / "emb.out"
    assert cli.main(["encode", str(small_image), "--backend", "numpy", "--out", str(out), "--quiet"]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["emb.out"]  # not emb.out.npz, no temporary left
    assert capsys.readouterr().out.strip().endswith(f"wrote {out}")
    with np.load(out) as data:
        assert data["image_0"].shape == (1, 40) and data["sources"].tolist() == [str(small_image)]


def test_encode_checks_its_output_before_computing(tmp_path, small_image, capsys, no_compute):
    (tmp_path / "plain").write_text("a file, not a folder")
    bad = tmp_path / "plain" / "emb.npz"
    assert cli.main(["encode", str(small_image), "--backend", "numpy", "--out", str(bad), "--quiet"]) == 2
    assert f"{bad}: cannot write there: {tmp_path / 'plain'} is a file, not a folder" in error_line(capsys)
    assert cli.main(["encode", str(small_image), "--backend", "numpy", "--out", str(tmp_path), "--quiet"]) == 2
    assert "is a folder, not a file" in error_line(capsys)
    with read_only_folder(tmp_path / "ro") as folder:
        assert cli.main(["encode", str(small_image), "--out", str(folder / "emb.npz"), "--quiet"]) == 2
        assert f"cannot write in {folder}" in error_line(capsys)


def test_encode_checks_every_image_before_computing(tmp_path, small_image, capsys, no_compute):
    frames = [Image.fromarray(np.full((8, 8, 3), 40 * i, np.uint8)) for i in range(2)]
    frames[0].save(tmp_path / "anim.gif", save_all=True, append_images=frames[1:])
    for bad, reason in [(tmp_path, "is a folder, not an image file"), (tmp_path / "anim.gif", "holds 2 frames")]:
        assert cli.main(["encode", str(small_image), str(bad), "--out", str(tmp_path / "e.npz"), "--quiet"]) == 2
        line = error_line(capsys)
        assert str(bad) in line and reason in line


def test_encode_with_a_full_disk_keeps_the_earlier_file(tmp_path, small_image, second_image, capsys):
    out = tmp_path / "emb.npz"
    assert cli.main(["encode", str(small_image), "--backend", "numpy", "--out", str(out), "--quiet"]) == 0
    before = snapshot(tmp_path)
    capsys.readouterr()
    argv = ["encode", str(second_image), str(small_image), "--backend", "numpy", "--out", str(out), "--quiet"]
    with file_size_limit(len(before["emb.npz"]) + 512):  # the new file (two images) does not fit
        assert cli.main(argv) == 2
    line = error_line(capsys)
    assert f"cannot write {out}" in line and "File too large" in line
    assert snapshot(tmp_path) == before  # the earlier file intact, no temporary left


def test_encode_streams_one_image_at_a_time(tmp_path, small_image, second_image, monkeypatch):
    """Memory independent of the number of files: each image is preprocessed, encoded and written
    before the next is read (counted: at most one preprocessed image alive at any time)."""
    import weakref

    from moonvit_kernels import preprocess

    real = preprocess.preprocess_images
    alive, most = [0], [0]

    def counted(*args, **kwargs):
        item = real(*args, **kwargs)
        alive[0] += 1
        most[0] = max(most[0], alive[0])
        weakref.finalize(item, lambda: alive.__setitem__(0, alive[0] - 1))
        return item

    monkeypatch.setattr(preprocess, "preprocess_images", counted)
    images = [str(small_image), str(second_image)] * 3
    out = tmp_path / "e.npz"
    assert (
        cli.main(["encode", *images, "--backend", "numpy", "--out", str(out), "--in-patch-limit", "64", "--quiet"]) == 0
    )
    assert most[0] == 1
    with np.load(out) as data:
        assert data["grid_thws"].shape == (6, 3) and data["sources"].tolist() == images
        np.testing.assert_array_equal(data["image_0"], data["image_2"])


def test_demo_checks_its_output_before_computing(tmp_path, capsys, no_compute):
    (tmp_path / "plain").write_text("x")
    assert cli.main(["demo", "--out", str(tmp_path / "plain" / "pictures")]) == 2
    assert "is a file, not a folder" in error_line(capsys)


def test_demo_crop_of_a_one_pixel_image():
    assert demo.demo_crop_box(1, 1) == (0, 0, 1, 1)
    assert demo.demo_crop_box(256, 300) == (64, 37, 192, 165)  # the bundled photograph: as before


def test_a_decompression_bomb_is_one_error_line(tmp_path, small_image, capsys, monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 16)  # the 8x8 image: 64 pixels, past twice 16
    assert cli.main(["encode", str(small_image), "--out", str(tmp_path / "e.npz"), "--quiet"]) == 2
    line = error_line(capsys)
    assert str(small_image) in line and "decompression bomb" in line


# ============================================================================ golden: provenance, no stale files
def test_golden_removes_files_of_an_earlier_run_and_records_provenance(tmp_path, capsys):
    out = tmp_path / "g"
    assert cli.main(["golden", "--out", str(out), "--float64"]) == 0
    assert (out / "stages_float64.npz").is_file()
    (out / "notes.txt").write_text("the user's own file")
    assert cli.main(["golden", "--out", str(out)]) == 0  # same checkpoint and inputs, no float64 this time
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "README.md",
        "config.json",
        "extras.npz",
        "inputs.npz",
        "notes.txt",
        "provenance.json",
        "stages_float32.npz",
    ]
    provenance = json.loads((out / "provenance.json").read_text())
    made_with = provenance["made_with"]
    assert made_with["checkpoint"] and made_with["config"] and made_with["inputs"]
    assert sorted(provenance["files"]) == [n for n in names if n not in ("notes.txt", "provenance.json")]
    golden.check_golden(out)
    (out / "extras.npz").write_bytes((out / "inputs.npz").read_bytes())  # a file from elsewhere
    with pytest.raises(ValueError, match=r"extras\.npz: not the file .*provenance\.json"):
        golden.check_golden(out)


def test_golden_refuses_a_folder_made_from_other_weights(tmp_path, capsys, no_compute):
    out = tmp_path / "g"
    out.mkdir()
    other = tmp_path / "other"
    save_checkpoint(other, random_weights(VisionConfig.tiny(), seed=8), VisionConfig.tiny())
    made_with = {"checkpoint": "0" * 64, "config": "1" * 64, "inputs": "2" * 64, "preprocess": None}
    (out / "stages_float64.npz").write_bytes(b"an earlier run")
    files = {"stages_float64.npz": file_digest(out / "stages_float64.npz")}
    record = {"format": golden.GOLDEN_FORMAT, "made_with": made_with, "files": files}
    (out / "provenance.json").write_text(json.dumps(record))
    assert cli.main(["golden", "--out", str(out), "--weights", str(other)]) == 2
    line = error_line(capsys)
    assert str(out) in line and "checkpoint" in line and "--overwrite" in line
    (out / "provenance.json").unlink()  # golden files without provenance: an unknown earlier run, not touched
    assert cli.main(["golden", "--out", str(out), "--weights", str(other), "--overwrite"]) == 2
    assert "stages_float64.npz" in error_line(capsys) and (out / "stages_float64.npz").read_bytes() == b"an earlier run"


def test_golden_overwrite_replaces_everything(tmp_path):
    out = tmp_path / "g"
    assert cli.main(["golden", "--out", str(out), "--float64"]) == 0
    other = tmp_path / "other"
    save_checkpoint(other, random_weights(VisionConfig.tiny(), seed=8), VisionConfig.tiny())
    assert cli.main(["golden", "--out", str(out), "--weights", str(other), "--overwrite"]) == 0
    assert not (out / "stages_float64.npz").exists()
    golden.check_golden(out)


def test_golden_never_touches_files_it_did_not_write(tmp_path, capsys):
    """Issue 31: `golden --out CKPT` refused the checkpoint's config.json / README.md as golden files of an older
    version, and `--overwrite` then replaced them. Files golden did not record writing are never touched."""
    ckpt = tmp_path / "ckpt"
    save_checkpoint(ckpt, random_weights(VisionConfig.tiny(), seed=3), VisionConfig.tiny())
    (ckpt / "README.md").write_text("the model card")
    before = snapshot(ckpt)
    for overwrite in ([], ["--overwrite"]):
        assert cli.main(["golden", "--out", str(ckpt), *overwrite]) == 2
        line = error_line(capsys)
        assert "README.md, config.json" in line and "did not write" in line and "will not touch" in line, line
        assert "--overwrite" not in line
        assert snapshot(ckpt) == before
    (ckpt / "provenance.json").write_text(json.dumps({"format": "another program", "made_with": {}}))
    assert cli.main(["golden", "--out", str(ckpt), "--overwrite"]) == 2
    assert "provenance.json" in error_line(capsys)
    assert (ckpt / "provenance.json").read_text().startswith('{"format": "another program"')


def test_golden_replaces_only_the_files_its_record_lists(tmp_path, capsys):
    out = tmp_path / "g"
    assert cli.main(["golden", "--out", str(out), "--float64"]) == 0
    record = json.loads((out / "provenance.json").read_text())
    (out / "README.md").write_text("edited by hand")  # no longer the file golden wrote
    assert cli.main(["golden", "--out", str(out), "--overwrite"]) == 2
    assert "README.md" in error_line(capsys) and (out / "README.md").read_text() == "edited by hand"
    (out / "README.md").unlink()
    record["files"]["../outside.txt"] = record["files"].pop("stages_float64.npz")  # a hostile record
    (tmp_path / "outside.txt").write_bytes((out / "stages_float64.npz").read_bytes())
    (out / "provenance.json").write_text(json.dumps(record))
    assert cli.main(["golden", "--out", str(out)]) == 2  # stages_float64.npz is no longer listed: foreign
    assert "stages_float64.npz" in error_line(capsys)
    (out / "stages_float64.npz").unlink()
    assert cli.main(["golden", "--out", str(out)]) == 0
    assert (tmp_path / "outside.txt").is_file()
    golden.check_golden(out)


def test_an_interrupted_golden_run_can_be_run_again(tmp_path, capsys, monkeypatch):
    out = tmp_path / "g"
    assert cli.main(["golden", "--out", str(out), "--float64"]) == 0
    other = tmp_path / "other"
    save_checkpoint(other, random_weights(VisionConfig.tiny(), seed=8), VisionConfig.tiny())
    real_replace = os.replace
    moved = []

    def interrupted(src, dst):  # a Ctrl-C after two of the finished files have moved into `out`
        if Path(dst).parent == out:
            if len(moved) == 2:
                raise KeyboardInterrupt
            moved.append(dst)
        real_replace(src, dst)

    monkeypatch.setattr(golden.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        golden.write_golden(out, str(other), *load_checkpoint(other), *read_bundled_inputs(), float64=False)
    monkeypatch.setattr(golden.os, "replace", real_replace)
    with pytest.raises(ValueError, match="interrupted"):
        golden.check_golden(out)
    assert cli.main(["golden", "--out", str(out), "--weights", str(other)]) == 0
    assert not (out / "stages_float64.npz").exists()
    golden.check_golden(out)


def read_bundled_inputs():
    with np.load(TINY / "inputs.npz") as inputs:
        return inputs["pixel_values"], inputs["grid_thws"]


def test_golden_with_a_full_disk_keeps_the_earlier_folder(tmp_path, capsys):
    out = tmp_path / "g"
    assert cli.main(["golden", "--out", str(out)]) == 0
    before = snapshot(out)
    capsys.readouterr()
    with file_size_limit(4096):
        assert cli.main(["golden", "--out", str(out), "--float64"]) == 2
    assert "File too large" in error_line(capsys)
    assert snapshot(out) == before


def test_golden_checks_its_output_before_computing(tmp_path, capsys, monkeypatch):
    from moonvit_kernels import reference

    monkeypatch.setattr(reference, "vision_forward", lambda *a, **k: pytest.fail("computed first"))
    (tmp_path / "plain").write_text("x")
    assert cli.main(["golden", "--out", str(tmp_path / "plain")]) == 2
    assert "is a file, not a folder" in error_line(capsys)


# ============================================================================ configs and checkpoints: bounded, named
def test_a_config_with_a_billion_layers_fails_at_once(tmp_path, capsys, monkeypatch):
    from moonvit_kernels import weights as W

    real = W.expected_shapes
    monkeypatch.setattr(
        W, "expected_shapes", lambda c: real(c) if c.vt_num_hidden_layers < 1000 else pytest.fail("unbounded")
    )
    config = VisionConfig.tiny()
    save_checkpoint(tmp_path / "ck", random_weights(config, seed=2), config)
    raw = json.loads((tmp_path / "ck" / "config.json").read_text())
    raw["vision_config"]["vt_num_hidden_layers"] = 10**9
    (tmp_path / "ck" / "config.json").write_text(json.dumps(raw))
    assert cli.main(["info", str(tmp_path / "ck")]) == 1
    out = capsys.readouterr().out
    assert "matches its config: NO" in out and "vt_num_hidden_layers=1000000000 but the checkpoint holds 2" in out
    assert cli.main(["run", "--weights", str(tmp_path / "ck")]) == 2
    assert "vt_num_hidden_layers=1000000000" in error_line(capsys)


def test_info_names_a_dtype_the_loader_cannot_read(tmp_path, capsys):
    config = VisionConfig.tiny()
    weights = random_weights(config, seed=2)
    save_checkpoint(tmp_path / "ck", weights, config)
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(tmp_path / "ck" / "model.safetensors"))
    tensors["vision_tower.encoder.final_layernorm.weight"] = np.ones(32, np.int8)
    save_file(tensors, str(tmp_path / "ck" / "model.safetensors"))
    assert cli.main(["info", str(tmp_path / "ck")]) == 1
    out = capsys.readouterr().out
    assert "matches its config: NO" in out and "final_layernorm.weight has dtype I8" in out
    assert cli.main(["run", "--weights", str(tmp_path / "ck")]) == 2
    assert "dtype I8" in error_line(capsys)


@pytest.mark.parametrize("command", ["info", "run", "encode"])
def test_broken_checkpoint_files_are_one_error_line(tmp_path, capsys, command, small_image):
    config = VisionConfig.tiny()
    save_checkpoint(tmp_path / "index", random_weights(config, seed=2), config, shards=2)
    (tmp_path / "index" / "model.safetensors.index.json").write_text(json.dumps({"weight_map": [["a", "b"]]}))
    save_checkpoint(tmp_path / "folder", random_weights(config, seed=2), config)
    (tmp_path / "folder" / "config.json").unlink()
    (tmp_path / "folder" / "config.json").mkdir()
    for ck, reason in [("index", "weight_map must map tensor names"), ("folder", "is a folder")]:
        argv = {
            "info": ["info", str(tmp_path / ck)],
            "run": ["run", "--weights", str(tmp_path / ck)],
            "encode": ["encode", str(small_image), "--weights", str(tmp_path / ck), "--out", str(tmp_path / "e.npz")],
        }[command]
        rc = cli.main(argv)
        if command == "info" and ck == "folder":  # info still lists the tensors; the config is named unusable
            assert rc == 0 and "config: none usable" in capsys.readouterr().out
            continue
        assert rc == 2
        line = error_line(capsys)
        assert reason in line and str(tmp_path / ck) in line


# ============================================================================ one run per output (issue 31)
@pytest.mark.parametrize(
    "command, out_name",
    [
        (["fetch", str(TINY)], "fetched"),
        (["encode", "IMAGE", "--backend", "numpy"], "emb.npz"),
        (["encode-dataset", "IMAGES"], "dataset"),
        (["golden"], "golden"),
        (["demo"], "demo"),
        (["rope"], "rope.png"),
    ],
)
def test_a_second_run_into_the_same_output_is_refused_naming_the_first(
    tmp_path, capsys, small_image, command, out_name, no_compute
):
    from moonvit_kernels.output_lock import output_lock

    out = tmp_path / out_name
    args = [str(small_image) if a == "IMAGE" else str(small_image.parent) if a == "IMAGES" else a for a in command]
    before = snapshot(tmp_path)
    with output_lock(out, "the first run"):
        assert cli.main([*args, "--out", str(out)]) == 2
    line = error_line(capsys)
    assert f"{out}: in use by another run (pid {os.getpid()}, `the first run`, started " in line
    assert snapshot(tmp_path) == before  # nothing written, the lock file gone


def test_encode_refuses_a_nonfinite_embedding_naming_the_image_and_stage(tmp_path, small_image, capsys):
    config, weights = load_checkpoint(TINY)
    huge = {
        k: (np.full_like(v, 3e38) if k == "vision_tower.patch_embed.proj.weight" else v) for k, v in weights.items()
    }
    save_checkpoint(tmp_path / "ckpt", huge, config, dtype="float32")
    out = tmp_path / "emb.npz"
    args = ["encode", str(small_image), "--weights", str(tmp_path / "ckpt"), "--backend", "numpy", "--out", str(out)]
    assert cli.main([*args, "--quiet"]) == 2
    line = error_line(capsys)
    assert f"{small_image}: the embedding holds NaN or Inf (first at stage patch_embed)" in line
    assert not out.exists()
    assert cli.main([*args, "--quiet", "--allow-nonfinite"]) == 0
    with np.load(out) as data:
        assert not np.isfinite(data["image_0"]).any()


def test_golden_refuses_nonfinite_stages_unless_asked(tmp_path, capsys):
    """Finite but huge weights (3e38) make every stage NaN: golden writes no such values for porters (the folder
    stays empty) and names the first stage; --allow-nonfinite writes them."""
    config, weights = load_checkpoint(TINY)
    huge = {
        k: (np.full_like(v, 3e38) if k == "vision_tower.patch_embed.proj.weight" else v) for k, v in weights.items()
    }
    save_checkpoint(tmp_path / "ckpt", huge, config, dtype="float32")
    out = tmp_path / "golden"
    args = ["golden", "--weights", str(tmp_path / "ckpt"), "--out", str(out)]
    assert cli.main(args) == 2
    assert "stage patch_embed of the float32 computation holds" in error_line(capsys)
    assert not [p for p in out.iterdir() if not p.name.startswith(".")]
    assert cli.main([*args, "--allow-nonfinite"]) == 0
    with np.load(out / "stages_float32.npz") as stages:
        assert not np.isfinite(stages["patch_embed"]).all()


def test_demo_never_replaces_pictures_it_did_not_write(tmp_path, capsys):
    out = tmp_path / "demo"
    out.mkdir()
    (out / "05_attention_mask.png").write_bytes(b"my own picture")
    before = snapshot(out)
    assert cli.main(["demo", "--out", str(out), "--in-patch-limit", "64"]) == 2
    assert "holds 05_attention_mask.png that this command did not write" in error_line(capsys)
    assert snapshot(out) == before
    (out / "05_attention_mask.png").unlink()
    assert cli.main(["demo", "--out", str(out), "--in-patch-limit", "64"]) == 0
    assert cli.main(["demo", "--out", str(out), "--in-patch-limit", "64"]) == 0  # its own pictures: replaced
    assert sorted(p.name for p in out.iterdir()) == sorted([*demo.DEMO_FILES, demo.DEMO_RECORD])


def test_rope_never_replaces_files_it_did_not_write(tmp_path, capsys):
    out = tmp_path / "rope.png"
    (tmp_path / "rope_comb.png").write_bytes(b"mine")
    (tmp_path / "rope.html").write_text("my page")
    before = snapshot(tmp_path)
    for extra in ([], ["--html"]):
        assert cli.main(["rope", "--head-dim", "8", "--grid", "4x4", "--out", str(out), *extra]) == 2
        assert "rope_comb.png that this command did not write" in error_line(capsys)
        assert snapshot(tmp_path) == before
    (tmp_path / "rope_comb.png").unlink()
    assert cli.main(["rope", "--head-dim", "8", "--grid", "4x4", "--out", str(out)]) == 0  # the page is not its
    assert (tmp_path / "rope.html").read_text() == "my page"
    assert cli.main(["rope", "--head-dim", "8", "--grid", "4x4", "--out", str(out), "--html"]) == 2
    (tmp_path / "rope.html").unlink()
    assert cli.main(["rope", "--head-dim", "8", "--grid", "4x4", "--out", str(out), "--html"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".rope.rope.json", "rope.html", "rope.png", "rope_comb.png", "rope_offset.png"
    ]  # fmt: skip
