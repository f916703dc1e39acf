"""A host's settings and a goal's host workspace, as plain functions: `HOST:NAME` read from a
goal's workspace, a workspace found on a host by its name or path, why no host offers one, and
`perdure worker --host NAME --workspaces DIR…` (or config.toml's `[host]`) checked."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

import perdure
from perdure.activities.tools.user.toolbox import Toolbox
from perdure.workers.host import HostConfigError, HostSettings, host_config, host_settings, parse_workspaces
from perdure.workflows.devices.device_contracts import DEVICE_TOOLS
from perdure.workflows.shared.host_workspaces import (
    HostWorkspace,
    find_workspace,
    host_workspace,
    workspace_name,
    workspace_problem,
)

HOSTS = {"h1": {"repo": "/srv/repo", "docs": "/srv/docs"}, "h2": {"repo": "/data/repo"}}


@pytest.mark.parametrize(
    ("workspace", "bound"),
    [
        ("h1:repo", HostWorkspace("h1", "repo")),
        ("h1:/srv/repo", HostWorkspace("h1", "/srv/repo")),
        ("build-2:my.repo", HostWorkspace("build-2", "my.repo")),
        ("/home/me/proj", None),  # an absolute path: the workers' machines, as always
        ("/srv/a:b", None),
        ("H1:repo", None),
        ("h1:", None),
        ("h1: ", None),
    ],
)
def test_a_goals_workspace_names_a_host_only_as_host_colon_workspace(workspace, bound):
    assert host_workspace(workspace) == bound


def test_a_workspace_is_found_on_a_host_by_its_name_or_its_path_there():
    assert find_workspace(HOSTS["h1"], "repo") == ("repo", "/srv/repo")
    assert find_workspace(HOSTS["h1"], "/srv/docs/") == ("docs", "/srv/docs")
    assert find_workspace(HOSTS["h2"], "docs") is None
    # Named by its path on its first host, the workspace is known by its name on the others.
    assert workspace_name(HostWorkspace("h1", "/srv/repo"), HOSTS["h1"]) == "repo"
    assert workspace_name(HostWorkspace("h1", "/srv/repo"), None) == "/srv/repo"


def test_why_no_host_offers_a_workspace_names_the_hosts_and_what_they_hold():
    assert workspace_problem(HostWorkspace("h1", "repo"), HOSTS) is None
    assert workspace_problem(HostWorkspace("ghost", "repo"), HOSTS) == (
        "no host named 'ghost' (hosts: h1 (docs, repo), h2 (repo))"
    )
    assert workspace_problem(HostWorkspace("h2", "docs"), HOSTS) == (
        "host h2 offers no workspace 'docs' (it offers: repo (/data/repo)); h1 offers it"
    )
    assert workspace_problem(HostWorkspace("h1", "x"), {}) == "no host named 'h1' (hosts: none yet)"


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("PERDURE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PERDURE_CONFIG", str(tmp_path / "config.toml"))
    return tmp_path / "home"


def test_workspaces_are_named_by_their_directory_or_as_given_and_each_is_given_once(tmp_path, home):
    (tmp_path / "repo").mkdir()
    (tmp_path / "site").mkdir()
    held = parse_workspaces([f"{tmp_path / 'repo'},web={tmp_path / 'site'}"])
    assert held == {"repo": (tmp_path / "repo").resolve(), "web": (tmp_path / "site").resolve()}
    (tmp_path / "other" / "repo").mkdir(parents=True)
    home.mkdir()
    (home / "inside").mkdir()
    for items, said in (
        ([str(tmp_path / "repo"), str(tmp_path / "other" / "repo")], "two workspaces are named 'repo'"),
        ([str(tmp_path / "repo"), f"again={tmp_path / 'repo'}"], "is given twice"),
        ([str(tmp_path / "missing")], "does not exist"),
        ([f"bad name={tmp_path / 'repo'}"], "workspace name 'bad name' is not allowed"),
        ([str(home / "inside")], "lies in PERDURE_HOME"),
        ([], "--host needs --workspaces DIR"),
    ):
        with pytest.raises(HostConfigError, match=said):
            parse_workspaces(items)


def test_config_toml_names_the_host_and_the_command_line_wins(tmp_path, home):
    (tmp_path / "repo").mkdir()
    (tmp_path / "docs").mkdir()
    config = tmp_path / "config.toml"
    assert host_settings(None, None, None) is None  # no config file, no option: not a host
    config.write_text(f'[host]\nname = "h1"\nworkspaces = ["{tmp_path / "repo"}"]\nlease_s = 4\n')
    assert host_settings(None, None, None) == HostSettings("h1", {"repo": (tmp_path / "repo").resolve()}, 4.0)
    assert host_settings("h2", [str(tmp_path / "docs")], 3) == HostSettings(
        "h2", {"docs": (tmp_path / "docs").resolve()}, 3.0
    )
    config.write_text('[host]\nname = "h1"\nroots = ["/x"]\n')
    with pytest.raises(HostConfigError, match=r"\[host\] has unknown keys roots"):
        host_settings(None, None, None)
    config.unlink()
    with pytest.raises(HostConfigError, match="out of range"):
        host_settings("h1", [str(tmp_path / "repo")], 0.5)
    with pytest.raises(HostConfigError, match="--workspaces needs --host NAME"):
        host_settings(None, [str(tmp_path / "repo")], None)


class Lines(BaseModel):
    path: str


@perdure.tool(workspace=True)
def count_lines(args: Lines, call: perdure.ToolCall) -> str:
    """Count a file's lines in the workspace."""
    return str(len((call.workspace / args.path).read_text().splitlines()))


@perdure.tool(network=True)
def look_up(args: Lines) -> str:
    """Look something up (no workspace: runs on any worker)."""
    return args.path


def test_a_host_offers_the_device_tools_and_the_users_workspace_tools_and_asks_no_one(tmp_path, home):
    (tmp_path / "repo").mkdir()
    toolbox = Toolbox([count_lines, look_up], ["tests.test_host_settings"])
    config = host_config(HostSettings("h1", {"repo": (tmp_path / "repo").resolve()}), toolbox)
    assert config.tools == frozenset(DEVICE_TOOLS) | {"count_lines"}
    assert set(config.user_tools.declarations) == {"count_lines"}
    assert config.approval == {"*": "never"} and config.network
    assert config.scratch == home.resolve() / "hosts" / "h1" and config.scratch.is_dir()
    assert config.workspaces == {"repo": (tmp_path / "repo").resolve()}
