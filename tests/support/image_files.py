"""Image files for the image tests: pictures of noise encoded as PNG, JPEG, WebP or GIF, data URIs of
them, hostile files (a header declaring a huge image, a truncated file, an animated GIF), and
transformers' CLIP image vectors of the files as its processor reads them (the reference)."""

from __future__ import annotations

import base64
import io
import struct
import zlib
from pathlib import Path

import numpy as np
from PIL import Image


def encoded(image: Image.Image, kind: str = "PNG") -> bytes:
    out = io.BytesIO()
    image.save(out, kind)
    return out.getvalue()


def data_uri(data: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64,{base64.b64encode(data).decode()}"


def noise(width: int, height: int, rng: np.random.Generator) -> Image.Image:
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def noise_files(n: int, seed: int = 0, sides: tuple[int, int] = (16, 40)) -> list[tuple[str, bytes]]:
    """``n`` pictures of noise of ``sides`` pixels a side (each side drawn apart), every third a JPEG,
    the others PNGs: (suffix, file bytes) each."""
    rng = np.random.default_rng(seed)
    files = []
    for i in range(n):
        width, height = (int(v) for v in rng.integers(sides[0], sides[1] + 1, 2))
        kind = "JPEG" if i % 3 == 2 else "PNG"
        files.append((".jpg" if kind == "JPEG" else ".png", encoded(noise(width, height, rng), kind)))
    return files


def write_files(folder: Path, files: list[tuple[str, bytes]], names: list[str]) -> list[Path]:
    """Each file under ``folder`` as its name (without its suffix) and its suffix say."""
    paths = []
    for (suffix, data), name in zip(files, names, strict=True):
        path = folder / f"{name}{suffix}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        paths.append(path)
    return paths


def huge_png_header(width: int, height: int) -> bytes:
    """A small PNG file whose header declares ``width`` x ``height`` pixels."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def animated_gif() -> bytes:
    """A GIF of two frames: its header is a still image's, its decoding refuses it."""
    frames = [Image.new("RGB", (24, 24), color) for color in ((255, 0, 0), (0, 0, 255))]
    out = io.BytesIO()
    frames[0].save(out, "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    return out.getvalue()


def clip_reference(folder: Path):
    """transformers' CLIPModel and CLIPImageProcessor of a CLIP folder."""
    from transformers import CLIPImageProcessor, CLIPModel

    return CLIPModel.from_pretrained(str(folder)).eval(), CLIPImageProcessor.from_pretrained(str(folder))


def clip_image_vectors(reference, images: list[Image.Image]) -> np.ndarray:
    """[n, projection] float32: CLIP's image vectors of ``images`` (the processor's pixels)."""
    import torch

    model, processor = reference
    with torch.inference_mode():
        pixels = processor(images=images, return_tensors="pt")["pixel_values"]
        return model.get_image_features(pixel_values=pixels).pooler_output.numpy()


def clip_file_vectors(reference, files: list[bytes]) -> np.ndarray:
    """``clip_image_vectors`` of files, each opened as transformers' users open one."""
    return clip_image_vectors(reference, [Image.open(io.BytesIO(data)) for data in files])
