"""The docs runner holds pages to their conventions: it refuses a block without language or
a 'not run' without reason, and fails a transcript whose output differs from the page."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.docs_runner import output_matches, parse, run_page
from tests.test_docs_examples import page_env

FENCE = "```"


def _page(tmp_path: Path, text: str) -> Path:
    page = tmp_path / "page.md"
    page.write_text(text.replace("'''", FENCE))
    return page


def _env() -> dict[str, str]:
    return page_env(Path(sys.executable).parent)


def test_a_block_without_language_is_refused(tmp_path: Path) -> None:
    page = _page(tmp_path, "'''\npip install x\n'''\n")
    with pytest.raises(AssertionError, match="must name its language"):
        parse(page)


def test_not_run_needs_a_reason(tmp_path: Path) -> None:
    page = _page(tmp_path, "<!-- not run: -->\n'''sh\nexit 1\n'''\n")
    with pytest.raises(AssertionError, match="needs a reason"):
        parse(page)


def test_a_block_marked_not_run_is_skipped_and_reported(tmp_path: Path) -> None:
    page = _page(tmp_path, "<!-- not run: it would fail -->\n'''sh\nexit 1\n'''\n")
    (tmp_path / "run").mkdir()
    [skipped] = run_page(page, tmp_path / "run", _env())
    assert skipped.not_run == "it would fail"


def test_files_commands_and_transcripts_run_in_order(tmp_path: Path) -> None:
    page = _page(
        tmp_path,
        "'''python title=\"pkg/hello.py\"\nprint('hello', 41 + 1)\n'''\n"
        "'''sh\npython pkg/hello.py > out.txt\n'''\n"
        "'''console\n$ cat out.txt\nhello 7\n'''\n",
    )
    (tmp_path / "run").mkdir()
    run_page(page, tmp_path / "run", _env())  # numbers may differ: 42 matches 7


def test_a_transcript_whose_output_differs_fails(tmp_path: Path) -> None:
    page = _page(tmp_path, "'''console\n$ echo completed\nfailed\n'''\n")
    (tmp_path / "run").mkdir()
    with pytest.raises(AssertionError, match="printed"):
        run_page(page, tmp_path / "run", _env())


def test_a_failing_command_fails_the_page(tmp_path: Path) -> None:
    page = _page(tmp_path, "'''sh\nfalse\n'''\n")
    (tmp_path / "run").mkdir()
    with pytest.raises(AssertionError, match="exit 1"):
        run_page(page, tmp_path / "run", _env())


def test_the_script_must_print_what_the_page_claims(tmp_path: Path) -> None:
    page = _page(tmp_path, "'''python\nprint('red')  # green\n'''\n")
    (tmp_path / "run").mkdir()
    with pytest.raises(AssertionError, match="'green' not printed"):
        run_page(page, tmp_path / "run", _env())


def test_ids_numbers_and_ellipses_may_differ_but_words_may_not() -> None:
    shown = "run 2d6c1a4e-0000-4000-8000-000000000001 took 12.5 ms\n... done"
    printed = "run 9f1b7c2d-1111-4111-8111-111111111111 took 3.0 ms\nnoise\nall done"
    assert output_matches(shown, printed)
    assert not output_matches(shown, printed.replace("took", "lost"))


def test_a_background_command_is_stopped_when_the_page_ends(tmp_path: Path) -> None:
    page = _page(tmp_path, "'''sh\nsleep 300 &\necho $! > pid\n'''\n")
    (tmp_path / "run").mkdir()
    run_page(page, tmp_path / "run", _env())
    pid = int((tmp_path / "run" / "pid").read_text())
    assert (
        not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    )
