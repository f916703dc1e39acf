"""The package's shape (issue 35): every folder setup.py maps into `perdure` exists and is a
package, and no module file name appears twice in it, so a name says which file it is."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def setup_roots() -> dict[str, str]:
    tree = ast.parse((ROOT / "setup.py").read_text())
    found = next(n for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "ROOTS")
    return ast.literal_eval(found.value)


def test_every_mapped_folder_is_a_package_under_perdure() -> None:
    roots = setup_roots()
    assert roots["perdure"] == "perdure"
    assert all(name == "perdure" or name.startswith("perdure.") for name in roots)
    for folder in roots.values():
        assert (ROOT / folder / "__init__.py").is_file(), folder


def test_no_module_file_name_appears_twice_in_the_package() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for folder in setup_roots().values():
        for path in (ROOT / folder).rglob("*.py"):
            if path.name != "__init__.py" and path.name != "__main__.py":
                where[path.name].append(path.relative_to(ROOT).as_posix())
    twice = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert not twice, twice
