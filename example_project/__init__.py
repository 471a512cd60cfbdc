"""An order saga, runnable with nothing installed but the package: ``python -m example_project``.

Items are reserved one by one (``for_each``), paid for by a nested ``payment`` saga, and
held at a manager's approval gate (``wait_for("approved")``) before shipping.
"""
