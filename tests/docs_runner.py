"""Runs the code blocks of a Markdown page the way a reader would, in a fresh directory.

What a page's author writes (docs/contributing.md shows it to readers too):

- ```` ```python title="shop.py" ````: a file, written at that path in the page's directory
  (the docs site shows the title above the block).
- ```` ```python ````: part of the page's script. A page's untitled Python blocks run
  together, in order, as one script, after the page's commands. ``print(x)  # text``
  says the script prints ``text`` (the part before a ``:``; not for ``e.g.``/``(...)``).
- ```` ```sh ````: commands, run by ``bash -e`` in the page's directory. A command ending
  in `` &`` (a worker) runs until the page is done.
- ```` ```console ````: a transcript. Each ``$ command`` runs, and the lines under it are
  what it prints on stdout, where execution ids and numbers may differ and ``...`` stands
  for any text.
- ``<!-- not run: reason -->`` on the line before a block: the block is not run, for the
  reason given (a reason is required).
- ``<!-- files from: page.md -->``: the file blocks of that page are written first.
- Every fenced block names its language; ``text`` for what is not code.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

RUNNABLE = {"python", "sh", "console"}
#: Languages that are not code to run: configuration, queries, diagrams, plain text.
NOT_CODE = {"text", "sql", "toml", "ini", "yaml", "mermaid", "json"}
_FENCE = re.compile(r"^(\s*)```(\S*)(.*)$")
_TITLE = re.compile(r'title="([^"]+)"')
_NOT_RUN = re.compile(r"^<!--\s*not run:(.*?)-->\s*$")
_FILES_FROM = re.compile(r"^<!--\s*files from:\s*(\S+)\s*-->", re.MULTILINE)
_SHOWN = re.compile(r"print\(.*\)\s+# (.+)$")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_NUMBER = re.compile(r"\d+(\.\d+)?")


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    language: str
    title: str | None
    code: str
    not_run: str | None

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def parse(path: Path) -> list[Block]:
    """The fenced blocks of a page, with their marker; fails on a block without language
    or a ``not run`` marker without a reason."""
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        fence = _FENCE.match(lines[index])
        if not fence:
            index += 1
            continue
        indent, language, info = fence.groups()
        start, body = index + 1, []
        index += 1
        while not lines[index].strip().startswith("```"):
            body.append(lines[index][len(indent) :])
            index += 1
        index += 1
        previous = next((lines[i] for i in range(start - 2, -1, -1) if lines[i].strip()), "")
        marker = _NOT_RUN.match(previous.strip())
        reason = marker.group(1).strip() if marker else None
        where = f"{path.name}:{start}"
        assert language, f"{where}: a fenced block must name its language (text if no code)"
        assert language in RUNNABLE | NOT_CODE, f"{where}: unknown block language {language!r}"
        assert reason != "", f"{where}: 'not run' needs a reason"
        title = _TITLE.search(info)
        code = "\n".join(body) + "\n"
        blocks.append(Block(path.name, start, language, title and title.group(1), code, reason))
    return blocks


def files_from(path: Path) -> list[Path]:
    return [path.parent / name for name in _FILES_FROM.findall(path.read_text())]


def normalize(text: str) -> str:
    """Output as compared: execution ids and numbers blanked, spacing and blank lines
    ignored."""
    text = _NUMBER.sub("N", _UUID.sub("<id>", text))
    return "\n".join(" ".join(line.split()) for line in text.splitlines() if line.strip())


def output_matches(expected: str, actual: str) -> bool:
    parts = [re.escape(part) for part in normalize(expected).split("...")]
    return re.fullmatch(".*?".join(parts), normalize(actual), re.DOTALL) is not None


def transcript(code: str) -> Iterator[tuple[str, str]]:
    """``(command, expected output)`` pairs of a console block."""
    command: str | None = None
    expected: list[str] = []
    for line in code.splitlines():
        if line.startswith("$ "):
            if command is not None:
                yield command, "\n".join(expected)
            command, expected = line[2:], []
        else:
            assert command is not None, f"console output before any '$ ' command: {line!r}"
            expected.append(line)
    if command is not None:
        yield command, "\n".join(expected)


class Page:
    """One page's run: its directory, environment and background processes."""

    def __init__(self, directory: Path, env: dict[str, str], timeout: float = 120) -> None:
        self.directory, self.env, self.timeout = directory, env, timeout
        self.groups: list[int] = []
        self.log = directory / "commands.log"

    def write(self, block: Block) -> None:
        assert block.title is not None
        target = self.directory / block.title
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(block.code)

    def run_commands(self, block: Block) -> None:
        with open(self.log, "ab") as log:
            # Output to a file, not a pipe: a background worker keeps its copy open.
            process = subprocess.Popen(
                ["bash", "-e", "-c", block.code],
                cwd=self.directory,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.groups.append(process.pid)
        status = process.wait(timeout=self.timeout)
        assert status == 0, f"{block.where}: exit {status}\n{self.log_tail()}"

    def run_transcript(self, block: Block) -> None:
        for command, expected in transcript(block.code):
            with open(self.log, "ab") as log:
                done = subprocess.run(
                    ["bash", "-e", "-c", command],
                    cwd=self.directory,
                    env=self.env,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    text=True,
                    timeout=self.timeout,
                )
            assert done.returncode == 0, f"{block.where}: $ {command}\n{self.log_tail()}"
            assert output_matches(expected, done.stdout), (
                f"{block.where}: $ {command} printed\n{done.stdout}\nthe page shows\n{expected}"
            )

    def run_script(self, blocks: list[Block]) -> None:
        code = "\n".join(block.code for block in blocks)
        (self.directory / "page_script.py").write_text(code)
        with open(self.log, "ab") as log:
            done = subprocess.run(
                ["python", "page_script.py"],
                cwd=self.directory,
                env=self.env,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                timeout=self.timeout,
            )
        where = blocks[0].where
        assert done.returncode == 0, f"{where}: the page's script failed\n{self.log_tail()}"
        for line in code.splitlines():
            shown = _SHOWN.search(line)
            if shown and not shown.group(1).startswith(("e.g.", "(")):
                claim = shown.group(1).split(":")[0]
                assert claim in done.stdout, f"{where}: {claim!r} not printed:\n{done.stdout}"

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else ""

    def stop_background(self) -> None:
        for group in self.groups:
            _signal_group(group, signal.SIGTERM)
        deadline = time.monotonic() + 20
        while any(_group_alive(g) for g in self.groups) and time.monotonic() < deadline:
            time.sleep(0.2)
        for group in self.groups:
            _signal_group(group, signal.SIGKILL)


def _signal_group(group: int, signum: int) -> None:
    with suppress(ProcessLookupError):
        os.killpg(group, signum)


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


@contextmanager
def page_run(directory: Path, env: dict[str, str]) -> Iterator[Page]:
    page = Page(directory, env)
    try:
        yield page
    finally:
        page.stop_background()


def run_page(path: Path, directory: Path, env: dict[str, str]) -> list[Block]:
    """Run every runnable block of ``path`` (see the module docstring); returns the blocks
    that were not run, for the caller to report."""
    blocks = parse(path)
    with page_run(directory, env) as page:
        for other in files_from(path):
            for block in parse(other):
                if block.language == "python" and block.title:
                    page.write(block)
        script: list[Block] = []
        for block in blocks:
            if block.not_run is not None or block.language in NOT_CODE:
                continue
            if block.language == "python":
                if block.title:
                    page.write(block)
                else:
                    script.append(block)
            elif block.language == "sh":
                page.run_commands(block)
            else:
                page.run_transcript(block)
        if script:
            page.run_script(script)
    return [block for block in blocks if block.not_run is not None]
