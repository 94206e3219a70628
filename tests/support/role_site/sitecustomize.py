"""Loaded at start-up by a service process that the tests run as its role's image holds it
(tests/support/role_images.py puts this folder first on PYTHONPATH): each top-level module named in
EMBEDFLEET_TEST_ABSENT is refused at import, as if it were not installed."""

import os
import sys
from importlib.abc import MetaPathFinder

ABSENT = frozenset(filter(None, os.environ.get("EMBEDFLEET_TEST_ABSENT", "").split(",")))


class Absent(MetaPathFinder):
    """Ahead of every other finder: a module of ``ABSENT`` (or one inside it) is not found."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] in ABSENT:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


if ABSENT:
    sys.meta_path.insert(0, Absent())
