"""HTTP clients kept for the life of the worker's event loop.

Building an HTTP client loads an SSL context (35-60 ms here) and a new client
opens new connections, so a call that builds its own pays that every time: more
than a local step costs in total. Activities share one client per purpose and
event loop instead; clients belong to the loop that made them, and the pool
forgets a loop when it is garbage-collected. Nothing here closes a client: they
live as long as the worker.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import httpx

T = TypeVar("T")

_POOL: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple, Any]] = weakref.WeakKeyDictionary()


def pooled(ident: tuple, make: Callable[[], T]) -> T:
    """The client for `ident` in the running loop, made on first use."""
    clients = _POOL.setdefault(asyncio.get_running_loop(), {})
    if ident not in clients:
        clients[ident] = make()
    return clients[ident]


def http_client(timeout_s: float, follow_redirects: bool) -> httpx.AsyncClient:
    return pooled(
        ("httpx", timeout_s, follow_redirects),
        lambda: httpx.AsyncClient(timeout=timeout_s, follow_redirects=follow_redirects),
    )
