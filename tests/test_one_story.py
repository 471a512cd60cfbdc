"""One run reads the same through every view: runs of every shape (parallel, branch, loop,
for_each, sub-saga, a wait signalled and one timed out, parked, cancelled, retried
attempts) rendered by the read API, ``celery saga show`` (text and ``--json``), the web
view and the Django admin's graph, whose statuses must agree word for word. A view that
changes its words on its own fails here."""

from __future__ import annotations

import html
import json
import re
import time
import uuid
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

from celery_saga import ExecutionState, get_clock
from celery_saga.cli import saga as saga_cli
from celery_saga.contrib.django.story import graph_html
from celery_saga.inspect import GraphNode, RunView
from celery_saga.web import Credentials, WebSettings, create_app
from tests.conftest import Harness

AUTH = ("ops", "pw")
#: (depth, name, status) of every node, depth first: what each view is read back as.
Shape = list[tuple[int, str, str]]
_KINDS = {"parallel", "branch", "loop", "for_each", "wait", "pivot", "sub_saga"}


def _parallel(h: Harness) -> str:
    run = h.start("fanout", {"order": 1})
    assert run.wait(30).state is ExecutionState.COMPLETED, h.worker_logs()
    return str(run.id)


def _branch(h: Harness) -> str:
    run = h.start("routed", {"amounts": [1, 2]})
    assert run.wait(30).state is ExecutionState.COMPLETED, h.worker_logs()
    return str(run.id)


def _loop(h: Harness) -> str:
    run = h.start("polling", {"rounds": 2})
    assert run.wait(30).state is ExecutionState.COMPLETED, h.worker_logs()
    return str(run.id)


def _for_each(h: Harness) -> str:
    run = h.start("batch", {"items": ["x", "y", "z"]})
    assert run.wait(30).state is ExecutionState.COMPLETED, h.worker_logs()
    return str(run.id)


def _sub_saga(h: Harness) -> str:
    run = h.start("parent", {"order": 2})
    assert run.wait(30).state is ExecutionState.COMPLETED, h.worker_logs()
    return str(run.id)


def _signalled(h: Harness) -> str:
    run = h.start("gate_only")
    assert run.wait(30).state is ExecutionState.WAITING, h.worker_logs()
    h.engine.signal(run.id, "go")
    assert run.wait(30).state is ExecutionState.COMPLETED, h.worker_logs()
    return str(run.id)


def _still_waiting(h: Harness) -> str:
    run = h.start("gate_last", {"order": 3})
    assert run.wait(30).state is ExecutionState.WAITING, h.worker_logs()
    return str(run.id)


def _timed_out(h: Harness) -> str:
    run = h.start("approval", {"order": 4})
    assert run.wait(30).state is ExecutionState.WAITING, h.worker_logs()
    wake_at = run.get().record.wake_at
    time.sleep(max(0.0, (wake_at - get_clock().now()).total_seconds()) + 0.05)
    assert h.engine.fire_timers() >= 1
    run.wait(30, states=[ExecutionState.FAILED, ExecutionState.COMPENSATION_STUCK])
    return str(run.id)


def _parked(h: Harness) -> str:
    switch = f"undo-{uuid.uuid4().hex}"
    h.test_app.set_switch(switch, True)
    plan = {"s4": {"fail": True}, "s2": {"undo_switch": switch}}
    run = h.start("five", {"order": 5, "plan": plan})
    assert run.wait(30).state is ExecutionState.COMPENSATION_STUCK, h.worker_logs()
    return str(run.id)


def _resolved(h: Harness) -> str:
    parked = _parked(h)
    h.engine.resolve(parked, step="s2", note="undone at the desk", actor="ops@desk")
    assert h.engine.handle(parked).wait(30).state is ExecutionState.FAILED, h.worker_logs()
    return parked


def _cancelled(h: Harness) -> str:
    run = h.start("gate_last", {"order": 6})
    assert run.wait(30).state is ExecutionState.WAITING, h.worker_logs()
    h.engine.cancel(run.id, "not needed", actor="ops@desk")
    assert run.wait(30).state is ExecutionState.CANCELLED, h.worker_logs()
    return str(run.id)


def _retried(h: Harness) -> str:
    run = h.start("five", {"order": 7, "plan": {"s3": {"fail_attempts": 1}}})
    assert run.wait(30).state is ExecutionState.COMPLETED, h.worker_logs()
    return str(run.id)


