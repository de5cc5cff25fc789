"""Write the kernelspec logos (PNG 32/64 and SVG) for both kernels.

Run once when the artwork changes: `python tools/make_logos.py`. The PNGs are drawn with the
standard library (zlib + struct), so no imaging dependency is needed.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

COLORS = {"nbrewind-audit": (0x2B, 0x6C, 0xB0), "nbrewind-repeat": (0x2F, 0x9E, 0x6B)}
LETTERS = {"nbrewind-audit": "A", "nbrewind-repeat": "R"}


def _png(width: int, pixels: list[list[tuple[int, int, int, int]]]) -> bytes:
    raw = b"".join(b"\x00" + b"".join(struct.pack("BBBB", *p) for p in row) for row in pixels)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, width, 8, 6, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def _draw(size: int, rgb: tuple[int, int, int], rewind: bool) -> bytes:
    """A filled rounded square with a white 'rewind' double triangle (repeat) or a dot ring (audit)."""
    px: list[list[tuple[int, int, int, int]]] = []
    r = size * 0.2
    for y in range(size):
        row = []
        for x in range(size):
            cx, cy = x + 0.5, y + 0.5
            dx = max(r - cx, 0.0, cx - (size - r))
            dy = max(r - cy, 0.0, cy - (size - r))
            inside = dx * dx + dy * dy <= r * r
            if not inside:
                row.append((0, 0, 0, 0))
                continue
            u, v = cx / size, cy / size
            white = False
            if rewind:
                for left in (0.2, 0.48):
                    if left <= u <= left + 0.3 and abs(v - 0.5) <= (u - left) * 0.9:
                        white = True
            else:
                d = ((u - 0.5) ** 2 + (v - 0.5) ** 2) ** 0.5
                white = 0.22 <= d <= 0.32 or d <= 0.08
            row.append((255, 255, 255, 255) if white else (*rgb, 255))
        px.append(row)
    return _png(size, px)


def _svg(rgb: tuple[int, int, int], rewind: bool) -> str:
    fill = "#%02x%02x%02x" % rgb
    if rewind:
        mark = '<path d="M20 50 L50 20 L50 80 Z M50 50 L80 20 L80 80 Z" fill="#fff"/>'
    else:
        mark = '<circle cx="50" cy="50" r="27" fill="none" stroke="#fff" stroke-width="10"/><circle cx="50" cy="50" r="8" fill="#fff"/>'
    return (
        '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 100 100" width="64" height="64">'
        f'<rect x="0" y="0" width="100" height="100" rx="20" fill="{fill}"/>{mark}</svg>\n'
    )


def main() -> None:
    root = Path(__file__).resolve().parent.parent / "kernelspecs"
    for name, rgb in COLORS.items():
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        rewind = name.endswith("repeat")
        for size in (32, 64):
            (folder / f"logo-{size}x{size}.png").write_bytes(_draw(size, rgb, rewind))
        (folder / "logo-svg.svg").write_text(_svg(rgb, rewind))


if __name__ == "__main__":
    main()
