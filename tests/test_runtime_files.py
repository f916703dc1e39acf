"""perdure.runtime.files: write-then-rename leaves the old file or the whole new one, and no temp file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from perdure.runtime.files import write_atomically, write_once


def test_replaces_the_file_and_leaves_no_temp_file(tmp_path: Path):
    path = tmp_path / "deep" / "state.json"
    write_atomically(path, b"old")
    write_atomically(path, b"new", mode=0o644)
    assert path.read_bytes() == b"new"
    assert path.stat().st_mode & 0o777 == 0o644
    assert os.listdir(path.parent) == ["state.json"]


def test_a_failed_write_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    path = tmp_path / "state.json"
    write_atomically(path, b"old")

    def crash(fd: int) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(OSError, match="disk full"):
        write_atomically(path, b"new")
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["state.json"]


def test_write_once_never_rewrites(tmp_path: Path):
    path = tmp_path / "sha256" / "ab" / "abcd"
    write_once(path, b"first")
    write_once(path, b"second")
    assert path.read_bytes() == b"first"
