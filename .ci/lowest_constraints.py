"""Write a pip constraints file pinning every requirement of the package and its test extra
to the lowest version pyproject.toml allows (its ``>=`` bound), for ``tox -e lowest``.

Only direct requirements are pinned; what they need resolves as pip finds it, as it would
for a user who has those versions installed already.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
SELF = "celery-saga-engine"
_LOWER = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*(?:\[([^\]]*)\])?\s*>=\s*([0-9][^,;\s]*)")
_EXTRAS = re.compile(r"^\s*" + re.escape(SELF) + r"\s*\[([^\]]*)\]")


def requirements(project: dict, extras: list[str]) -> list[str]:
    """The package's requirements plus those of ``extras``, self-references expanded."""
    found = list(project["dependencies"])
    pending, seen = list(extras), set()
    while pending:
        extra = pending.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for requirement in project["optional-dependencies"][extra]:
            nested = _EXTRAS.match(requirement)
            if nested:
                pending += [name.strip() for name in nested.group(1).split(",")]
            else:
                found.append(requirement)
    return found


def lowest_pins(requirement_list: list[str]) -> dict[str, str]:
    pins: dict[str, str] = {}
    for requirement in requirement_list:
        match = _LOWER.match(requirement)
        if match is None:
            raise SystemExit(f"no lower bound (>=) in requirement {requirement!r}")
        name = match.group(1).lower().replace("_", "-")
        pins[name] = max(pins.get(name, "0"), match.group(3), key=_version_key)
    return pins


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


def main() -> None:
    target = Path(sys.argv[1])
    extras = sys.argv[2:] or ["test"]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = lowest_pins(requirements(project, extras))
    target.write_text("".join(f"{name}=={version}\n" for name, version in sorted(pins.items())))
    print(f"pinned {len(pins)} requirements to their lower bounds in {target}")


if __name__ == "__main__":
    main()
