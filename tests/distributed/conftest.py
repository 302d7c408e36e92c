import os
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # launch.py, workers.py

import launch


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "shared_launch: reads a shared launch (launch.shared); runs last")


@pytest.hookimpl(trylast=True)  # after `-k`/`-m` deselect: only what runs
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests that read a shared launch go last, and the launches begin now, in the background, while the
    others run. Not in a pytest-xdist worker: every worker collects every test, so each would launch them all."""
    sizes = {item: launch.shared_world_size(item) for item in items}
    items.sort(key=lambda item: sizes[item] is not None)  # stable: each part keeps its order
    if "PYTEST_XDIST_WORKER" not in os.environ:
        launch.start_shared_launches(set(sizes.values()) - {None})


def pytest_sessionfinish(session: pytest.Session) -> None:
    launch.stop_shared_launches()
