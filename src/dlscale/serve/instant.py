"""An instant OpenAI-compatible server on loopback, in a thread of this process, and the client's
overhead measured against it.

The server answers ``/v1/completions`` and ``/v1/chat/completions`` at once: every event of a
streamed answer is written as soon as the request is read, so a TTFT measured against it is what
the client, the loopback and this small server cost together, an upper bound of the client's own
overhead on the TTFT of a real server (docs/PERFORMANCE.md, "Serving client overhead"). ``handler``
lets a test replace the answer (faults) while keeping the rest.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable
from typing import Any

Handler = Callable[[Any, dict[str, Any]], Awaitable[Any]]


def event(data: Any) -> bytes:
    return b"data: " + (data if isinstance(data, bytes) else json.dumps(data).encode()) + b"\n\n"


def chunk(text: str, chat: bool, finish: str | None = None, usage: dict[str, int] | None = None) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
    choice.update({"delta": {"content": text}} if chat else {"text": text})
    return {"object": "chat.completion.chunk" if chat else "text_completion", "choices": [choice],
            **({"usage": usage} if usage else {})}


async def instant_answer(request: Any, body: dict[str, Any]) -> Any:
    """The instant answer: ``max_tokens`` tokens ("t0 t1 ..."), streamed or whole, with usage."""
    from aiohttp import web

    chat = request.path.endswith("/chat/completions")
    n = int(body.get("max_tokens") or 16)
    usage = {"prompt_tokens": len(str(body.get("prompt") or body.get("messages") or "").split()),
             "completion_tokens": n}
    usage["total_tokens"] = usage["prompt_tokens"] + n
    if not body.get("stream"):
        text = " ".join(f"t{i}" for i in range(n))
        doc = {"choices": [{"index": 0, "finish_reason": "length",
                            **({"message": {"role": "assistant", "content": text}} if chat else {"text": text})}],
               "usage": usage}
        return web.json_response(doc)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for i in range(n):
        await resp.write(event(chunk(f" t{i}", chat)))
    await resp.write(event(chunk("", chat, "length", usage)))
    await resp.write(b"data: [DONE]\n\n")
    return resp


class InstantServer:
    """``with InstantServer() as s: s.url`` — an OpenAI-compatible server on 127.0.0.1, in its own thread."""

    def __init__(self, model: str = "instant", handler: Handler | None = None, port: int = 0):
        self.model, self.handler, self.port = model, handler or instant_answer, port
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="dlscale-instant-server", daemon=True)
        self._runner: Any = None

    def _app(self) -> Any:
        from aiohttp import web

        async def models(_request: Any) -> Any:
            return web.json_response({"object": "list", "data": [{"id": self.model, "object": "model"}]})

        async def complete(request: Any) -> Any:
            body = await request.json()
            if body.get("model") != self.model:
                return web.json_response({"error": {"message": f"model {body.get('model')!r} not found"}}, status=404)
            return await self.handler(request, body)

        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/completions", complete)
        app.router.add_post("/v1/chat/completions", complete)
        return app

    def _serve(self) -> None:
        from aiohttp import web

        asyncio.set_event_loop(self._loop)
        self._runner = web.AppRunner(self._app(), access_log=None, shutdown_timeout=1.0)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        self._loop.run_until_complete(site.start())
        port = site._server.sockets[0].getsockname()[1]  # noqa: SLF001 - aiohttp keeps the bound socket there
        self.url = f"http://127.0.0.1:{port}"
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup())
        self._loop.close()

    def __enter__(self) -> "InstantServer":
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the instant server did not start within 30 s")
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(self._loop.stop)
        except RuntimeError:  # stopped and closed already (a test that kills the server mid-run)
            pass
        self._thread.join(timeout=30)


async def calibrate(ep_like: Any, tokens: int, concurrency: int, n: int = 30) -> dict[str, Any]:
    """The client's TTFT and ITL against the instant server: at concurrency 1, and at ``concurrency``."""
    from dataclasses import replace

    from dlscale.serve.figures import point_figures
    from dlscale.serve.load import at_concurrency, session
    from dlscale.serve.workload import Request

    reqs = [Request("calibration prompt", max(1, tokens), 2)]
    out: dict[str, Any] = {"tokens": max(1, tokens), "requests": n}
    with InstantServer() as srv:
        ep = replace(ep_like, base_url=srv.url, model=srv.model, key_env="", fixed_output=False)
        async with session() as s:
            for name, c in (("one", 1), ("loaded", max(1, concurrency))):
                pt = await at_concurrency(s, ep, reqs, c, n=max(n, 2 * c), duration=60.0, timeout=30.0)
                f = point_figures(pt.results)
                out[name] = {"concurrency": c, "ttft_median_s": f["ttft_median_s"], "ttft_p99_s": f["ttft_p99_s"],
                             "itl_median_s": f["itl_median_s"], "failed": f["failed"]}
    return out
