"""Takes the screenshots of docs/web.md: a shop's runs in the web view, in headless Chromium.

Usage (from the repository's root, with the dev extra and Debian's chromium and
chromium-driver installed)::

    python docs/images/take_web_screenshots.py [OUT_DIR]

It starts a SQLite store and a Celery worker in this process (``memory://`` broker), makes
runs that complete, fail and are compensated, park on a reversal that keeps failing and
wait for a signal, and one whose card is declined three times, that waits two seconds for
an approval and then unwinds four steps; serves the view with actions on, and writes
``web-runs.png``, ``web-run-compensated.png``, ``web-run-parked.png`` and
``web-run-timeline.png`` into OUT_DIR (default: this script's folder).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from celery import Celery  # noqa: E402

from celery_saga import Saga, SagaContext, SagaEngine, path, step  # noqa: E402
from celery_saga.web import Credentials, WebSettings  # noqa: E402
from celery_saga.worker.embedded import embedded_worker  # noqa: E402
from tests.web_browser import chromium, send_basic_auth, serving  # noqa: E402

USER, PASSWORD = "alice", "correct-horse"


def ok(ctx: SagaContext) -> dict[str, Any]:
    return {"done": ctx.step_name, "order": ctx.input["order"]}


def undo(ctx: SagaContext) -> None:
    return None


def refund(ctx: SagaContext) -> None:
    if ctx.input.get("refunds_down"):
        raise ConnectionError("payment provider unavailable: refund not accepted")


def ship(ctx: SagaContext) -> dict[str, Any]:
    if ctx.input.get("address_invalid"):
        raise ValueError(f"carrier refused the address of order {ctx.input['order']}")
    return {"tracking": f"TRK{ctx.input['order']}"}


def charge(ctx: SagaContext) -> dict[str, Any]:
    time.sleep(0.3)
    if ctx.attempt <= ctx.input.get("declines", 0):
        raise ConnectionError("card network timeout")
    return {"charged": ctx.input["order"]}


def pack(ctx: SagaContext) -> dict[str, Any]:
    time.sleep(1.5)
    return {"parcel": f"P{ctx.input['order']}"}


def carrier(ctx: SagaContext) -> str:
    return "express" if ctx.input.get("express") else "standard"


def shop() -> Saga:
    return (
        Saga("fulfil_order", sensitive=("card",))
        .step("reserve_stock", ok, compensate=undo)
        .parallel(
            "payment",
            step("charge_card", ok, compensate=refund, compensation_retry=2),
            step("award_points", ok, compensate=undo),
        )
        .branch(
            "carrier",
            carrier,
            path("express", step("book_courier", ok, compensate=undo)),
            path("standard", step("book_post", ok, compensate=undo)),
        )
        .wait_for("packed", timeout=86400)
        .step("ship", ship)
    )


def ship_order() -> Saga:
    """The timeline screenshot's saga: a retried charge, a slow packer, a gate."""
    return (
        Saga("ship_order")
        .step("reserve_stock", ok, compensate=undo)
        .step("charge_card", charge, compensate=undo, retry=4, backoff=0.3)
        .step("pack", pack, compensate=undo)
        .step("print_label", ok, compensate=undo)
        .wait_for("approved")
        .step("ship", ship)
    )


def _timeline_run(engine: SagaEngine) -> str:
    plan = {"order": 1045, "declines": 3, "address_invalid": True}
    handle = engine.start("ship_order", plan)
    handle.wait(60, states={_waiting()})
    time.sleep(2)
    engine.signal(handle.id, "approved", {"by": "supervisor"})
    handle.wait(60)
    return handle.id


def _runs(engine: SagaEngine) -> dict[str, str]:
    card = "4242 4242 4242 4242"
    made: dict[str, str] = {}
    plans = {
        "completed": {"express": True},
        "compensated": {"address_invalid": True},
        "parked": {"address_invalid": True, "refunds_down": True, "express": True},
        "waiting": {},
    }
    for order, (name, plan) in enumerate(plans.items(), start=1041):
        handle = engine.start("fulfil_order", {"order": order, "card": card, **plan})
        if name != "waiting":
            handle.wait(30, states={_waiting()})
            engine.signal(handle.id, "packed", {"by": "packing-station-3"})
        made[name] = handle.id
    for name, run_id in made.items():
        if name != "waiting":
            engine.handle(run_id).wait(30)
    return made


def _waiting() -> Any:
    from celery_saga import ExecutionState

    return ExecutionState.WAITING


def _shot(driver: Any, url: str, out: Path, width: int = 1280, tallest: int = 1700) -> None:
    driver.set_window_size(width, 900)
    driver.get(url)
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(width, min(int(height) + 20, tallest))
    driver.save_screenshot(str(out))
    print(out)


def _timeline_shot(driver: Any, url: str, out: Path) -> None:
    """The run page scrolled to its timeline: the picture, the text timeline under it."""
    from selenium.webdriver.common.by import By

    driver.set_window_size(1280, 760)
    driver.get(url)
    heading = driver.find_element(By.XPATH, "//h2[text()='Timeline']")
    driver.execute_script("arguments[0].scrollIntoView()", heading)
    driver.save_screenshot(str(out))
    print(out)


def main(out: Path) -> None:
    with tempfile.TemporaryDirectory() as folder:
        app = Celery("shop", broker="memory://localhost/", set_as_current=False)
        app.conf.update(
            task_default_queue="shop-screenshots",
            saga_store_url=f"sqlite:///{folder}/store.sqlite3",
            broker_transport_options={"polling_interval": 0.01},
            result_backend="cache+memory://",
        )
        engine = SagaEngine(app)
        engine.register(shop())
        engine.register(ship_order())
        engine.ensure_schema()
        settings = WebSettings(Credentials(USER, PASSWORD), actions=True)
        with embedded_worker(app, concurrency=2), serving(engine, settings) as site:
            runs = _runs(engine)
            timeline = _timeline_run(engine)
            driver = chromium()
            try:
                send_basic_auth(driver, USER, PASSWORD)
                _shot(driver, site + "/", out / "web-runs.png", tallest=700)
                _shot(driver, f"{site}/runs/{runs['compensated']}", out / "web-run-compensated.png")
                _shot(driver, f"{site}/runs/{runs['parked']}", out / "web-run-parked.png")
                _timeline_shot(driver, f"{site}/runs/{timeline}", out / "web-run-timeline.png")
            finally:
                driver.quit()
        engine.db.dispose()


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent)
