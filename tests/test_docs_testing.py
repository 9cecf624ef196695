"""The README's "Testing your code" suite, run as written: its files, as a user copies them.

The section's Python blocks each start with the name of their file
(``# conftest.py``); they are read from README.md, written into an empty
directory and run with pytest in a process of their own, on the installed
package and its pytest plugin, as a new project runs them. pytest-celery's
plugin is switched off, as in a project without it: the README's conftest.py
is written for one (beside pytest-celery it drops its pytest_plugins line).
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.test_pytest_plugin import run_pytest

README = Path(__file__).resolve().parents[1] / "README.md"
SECTION = "## Testing your code"

#: A fenced Python block: its text, without the fences.
BLOCK = re.compile(r"^```python\n(.*?)^```$", flags=re.MULTILINE | re.DOTALL)
#: The first line of a block that is a file: ``# name.py``.
FILE_NAME = re.compile(r"# ([\w-]+\.py)")


def section(readme: str, heading: str = SECTION) -> str:
    """The text of the section under *heading*, up to the next section of its level."""
    start = readme.index(f"\n{heading}\n")
    level = heading.split(" ", 1)[0]
    following = re.search(rf"^{level} ", readme[start + len(heading) + 2 :], flags=re.MULTILINE)
    end = start + len(heading) + 2 + following.start() if following else len(readme)
    return readme[start:end]


def snippet_files(text: str) -> dict[str, str]:
    """Every Python block of *text*, by the file name on its first line; a block without
    one is an error, so that no snippet of the section goes unrun."""
    files: dict[str, str] = {}
    for block in BLOCK.findall(text):
        first_line = block.split("\n", 1)[0]
        named = FILE_NAME.fullmatch(first_line)
        assert named, f"a Python block of {SECTION!r} does not name its file: {first_line!r}"
        assert named.group(1) not in files, f"two blocks are {named.group(1)}"
        files[named.group(1)] = block
    return files


def readme_files() -> dict[str, str]:
    files = snippet_files(section(README.read_text()))
    assert {"conftest.py", "shop.py"} <= set(files), sorted(files)
    return files


def defined_tests(files: dict[str, str]) -> set[str]:
    """The test functions of the test modules among *files*."""
    return {
        name
        for file_name, text in files.items()
        if file_name.startswith("test_")
        for name in re.findall(r"^def (test_\w+)\(", text, flags=re.MULTILINE)
    }


def run_suite(tmp_path: Path, files: dict[str, str]) -> tuple[int, str, set[str]]:
    """Write *files* into the empty *tmp_path*, run pytest there: exit code, output, and the
    test functions that passed (parameters stripped)."""
    assert not any(tmp_path.iterdir())
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    proc = run_pytest(tmp_path, "-p", "no:cacheprovider", "-rA")
    out = proc.stdout + proc.stderr
    passed = set(re.findall(r"^PASSED test_\w+\.py::(test_\w+)", out, flags=re.MULTILINE))
    return proc.returncode, out, passed


def test_the_readme_suite_passes_as_written(tmp_path):
    """Every test of the README's suite passes, and nothing else is reported (no skip,
    no warning): the files work when copied, with no other file beside them."""
    files = readme_files()
    expected = defined_tests(files)
    assert "test_settle_runs_on_a_worker_that_leads" in expected, sorted(expected)
    code, out, passed = run_suite(tmp_path, files)
    assert code == 0, out[-4000:]
    assert passed == expected, out[-4000:]
    summary = out.strip().splitlines()[-1]
    assert re.fullmatch(r"=+ \d+ passed in [0-9.]+s =+", summary), out[-4000:]


def test_the_check_fails_when_a_file_of_the_readme_is_missing(tmp_path):
    """Without the README's conftest.py, the same check sees the worker test fail."""
    files = readme_files()
    del files["conftest.py"]
    code, out, passed = run_suite(tmp_path, files)
    assert code != 0, out[-4000:]
    assert "test_settle_runs_on_a_worker_that_leads" not in passed, out[-4000:]
    assert passed < defined_tests(files), out[-4000:]
