"""Images and videos -> `pixel_values [L, 3, p, p]` + `grid_thws [N, 3]`, as the Kimi K3 processor does.

Pipeline for one image (each step is one function below):

1. `load_image`      path / file bytes / PIL image / uint8 array `[H, W, 3|4]` (NumPy, or CuPy / torch
                     via DLPack); refused: several frames, float pixels, 16/32-bit values beyond 255
2. `resize_plan`     shrink only: `scale = min(1, sqrt(in_patch_limit / (max(1, W//p)·max(1, H//p))),
                     limit·p / W, limit·p / H)`, new side `max(1, int(side·scale))`; then zero padding
                     right and bottom up to a multiple of `p·merge` (28 for K3)
3. `resize_image`    PIL bicubic; images with alpha are blended over an 8-pixel chessboard
                     (white 255 / gray 180, white square top-left) AFTER the resize (`fill_transparent`)
4. `pad_image`       zeros right and bottom -> uint8 `[H_pad, W_pad, 3]`
5. `normalize`       `(x/255 − 0.5)/0.5` per channel, float32 (so padding becomes −1)
6. `patchify`        `[T, H, W, C] -> [T·h·w, C, p, p]`, patches in order frame, row, column

Sizes are written `width × height` (PIL's order) wherever a pair is named `size`; arrays are
`[height, width, channel]`. A 225 × 223 image (W = 225, H = 223) pads to 252 × 224, i.e. a grid of
h = 16 rows and w = 18 columns: `grid_thws [[1, 16, 18]]`, 288 patches, 72 tokens after the 2×2 merge.

Videos: frames are sampled evenly (`num_frames`) and grouped into chunks of at most
`frames_per_chunk` (= `init_pos_emb_time`, 4 in K3); each chunk is one media item `(t, h, w)`.
All frames of a video must share one size and are resized with one plan.

Accepted pixels are uint8 only: a float array is ambiguous (0..1 or 0..255?) and is rejected with
a ValueError, as are arrays that are not `[H, W, 3]` / `[H, W, 4]`; so are float image files (PIL
mode F) and 16/32-bit integer files (I;16, I) holding values above 255, which the K3 processor's
`convert("RGB")` would clip to white (within 0..255 they read exactly). A file with several frames
(animated GIF, multi-page TIFF) is refused: `load_frames(path)` gives them to `preprocess_video`.
Outputs are always NumPy.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageSequence, UnidentifiedImageError

from .config import VisionConfig


# ============================================================================ settings
@dataclass(frozen=True)
class PreprocessConfig:
    """The K3 processor's `media_proc_cfg` (defaults = the released K3 values)."""

    patch_size: int = 14
    merge_kernel_size: tuple[int, int] = (2, 2)
    in_patch_limit: int = 65536
    patch_limit_on_one_side: int = 512
    frames_per_chunk: int = 4
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    chessboard_square_size: int = 8
    chessboard_white_value: int = 255
    chessboard_gray_value: int = 180

    def __post_init__(self) -> None:
        object.__setattr__(self, "merge_kernel_size", tuple(int(k) for k in self.merge_kernel_size))
        for key in ("patch_size", "in_patch_limit", "patch_limit_on_one_side", "frames_per_chunk"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{key} must be a positive integer, got {value!r}")
        if len(self.merge_kernel_size) != 2 or min(self.merge_kernel_size) <= 0:
            raise ValueError(f"merge_kernel_size must be two positive integers, got {self.merge_kernel_size!r}")

    @classmethod
    def from_vision_config(cls, config: VisionConfig, **overrides: Any) -> PreprocessConfig:
        """Patch size, merge size and frames per chunk taken from a `VisionConfig`; other fields
        from K3's defaults unless given in `overrides` (e.g. `in_patch_limit=1024`)."""
        base = {
            "patch_size": config.patch_size,
            "merge_kernel_size": tuple(config.merge_kernel_size),
            "frames_per_chunk": config.init_pos_emb_time,
        }
        return cls(**{**base, **overrides})

    def with_limits(self, **changes: Any) -> PreprocessConfig:
        """A copy with some fields changed (checked again)."""
        return replace(self, **changes)


def resolve_settings(config: VisionConfig | PreprocessConfig | None, **overrides: Any) -> PreprocessConfig:
    """`PreprocessConfig` from a VisionConfig, a PreprocessConfig or None (K3 defaults), plus overrides."""
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if config is None:
        return PreprocessConfig(**overrides)
    if isinstance(config, PreprocessConfig):
        return config.with_limits(**overrides) if overrides else config
    if isinstance(config, VisionConfig):
        return PreprocessConfig.from_vision_config(config, **overrides)
    raise ValueError(f"config must be a VisionConfig or PreprocessConfig, got {type(config).__name__}")


# ============================================================================ 1. loading
def to_numpy(array: Any) -> np.ndarray:
    """A NumPy view or copy of a NumPy / CuPy / torch array (via DLPack; device arrays are copied
    to the host). ValueError for anything else."""
    if isinstance(array, np.ndarray):
        return array
    if not hasattr(array, "__dlpack__"):
        raise ValueError(f"expected an array (NumPy, CuPy, torch), got {type(array).__name__}")
    try:
        return np.from_dlpack(array)
    except (BufferError, RuntimeError, TypeError, ValueError):
        pass  # a device array: ask for a host copy below
    attempts = (
        lambda: np.from_dlpack(array, device="cpu", copy=True),
        lambda: array.get(),  # CuPy
        lambda: array.detach().cpu().numpy(),  # torch
    )
    for attempt in attempts:
        try:
            return np.asarray(attempt())
        except Exception:  # noqa: BLE001 — try the next way to reach host memory
            continue
    raise ValueError(f"cannot copy a {type(array).__name__} to host memory through DLPack")


def array_to_image(array: Any) -> Image.Image:
    """uint8 `[H, W, 3]` (RGB) or `[H, W, 4]` (RGBA) array -> PIL image. ValueError otherwise."""
    a = to_numpy(array)
    if a.ndim != 3 or a.shape[2] not in (3, 4):
        raise ValueError(f"image array shape {a.shape} is not [H, W, 3] (RGB) or [H, W, 4] (RGBA)")
    if a.dtype != np.uint8:
        raise ValueError(
            f"image array dtype {a.dtype} is not uint8: pass 0..255 pixels as uint8 "
            "(float images are ambiguous: 0..1 or 0..255?)"
        )
    if a.shape[0] == 0 or a.shape[1] == 0:
        raise ValueError(f"image array shape {a.shape} is empty")
    return Image.fromarray(np.ascontiguousarray(a))  # uint8 [H, W, 3] -> "RGB", [H, W, 4] -> "RGBA"


# PIL modes of integer pixels wider than 8 bits, and their widths
WIDE_INTEGER_MODES = {"I;16": 16, "I;16L": 16, "I;16B": 16, "I;16N": 16, "I": 32}


@contextlib.contextmanager
def open_image_file(source: str | os.PathLike | bytes) -> Iterator[Image.Image]:
    """`PIL.Image.open` of a path (or encoded bytes) with what can be told from the header checked:
    the file exists and is an image, not a decompression bomb, one frame, not float pixels.
    ValueError naming the file otherwise. Pixels are not decoded."""
    label = "image bytes" if isinstance(source, bytes) else str(source)
    if not isinstance(source, bytes):
        path = Path(source)
        if path.is_dir():
            raise ValueError(f"{path}: is a folder, not an image file")
        if not path.is_file():
            raise ValueError(f"{path}: no such image file")
    try:
        opened = Image.open(io.BytesIO(source) if isinstance(source, bytes) else source)
    except Image.DecompressionBombError as e:
        raise ValueError(f"{label}: {_bomb_reason(e)}") from None
    except (UnidentifiedImageError, OSError, SyntaxError) as e:
        raise ValueError(f"{label}: cannot read as an image ({type(e).__name__}: {e})") from None
    with opened:
        check_image(opened, label, pixels=False)
        yield opened


def _bomb_reason(error: Exception) -> str:
    found = re.search(r"\((\d+) pixels\)", str(error))
    pixels = f"{int(found.group(1))} pixels" if found else "too many pixels"
    return (
        f"{pixels}: PIL refuses it as a possible decompression bomb (limit 2 x Image.MAX_IMAGE_PIXELS = "
        f"{2 * (Image.MAX_IMAGE_PIXELS or 0)}); raise PIL.Image.MAX_IMAGE_PIXELS if the file is trusted"
    )


def check_image(image: Image.Image, label: str, pixels: bool = True) -> None:
    """ValueError naming `label` for what the K3 processor would read wrong: several frames (an
    animation, a multi-page file: which one?), float pixels (0..1 or 0..255?), and (with `pixels`,
    which decodes them) 16/32-bit integers beyond 255, which its `convert("RGB")` clips to white."""
    frames = getattr(image, "n_frames", 1)
    if frames > 1:
        raise ValueError(
            f"{label}: holds {frames} frames (an animation or a multi-page file): pass the frames as a "
            "video, preprocess_video(load_frames(path)), or save the one frame wanted"
        )
    if image.mode.startswith("F"):
        raise ValueError(
            f"{label}: float pixels (PIL mode {image.mode}) are ambiguous (0..1 or 0..255?): save 8-bit pixels"
        )
    bits = WIDE_INTEGER_MODES.get(image.mode)
    if bits and pixels:
        low, high = image.getextrema()
        if low < 0 or high > 255:
            raise ValueError(
                f"{label}: {bits}-bit pixels (PIL mode {image.mode}) up to {high}: the K3 processor's "
                "convert('RGB') clips them at 255 (bright areas turn white); scale them to 8 bits first, e.g. "
                "Image.fromarray((np.asarray(im) >> 8).astype(np.uint8)) for 16-bit data"
            )


def inspect_image(source: str | os.PathLike) -> tuple[int, int]:
    """(width, height) of an image file, read from its header alone, after `open_image_file`'s checks:
    a cheap pass over many files before any of them is decoded."""
    with open_image_file(source) as opened:
        return opened.size


def load_image(source: Any) -> Image.Image:
    """A PIL image from a path, encoded file bytes, a PIL image or a uint8 array; ValueError naming
    the file when it cannot be read as an image, or would be read wrong (`check_image`)."""
    if isinstance(source, Image.Image):
        image = source
        check_image(image, "image")
    elif isinstance(source, (str, os.PathLike, bytes)):
        label = "image bytes" if isinstance(source, bytes) else str(source)
        try:
            with open_image_file(source) as opened:
                opened.load()
                image = opened.copy()
        except (OSError, SyntaxError) as e:
            raise ValueError(f"{label}: cannot read as an image ({type(e).__name__}: {e})") from None
        check_image(image, label)
    else:
        image = array_to_image(source)
    if image.width == 0 or image.height == 0:
        raise ValueError(f"image has size {image.width}x{image.height}")
    return image


def load_frames(source: str | os.PathLike) -> list[Image.Image]:
    """Every frame of an animated or multi-page image file (GIF, APNG, WebP, TIFF), in order, for
    `preprocess_video`: taking a file's frames as a video is asked for explicitly, never implied."""
    path = Path(source)
    if not path.is_file():
        raise ValueError(f"{path}: no such image file")
    try:
        with Image.open(path) as opened:
            frames = []
            for frame in ImageSequence.Iterator(opened):
                frame.load()
                frames.append(frame.copy())
    except Image.DecompressionBombError as e:
        raise ValueError(f"{path}: {_bomb_reason(e)}") from None
    except (UnidentifiedImageError, OSError, SyntaxError) as e:
        raise ValueError(f"{path}: cannot read as an image ({type(e).__name__}: {e})") from None
    for i, frame in enumerate(frames):
        if frame.mode.startswith("F") or frame.mode in WIDE_INTEGER_MODES:
            check_image(frame, f"{path} frame {i}")
    return frames


def has_alpha(image: Image.Image) -> bool:
    """True for images with an alpha band or a transparent palette entry."""
    return "A" in image.getbands() or "transparency" in image.info


# ============================================================================ 2. resize plan
@dataclass(frozen=True)
class ResizePlan:
    """Sizes (width, height) at each step, and the resulting patch grid."""

    width: int
    height: int
    new_width: int
    new_height: int
    pad_width: int
    pad_height: int
    patch_size: int
    merge_kernel_size: tuple[int, int]

    @property
    def padded_size(self) -> tuple[int, int]:
        return self.new_width + self.pad_width, self.new_height + self.pad_height

    @property
    def grid_hw(self) -> tuple[int, int]:
        """(patch rows h, patch columns w)."""
        w, h = self.padded_size
        return h // self.patch_size, w // self.patch_size

    @property
    def num_tokens(self) -> int:
        """Tokens per item after the kh × kw merge (frames are pooled): `(h/kh)·(w/kw)`."""
        h, w = self.grid_hw
        kh, kw = self.merge_kernel_size
        return (h // kh) * (w // kw)


def resize_plan(width: int, height: int, settings: PreprocessConfig | None = None) -> ResizePlan:
    """K3's `navit_resize`: shrink (never enlarge) to the patch budget, then pad to `p·merge`.

    `scale = min(1, sqrt(in_patch_limit / (max(1, W//p)·max(1, H//p))), limit·p/W, limit·p/H)`,
    `new = max(1, int(side·scale))` capped at `limit·p`, pad right/bottom to a multiple of `p·k`.
    """
    s = settings or PreprocessConfig()
    if width <= 0 or height <= 0:
        raise ValueError(f"image size {width}x{height} must be positive")
    p, side = s.patch_size, s.patch_limit_on_one_side
    scale = min(
        1.0,
        math.sqrt(s.in_patch_limit / (max(1, width // p) * max(1, height // p))),
        side * p / width,
        side * p / height,
    )
    new_w = min(max(1, int(width * scale)), side * p)
    new_h = min(max(1, int(height * scale)), side * p)
    kh, kw = s.merge_kernel_size
    factor_w, factor_h = kw * p, kh * p
    return ResizePlan(
        width=width,
        height=height,
        new_width=new_w,
        new_height=new_h,
        pad_width=-new_w % factor_w,
        pad_height=-new_h % factor_h,
        patch_size=p,
        merge_kernel_size=(kh, kw),
    )


# ============================================================================ 3. resize + transparency
def chessboard(height: int, width: int, square: int = 8, white: int = 255, gray: int = 180) -> np.ndarray:
    """uint8 `[height, width, 3]` chessboard of `square`-pixel squares, white square at top left."""
    rows = np.arange(height)[:, None] // square
    cols = np.arange(width)[None, :] // square
    board = np.where((rows + cols) % 2 == 1, gray, white).astype(np.uint8)
    return np.repeat(board[:, :, None], 3, axis=2)


def fill_transparent(image: Image.Image, settings: PreprocessConfig | None = None) -> np.ndarray:
    """Blend an image over the chessboard by its alpha -> uint8 `[H, W, 3]`.

    `out = α·rgb + (1 − α)·board` in float32 with `α = a/255`, truncated to uint8 (as K3 does).
    Images without alpha are simply converted to RGB.
    """
    s = settings or PreprocessConfig()
    if not has_alpha(image):
        return np.asarray(image.convert("RGB"))
    rgba = np.asarray(image.convert("RGBA"))
    board = chessboard(
        rgba.shape[0], rgba.shape[1], s.chessboard_square_size, s.chessboard_white_value, s.chessboard_gray_value
    )
    alpha = rgba[:, :, 3:4].astype(np.float32) / np.float32(255.0)
    out = alpha * rgba[:, :, :3] + (np.float32(1.0) - alpha) * board
    return out.astype(np.uint8)


def resize_image(image: Image.Image, plan: ResizePlan, settings: PreprocessConfig | None = None) -> np.ndarray:
    """PIL bicubic resize to `(new_width, new_height)`, then the transparency blend -> uint8 `[h', w', 3]`."""
    if has_alpha(image):
        image = image.convert("RGBA")
    elif image.mode != "RGB":
        image = image.convert("RGB")
    if image.size != (plan.new_width, plan.new_height):
        image = image.resize((plan.new_width, plan.new_height), Image.Resampling.BICUBIC)
    return fill_transparent(image, settings)


# ============================================================================ 4-6. pad, normalise, patchify
def pad_image(rgb: np.ndarray, plan: ResizePlan) -> np.ndarray:
    """Zero padding on the right and bottom: uint8 `[new_h, new_w, 3] -> [new_h + pad_h, new_w + pad_w, 3]`."""
    return np.pad(rgb, ((0, plan.pad_height), (0, plan.pad_width), (0, 0)))


def normalize(pixels: np.ndarray, settings: PreprocessConfig | None = None) -> np.ndarray:
    """uint8 `[..., 3]` -> float32 `(x/255 − mean)/std` per channel (K3: mean = std = 0.5, range [−1, 1])."""
    s = settings or PreprocessConfig()
    mean = np.asarray(s.image_mean, dtype=np.float32)
    std = np.asarray(s.image_std, dtype=np.float32)
    return (pixels.astype(np.float32) / np.float32(255.0) - mean) / std


def patchify(frames: np.ndarray, patch_size: int) -> tuple[np.ndarray, tuple[int, int, int]]:
    """`[T, H, W, C]` -> (`[T·h·w, C, p, p]`, `(T, h, w)`) with `h = H/p`, `w = W/p`.

    `reshape(T, h, p, w, p, C) -> transpose(0, 1, 3, 5, 2, 4)`: patch order frame, row, column;
    inside a patch channel, then pixel row `ky`, then pixel column `kx`.
    """
    if frames.ndim != 4:
        raise ValueError(f"frames shape {frames.shape} is not [T, H, W, C]")
    T, H, W, C = frames.shape
    p = patch_size
    if H % p or W % p:
        raise ValueError(f"frame size {W}x{H} (WxH) is not a multiple of patch_size={p}")
    h, w = H // p, W // p
    patches = frames.reshape(T, h, p, w, p, C).transpose(0, 1, 3, 5, 2, 4)
    return np.ascontiguousarray(patches.reshape(T * h * w, C, p, p)), (T, h, w)


def unpatchify(pixel_values: np.ndarray, grid_thw: Sequence[int]) -> np.ndarray:
    """Inverse of `patchify` for one item: `[t·h·w, C, p, p]` -> `[t, h·p, w·p, C]`."""
    t, h, w = (int(v) for v in grid_thw)
    pv = to_numpy(pixel_values)
    if pv.ndim != 4 or pv.shape[0] != t * h * w or pv.shape[2] != pv.shape[3]:
        raise ValueError(f"pixel_values shape {pv.shape} does not hold t·h·w = {t * h * w} square patches")
    C, p = pv.shape[1], pv.shape[2]
    return pv.reshape(t, h, w, C, p, p).transpose(0, 1, 4, 2, 5, 3).reshape(t, h * p, w * p, C)


# ============================================================================ whole pipeline
@dataclass
class Preprocessed:
    """Model inputs plus what is needed to draw them.

    `pixel_values [L, 3, p, p]` float32, `grid_thws [N, 3]` int64 (one row per item);
    `frames[i]` uint8 `[t, H_pad, W_pad, 3]` (item i after resize, blend and padding);
    `plans[i]` its `ResizePlan` (original, resized and padded sizes, width first).
    """

    pixel_values: np.ndarray
    grid_thws: np.ndarray
    frames: list[np.ndarray] = field(default_factory=list)
    plans: list[ResizePlan] = field(default_factory=list)

    @property
    def num_tokens(self) -> list[int]:
        """Output tokens per item after the merge: `(h/kh)·(w/kw)`."""
        return [plan.num_tokens for plan in self.plans]

    def __add__(self, other: Preprocessed) -> Preprocessed:
        return Preprocessed(
            np.concatenate([self.pixel_values, other.pixel_values]),
            np.concatenate([self.grid_thws, other.grid_thws]),
            self.frames + other.frames,
            self.plans + other.plans,
        )


def _item(frames_uint8: np.ndarray, plan: ResizePlan, settings: PreprocessConfig) -> Preprocessed:
    pixel_values, grid = patchify(normalize(frames_uint8, settings), settings.patch_size)
    return Preprocessed(pixel_values, np.asarray([grid], dtype=np.int64), [frames_uint8], [plan])


def _concat(items: list[Preprocessed]) -> Preprocessed:
    out = items[0]
    for item in items[1:]:
        out = out + item
    return out


def prepare_image(source: Any, settings: PreprocessConfig | None = None) -> tuple[np.ndarray, ResizePlan]:
    """One image -> (uint8 `[H_pad, W_pad, 3]` resized, blended and padded, its `ResizePlan`)."""
    s = settings or PreprocessConfig()
    image = load_image(source)
    plan = resize_plan(image.width, image.height, s)
    return pad_image(resize_image(image, plan, s), plan), plan


def preprocess_images(
    images: Any, config: VisionConfig | PreprocessConfig | None = None, **limits: Any
) -> Preprocessed:
    """Images (one, or a list) -> packed `Preprocessed`, one `(1, h, w)` row per image.

    `config` gives patch and merge sizes (K3's when None); `limits` override `PreprocessConfig`
    fields such as `in_patch_limit` or `patch_limit_on_one_side`.
    """
    s = resolve_settings(config, **limits)
    if isinstance(images, (list, tuple)):
        if len(images) == 0:
            raise ValueError("no images given (empty list)")
        sources = list(images)
    else:
        sources = [images]
    items = []
    for i, source in enumerate(sources):
        try:
            items.append(_image_item(source, s))
        except ValueError as e:
            raise ValueError(f"image {i}: {e}") from None
    return _concat(items)


def _image_item(source: Any, settings: PreprocessConfig) -> Preprocessed:
    padded, plan = prepare_image(source, settings)
    return _item(padded[None], plan, settings)


def sample_frame_indices(total: int, num_frames: int | None) -> np.ndarray:
    """`num_frames` indices spread evenly over `0 .. total−1` (first and last included); all when None."""
    if total <= 0:
        raise ValueError("a video needs at least one frame")
    if num_frames is None or num_frames >= total:
        return np.arange(total)
    if num_frames <= 0:
        raise ValueError(f"num_frames must be positive, got {num_frames}")
    return np.round(np.linspace(0, total - 1, num_frames)).astype(np.int64)


def preprocess_video(
    frames: Any,
    config: VisionConfig | PreprocessConfig | None = None,
    num_frames: int | None = None,
    **limits: Any,
) -> Preprocessed:
    """Video frames (a list of images, or a uint8 array `[T, H, W, 3|4]`) -> packed chunks.

    Frames are sampled evenly (`num_frames`, all by default), resized with one plan (they must
    share a size) and grouped into chunks of at most `frames_per_chunk`; each chunk is one item
    `(t, h, w)`. E.g. 6 frames with chunks of 4 -> items with t = 4 and t = 2.
    """
    s = resolve_settings(config, **limits)
    if not isinstance(frames, (list, tuple)):
        arr = to_numpy(frames)
        if arr.ndim != 4:
            raise ValueError(f"video array shape {arr.shape} is not [T, H, W, 3|4]")
        frames = list(arr)
    if len(frames) == 0:
        raise ValueError("no video frames given (empty list)")
    picked = [frames[int(i)] for i in sample_frame_indices(len(frames), num_frames)]
    loaded = []
    for i, frame in enumerate(picked):
        try:
            loaded.append(load_image(frame))
        except ValueError as e:
            raise ValueError(f"video frame {i}: {e}") from None
    size = loaded[0].size
    for i, image in enumerate(loaded):
        if image.size != size:
            raise ValueError(
                f"video frame {i} has size {image.width}x{image.height} but frame 0 has {size[0]}x{size[1]} "
                "(WxH): frames of a video must share one size"
            )
    plan = resize_plan(size[0], size[1], s)
    padded = np.stack([pad_image(resize_image(image, plan, s), plan) for image in loaded])
    chunks = [padded[i : i + s.frames_per_chunk] for i in range(0, len(padded), s.frames_per_chunk)]
    return _concat([_item(chunk, plan, s) for chunk in chunks])


def preprocess(
    media: Sequence[Any],
    config: VisionConfig | PreprocessConfig | None = None,
    num_frames: int | None = None,
    **limits: Any,
) -> Preprocessed:
    """Mixed media packed in order: each entry is an image (path, PIL, uint8 `[H, W, 3|4]`) or a
    video (a list/tuple of frames, or a uint8 `[T, H, W, 3|4]` array; `num_frames` sampled)."""
    if isinstance(media, (str, os.PathLike, Image.Image)) or not isinstance(media, (list, tuple)):
        media = [media]
    if len(media) == 0:
        raise ValueError("no media given (empty list)")
    s = resolve_settings(config, **limits)
    items = []
    for i, entry in enumerate(media):
        is_video = isinstance(entry, (list, tuple)) or getattr(entry, "ndim", 0) == 4
        try:
            items.append(preprocess_video(entry, s, num_frames) if is_video else _image_item(entry, s))
        except ValueError as e:
            raise ValueError(f"media {i}: {e}") from None
    return _concat(items)
