"""How the repository's folders install as the one `perdure` package.

Each top-level folder X/ below is the package `perdure.X` (its sub-packages are found, never
listed); `perdure/` holds the public API. Nothing else is installed: tests/, bench/ and docs/
stay in the checkout. Metadata, dependencies and package data are in pyproject.toml.
"""

from setuptools import find_packages, setup

ROOTS = {
    "perdure": "perdure",
    "perdure.workflows": "workflows",
    "perdure.activities": "activities",
    "perdure.workers": "workers",
    "perdure.starters": "starters",
    "perdure.runtime": "runtime",
    "perdure.memory": "memory",
    "perdure.testing": "testing",
    # No code: the dev server's dynamic config, shipped for `perdure server start` from a wheel.
    "perdure.temporal_dev": "temporal-dev",
}

packages: list[str] = []
for name, folder in ROOTS.items():
    packages += [name, *(f"{name}.{sub}" for sub in find_packages(folder))]

setup(packages=packages, package_dir=ROOTS)
