"""Render the README screenshots from the recorded fixtures: screenshots/<bottleneck>.svg (and .png with --png).

The screen is the real app (``make_app``) replaying a fixture at full speed, so nothing depends on the clock;
the fixtures were recorded before ranks sent telemetry frames, so a frozen sample of the 2-core VM they were
recorded on stands in (the panel titles it as the monitor's own host).

    python scripts/export_screenshots.py [--png] [--size 120x36]

PNG needs ``rsvg-convert`` (Debian: librsvg2-bin).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

from dagtop.model.cost import NO_TERMS, CostTerms
from dagtop.sources import RecordingSource
from dagtop.telemetry import HostSample, TelemetrySample
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


def frozen_telemetry() -> TelemetrySample:
    return TelemetrySample(HostSample("vm", 93.0, 2, 1_700_000_000, 25_200_000_000, 0.0, 120_000.0, 9.8e8, 9.8e8),
                           (), "no NVIDIA GPU (NVML library not found)")


async def render(fixture: Path, out: Path, size: tuple[int, int], keys: tuple[str, ...] = (),
                 terms: CostTerms = NO_TERMS) -> None:
    app = make_app(RecordingSource(fixture, speed=0), sampler=frozen_telemetry, source_label=f"replay {fixture.name}",
                   cost_terms=terms)
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


def to_png(svg: Path) -> Path:
    """rsvg-convert drops leading non-breaking spaces in <text>; xml:space="preserve" keeps them."""
    png = svg.with_suffix(".png")
    preserved = svg.read_text().replace("<svg ", '<svg xml:space="preserve" ', 1)
    subprocess.run(["rsvg-convert", "-o", str(png)], input=preserved.encode(), check=True)
    return png


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--png", action="store_true", help="also write PNG (needs rsvg-convert)")
    parser.add_argument("--size", default="120x36", help="terminal size COLSxROWS (default %(default)s)")
    parser.add_argument("--out", default=str(ROOT / "screenshots"))
    args = parser.parse_args()
    cols, rows = (int(v) for v in args.size.split("x"))
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.png and shutil.which("rsvg-convert") is None:
        print("export_screenshots: --png needs rsvg-convert (apt-get install librsvg2-bin)", file=sys.stderr)
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
