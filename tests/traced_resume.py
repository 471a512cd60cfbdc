"""Another process's resume of a parked run (``python -m tests.traced_resume RUN_ID``):
the tracing tests' app (its spans written to files, its clock shifted as the test's
rig says), the resume made under a span of its own, whose id is printed."""

from __future__ import annotations

import sys

from opentelemetry import trace

from tests import traced_app


def main(execution_id: str) -> None:
    with trace.get_tracer("ops").start_as_current_span("operator clicks resume") as asking:
        traced_app._test_app.engine.resume_compensation(execution_id, actor="oncall")
    print(format(asking.get_span_context().span_id, "016x"))


if __name__ == "__main__":
    main(sys.argv[1])
