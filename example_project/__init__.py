"""An order saga, runnable with nothing installed but the package: ``python -m example_project``."""
