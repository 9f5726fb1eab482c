"""Image decoding, resizing and normalisation for the featurizer (docs/protocol.md step 6). Two
decode paths: ``pil``, Cole et al.'s ``PIL open → convert("RGB") → resize BILINEAR → ToTensor →
Normalize`` bit for bit; ``torchvision``, batched nvJPEG on CUDA (libjpeg-turbo on a CPU) and a
torch resize, within one grey level of PIL's (docs/design.md, docs/performance.md).
"""

from __future__ import annotations

import contextlib
import functools
import io
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from featurize.specs import IMAGENET_MEAN, IMAGENET_STD
from probe.errors import SpmlError

# JPEG start-of-frame markers nvJPEG decodes: baseline, extended sequential, progressive
# (Huffman-coded). Arithmetic-coded and lossless frames go to the CPU fallback.
_NVJPEG_SOF = frozenset((0xC0, 0xC1, 0xC2))
_ALL_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # C4 DHT, C8 JPG, CC DAC


class BadImageError(SpmlError):
    """An image file that cannot be read or decoded (the message names the file)."""


RESIZE_MODES: tuple[str, ...] = ("square", "shortest", "squash")
INTERPOLATIONS: tuple[str, ...] = ("bilinear", "bicubic")
CROP_ROUNDINGS: tuple[str, ...] = ("round", "floor")
_PIL_FILTERS = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC}


@dataclass(frozen=True)
class ImageTransform:
    """The image → model-input transform, recorded in the store: the protocol's S×S resize
    (``resize="square"``, the default), or a backbone's own (docs/backbones.md): the shorter side
    to ``size`` (``"shortest"``; the longer ``int(size · long / short)``, torchvision's rule) or
    S×S (``"squash"``), then a centred ``crop`` at offset ``round((size - crop) / 2)``
    (torchvision) or, with ``crop_rounding="floor"``, ``(size - crop) // 2`` (Hugging Face)."""

    size: int = 448  # the protocol's 448×448 (square, aspect not kept)
    mean: tuple[float, float, float] = IMAGENET_MEAN  # ImageNet statistics (ResNet-50 V1)
    std: tuple[float, float, float] = IMAGENET_STD  # likewise; a backbone may bring its own
    interpolation: str = "bilinear"  # PIL's BILINEAR (the protocol) or BICUBIC, antialiased
    resize: str = "square"  # see the class docstring
    crop: int | None = None  # centre crop after the resize (None: none)
    crop_rounding: str = "round"  # the centre crop's offset rule (class docstring)
    antialias: bool = field(default=True, init=False)  # PIL always antialiases when shrinking

    def __post_init__(self) -> None:
        if int(self.size) < 16:
            raise SpmlError(f"image size must be >= 16 pixels, got {self.size}")
        for name in ("mean", "std"):
            value = getattr(self, name)
            if len(value) != 3:
                raise SpmlError(f"{name} needs 3 values (R, G, B), got {value!r}")
        if min(self.std) <= 0:
            raise SpmlError(f"std values must be positive, got {self.std!r}")
        for name, choices in (("interpolation", INTERPOLATIONS), ("resize", RESIZE_MODES),
                              ("crop_rounding", CROP_ROUNDINGS)):
            if getattr(self, name) not in choices:
                raise SpmlError(
                    f"image transform: {name} must be one of {', '.join(choices)}; "
                    f"got {getattr(self, name)!r}")
        if self.crop is not None and not 1 <= int(self.crop) <= int(self.size):
            raise SpmlError(
                f"image transform: crop must be between 1 and the resize size {self.size}; "
                f"got {self.crop}")

    @property
    def out_size(self) -> int:
        """Side of the square model input (the crop, else the resize size)."""
        return int(self.crop) if self.crop is not None else int(self.size)

    def resized_shape(self, height: int, width: int) -> tuple[int, int]:
        """``(h, w)`` of an image of ``height × width`` after the resize, before the crop."""
        s = int(self.size)
        if self.resize != "shortest":
            return s, s
        if width <= height:
            return int(s * height / width), s
        return s, int(s * width / height)

    def crop_box(self, height: int, width: int) -> tuple[int, int]:
        """``(top, left)`` of the centre crop in a resized ``height × width`` image."""
        c = self.out_size
        if self.crop_rounding == "floor":
            return (height - c) // 2, (width - c) // 2
        return round((height - c) / 2.0), round((width - c) / 2.0)

    def describe(self) -> dict:
        """JSON-able description (the store's provenance ``transform`` field, with extras)."""
        out = asdict(self)
        for key in ("resize", "crop", "crop_rounding"):
            out.pop(key)
        if self.resize == "square" and self.crop is None:  # the protocol's, as always recorded
            out.update(resize=[self.size, self.size], keep_aspect=False, crop=None)
        else:
            shortest = self.resize == "shortest"
            out.update(resize=f"shorter side to {self.size}" if shortest else [self.size] * 2,
                       keep_aspect=shortest,
                       crop=None if self.crop is None else [self.out_size] * 2,
                       crop_offset="round((resized - crop) / 2)" if self.crop_rounding == "round"
                       else "(resized - crop) // 2")
        out.update(exif_orientation="ignored", to_tensor="uint8 / 255", mean=list(self.mean),
                   std=list(self.std))
        return out


