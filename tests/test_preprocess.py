"""The K3 preprocessor: known sizes, patch order against a loop, alpha blending, video chunks, errors."""

import math

import numpy as np
import pytest
from PIL import Image

from moonvit_kernels.bundled import PHOTO as BUNDLED_PHOTO
from moonvit_kernels.config import VisionConfig
from moonvit_kernels.preprocess import (
    PreprocessConfig,
    chessboard,
    inspect_image,
    load_frames,
    load_image,
    patchify,
    preprocess,
    preprocess_images,
    preprocess_video,
    resize_plan,
    sample_frame_indices,
    to_numpy,
    unpatchify,
)
from moonvit_kernels.reference import validate_inputs

PHOTO = BUNDLED_PHOTO


def random_image(height: int, width: int, channels: int = 3, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, channels), dtype=np.uint8)


def loop_patchify(frames: np.ndarray, p: int) -> np.ndarray:
    """Independent patch cutting: frame, then patch row, then patch column; inside c, ky, kx."""
    T, H, W, C = frames.shape
    out = []
    for t in range(T):
        for r in range(H // p):
            for c in range(W // p):
                patch = np.empty((C, p, p), dtype=frames.dtype)
                for ch in range(C):
                    for ky in range(p):
                        for kx in range(p):
                            patch[ch, ky, kx] = frames[t, r * p + ky, c * p + kx, ch]
                out.append(patch)
    return np.stack(out)


# ============================================================================ known sizes
def test_225_by_223_image_known_values():
    """W = 225, H = 223: no resize (240 patches << 65536), pad to 252 x 224 -> 16 rows x 18 columns."""
    img = random_image(223, 225)  # array layout [H, W, C]
    out = preprocess_images(img)
    assert out.grid_thws.tolist() == [[1, 16, 18]]
    assert out.pixel_values.shape == (288, 3, 14, 14)
    assert out.pixel_values.dtype == np.float32
    assert out.num_tokens == [72]
    plan = out.plans[0]
    assert (plan.new_width, plan.new_height) == (225, 223)
    assert plan.padded_size == (252, 224)
    # the other orientation gives the transposed grid: the decision is visible, not hidden
    assert preprocess_images(random_image(225, 223)).grid_thws.tolist() == [[1, 18, 16]]


def test_225_by_223_pixels_round_trip_through_patches():
    img = random_image(223, 225, seed=3)
    out = preprocess_images(img)
    frame = out.frames[0][0]
    assert frame.shape == (224, 252, 3)
    np.testing.assert_array_equal(frame[:223, :225], img)  # not resized
    assert not frame[223:].any() and not frame[:, 225:].any()  # zero padding right and bottom
    expected = (img.astype(np.float32) / 255 - 0.5) / 0.5
    canvas = np.full((224, 252, 3), -1.0, dtype=np.float32)  # padding normalises to -1
    canvas[:223, :225] = expected
    np.testing.assert_array_equal(out.pixel_values, loop_patchify(canvas[None], 14))


def test_very_wide_image_hits_one_side_limit():
    plan = resize_plan(100000, 100)
    assert (plan.new_width, plan.new_height) == (7167, 7)
    assert plan.grid_hw == (2, 512)
    out = preprocess_images(np.full((100, 100000, 3), 77, dtype=np.uint8))
    assert out.plans[0] == plan
    assert out.grid_thws.tolist() == [[1, 2, 512]]
    assert out.frames[0].shape == (1, 28, 7168, 3)


def test_tiny_image_is_padded_not_enlarged():
    img = random_image(3, 5, seed=1)
    out = preprocess_images(img)
    plan = out.plans[0]
    assert (plan.new_width, plan.new_height) == (5, 3)
    assert out.grid_thws.tolist() == [[1, 2, 2]]
    np.testing.assert_array_equal(out.frames[0][0, :3, :5], img)
    assert not out.frames[0][0, 3:].any() and not out.frames[0][0, :, 5:].any()


@pytest.mark.parametrize("size", [(1000, 800), (4099, 13), (37, 53), (3000, 2999)])
def test_patch_budget_and_resize_follow_the_formula(size):
    width, height = size
    s = PreprocessConfig(in_patch_limit=1024, patch_limit_on_one_side=40)
    plan = resize_plan(width, height, s)
    p = 14
    scale = min(1.0, math.sqrt(1024 / (max(1, width // p) * max(1, height // p))), 40 * p / width, 40 * p / height)
    assert (plan.new_width, plan.new_height) == (max(1, int(width * scale)), max(1, int(height * scale)))
    assert plan.new_width <= width and plan.new_height <= height  # shrink only
    assert (plan.new_width // p) * (plan.new_height // p) <= 1024
    h, w = plan.grid_hw
    assert h % 2 == 0 and w % 2 == 0 and h <= 40 and w <= 40
    assert 0 <= plan.pad_width < 28 and 0 <= plan.pad_height < 28


def test_resize_is_pil_bicubic_of_the_photo():
    out = preprocess_images(PHOTO, in_patch_limit=100)
    plan = out.plans[0]
    assert plan.new_width < plan.width
    with Image.open(PHOTO) as im:
        expected = np.asarray(im.convert("RGB").resize((plan.new_width, plan.new_height), Image.Resampling.BICUBIC))
    np.testing.assert_array_equal(out.frames[0][0, : plan.new_height, : plan.new_width], expected)


def test_patch_and_merge_sizes_come_from_a_vision_config():
    tiny = VisionConfig.tiny()
    out = preprocess_images(random_image(13, 30, seed=2), tiny)
    assert out.pixel_values.shape[1:] == (3, 4, 4)
    assert out.grid_thws.tolist() == [[1, 4, 8]]  # 30 x 13 pads to 32 x 16 (multiples of 8)
    pv, grid = validate_inputs(out.pixel_values, out.grid_thws, tiny)
    assert pv.shape[0] == 32


# ============================================================================ patchify
def test_patchify_matches_a_loop_at_awkward_sizes():
    frames = np.random.default_rng(4).standard_normal((2, 9, 15, 3)).astype(np.float32)
    patches, grid = patchify(frames, 3)
    assert grid == (2, 3, 5)
    np.testing.assert_array_equal(patches, loop_patchify(frames, 3))


def test_unpatchify_inverts_patchify():
    frames = np.random.default_rng(12).standard_normal((3, 8, 20, 3)).astype(np.float32)
    patches, grid = patchify(frames, 4)
    np.testing.assert_array_equal(unpatchify(patches, grid), frames)
    with pytest.raises(ValueError, match="t·h·w"):
        unpatchify(patches, (3, 2, 4))


def test_patchify_rejects_sizes_that_are_not_patch_multiples():
    with pytest.raises(ValueError, match="multiple of patch_size"):
        patchify(np.zeros((1, 10, 12, 3), np.float32), 4)
    with pytest.raises(ValueError, match=r"\[T, H, W, C\]"):
        patchify(np.zeros((10, 12, 3), np.float32), 4)


# ============================================================================ transparency
def test_chessboard_pattern():
    board = chessboard(20, 27)
    assert board.shape == (20, 27, 3) and board.dtype == np.uint8
    for y, x in [(0, 0), (7, 7), (0, 8), (8, 0), (8, 8), (19, 26), (15, 16)]:
        want = 255 if (y // 8 + x // 8) % 2 == 0 else 180
        assert (board[y, x] == want).all(), (y, x)


def test_rgba_transparent_pixels_show_the_chessboard():
    rgba = random_image(12, 20, channels=4, seed=5)
    rgba[..., 3] = np.random.default_rng(6).integers(0, 256, (12, 20))
    rgba[0, 0, 3] = 0
    rgba[0, 1, 3] = 255
    out = preprocess_images(rgba, VisionConfig.tiny())  # no resize at this size
    frame = out.frames[0][0]
    alpha = rgba[..., 3:4].astype(np.float32) / 255
    want = (alpha * rgba[..., :3] + (1 - alpha) * chessboard(12, 20)).astype(np.uint8)
    np.testing.assert_array_equal(frame[:12, :20], want)
    np.testing.assert_array_equal(frame[0, 0], [255, 255, 255])
    np.testing.assert_array_equal(frame[0, 1], rgba[0, 1, :3])


def test_alpha_is_blended_after_the_resize():
    """A fully transparent image that must shrink: the output holds an unscaled 8-pixel board."""
    rgba = np.zeros((200, 300, 4), dtype=np.uint8)
    out = preprocess_images(rgba, in_patch_limit=64)
    plan = out.plans[0]
    assert plan.new_width < 300
    np.testing.assert_array_equal(
        out.frames[0][0, : plan.new_height, : plan.new_width], chessboard(plan.new_height, plan.new_width)
    )


def test_opaque_rgba_equals_rgb_and_grayscale_becomes_rgb():
    rgb = random_image(30, 17, seed=7)
    rgba = np.concatenate([rgb, np.full((30, 17, 1), 255, np.uint8)], axis=2)
    a = preprocess_images(rgb)
    b = preprocess_images(rgba)
    np.testing.assert_array_equal(a.pixel_values, b.pixel_values)
    gray = Image.fromarray(rgb[..., 0])
    g = preprocess_images(gray).frames[0][0, :30, :17]
    np.testing.assert_array_equal(g, np.repeat(rgb[..., :1], 3, axis=2))


def test_palette_image_with_transparency_uses_the_chessboard():
    pal = Image.new("P", (10, 9), 0)
    pal.putpalette([10, 20, 30] * 256)
    pal.info["transparency"] = 0
    frame = preprocess_images(pal).frames[0][0, :9, :10]
    np.testing.assert_array_equal(frame, chessboard(9, 10))


# ============================================================================ several items, video
def test_several_images_are_packed_in_order():
    imgs = [random_image(30, 40, seed=8), random_image(60, 20, seed=9)]
    both = preprocess_images(imgs)
    one = [preprocess_images(im) for im in imgs]
    assert both.grid_thws.tolist() == [[1, 4, 4], [1, 6, 2]]
    np.testing.assert_array_equal(both.pixel_values, np.concatenate([o.pixel_values for o in one]))


def test_video_of_six_frames_becomes_chunks_of_four_and_two():
    frames = [random_image(30, 45, seed=s) for s in range(6)]
    out = preprocess_video(frames)
    assert out.grid_thws.tolist() == [[4, 4, 4], [2, 4, 4]]
    n = 16
    assert out.pixel_values.shape[0] == 6 * n
    for f in range(6):
        alone = preprocess_images(frames[f]).pixel_values
        np.testing.assert_array_equal(out.pixel_values[f * n : (f + 1) * n], alone)
    assert out.num_tokens == [4, 4]  # frames are pooled: (h/2)·(w/2) per chunk


def test_video_array_and_frame_sampling():
    frames = np.stack([np.full((8, 8, 3), 20 * f, np.uint8) for f in range(10)])
    assert sample_frame_indices(10, 4).tolist() == [0, 3, 6, 9]
    out = preprocess_video(frames, VisionConfig.tiny(), num_frames=4)
    assert out.grid_thws.tolist() == [[4, 2, 2]]
    firsts = out.frames[0][:, 0, 0, 0]
    assert firsts.tolist() == [0, 60, 120, 180]


def test_mixed_media_keeps_images_and_videos_in_order():
    img = random_image(20, 20, seed=10)
    video = [random_image(28, 28, seed=s) for s in range(5)]
    out = preprocess([img, video], VisionConfig.tiny(), frames_per_chunk=3)
    assert out.grid_thws.tolist() == [[1, 6, 6], [3, 8, 8], [2, 8, 8]]
    validate_inputs(out.pixel_values, out.grid_thws, VisionConfig.tiny())


# ============================================================================ array interchange
class HostDLPack:
    """A non-NumPy array that exposes host memory through DLPack only (like a torch CPU tensor)."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, **kwargs):
        return self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


class DeviceArray:
    """Stands in for a CuPy array: DLPack refuses a host view, `.get()` copies to the host."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, **kwargs):
        raise BufferError("device memory")

    def __dlpack_device__(self):
        return (2, 0)

    def get(self):
        return self._a.copy()


def test_dlpack_and_device_arrays_give_numpy_outputs():
    img = random_image(30, 31, seed=11)
    ref = preprocess_images(img)
    for wrapped in (HostDLPack(img), DeviceArray(img)):
        assert isinstance(to_numpy(wrapped), np.ndarray)
        out = preprocess_images(wrapped)
        assert isinstance(out.pixel_values, np.ndarray)
        np.testing.assert_array_equal(out.pixel_values, ref.pixel_values)


# ============================================================================ errors
@pytest.mark.parametrize(
    "bad, message",
    [
        (np.zeros((10, 10), np.uint8), r"not \[H, W, 3\]"),
        (np.zeros((10, 10, 2), np.uint8), r"not \[H, W, 3\]"),
        (np.zeros((10, 10, 3), np.float32), "dtype float32 is not uint8"),
        (np.zeros((10, 10, 3), np.uint16), "dtype uint16 is not uint8"),
        (np.zeros((0, 10, 3), np.uint8), "empty"),
        ([], "empty list"),
        (42, "expected an array"),
    ],
)
def test_bad_images_raise_value_errors(bad, message):
    with pytest.raises(ValueError, match=message):
        preprocess_images(bad)


def test_bad_paths_name_the_file(tmp_path):
    missing = tmp_path / "nope.png"
    with pytest.raises(ValueError, match="nope.png: no such image file"):
        load_image(missing)
    text = tmp_path / "notes.jpg"
    text.write_text("not an image")
    with pytest.raises(ValueError, match="notes.jpg: cannot read as an image"):
        preprocess_images([PHOTO, text])


def test_bad_videos_raise_value_errors():
    with pytest.raises(ValueError, match="empty list"):
        preprocess_video([])
    with pytest.raises(ValueError, match="must share one size"):
        preprocess_video([random_image(10, 12), random_image(12, 10)])
    with pytest.raises(ValueError, match=r"\[T, H, W, 3\|4\]"):
        preprocess_video(np.zeros((4, 4, 3), np.uint8))
    with pytest.raises(ValueError, match="in_patch_limit must be a positive integer"):
        preprocess_images(random_image(4, 4), in_patch_limit=0)


# ============================================================================ image kinds that used to read wrong
def test_16_and_32_bit_images_beyond_255_are_refused_not_clipped_to_white(tmp_path):
    """PIL's convert("RGB") (what the K3 processor calls) clips I;16 / I pixels at 255: a 16-bit photo
    turns white. Such files are refused naming the range; ones whose values fit 0..255 read as 8-bit."""
    values = np.random.default_rng(5).integers(0, 65536, (9, 11)).astype(np.uint16)
    wide = tmp_path / "sixteen.png"
    Image.fromarray(values).save(wide)
    assert Image.open(wide).mode == "I;16"
    with pytest.raises(ValueError, match=r"sixteen\.png: 16-bit pixels \(PIL mode I;16\) up to \d+: .*clips"):
        load_image(wide)
    deep = tmp_path / "thirty_two.tif"
    Image.fromarray(values.astype(np.int32) * 3).save(deep)
    assert Image.open(deep).mode == "I"
    with pytest.raises(ValueError, match=r"thirty_two\.tif: 32-bit pixels \(PIL mode I\)"):
        preprocess_images(deep)
    small = tmp_path / "small_values.png"
    eight = (values % 256).astype(np.uint8)
    Image.fromarray(eight.astype(np.uint16)).save(small)
    got = preprocess_images(small)
    want = preprocess_images(np.repeat(eight[:, :, None], 3, axis=2))
    np.testing.assert_array_equal(got.pixel_values, want.pixel_values)


def test_float_images_are_refused_as_ambiguous(tmp_path):
    path = tmp_path / "unit.tif"
    Image.fromarray(np.random.default_rng(6).random((7, 9)).astype(np.float32)).save(path)
    with pytest.raises(ValueError, match=r"unit\.tif: float pixels \(PIL mode F\) are ambiguous"):
        load_image(path)
    with pytest.raises(ValueError, match="ambiguous"):
        inspect_image(path)  # refused from the header, before decoding


@pytest.mark.parametrize("suffix", [".gif", ".tif"])
def test_multi_frame_files_are_refused_or_taken_as_video_explicitly(tmp_path, suffix):
    frames = [Image.fromarray(random_image(12, 10, seed=i)) for i in range(3)]
    path = tmp_path / f"animated{suffix}"
    frames[0].save(path, save_all=True, append_images=frames[1:])
    with pytest.raises(ValueError, match=rf"animated\{suffix}: holds 3 frames.*load_frames"):
        preprocess_images(path)
    with pytest.raises(ValueError, match="holds 3 frames"):
        inspect_image(path)
    loaded = load_frames(path)
    assert len(loaded) == 3 and all(f.size == (10, 12) for f in loaded)
    video = preprocess_video(loaded, VisionConfig.tiny())
    assert video.grid_thws.tolist() == [[3, 4, 4]]
    if suffix == ".tif":  # lossless: the frames are the pixels written
        for got, want in zip(loaded, frames, strict=True):
            np.testing.assert_array_equal(np.asarray(got.convert("RGB")), np.asarray(want))


def test_a_decompression_bomb_is_one_named_error(tmp_path, monkeypatch):
    path = tmp_path / "huge.png"
    Image.fromarray(random_image(40, 50)).save(path)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 900)  # 2000 pixels: past twice the limit
    for read in (load_image, inspect_image):
        with pytest.raises(ValueError, match=r"huge\.png: 2000 pixels: .*decompression bomb"):
            read(path)


def test_a_folder_is_not_an_image(tmp_path):
    with pytest.raises(ValueError, match=rf"{tmp_path}: is a folder, not an image file"):
        load_image(tmp_path)
    with pytest.raises(ValueError, match="is a folder, not an image file"):
        inspect_image(tmp_path)
    with pytest.raises(ValueError, match="no such image file"):
        inspect_image(tmp_path / "missing.png")
    (tmp_path / "text.png").write_text("not an image")
    with pytest.raises(ValueError, match="cannot read as an image"):
        inspect_image(tmp_path / "text.png")