SHAPES: dict[str, Callable[[Harness], str]] = {
    "parallel": _parallel,
    "branch": _branch,
    "loop": _loop,
    "for_each": _for_each,
    "sub_saga": _sub_saga,
    "wait signalled": _signalled,
    "wait waiting": _still_waiting,
    "wait timed out": _timed_out,
    "parked": _parked,
    "resolved": _resolved,
    "cancelled": _cancelled,
    "retried": _retried,
}


@pytest.fixture(scope="module")
def runs(harness: Harness) -> Iterator[dict[str, str]]:
    """One run of every shape, on this backend (the Redis broker adds nothing here: the
    store is what the views read, and PostgreSQL runs under the RabbitMQ one)."""
    if harness.name == "postgres-redis":
        pytest.skip("the views read the store: PostgreSQL is covered with RabbitMQ")
    yield {shape: make(harness) for shape, make in SHAPES.items()}


def _of_values(nodes: tuple[GraphNode, ...], depth: int = 0) -> Shape:
    found: Shape = []
    for node in nodes:
        found.append((depth, node.name, node.status))
        found += _of_values(node.children, depth + 1)
    return found


def _of_json(nodes: list[dict[str, Any]], depth: int = 0) -> Shape:
    found: Shape = []
    for node in nodes:
        found.append((depth, node["name"], node["status"]))
        found += _of_json(node["children"], depth + 1)
    return found


_LINE = re.compile(r"^(?P<indent> *)(?P<label>[^:]+): (?P<status>.+?)(?:  \(.*\))?$")


def _of_text(output: str) -> Shape:
    """The graph section of ``show``'s text: one line a node, two spaces a level."""
    section = output.split("\ngraph:\n", 1)[1].split("\ntimeline:\n", 1)[0]
    found: Shape = []
    for line in section.splitlines():
        match = _LINE.match(line)
        assert match is not None, line
        label = match["label"]
        kind, _, name = label.partition(" ")
        depth = (len(match["indent"]) - 2) // 2
        found.append((depth, name if kind in _KINDS else label, match["status"]))
    return found


_NODE = re.compile(r'data-node="([^"]*)" data-status="([^"]*)"')


def _of_html(page: str) -> list[tuple[str, str]]:
    """(name, status) of each drawn node, in document (depth first) order."""
    return [(html.unescape(n), html.unescape(s)) for n, s in _NODE.findall(page)]


def _show(harness: Harness, *args: str) -> str:
    obj = SimpleNamespace(app=harness.test_app.app)
    result = CliRunner().invoke(saga_cli, ["show", *args], obj=obj, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def _views(harness: Harness, execution_id: str) -> dict[str, Any]:
    view: RunView = harness.engine.inspect().run(execution_id)
    shown = json.loads(_show(harness, execution_id, "--json"))
    text = _show(harness, execution_id)
    client = create_app(harness.engine, WebSettings(Credentials(*AUTH))).test_client()
    page = client.get(f"/runs/{execution_id}", auth=AUTH).get_data(as_text=True)
    graph = page.split('id="graph"', 1)[1]
    return {"view": view, "json": shown, "text": text, "page": page, "graph": graph}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_view_tells_a_run_in_the_same_words(
    harness: Harness, runs: dict[str, str], shape: str
) -> None:
    seen = _views(harness, runs[shape])
    view: RunView = seen["view"]
    expected = _of_values(view.graph)
    assert expected, f"{shape}: the read API drew no graph"
    assert _of_json(seen["json"]["tree"]) == expected, "show --json"
    assert _of_text(seen["text"]) == expected, "show"
    flat = [(name, status) for _, name, status in expected]
    assert _of_html(seen["graph"]) == flat, "the web view"
    assert _of_html(graph_html(view.graph)) == flat, "the Django admin"
    assert seen["json"]["state"] == view.state
    assert f"state={view.state}" in seen["text"]
    assert f'id="state">{view.state}<' in seen["page"]
    if view.waiting is not None:
        assert seen["json"]["waiting"] == view.waiting
        assert view.waiting in seen["text"]
        assert f'id="waiting">{view.waiting}<' in html.unescape(seen["page"])


def test_the_shapes_say_each_word_of_the_vocabulary(harness: Harness, runs: dict[str, str]) -> None:
    """The runs above reach every status word a view may print: a wait signalled, one
    waiting, one timed out, a reversal's outcome, a group with a failure inside."""
    said = {
        status
        for execution_id in runs.values()
        for _, _, status in _of_values(harness.engine.inspect().run(execution_id).graph)
    }
    wanted = {
        "completed",
        "signalled",
        "waiting",
        "timed out",
        "not run",
        "completed -> compensated",
        "completed -> compensation_failed",
        "completed -> compensation_resolved",
        "failed",
    }
    assert wanted <= said, sorted(said)
