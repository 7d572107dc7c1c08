"""pytest plugin: finish a GPU test run that a device call's time limit cut short.

    PYTEST_DONE=done.txt python -m pytest -p pytest_resume tests ...   (bench/ on PYTHONPATH)

Deselects every test whose node id is a line of ``$PYTEST_DONE`` (the ids a cut run's ``-v`` log
reported PASSED/FAILED/SKIPPED), so the next call runs only what is left. Works under xdist (each
worker loads the plugin). The two logs together are the suite's record: say so where it is quoted.
"""

from __future__ import annotations

import os


def pytest_collection_modifyitems(config, items):
    path = os.environ.get("PYTEST_DONE")
    if not path:
        return
    with open(path) as f:
        done = {line.strip() for line in f if line.strip()}
    skipped = [item for item in items if item.nodeid in done]
    if skipped:
        config.hook.pytest_deselected(items=skipped)
        items[:] = [item for item in items if item.nodeid not in done]
