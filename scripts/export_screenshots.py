"""Render the README screenshots from the recorded fixtures: screenshots/<name>.svg (and .png with --png), or check
that the ones checked in are what the code draws now (``--check``, run by tests/test_readme.py).

The screen is the real app (``make_app``) replaying a fixture at full speed, so nothing depends on the clock, and
as ``dagtop replay`` draws it: no telemetry of the machine this runs on (the fixtures were recorded before ranks
sent telemetry frames, and a replay never shows the monitor's own host).

    python scripts/export_screenshots.py [--png] [--size 120x36]
    python scripts/export_screenshots.py --check

A PNG is rendered from its SVG (cairosvg, ``pip install cairosvg``, else ``rsvg-convert``; DejaVu Sans Mono) and
carries the SHA-256 of that SVG in a ``tEXt`` chunk, so ``--check`` tells a PNG left from an older SVG without
rendering anything.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

from dagtop.io.sources import RecordingSource
from dagtop.model.cost import NO_TERMS, CostTerms
from dagtop.ui.app import make_app

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "dagtop" / "fixtures"
SHOTS = {
    "io": "demo-io.dagtop",
    "compute": "demo-compute.dagtop",
    "allreduce": "demo-allreduce.dagtop",
    "straggler": "demo-straggler1-io.dagtop",
    "advice": "demo-advice.dagtop",
}
"""Screenshot name → fixture: one per bottleneck, a straggler, and the advice screen."""
KEYS = {"advice": ("a",)}
"""Screenshot name → keys pressed once the fixture is read (a modal screen over the main one)."""
TERMS = {"advice": CostTerms(gpu_hour_price=2.5, epoch_samples=1_281_167)}
"""Screenshot name → what the advice prices with: ImageNet's training set at $2.50 a GPU-hour."""
SIZE = (120, 36)
SVG_HASH_KEY = b"dagtop-svg-sha256"
"""The PNG ``tEXt`` keyword whose text is the SHA-256 (hex) of the SVG the PNG was rendered from."""


async def render(fixture: Path, out: Path, size: tuple[int, int] = SIZE, keys: tuple[str, ...] = (),
                 terms: CostTerms = NO_TERMS) -> None:
    app = make_app(RecordingSource(fixture, speed=0), source_label=f"replay {fixture.name}", cost_terms=terms)
    async with app.run_test(size=size) as pilot:
        for _ in range(400):
            if app.shown.finished:
                break
            await pilot.pause(0.05)
        if not app.shown.finished:
            raise RuntimeError(f"{fixture} was not read to its end")
        for key in keys:
            await pilot.press(key)
        await pilot.pause()
        app.save_screenshot(filename=out.name, path=str(out.parent))


def svg_hash(svg: Path) -> str:
    return hashlib.sha256(svg.read_bytes()).hexdigest()


def png_svg_hash(png: Path) -> str | None:
    """The SVG hash a PNG of :func:`to_png` carries, or None."""
    data = png.read_bytes()
    at = 8
    while at + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        if kind == b"tEXt":
            key, _, text = data[at + 8:at + 8 + length].partition(b"\0")
            if key == SVG_HASH_KEY:
                return text.decode()
        at += 12 + length
    return None


def to_png(svg: Path) -> Path:
    """The PNG beside ``svg``, carrying the SVG's hash right after its header chunk."""
    png = svg.with_suffix(".png")
    # rsvg-convert drops leading non-breaking spaces in <text>; xml:space="preserve" keeps them. Fira Code, which
    # the SVG asks for, is rarely installed: a proportional fallback would misalign every column.
    preserved = svg.read_text().replace("<svg ", '<svg xml:space="preserve" ', 1).replace(
        "Fira Code", "DejaVu Sans Mono").encode()
    try:
        import cairosvg  # type: ignore[import-not-found]

        data = cairosvg.svg2png(bytestring=preserved)
    except ImportError:
        data = subprocess.run(["rsvg-convert"], input=preserved, check=True, capture_output=True).stdout
    text = SVG_HASH_KEY + b"\0" + svg_hash(svg).encode()
    chunk = struct.pack(">I4s", len(text), b"tEXt") + text + struct.pack(">I", zlib.crc32(b"tEXt" + text))
    ihdr_end = 8 + 12 + struct.unpack(">I", data[8:12])[0]
    png.write_bytes(data[:ihdr_end] + chunk + data[ihdr_end:])
    return png


def stale(shots: Path, size: tuple[int, int] = SIZE) -> list[str]:
    """What in ``shots`` the code would draw otherwise now: SVGs that differ, PNGs not rendered from their SVG."""
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, fixture in SHOTS.items():
            fresh = Path(tmp) / f"{name}.svg"
            asyncio.run(render(FIXTURES / fixture, fresh, size, KEYS.get(name, ()), TERMS.get(name, NO_TERMS)))
            svg, png = shots / f"{name}.svg", shots / f"{name}.png"
            if not svg.is_file() or svg.read_text() != fresh.read_text():
                out.append(str(svg.relative_to(ROOT) if svg.is_relative_to(ROOT) else svg))
            elif not png.is_file() or png_svg_hash(png) != svg_hash(svg):
                out.append(str(png.relative_to(ROOT) if png.is_relative_to(ROOT) else png))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--png", action="store_true", help="also write PNG (cairosvg or rsvg-convert)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a screenshot is stale")
    parser.add_argument("--size", default="120x36", help="terminal size COLSxROWS (default %(default)s)")
    parser.add_argument("--out", default=str(ROOT / "screenshots"))
    args = parser.parse_args()
    cols, rows = (int(v) for v in args.size.split("x"))
    out_dir = Path(args.out)
    if args.check:
        old = stale(out_dir, (cols, rows))
        for path in old:
            print(f"export_screenshots: {path} is not what the code draws now: run python "
                  f"scripts/export_screenshots.py --png", file=sys.stderr)
        return 1 if old else 0
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.png and shutil.which("rsvg-convert") is None:
        try:
            import cairosvg  # noqa: F401
        except ImportError:
            print("export_screenshots: --png needs cairosvg (pip install cairosvg) or rsvg-convert "
                  "(apt-get install librsvg2-bin)", file=sys.stderr)
            return 2
    for name, fixture in SHOTS.items():
        svg = out_dir / f"{name}.svg"
        asyncio.run(render(FIXTURES / fixture, svg, (cols, rows), KEYS.get(name, ()), TERMS.get(name, NO_TERMS)))
        print(svg)
        if args.png:
            print(to_png(svg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
