"""A pytest run that survives its process dying: on a chip, XLA's compiler can abort the process (a `F` log line,
SIGABRT) in one test, which took the rest of the suite and every report with it.

With TORCH_TPU_TEST_JOURNAL=PATH, each test's start, end and failure text go to PATH as they happen (written and
flushed line by line). A run started again with the same journal deselects every test it names as started, so it
resumes after the one that killed the process, and reports that one as crashed. bench/device_run.sh restarts a
pytest step that died this way. TORCH_TPU_TEST_ABORT=TEXT aborts the process in the tests whose id contains TEXT
(the dry run of that restart). Without the variable nothing happens.

    python torch_tpu/testing/journal.py PATH     the test the process died in (none: nothing printed)
    python torch_tpu/testing/journal.py PATH --failures     the failures' texts
(run as a file, it imports neither torch nor torch_tpu: bench/device_run.sh calls it between pytest runs)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

_START, _END, _FAILED = "start ", "end ", "failed "


def _journal() -> Path | None:
    path = os.environ.get("TORCH_TPU_TEST_JOURNAL")
    return Path(path) if path else None


def _write(text: str) -> None:
    with open(_journal(), "a") as journal:
        journal.write(text)
        journal.flush()
        os.fsync(journal.fileno())


def read(path: Path) -> tuple[list[str], list[str]]:
    """(started, crashed): the test ids a journal names as started, and those of them that never ended."""
    started, ended = [], set()
    for line in path.read_text().splitlines() if path.exists() else []:
        if line.startswith(_START):
            started.append(line[len(_START) :])
        elif line.startswith(_END):
            ended.add(line[len(_END) :])
    return started, [test for test in started if test not in ended]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Resuming: the tests an earlier run of this journal started are deselected."""
    path = _journal()
    if path is None:
        return
    started, crashed = read(path)
    done = set(started)
    kept = [item for item in items if item.nodeid not in done]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if item.nodeid in done])
        items[:] = kept
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    for test in crashed:
        if reporter is not None:
            reporter.write_line(f"{test} CRASHED (the process died in it; resuming after it)", red=True)


def pytest_runtest_logstart(nodeid: str, location: tuple) -> None:
    if _journal() is not None:
        _write(f"{_START}{nodeid}\n")
        abort = os.environ.get("TORCH_TPU_TEST_ABORT")
        if abort and abort in nodeid:
            os.abort()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """A failure's text at once: the summary at the end of the run is lost if the process dies."""
    if _journal() is not None and report.failed:
        _write(f"{_FAILED}{report.nodeid} ({report.when})\n{report.longreprtext[-4000:]}\n")


def pytest_runtest_logfinish(nodeid: str, location: tuple) -> None:
    if _journal() is not None:
        _write(f"{_END}{nodeid}\n")


def failures(path: Path) -> str:
    """The failures' texts a journal holds (a dead process's report lost them)."""
    lines = path.read_text().splitlines() if path.exists() else []
    return "".join(f"{line}\n" for line in lines if not line.startswith((_START, _END)))


def main(argv: list[str]) -> None:
    path = Path(argv[0])
    if argv[1:] == ["--failures"]:
        sys.stdout.write(failures(path))
        return
    crashed = read(path)[1]
    if crashed:
        print(crashed[-1])


if __name__ == "__main__":
    main(sys.argv[1:])
