"""The endpoint checked before any load: reachable, OpenAI-compatible, serving the model, and which
optional request fields it accepts. Every problem here is bad input: one line, exit 2.

``GET /v1/models`` must answer a list whose ids include the model. Then a two-token request with
the optional fields (``ignore_eos`` and ``min_tokens`` for a fixed output length, ``stream_options``
for usage in a stream) is sent; a 400 or 422 is taken as a field the server refuses, and the
request is sent again without the fixed-output fields, then without ``stream_options``. What was
accepted is recorded (``fixed_output``, ``stream_options``): a server that refuses a fixed output
length gives answers of the length the model chooses, up to ``max_tokens``.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

from dlscale.errors import UsageError
from dlscale.serve.client import Endpoint, send

CHECK_TIMEOUT_S = 10.0


async def models(session: Any, base_url: str) -> list[str]:
    """The model ids the server lists; a UsageError when it cannot be reached or does not answer as OpenAI's API."""
    import aiohttp

    try:
        async with asyncio.timeout(CHECK_TIMEOUT_S):
            async with session.get(base_url + "/v1/models") as resp:
                status, body = resp.status, await resp.read()
    except TimeoutError:
        raise UsageError(f"{base_url} did not answer GET /v1/models within {CHECK_TIMEOUT_S:g} s") from None
    except aiohttp.ClientConnectorError as e:
        why = e.os_error.strerror or str(e.os_error) if e.os_error is not None else str(e)
        raise UsageError(f"cannot reach {base_url} ({why}); is the server running there?") from None
    except aiohttp.ClientError as e:
        raise UsageError(f"cannot reach {base_url} ({type(e).__name__}: {' '.join(str(e).split())[:200]}); "
                         "is the server running there?") from None
    try:
        doc = json.loads(body) if status == 200 else None
    except ValueError:
        doc = None
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        snippet = " ".join(body[:120].decode(errors="replace").split())
        raise UsageError(f"{base_url} is not an OpenAI-compatible server: GET /v1/models answered {status} "
                         f"{snippet!r}, not a list of models")
    return [str(m.get("id")) for m in data if isinstance(m, dict) and m.get("id") is not None]


async def check(session: Any, ep: Endpoint, timeout: float, want_fixed: bool) -> tuple[Endpoint, dict[str, Any]]:
    """The endpoint with the optional fields the server accepts, and what was found."""
    served = await models(session, ep.base_url)
    if ep.model not in served:
        raise UsageError(f"unknown model {ep.model!r}: {ep.base_url} serves {', '.join(served) or 'no model'}")
    tries = [replace(ep, fixed_output=want_fixed, extra={"stream_options": {"include_usage": True}})]
    if want_fixed:
        tries.append(replace(tries[0], fixed_output=False))
    tries.append(replace(ep, fixed_output=False, extra={}))
    refused = []
    for cand in tries:
        r = await send(session, cand, -1, "hello", 2, timeout)
        if r.ok:
            found = {"models": served, "fixed_output": cand.fixed_output, "stream_options": bool(cand.extra),
                     "refused": refused}
            return cand, found
        if r.error not in ("http_400", "http_422"):
            raise UsageError(f"{ep.base_url}{ep.path} failed a two-token request ({r.error}: {r.detail}); "
                             "is it an OpenAI-compatible server?")
        refused.append(r.detail)
    raise UsageError(f"{ep.base_url}{ep.path} refused a two-token request for {ep.model!r}: {refused[-1]}")
