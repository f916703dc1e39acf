"""Workspace confinement: traversal, absolute paths, symlinks in and out, odd inputs."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perdure.activities.tools.workspace import WorkspaceEscape, WorkspaceMissing, resolve_in_workspace, workspace_root


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "file.txt").write_text("hi")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    return root


def test_plain_relative_paths_resolve_inside(ws: Path) -> None:
    assert resolve_in_workspace(ws, "sub/file.txt", must_exist=True) == ws.resolve() / "sub" / "file.txt"
    assert resolve_in_workspace(ws, "./sub//file.txt") == ws.resolve() / "sub" / "file.txt"
    assert resolve_in_workspace(ws, ".") == ws.resolve()


@pytest.mark.parametrize("path", ["../x", "a/../../x", "sub/..", "sub/../file.txt"])
def test_dotdot_is_rejected(ws: Path, path: str) -> None:
    with pytest.raises(WorkspaceEscape, match=r"contains '\.\.'"):
        resolve_in_workspace(ws, path)


def test_absolute_path_is_rejected_with_a_clear_message(ws: Path) -> None:
    with pytest.raises(WorkspaceEscape) as err:
        resolve_in_workspace(ws, "/etc/passwd")
    assert str(err.value) == "'/etc/passwd' is absolute; paths are relative to the workspace"


@pytest.mark.parametrize("path", ["", "   "])
def test_empty_path_is_rejected(ws: Path, path: str) -> None:
    with pytest.raises(WorkspaceEscape, match="path is empty"):
        resolve_in_workspace(ws, path)


def test_nul_byte_is_rejected(ws: Path) -> None:
    with pytest.raises(WorkspaceEscape, match="NUL byte"):
        resolve_in_workspace(ws, "sub/file.txt\x00.png")


def test_symlinked_directory_pointing_outside_is_rejected(ws: Path) -> None:
    outside = (ws.parent / "outside").resolve()
    (ws / "link").symlink_to(outside, target_is_directory=True)
    with pytest.raises(WorkspaceEscape) as err:
        resolve_in_workspace(ws, "link/secret.txt")
    assert str(err.value) == (
        f"'link/secret.txt' resolves to '{outside / 'secret.txt'}' outside the workspace (via a symlink)"
    )
    # A file that does not exist yet behind the same link is just as much outside.
    with pytest.raises(WorkspaceEscape, match="outside the workspace"):
        resolve_in_workspace(ws, "link/new/deeper.txt")


def test_symlinked_final_file_pointing_outside_is_rejected(ws: Path) -> None:
    (ws / "innocent.txt").symlink_to(ws.parent / "outside" / "secret.txt")
    with pytest.raises(WorkspaceEscape, match="outside the workspace"):
        resolve_in_workspace(ws, "innocent.txt")


def test_dangling_symlink_pointing_outside_is_rejected(ws: Path) -> None:
    # Writing through it would create a file outside the workspace.
    (ws / "drop.txt").symlink_to(ws.parent / "outside" / "not-yet.txt")
    with pytest.raises(WorkspaceEscape, match="outside the workspace"):
        resolve_in_workspace(ws, "drop.txt")


def test_symlink_that_stays_inside_is_allowed(ws: Path) -> None:
    (ws / "alias").symlink_to(ws / "sub", target_is_directory=True)
    (ws / "relative-alias").symlink_to("sub", target_is_directory=True)
    assert resolve_in_workspace(ws, "alias/file.txt", must_exist=True) == ws.resolve() / "sub" / "file.txt"
    assert resolve_in_workspace(ws, "relative-alias/file.txt") == ws.resolve() / "sub" / "file.txt"


def test_symlink_loop_is_rejected(ws: Path) -> None:
    (ws / "loop").symlink_to(ws / "loop")
    with pytest.raises(WorkspaceEscape, match="cannot be resolved"):
        resolve_in_workspace(ws, "loop/x")


def test_new_file_in_existing_subdir_is_allowed(ws: Path) -> None:
    assert resolve_in_workspace(ws, "sub/new.txt") == ws.resolve() / "sub" / "new.txt"
    assert resolve_in_workspace(ws, "sub/deeper/new.txt") == ws.resolve() / "sub" / "deeper" / "new.txt"


def test_must_exist(ws: Path) -> None:
    with pytest.raises(FileNotFoundError, match="'sub/nope.txt' does not exist"):
        resolve_in_workspace(ws, "sub/nope.txt", must_exist=True)


def test_workspace_root_reached_through_a_symlink_is_fine(ws: Path) -> None:
    alias = ws.parent / "ws-alias"
    alias.symlink_to(ws, target_is_directory=True)
    assert resolve_in_workspace(alias, "sub/file.txt") == ws.resolve() / "sub" / "file.txt"


def test_missing_or_non_directory_workspace(ws: Path) -> None:
    with pytest.raises(WorkspaceMissing, match="does not exist"):
        workspace_root(ws / "nope")
    with pytest.raises(WorkspaceMissing, match="is not a directory"):
        workspace_root(ws / "sub" / "file.txt")
    with pytest.raises(WorkspaceMissing, match="does not exist"):
        resolve_in_workspace(ws / "nope", "a.txt")


# --- property: whatever the path, either refused or inside ---------------------

SEGMENTS = ["a", "b", "sub", ".", "..", "", "out", "in", "loop"]


@pytest.fixture(scope="module")
def maze(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace with a link out, a link that stays in and a loop, shared by every example."""
    base = tmp_path_factory.mktemp("maze")
    root = base / "ws"
    (root / "a" / "b").mkdir(parents=True)
    (root / "sub").mkdir()
    (base / "elsewhere").mkdir()
    (root / "out").symlink_to(base / "elsewhere", target_is_directory=True)
    (root / "a" / "out").symlink_to(base / "elsewhere", target_is_directory=True)
    (root / "in").symlink_to("a", target_is_directory=True)
    (root / "loop").symlink_to(root / "loop")
    return root


def _walk(root: Path, parts: tuple[str, ...]) -> Path | None:
    """An independent oracle: follow the path by hand with readlink. None for a symlink loop."""
    pending = list(parts)
    current = root
    hops = 0
    while pending:
        part = pending.pop(0)
        if part == "/":
            current = Path("/")
        elif part == "..":
            current = current.parent
        elif part not in ("", "."):
            step = current / part
            if step.is_symlink():
                hops += 1
                if hops > 40:
                    return None
                pending = list(PurePosixPath(os.readlink(step)).parts) + pending
            else:
                current = step
    return current


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=7))
def test_any_path_is_refused_or_inside(maze: Path, segments: list[str]) -> None:
    relative = "/".join(segments)
    parts = PurePosixPath(relative).parts
    root = maze.resolve()
    walked = None if relative.startswith("/") or ".." in parts else _walk(root, parts)
    should_refuse = not relative.strip() or walked is None or not walked.is_relative_to(root)
    try:
        resolved = resolve_in_workspace(maze, relative)
    except WorkspaceEscape:
        assert should_refuse, f"{relative!r} was refused although it stays inside"
        return
    assert resolved.is_relative_to(root)
    assert not should_refuse, f"{relative!r} was accepted although it leaves the workspace"
    assert resolved == walked


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "sub", ".", "in", "new"]), min_size=1, max_size=6))
def test_paths_without_a_way_out_are_accepted(maze: Path, segments: list[str]) -> None:
    resolved = resolve_in_workspace(maze, "/".join(segments))
    assert resolved.is_relative_to(maze.resolve())
