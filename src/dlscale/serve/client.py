"""One request to an OpenAI-compatible server and every arrival it brings, on an aiohttp session.

``/v1/completions`` (``prompt``) or ``/v1/chat/completions`` (one user message), streamed as
server-sent events or not. The clock is ``time.perf_counter``: ``sent`` just before the request is
written, one timestamp per event that carries generated text (``times``; the first is the first
token), ``end`` when the stream closes (or the whole body arrives). Token counts come from the
server's ``usage`` where it sends one, else from the local tokenizer on the text received, else
from the number of text events; each result says which (``count_source``).

A failure is a result, not an exception: ``error`` names its kind (``connect``, ``timeout``,
``http_<status>``, ``dropped_stream``, ``malformed_event``, ``error_event``) and ``detail`` says
more in one line. Every request runs under the run's timeout, connection to last byte.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

KINDS = ("connect", "timeout", "dropped_stream", "malformed_event", "error_event")


@dataclass
class Endpoint:
    """Where and how requests go; the API key is read from ``key_env`` at each session, never kept."""

    base_url: str
    model: str
    api: str = "completions"
    stream: bool = True
    key_env: str = "OPENAI_API_KEY"
    extra: dict[str, Any] = field(default_factory=dict)  # accepted optional fields (stream_options)
    fixed_output: bool = False  # the server accepted ignore_eos/min_tokens

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.api == "chat" else "/v1/completions"

    def headers(self) -> dict[str, str]:
        key = os.environ.get(self.key_env) if self.key_env else None
        return {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}

    def payload(self, prompt: str, output_len: int) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "max_tokens": output_len, "stream": self.stream}
        if self.api == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        if self.fixed_output:
            body.update(ignore_eos=True, min_tokens=output_len)
        if self.stream:
            body.update(self.extra)
        return body


@dataclass
class Result:
    index: int
    sent: float = 0.0
    times: list[float] = field(default_factory=list)  # arrivals of the events carrying text
    end: float | None = None
    error: str | None = None
    detail: str | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    count_source: str | None = None
    scheduled: float | None = None  # when the load generator meant to send it
    arrival: float | None = None  # at a rate with a cap in flight: its arrival, before it waited for a slot
    text: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def first(self) -> float | None:
        return self.times[0] if self.times else None


def text_of(event: dict[str, Any], chat: bool) -> str | None:
    """The generated text an event (or a whole non-streamed response) carries; None when it has no choice."""
    choices = event.get("choices")
    if not isinstance(choices, list) or not choices:
        return None
    c = choices[0] if isinstance(choices[0], dict) else {}
    if not chat:
        return c.get("text") or ""
    part = c.get("delta") or c.get("message") or {}
    return (part.get("content") or part.get("reasoning_content") or part.get("reasoning") or "") if isinstance(part, dict) else ""


def finished(event: dict[str, Any]) -> bool:
    choices = event.get("choices")
    return bool(isinstance(choices, list) and choices and isinstance(choices[0], dict) and choices[0].get("finish_reason"))


async def send(session: Any, ep: Endpoint, index: int, prompt: str, output_len: int, timeout: float,
               counter: Any = None, on_first: Any = None) -> Result:
    """Send one request; the result with its timestamps, or the kind of failure it met. ``on_first()`` is
    called as the first token arrives (MLPerf LoadGen's first-token completion)."""
    import aiohttp

    r = Result(index=index)
    try:
        async with asyncio.timeout(timeout):
            r.sent = time.perf_counter()
            async with session.post(ep.base_url + ep.path, json=ep.payload(prompt, output_len),
                                    headers=ep.headers()) as resp:
                if resp.status != 200:
                    body = (await resp.text())[:200]
                    return _fail(r, f"http_{resp.status}", " ".join(body.split()))
                if ep.stream:
                    await _read_stream(resp, r, ep.api == "chat", on_first)
                else:
                    await _read_whole(resp, r, ep.api == "chat")
    except TimeoutError:
        _fail(r, "timeout", f"no complete answer within {timeout:g} s")
    except aiohttp.ClientConnectorError as e:
        _fail(r, "connect", str(e))
    except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
        _fail(r, "dropped_stream", f"{type(e).__name__}: {e}")
    if r.ok:
        _count(r, counter)
    return r


def _fail(r: Result, kind: str, detail: str) -> Result:
    r.error, r.detail, r.end = kind, detail[:300], time.perf_counter()
    return r


async def _read_stream(resp: Any, r: Result, chat: bool, on_first: Any = None) -> None:
    done = False
    async for raw in resp.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue  # comments, event names, ids, blank separators
        data = line[5:].strip()
        if data == b"[DONE]":
            done = True
            break
        now = time.perf_counter()
        try:
            event = json.loads(data)
        except ValueError:
            _fail(r, "malformed_event", f"not JSON: {data[:80]!r}")
            return
        if not isinstance(event, dict):
            _fail(r, "malformed_event", f"not a JSON object: {data[:80]!r}")
            return
        if "error" in event:
            _fail(r, "error_event", json.dumps(event["error"])[:200])
            return
        _usage(r, event)
        text = text_of(event, chat)
        if text is None and "usage" not in event:
            _fail(r, "malformed_event", f"an event with no choices: {data[:80]!r}")
            return
        if text:
            r.times.append(now)
            r.text.append(text)
            if on_first is not None and len(r.times) == 1:
                on_first()
        done = done or finished(event)
    r.end = time.perf_counter()
    if not done:
        _fail(r, "dropped_stream", f"the stream closed before its end (no finish_reason, no [DONE]) after "
                                   f"{len(r.times)} text events")


async def _read_whole(resp: Any, r: Result, chat: bool) -> None:
    body = await resp.read()
    r.end = time.perf_counter()
    try:
        doc = json.loads(body)
    except ValueError:
        _fail(r, "malformed_event", f"the response is not JSON: {body[:80]!r}")
        return
    text = text_of(doc, chat) if isinstance(doc, dict) else None
    if text is None:
        _fail(r, "malformed_event", f"a response with no choices: {body[:80]!r}")
        return
    _usage(r, doc)
    if text:
        r.times.append(r.end)
        r.text.append(text)


def _usage(r: Result, event: dict[str, Any]) -> None:
    u = event.get("usage")
    if isinstance(u, dict) and isinstance(u.get("completion_tokens"), int):
        r.output_tokens = u["completion_tokens"]
        r.prompt_tokens = u.get("prompt_tokens") if isinstance(u.get("prompt_tokens"), int) else r.prompt_tokens
        r.count_source = "usage"


def _count(r: Result, counter: Any) -> None:
    """Output tokens where the server sent no usage: the local tokenizer on the text, else the text events."""
    if r.count_source == "usage":
        return
    if counter is not None:
        r.output_tokens, r.count_source = counter.count("".join(r.text)), "tokenizer"
    else:
        r.output_tokens, r.count_source = len(r.times), "chunks"
