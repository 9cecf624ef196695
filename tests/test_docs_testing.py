"""The Testing page's suite, run as written: its files, as a user copies them.

The page includes the files of docs/examples/testing/ (each starts with its
own name, ``# conftest.py``); they are copied into an empty directory and
run with pytest in a process of their own, on the installed package and its
pytest plugin, as a new project runs them: once with pytest-celery's plugin
active (the test extra installs it) and once with it switched off
(``-p no:celery``), as in a project without it. The header pytest prints
(``plugins: ...``) shows which plugin set each run had.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.test_pytest_plugin import run_pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "docs" / "examples" / "testing"
PAGE = ROOT / "docs" / "testing.md"

#: Each run of the suite: beside pytest-celery, and without it.
PLUGIN_SETS = pytest.mark.parametrize(
    "pytest_celery", [True, False], ids=["with-pytest-celery", "without-pytest-celery"]
)


def example_files() -> dict[str, str]:
    """The example's files by name; each starts with its own name, as the page shows it."""
    files = {path.name: path.read_text() for path in sorted(EXAMPLE.glob("*.py"))}
    assert {"conftest.py", "shop.py", "test_shop.py"} <= set(files), sorted(files)
    for name, text in files.items():
        assert text.startswith(f"# {name}\n"), name
    return files


def test_the_page_includes_every_file_of_the_example():
    """The Testing page shows the files this test runs, each included, none retyped."""
    page = PAGE.read_text()
    for name in example_files():
        assert f"examples/testing/{name}" in page, name


def defined_tests(files: dict[str, str]) -> set[str]:
    """The test functions of the test modules among *files*."""
    return {
        name
        for file_name, text in files.items()
        if file_name.startswith("test_")
        for name in re.findall(r"^def (test_\w+)\(", text, flags=re.MULTILINE)
    }


def write(tmp_path: Path, files: dict[str, str]) -> Path:
    """Write *files* into the empty *tmp_path*."""
    assert not any(tmp_path.iterdir())
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return tmp_path


def check_plugin_set(out: str, pytest_celery: bool) -> None:
    """pytest's header lists pytest-celery's plugin exactly when the run was to have it."""
    header = re.search(r"^plugins: (.*)$", out, flags=re.MULTILINE)
    assert header, out[-3000:]
    plugins = {p.strip().rsplit("-", 1)[0] for p in header.group(1).split(",")}
    assert "celery-leader" in plugins, header.group(0)
    assert ("celery" in plugins) is pytest_celery, header.group(0)


def run_suite(
    tmp_path: Path, files: dict[str, str], *, pytest_celery: bool = False
) -> tuple[int, str, set[str]]:
    """Write *files* into the empty *tmp_path*, run pytest there: exit code, output, and the
    test functions that passed (parameters stripped). An assertion-rewrite warning is an
    error, as under ``filterwarnings = error``."""
    write(tmp_path, files)
    proc = run_pytest(
        tmp_path,
        "-p",
        "no:cacheprovider",
        "-W",
        "error::pytest.PytestAssertRewriteWarning",
        "-rA",
        pytest_celery=pytest_celery,
    )
    out = proc.stdout + proc.stderr
    check_plugin_set(out, pytest_celery)
    passed = set(re.findall(r"^PASSED test_\w+\.py::(test_\w+)", out, flags=re.MULTILINE))
    return proc.returncode, out, passed


@PLUGIN_SETS
def test_the_suite_passes_as_written(tmp_path, pytest_celery):
    """Every test of the page's suite passes, and nothing else is reported (no skip,
    no warning): the files work when copied, with no other file beside them, whether
    pytest-celery is installed or not."""
    files = example_files()
    expected = defined_tests(files)
    assert "test_settle_runs_on_a_worker_that_leads" in expected, sorted(expected)
    code, out, passed = run_suite(tmp_path, files, pytest_celery=pytest_celery)
    assert code == 0, out[-4000:]
    assert passed == expected, out[-4000:]
    summary = out.strip().splitlines()[-1]
    assert re.fullmatch(r"=+ \d+ passed in [0-9.]+s =+", summary), out[-4000:]


@PLUGIN_SETS
def test_pytest_fixtures_lists_the_suites_fixtures(tmp_path, pytest_celery):
    """`pytest --fixtures` in the page's suite exits 0 and lists celery-leader's fixtures
    and the Celery fixtures leader_worker builds on, whether pytest-celery is installed
    or not."""
    write(tmp_path, example_files())
    proc = run_pytest(tmp_path, "-p", "no:cacheprovider", "--fixtures", pytest_celery=pytest_celery)
    out = proc.stdout + proc.stderr
    check_plugin_set(out, pytest_celery)
    assert proc.returncode == 0, out[-4000:]
    assert "INTERNALERROR" not in out, out[-4000:]
    for name in ("leader_lease", "leader_worker", "celery_app", "celery_worker_parameters"):
        assert re.search(rf"^{name}\b", out, flags=re.MULTILINE), out[-4000:]


def test_the_check_fails_when_a_file_of_the_example_is_missing(tmp_path):
    """Without the example's conftest.py, the same check sees the worker test fail."""
    files = example_files()
    del files["conftest.py"]
    code, out, passed = run_suite(tmp_path, files)
    assert code != 0, out[-4000:]
    assert "test_settle_runs_on_a_worker_that_leads" not in passed, out[-4000:]
    assert passed < defined_tests(files), out[-4000:]
