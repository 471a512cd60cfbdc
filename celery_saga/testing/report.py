"""What an exploration returns: the points it visited and what broke at each."""

from __future__ import annotations

from dataclasses import dataclass

from celery_saga.testing.points import Point


@dataclass(frozen=True)
class PointFailure:
    """A point where the saga broke an invariant (or an ``on_point`` assertion):
    ``problems`` says what broke, ``reproduction`` is the call that explores it alone."""

    point: Point
    problems: tuple[str, ...]
    reproduction: str

    def __str__(self) -> str:
        lines = [f"{self.point.id}:"] + [f"  - {problem}" for problem in self.problems]
        return "\n".join([*lines, f"  reproduce: {self.reproduction}"])


@dataclass(frozen=True)
class ExplorationReport:
    """``points`` in the order they were explored; ``failures`` those that broke, in the
    same order; ``left_out`` the points past ``max_points``; ``seconds`` the wall time."""

    saga: str
    points: tuple[Point, ...]
    failures: tuple[PointFailure, ...]
    left_out: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failures

    def __str__(self) -> str:
        head = (
            f"explored saga {self.saga!r}: {len(self.points)} points in {self.seconds:.1f} s, "
            f"{len(self.failures)} failing"
        )
        if self.left_out:
            head += f" ({self.left_out} left out by max_points)"
        return "\n".join([head, *map(str, self.failures)])