# ----------------------------------------------------------------------------- reading


def header_error(path: str | Path) -> str | None:
    """Why an image file cannot even be opened (missing, empty, a header PIL does not verify),
    else None; no pixels are decoded, so a truncated JPEG passes."""
    try:
        with Image.open(path) as image:
            image.verify()
    except FileNotFoundError:
        return f"image file {path} does not exist"
    except Exception as err:  # PIL raises many types for a file that is not an image
        return f"cannot open image {path} ({type(err).__name__}: {err})"
    return None


def read_bytes(path: str | Path) -> bytearray:
    """The file's bytes (a writable buffer, so tensors can view it without a copy)."""
    try:
        with open(path, "rb") as fh:
            data = bytearray(fh.read())
    except FileNotFoundError:
        raise BadImageError(f"image file {path} does not exist") from None
    except OSError as err:
        raise BadImageError(f"cannot read image file {path}: {err.strerror or err}") from None
    if not data:
        raise BadImageError(f"image file {path} is empty (0 bytes)")
    return data


def jpeg_frame(data: bytes | bytearray) -> tuple[int, int] | None:
    """``(SOF marker, number of components)`` of a JPEG stream's first start-of-frame header;
    None if it is not a JPEG or the header is truncated or malformed (the CPU path reports it)."""
    n = len(data)
    if n < 4 or data[0] != 0xFF or data[1] != 0xD8:
        return None
    pos = 2
    while pos + 4 <= n:
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # standalone markers, no length
            pos += 2
            continue
        length = (data[pos + 2] << 8) | data[pos + 3]
        if marker in _ALL_SOF:
            if pos + 10 > n:
                return None
            return marker, data[pos + 9]
        if marker == 0xDA or length < 2:  # start of scan before any frame: malformed
            return None
        pos += 2 + length
    return None


def nvjpeg_decodable(data: bytes | bytearray) -> bool:
    """True for the JPEGs the batched GPU decode handles: Huffman-coded, 3 components (YCbCr);
    grayscale, CMYK, arithmetic-coded JPEGs and other formats take the CPU fallback."""
    frame = jpeg_frame(data)
    return frame is not None and frame[0] in _NVJPEG_SOF and frame[1] == 3


def _open_rgb(source: str | Path | bytes | bytearray, name: str | Path) -> Image.Image:
    try:
        src = io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else source
        with Image.open(src) as img:
            return img.convert("RGB")  # convert() loads the pixels: decode errors surface here
    except FileNotFoundError:
        raise BadImageError(f"image file {name} does not exist") from None
    except (OSError, ValueError, Image.DecompressionBombError, SyntaxError) as err:
        raise BadImageError(f"cannot decode image {name}: {err}") from None


def pil_resized(path: str | Path, size: int) -> np.ndarray:
    """The reference pipeline up to the resize: open → RGB → resize((S, S), BILINEAR), uint8."""
    return np.asarray(_open_rgb(path, path).resize((size, size), Image.BILINEAR))


def pil_transformed(path: str | Path, transform: ImageTransform) -> np.ndarray:
    """``transform`` up to the normalisation with PIL: open → RGB → resize (``transform.resize``,
    its interpolation) → centre crop. ``(S, S, 3)`` uint8 with ``S = transform.out_size``; the
    protocol's transform gives exactly :func:`pil_resized`'s pixels."""
    img = _open_rgb(path, path)
    h, w = transform.resized_shape(img.height, img.width)
    if (h, w) != (img.height, img.width):
        img = img.resize((w, h), _PIL_FILTERS[transform.interpolation])
    if transform.crop is not None:
        top, left = transform.crop_box(h, w)
        c = transform.out_size
        img = img.crop((left, top, left + c, top + c))
    return np.asarray(img)


def _quiet_torchvision_io() -> None:
    # torchvision 0.29 warns that its codecs are deprecated (for TorchCodec); re-applied on every
    # call because test runners and warnings.catch_warnings() restore the filter list
    warnings.filterwarnings(
        "ignore", message=r"The image decoding and encoding capabilities of TorchVision")


