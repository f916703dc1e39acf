"""Activities share HTTP clients per event loop instead of building one per call."""

from __future__ import annotations

import asyncio

from perdure.activities.client_pool import http_client, pooled


async def test_one_client_per_purpose_in_a_loop():
    assert http_client(30, follow_redirects=False) is http_client(30, follow_redirects=False)
    assert http_client(30, follow_redirects=False) is not http_client(30, follow_redirects=True)
    made = []
    assert pooled(("x",), lambda: made.append(1) or object()) is pooled(("x",), lambda: made.append(1) or object())
    assert made == [1]


def test_a_new_loop_gets_its_own_client():
    async def get():
        return http_client(30, follow_redirects=False)

    first, second = asyncio.run(get()), asyncio.run(get())
    assert first is not second  # a client belongs to the loop that made it
