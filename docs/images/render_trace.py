"""Draws trace.svg (docs/tracing.md): the trace of one real run, as OpenTelemetry's console
exporter prints it, turned into a tree of spans on a time axis.

The run goes through the package for real (``task_always_eager``, a SQLite store in a
temporary folder) on a controlled clock that each body moves on, so the picture is the same
at every run of this script: span times come from the package's clock. Run it from the
repository's root after changing what a span carries:

    python docs/images/render_trace.py
"""

from __future__ import annotations

import io
import json
import tempfile
from datetime import datetime, timezone
from html import escape
from pathlib import Path
from typing import Any

from celery import Celery
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

from celery_saga import Saga, SagaContext, SagaEngine, set_clock
from celery_saga.testing import ControlledClock

HERE = Path(__file__).resolve().parent
ROW, LABEL, BAR, PAD = 24, 330, 520, 12
#: The attributes shown beside a span's name.
SHOWN = ("saga.attempt", "saga.outcome", "saga.actor", "saga.lost_attempt")


def run_the_example(console: io.StringIO) -> None:
    """One run of ``order``: reserve, a sub-saga, charge failing twice (retried once, then
    for good), so the unwind reverses what ran; every span printed to ``console`` as JSON."""
    clock = ControlledClock(datetime(2031, 5, 4, 9, 0, tzinfo=timezone.utc))
    set_clock(clock)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=console)))
    trace.set_tracer_provider(provider)
    app = Celery("shop", set_as_current=False)
    app.conf.update(task_always_eager=True, broker_url="memory://")
    folder = tempfile.mkdtemp()
    engine = SagaEngine(app, store_url=f"sqlite:///{folder}/trace.sqlite3")

    def work(seconds: float, fails: bool = False) -> Any:
        def body(ctx: SagaContext) -> str:
            clock.advance(seconds)
            if fails:
                raise ConnectionError("payment provider timed out")
            return ctx.step_name

        return body

    def undo(ctx: SagaContext) -> None:
        clock.advance(0.4)

    engine.register(
        Saga("notify").step("email", work(0.6)),
        Saga("order")
        .step("reserve", work(1.2), compensate=undo)
        .sub_saga("notify")
        .step("charge", work(0.9, fails=True), compensate=undo, retry=2, backoff=0.01),
    )

    def now() -> int:  # the request's span on the same clock as the package's
        return int(clock.now().timestamp() * 1e9)

    request = trace.get_tracer("shop").start_span("POST /orders", start_time=now())
    with trace.use_span(request):
        clock.advance(0.1)
        engine.start("order", {"order": 7})
        clock.advance(0.1)
    request.end(end_time=now())
    provider.shutdown()


def spans_of(console: str) -> list[dict[str, Any]]:
    """The console exporter's output: one JSON document per span."""
    decoder, spans, at = json.JSONDecoder(), [], 0
    while at < len(console):
        if console[at].isspace():
            at += 1
            continue
        span, at = decoder.raw_decode(console, at)
        spans.append(span)
    return spans


def _time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def tree_rows(spans: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    """(depth, span), each span under its parent, siblings by start time."""
    ids = {s["context"]["span_id"] for s in spans}
    children: dict[str | None, list[dict[str, Any]]] = {}
    for span in spans:
        parent = span["parent_id"] if span["parent_id"] in ids else None
        children.setdefault(parent, []).append(span)
    rows: list[tuple[int, dict[str, Any]]] = []

    def walk(parent: str | None, depth: int) -> None:
        for span in sorted(children.get(parent, []), key=lambda s: _time(s["start_time"])):
            rows.append((depth, span))
            walk(span["context"]["span_id"], depth + 1)

    walk(None, 0)
    return rows


def svg(rows: list[tuple[int, dict[str, Any]]]) -> str:
    begin = min(_time(s["start_time"]) for _, s in rows)
    end = max(_time(s["end_time"]) for _, s in rows)
    scale = BAR / max(end - begin, 1e-9)
    height = PAD * 2 + ROW * (len(rows) + 2)
    width = LABEL + BAR + PAD * 3 + 150
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="monospace" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="{PAD}" y="{PAD + 14}" font-weight="bold">one trace, one run: '
        f"{end - begin:.1f} s of the package's clock</text>",
    ]
    for index, (depth, span) in enumerate(rows, start=1):
        y = PAD + ROW * index
        attributes = span.get("attributes", {})
        failed = span["status"]["status_code"] == "ERROR"
        colour = (
            "#d9534f"
            if failed
            else ("#f0ad4e" if span["name"].startswith("reversal") else "#5b8def")
        )
        x0 = LABEL + PAD * 2 + (_time(span["start_time"]) - begin) * scale
        length = max((_time(span["end_time"]) - _time(span["start_time"])) * scale, 2)
        shown = " ".join(
            f"{key.split('.')[1]}={attributes[key]}" for key in SHOWN if key in attributes
        )
        out.append(
            f'<text x="{PAD + depth * 16}" y="{y + 15}">{escape(span["name"])}</text>'
            f'<rect x="{x0:.1f}" y="{y + 4}" width="{length:.1f}" height="{ROW - 8}" '
            f'rx="2" fill="{colour}"/>'
            f'<text x="{x0 + length + 6:.1f}" y="{y + 15}" fill="#555555">{escape(shown)}</text>'
        )
        if span.get("links"):
            out.append(f'<text x="{LABEL}" y="{y + 15}" fill="#888888">&#8599;</text>')
    legend = PAD + ROW * (len(rows) + 1) + 15
    out.append(
        f'<text x="{PAD}" y="{legend}" fill="#555555">blue: ran, red: failed (an exception '
        "event), orange: a reversal; &#8599; a span link (a reversal's to the attempt it "
        "undoes)</text>"
    )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main() -> None:
    console = io.StringIO()
    run_the_example(console)
    rows = tree_rows(spans_of(console.getvalue()))
    (HERE / "trace.svg").write_text(svg(rows))
    for depth, span in rows:
        print("  " * depth + span["name"])


if __name__ == "__main__":
    main()
