"""A run's timeline as a picture: each step attempt, reversal attempt and wait a bar on one
time axis, in lanes (the run page puts a step's reversals in the lane below it), drawn on
the server as inline SVG.

Pure: bars in, markup out. Every name is escaped; nothing is loaded and nothing runs (no
script, no link but a bar's own), and the only style is the ``<style>`` element inside the
SVG, which the page's ``Content-Security-Policy`` (``style-src 'unsafe-inline'``) allows.
Bars come out in time order, each a ``<g class="bar">`` whose ``data-*`` attributes say
what it is, so a test (or a reader of the page's source) finds them without pixels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from html import escape

#: Drawing units: the SVG scales to the page's width, text with it.
WIDTH = 1000
LABELS = 180
RIGHT = 14
AXIS = 24
ROW = 22
BAR = 14
WAIT_BAR = 8
LEGEND = 26
#: Lanes drawn at most; past them the picture says how many it left to the text timeline.
MAX_LANES = 300
#: The longest lane label drawn (its full name is in its tooltip).
LABEL_CHARS = 26


class BarKind(str, Enum):
    """What a bar stands for."""

    ATTEMPT = "attempt"
    REVERSAL = "reversal"
    WAIT = "wait"


@dataclass(frozen=True)
class Bar:
    """One span on the time axis. ``name``: the step (or, for a wait, its event);
    ``attempt``: its number (None for a wait); ``end``: None while it is still open (drawn
    up to ``now``); ``outcome``: how it ended, in the history's words (completed, failed,
    retrying, lost, released, skipped; signalled, timed out; running or waiting while
    open); ``lane``: its row, from the top; ``link``: a URL the bar opens (a sub-saga's
    child run)."""

    kind: BarKind
    name: str
    attempt: int | None
    start: datetime
    end: datetime | None
    outcome: str
    lane: int
    link: str | None = None


_STYLE = """
.tl text { font: 11px system-ui, sans-serif; fill: #1d2330; }
.tl .axis text { fill: #4b5563; font-size: 10px; }
.tl .grid { stroke: #e3e6ea; }
.tl .lane-rev { fill: #fbf6ec; } .tl .lane-wait { fill: #f7f0fc; } .tl .lane-attempt { fill: #fff; }
.tl .bar text { fill: #fff; font-size: 9.5px; pointer-events: none; }
.tl .out-completed rect { fill: #2f8f4e; stroke: #1f6b39; }
.tl .out-failed rect { fill: #b42318; stroke: #7f1a12; }
.tl .out-retrying rect { fill: #e08a00; stroke: #a35f00; }
.tl .out-lost rect { fill: #6b7280; stroke: #111827; stroke-dasharray: 3 2; }
.tl .out-released rect { fill: #c5cad1; stroke: #4b5563; stroke-dasharray: 3 2; }
.tl .out-skipped rect { fill: #6e56a8; stroke: #4a3878; }
.tl .out-running rect { fill: #2463b4; stroke: #17427a; }
.tl .kind-reversal.out-completed rect { fill: #c98a1a; stroke: #8a5d0e; }
.tl .kind-wait rect { fill: #efe0fa; stroke: #8a3ec2; }
.tl .kind-wait.out-timed-out rect { stroke: #b42318; stroke-dasharray: 4 2; }
.tl .open rect { stroke-dasharray: 2 2; fill-opacity: .55; }
.tl .more { fill: #6b7280; font-style: italic; }
"""


def render(bars: Sequence[Bar], now: datetime, origin: datetime | None = None) -> str:
    """``bars`` as one ``<svg>`` element ("" when there are none): a time axis from
    ``origin`` (the run's start, so its offsets are the text timeline's; else the earliest
    bar's) to the latest end (an open bar ends at ``now``), a row per lane labelled by its
    first bar, the bars in time order, and a legend of the outcomes drawn."""
    if not bars:
        return ""
    ordered = sorted(bars, key=lambda bar: (bar.start, bar.lane))
    lanes = sorted({bar.lane for bar in ordered})
    shown = lanes[:MAX_LANES]
    rows = {lane: index for index, lane in enumerate(shown)}
    first = min([bar.start for bar in ordered] + ([origin] if origin else []))
    last = max(_end(bar, now) for bar in ordered)
    scale = _Scale(first, max((last - first).total_seconds(), 0.001))
    hidden = len(lanes) - len(shown)
    body_height = AXIS + ROW * len(shown) + (ROW if hidden else 0)
    legend, legend_height = _legend(ordered, body_height)
    height = body_height + legend_height
    parts = [
        f'<svg class="tl" id="timeline-chart" xmlns="http://www.w3.org/2000/svg" role="img" '
        f'viewBox="0 0 {WIDTH} {height}" width="100%" preserveAspectRatio="xMinYMin meet">',
        "<title>The run's attempts, reversals and waits on a time axis</title>",
        f"<style>{_STYLE}</style>",
        *_lanes(ordered, rows),
        *_axis(scale, body_height),
    ]
    parts += [_bar(bar, rows[bar.lane], scale, now) for bar in ordered if bar.lane in rows]
    if hidden:
        y = AXIS + ROW * len(shown) + ROW - 7
        more = f"{hidden} more lanes are not drawn: the text timeline below has them all"
        parts.append(f'<text class="more" x="8" y="{y}">{escape(more)}</text>')
    parts += [*legend, "</svg>"]
    return "\n".join(parts)


def _end(bar: Bar, now: datetime) -> datetime:
    return bar.end if bar.end is not None else max(now, bar.start)


@dataclass(frozen=True)
class _Scale:
    """Times to x: ``first`` at the plot's left edge, ``seconds`` later at its right."""

    first: datetime
    seconds: float

    def x(self, at: datetime) -> float:
        offset = (at - self.first).total_seconds() / self.seconds
        return LABELS + offset * (WIDTH - LABELS - RIGHT)


def _lane_label(bar: Bar) -> str:
    if bar.kind is BarKind.REVERSAL:
        return f"↶ undo {bar.name}"
    if bar.kind is BarKind.WAIT:
        return f"wait {bar.name}"
    return bar.name


def _lanes(ordered: Sequence[Bar], rows: dict[int, int]) -> list[str]:
    """Each lane's background and label: its first bar's kind and name."""
    firsts: dict[int, Bar] = {}
    for bar in ordered:
        firsts.setdefault(bar.lane, bar)
    parts = []
    for lane, row in rows.items():
        bar, y = firsts[lane], AXIS + ROW * row
        kind = {BarKind.REVERSAL: "rev", BarKind.WAIT: "wait"}.get(bar.kind, "attempt")
        label = _lane_label(bar)
        short = label if len(label) <= LABEL_CHARS else label[: LABEL_CHARS - 1] + "…"
        parts.append(
            f'<g class="lane" data-lane="{lane}"><title>{escape(label)}</title>'
            f'<rect class="lane-{kind}" x="0" y="{y}" width="{WIDTH}" height="{ROW}"/>'
            f'<text x="6" y="{y + ROW - 7}">{escape(short)}</text></g>'
        )
    return parts


def _tick_step(seconds: float) -> float:
    """A round step (1, 2 or 5 times a power of ten) giving about eight ticks."""
    raw = seconds / 8
    power = 10.0 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def offset_label(seconds: float) -> str:
    """An offset from the axis's origin as it reads it: ``+250 ms``, ``+1.5 s``,
    ``+2.5 min``."""
    if seconds == 0:
        return "0"
    if seconds < 1:
        return f"+{seconds * 1000:.4g} ms"
    if seconds < 120:
        return f"+{seconds:.4g} s"
    return f"+{seconds / 60:.4g} min"


def _axis(scale: _Scale, bottom: int) -> list[str]:
    step = _tick_step(scale.seconds)
    parts = ['<g class="axis">']
    count = int(scale.seconds / step + 1e-9)
    for index in range(count + 1):
        seconds = index * step
        x = LABELS + seconds / scale.seconds * (WIDTH - LABELS - RIGHT)
        # a label at the right edge ends at its line, or the picture would cut it
        place = f'x="{x - 2:.1f}" text-anchor="end"' if x > WIDTH - 60 else f'x="{x + 2:.1f}"'
        parts.append(
            f'<line class="grid" x1="{x:.1f}" y1="{AXIS - 4}" x2="{x:.1f}" y2="{bottom}"/>'
            f'<text {place} y="{AXIS - 8}">{offset_label(seconds)}</text>'
        )
    parts.append("</g>")
    return parts


def _describe(bar: Bar, now: datetime) -> str:
    what = {BarKind.ATTEMPT: "attempt", BarKind.REVERSAL: "reversal attempt"}.get(bar.kind)
    head = f"{bar.name} {what} {bar.attempt}" if what else f"wait for {bar.name!r}"
    took = offset_label((_end(bar, now) - bar.start).total_seconds()).lstrip("+")
    took = "0 ms" if took == "0" else took
    still = " so far, still open" if bar.end is None else ""
    return f"{head}: {bar.outcome}, {took}{still}"


def _bar(bar: Bar, row: int, scale: _Scale, now: datetime) -> str:
    x0, x1 = scale.x(bar.start), scale.x(_end(bar, now))
    width = max(x1 - x0, 2.0)
    high = WAIT_BAR if bar.kind is BarKind.WAIT else BAR
    y = AXIS + ROW * row + (ROW - high) / 2
    outcome = bar.outcome.replace(" ", "-")
    classes = f"bar kind-{bar.kind.value} out-{outcome}" + (" open" if bar.end is None else "")
    attempt = "" if bar.attempt is None else str(bar.attempt)
    end = "" if bar.end is None else bar.end.isoformat()
    data = {
        "kind": bar.kind.value,
        "name": bar.name,
        "attempt": attempt,
        "outcome": bar.outcome,
        "lane": str(bar.lane),
        "start": bar.start.isoformat(),
        "end": end,
    }
    attributes = " ".join(f'data-{key}="{escape(value)}"' for key, value in data.items())
    inner = (
        f"<title>{escape(_describe(bar, now))}</title>"
        f'<rect x="{x0:.1f}" y="{y:.1f}" width="{width:.1f}" height="{high}" rx="2"/>'
    )
    if attempt and width >= 12:
        inner += f'<text x="{x0 + 3:.1f}" y="{y + high - 3.5:.1f}">{attempt}</text>'
    drawn = f'<g class="{escape(classes)}" {attributes}>{inner}</g>'
    return drawn if bar.link is None else f'<a href="{escape(bar.link)}">{drawn}</a>'


def _legend(ordered: Sequence[Bar], top: int) -> tuple[list[str], int]:
    """A swatch for each (kind, outcome) drawn, in the order they first appear, wrapped to
    the picture's width; with the height it takes."""
    seen: dict[tuple[BarKind, str], None] = {}
    for bar in ordered:
        seen.setdefault((bar.kind, bar.outcome), None)
    parts, x, y = ['<g class="legend">'], 8.0, top + 8
    for kind, outcome in seen:
        label = f"{kind.value} {outcome}"
        wide = 26 + 6.2 * len(label)
        if x + wide > WIDTH:
            x, y = 8.0, y + LEGEND - 8
        classes = f"swatch kind-{kind.value} out-{outcome.replace(' ', '-')}"
        parts.append(
            f'<g class="{escape(classes)}"><rect x="{x:.1f}" y="{y}" width="14" height="10" '
            f'rx="2"/></g><text x="{x + 18:.1f}" y="{y + 9}">{escape(label)}</text>'
        )
        x += wide
    parts.append("</g>")
    return parts, y + LEGEND - 8 - top
