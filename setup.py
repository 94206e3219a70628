"""The one thing pyproject.toml cannot say: the import name ``embedfleet`` over the user's top-level folders.

``embedfleet.shared`` is ``shared/`` and ``embedfleet.services`` is ``services/`` (package-dir), so a wheel, an
editable install and every tool see one module per file; nothing installs a top-level ``shared`` or
``services``. The metadata is pyproject.toml's.
"""

from setuptools import find_packages, setup

ROOTS = {"embedfleet.shared": "shared", "embedfleet.services": "services"}

setup(
    package_dir={"embedfleet": "embedfleet", **ROOTS},
    packages=["embedfleet"]
    + [
        f"embedfleet.{package}"
        for package in find_packages(include=[f"{folder}{tail}" for folder in ROOTS.values() for tail in ("", ".*")])
    ],
)
