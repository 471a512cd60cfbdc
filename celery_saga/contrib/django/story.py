"""A run's graph and timeline on its Django admin page, drawn from the read API's values
(``celery_saga.inspect``) in the words ``celery saga show`` and the web view print. Pure:
HTML text from the values, every value escaped."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from celery_saga.inspect import GraphNode, RunView
from celery_saga.inspect.text import timeline_lines


def graph_html(nodes: Sequence[GraphNode]) -> str:
    """The nodes as nested lists: each item names its node and says its status (the
    ``data-status`` attribute holds it too), a group's members and a child run's nodes
    listed under it."""
    if not nodes:
        return ""
    items = []
    for node in nodes:
        label = node.name if node.kind == "step" else f"{node.kind} {node.name}"
        detail = f" ({escape(node.detail)})" if node.detail else ""
        items.append(
            f'<li data-node="{escape(node.name)}" data-status="{escape(node.status)}">'
            f"{escape(label)}: <b>{escape(node.status)}</b>{detail}"
            f"{graph_html(node.children)}</li>"
        )
    return f'<ul class="saga-graph">{"".join(items)}</ul>'


def timeline_html(run: RunView) -> str:
    """The run's timeline as ``celery saga show`` prints it."""
    text = "\n".join(timeline_lines(run.timeline.entries))
    return f'<pre style="white-space: pre-wrap">{escape(text)}</pre>'
