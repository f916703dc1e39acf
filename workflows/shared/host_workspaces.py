"""Workspaces bound to a host: a goal's `workspace` written `HOST:NAME`, and what a host offers.

A host is a device (workflows/devices/) that `perdure worker --host NAME --workspaces DIR…`
runs beside its orchestrator: it announces the workspaces it holds (name -> its path there)
and runs the steps that touch one of them (file tools, commands, git, workspace versions, a
user tool declared `workspace=True`), while planning, model calls and remote effects run on
any worker. A goal whose workspace is `HOST:NAME` (or `HOST:/path/there`) is bound to that
host; any other workspace is an absolute path on the workers' machines, as always. Two
hosts that offer a workspace of the same name hold the same workspace (a clone of it): a
person may move a goal's steps from one to the other when the first is gone.

Pure, shared by workflows, activities, workers and starters.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import NamedTuple

from perdure.workflows.shared.tool_specs import DEVICE_NAME

WORKSPACE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
"""A workspace's name on a host: a directory's own name, or one given as NAME=DIR."""

WORKSPACE_MOVE = "*"
"""The key of GoalState.device_moves that holds the host a person moved the goal's workspace
steps to (a node's own key is its step name, which never is `*`)."""


class HostWorkspace(NamedTuple):
    """A goal's workspace on a host: the host's name, and the workspace's name there (or its path)."""

    host: str
    workspace: str

    def __str__(self) -> str:
        return f"{self.host}:{self.workspace}"


def host_workspace(workspace: str) -> HostWorkspace | None:
    """The host a goal's workspace names, or None for a path on the workers' machines (an
    absolute path never parses: it starts with `/`)."""
    host, sep, rest = workspace.partition(":")
    if not sep or not rest.strip() or not re.fullmatch(DEVICE_NAME, host):
        return None
    return HostWorkspace(host, rest.strip())


def find_workspace(offered: Mapping[str, str], wanted: str) -> tuple[str, str] | None:
    """(name, path) of the workspace `wanted` names among a host's `offered` (name -> path):
    by its name, or by its path there; None when the host does not hold it."""
    if wanted in offered:
        return wanted, offered[wanted]
    trimmed = wanted.rstrip("/") or "/"
    return next(((name, path) for name, path in offered.items() if path == trimmed), None)


def workspace_name(bound: HostWorkspace, first_offer: Mapping[str, str] | None) -> str:
    """The name of a goal's workspace, which every host holding it gives it: the spec may name it
    by its path on its first host (`first_offer`: that host's workspaces, when known)."""
    found = find_workspace(first_offer, bound.workspace) if first_offer else None
    return found[0] if found else bound.workspace


def describe_hosts(hosts: Mapping[str, Mapping[str, str]]) -> str:
    """`h1 (repo, docs), h2 (repo)`: hosts and the workspaces each offers, for a refusal."""
    return ", ".join(f"{name} ({', '.join(sorted(ws)) or 'no workspaces'})" for name, ws in sorted(hosts.items()))


def workspace_problem(wanted: HostWorkspace, hosts: Mapping[str, Mapping[str, str]]) -> str | None:
    """Why no host offers the workspace `wanted` (`hosts`: every host the registry knows, name ->
    its workspaces), or None when its host offers it."""
    offered = hosts.get(wanted.host)
    if offered is None:
        return f"no host named '{wanted.host}' (hosts: {describe_hosts(hosts) or 'none yet'})"
    if find_workspace(offered, wanted.workspace) is None:
        also = sorted(h for h, ws in hosts.items() if h != wanted.host and find_workspace(ws, wanted.workspace))
        elsewhere = f"; {', '.join(also)} {'offers' if len(also) == 1 else 'offer'} it" if also else ""
        holds = ", ".join(f"{n} ({p})" for n, p in sorted(offered.items())) or "none"
        return f"host {wanted.host} offers no workspace '{wanted.workspace}' (it offers: {holds}){elsewhere}"
    return None
