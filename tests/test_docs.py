"""The documentation stays true of the code: the README is a front door whose links resolve,
every PERDURE_* variable the code reads is in the environment reference, and every
repository path the docs name exists. (`make docs` checks the site's own links, strictly.)"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
ENV_REFERENCE = DOCS / "reference" / "configuration.md"
# The folders that install as perdure.X (setup.py), and the files beside them that run perdure.
PACKAGE_FOLDERS = ["perdure", "workflows", "activities", "workers", "starters", "runtime", "memory", "testing"]
RUN_FILES = ["Makefile", "docker-compose.yml", "Dockerfile"]
VARIABLE = re.compile(r"\bPERDURE_[A-Z0-9_]*[A-Z0-9]\b")
REPO_PATH = re.compile(
    r"`((?:perdure|workflows|activities|workers|starters|runtime|memory|testing|tests|bench|temporal-dev|docs)"
    r"/(?:[\w./-]*\.(?:py|yaml|yml|json|toml|md|png|txt|gz)|[\w./-]*/)?)`"
)


def variables_read() -> dict[str, Path]:
    found: dict[str, Path] = {}
    sources = [p for folder in PACKAGE_FOLDERS for p in (ROOT / folder).rglob("*.py")]
    for path in [*sources, *(ROOT / name for name in RUN_FILES)]:
        for name in VARIABLE.findall(path.read_text()):
            found.setdefault(name, path.relative_to(ROOT))
    return found


def test_the_environment_reference_lists_every_perdure_variable_the_code_reads():
    page = ENV_REFERENCE.read_text()
    listed = set(re.findall(r"^\| `(PERDURE_\w+)`(?:, `(PERDURE_\w+)`)?", page, flags=re.MULTILINE))
    listed_names = {name for row in listed for name in row if name}
    found = variables_read()
    assert len(found) > 25, "the scan found too few variables: did the package folders move?"
    # A name used as a prefix (the fake services' env_prefix "PERDURE_MAIL") stands for the
    # variables listed under it (PERDURE_MAIL_URL, PERDURE_MAIL_KEY, ...).
    missing = {
        name: str(where)
        for name, where in found.items()
        if name not in listed_names and not any(n.startswith(name + "_") for n in listed_names)
    }
    assert not missing, f"read by the code but not in {ENV_REFERENCE.relative_to(ROOT)}: {missing}"


def test_the_readme_is_a_front_door_whose_links_resolve():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 400
    targets = re.findall(r"\]\(([^)\s]+)\)", readme)
    local = [t.split("#")[0] for t in targets if not re.match(r"[a-z]+:", t) and not t.startswith("#")]
    assert len(local) > 20  # it points into the docs
    broken = [t for t in local if not (ROOT / t).exists()]
    assert not broken, f"README.md links to files that do not exist: {broken}"
    for section in ("## Two commands", "## A five-minute tour", "## Layout", "## Where to go next"):
        assert section in readme


def test_every_repository_path_the_docs_name_exists():
    pages = [ROOT / "README.md", ROOT / "CHANGELOG.md", *DOCS.rglob("*.md")]
    # A file (by its extension) or a folder (a trailing /): not a key such as `perdure/effect_key`.
    named = {(page.relative_to(ROOT), path) for page in pages for path in REPO_PATH.findall(page.read_text())}
    assert len(named) > 40
    missing = sorted(f"{page}: {path}" for page, path in named if not (ROOT / path).exists())
    assert not missing, "the docs name paths that do not exist:\n" + "\n".join(missing)


def test_every_page_is_in_the_site_s_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    # Generated at build time (docs/hooks/gen_reference.py), so not a file here, but in the nav.
    assert "reference/plan-schema.md" in nav
    assert {p for p in pages if f": {p}" not in nav} == set()