def cpu_decode(data: bytearray, name: str | Path) -> torch.Tensor:
    """Decode on the CPU to a ``(3, H, W)`` uint8 RGB tensor: libjpeg-turbo/libpng through
    ``torchvision.io.decode_image`` (grayscale and CMYK JPEGs converted to RGB), PIL for any
    format torchvision does not read (BMP, TIFF, …)."""
    from torchvision.io import ImageReadMode, decode_image

    _quiet_torchvision_io()
    try:
        return decode_image(torch.frombuffer(data, dtype=torch.uint8), mode=ImageReadMode.RGB)
    except RuntimeError:
        return torch.from_numpy(np.array(_open_rgb(data, name))).permute(2, 0, 1)


# ----------------------------------------------------------------------------- on the device


def batch_decode(datas: Sequence[bytearray], names: Sequence[str | Path], device: torch.device
                 ) -> list[torch.Tensor | BadImageError]:
    """RGB ``(3, H, W)`` uint8 tensors on ``device`` of :func:`nvjpeg_decodable` JPEGs, in one
    batched ``decode_jpeg`` call (nvJPEG on CUDA); if it rejects the batch, image by image, then
    on the CPU; an image no decoder reads comes back as a :class:`BadImageError` in its place."""
    from torchvision.io import ImageReadMode, decode_jpeg

    _quiet_torchvision_io()
    tensors = [torch.frombuffer(d, dtype=torch.uint8) for d in datas]
    with contextlib.suppress(RuntimeError):  # the batch rejected: image by image below
        return list(decode_jpeg(tensors, mode=ImageReadMode.RGB, device=device))
    out: list[torch.Tensor | BadImageError] = []
    for data, tensor, name in zip(datas, tensors, names):
        try:
            out.append(decode_jpeg(tensor, mode=ImageReadMode.RGB, device=device))
        except RuntimeError:
            try:
                out.append(cpu_decode(data, name).to(device))
            except BadImageError as err:
                out.append(err)
    return out


def resize_batch(images: Sequence[torch.Tensor], size: int | ImageTransform) -> torch.Tensor:
    """Resize ``(3, H, W)`` uint8 images to a ``(B, 3, S, S)`` uint8 batch, antialiased: an int
    ``size`` is the protocol's S×S bilinear resize; an :class:`ImageTransform` brings its resize,
    interpolation and centre crop. Images of one shape are resized together; on the CPU with the
    uint8 bilinear kernel (PIL's pixels within one grey level), else the float one, rounded."""
    if not images:
        raise SpmlError("resize_batch needs at least one image")
    transform = size if isinstance(size, ImageTransform) else ImageTransform(size=int(size))
    cpu = images[0].device.type == "cpu"
    mode = transform.interpolation
    groups: dict[tuple[int, int], list[int]] = {}
    for i, img in enumerate(images):
        groups.setdefault(tuple(img.shape[-2:]), []).append(i)
    out: dict[int, torch.Tensor] = {}
    for (h, w), idx in groups.items():
        x = torch.stack([images[i] for i in idx])
        rh, rw = transform.resized_shape(h, w)
        if (h, w) != (rh, rw):
            if cpu and mode == "bilinear":
                x = F.interpolate(x, size=(rh, rw), mode="bilinear", antialias=True)
            else:
                x = F.interpolate(x.float(), size=(rh, rw), mode=mode, antialias=True,
                                  align_corners=False).round_().clamp_(0, 255).to(torch.uint8)
        if transform.crop is not None:
            top, left = transform.crop_box(rh, rw)
            c = transform.out_size
            x = x[:, :, top : top + c, left : left + c]
        out.update(zip(idx, x))
    return torch.stack([out[i] for i in range(len(images))])


@functools.lru_cache(maxsize=16)
def _stats(mean: tuple[float, ...], std: tuple[float, ...], device: torch.device
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean/std as (1, 3, 1, 1) float32 tensors on ``device``, made once (not per batch: each
    host→device copy from pageable memory would wait for the device)."""
    return tuple(torch.tensor(v, dtype=torch.float32).view(1, 3, 1, 1).to(device)
                 for v in (mean, std))


def normalize(batch: torch.Tensor, transform: ImageTransform) -> torch.Tensor:
    """``(B, 3, S, S)`` uint8 → float32 ``(x / 255 - mean) / std``: the same arithmetic as
    ``ToTensor`` followed by ``Normalize`` (memory layout is kept, e.g. channels_last)."""
    mean, std = _stats(tuple(transform.mean), tuple(transform.std), batch.device)
    return batch.float().div_(255.0).sub_(mean).div_(std)
