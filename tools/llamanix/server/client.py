"""The one HTTP client for a llama-server: bench, the switch gate, smoke, doctor, readiness, the
test bed's server process and the demo all talk to a server through it.

It knows the endpoints (``/health``, ``/props``, ``/metrics``, ``/v1/chat/completions`` and
``/completion``, each streamed or not) and the API key (a ``Bearer`` header built from a key
file), each done one way. What a caller makes of an answer (a failed check, a refusal, a
retry) stays with the caller, so the methods return responses or parsed data and raise
``httpx`` errors as they are.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from types import TracebackType
from urllib.parse import urlparse

import httpx

from llamanix.core.errors import Problem, UserError
from llamanix.core.json_value import JsonObject
from llamanix.server.metrics import MetricsSnapshot, parse_metrics

# Long generations at agent context on a slow card take minutes; the connect limit stays short.
REQUEST_TIMEOUT_S = 600.0
CONNECT_TIMEOUT_S = 10.0
POLL_S = 0.25
CHAT = "/v1/chat/completions"
COMPLETION = "/completion"


def check_url(url: str, command: str, argument: str) -> None:
    """One line naming ``command``'s ``argument`` when ``url`` is not an http(s) URL."""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise UserError(
            Problem(
                command,
                argument,
                f"{url!r} is not an http(s) URL",
                "write e.g. http://127.0.0.1:8080",
            )
        )


def error_message(text: str) -> str:
    """What a refused request says: llama-server's ``{"error": {"message": ...}}``, else the
    body itself (cut to 300 characters: an HTML error page says nothing more after that)."""
    try:
        return str(json.loads(text)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return text.strip()[:300]


class NotServing(Exception):
    """The server did not become healthy in time (or stopped first); one line says why."""


class LlamaClient:
    """A connection pool to one llama-server at ``url``, with its API key if it has one."""

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = REQUEST_TIMEOUT_S,
        connect_s: float = CONNECT_TIMEOUT_S,
        max_connections: int = 8,
        model: str | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        # Behind a router (llama-server's router mode, llama-swap) a GET names its model in the
        # query; a plain llama-server ignores the parameter.
        self._model_query = {"model": model} if model else None
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(
            timeout=httpx.Timeout(timeout_s, connect=connect_s),
            limits=httpx.Limits(max_connections=max_connections),
            headers=headers,
        )

    def __enter__(self) -> LlamaClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # --- endpoints ------------------------------------------------------------------------

    def health(self) -> httpx.Response:
        return self._http.get(self.url + "/health")

    def props(self) -> httpx.Response:
        return self._http.get(self.url + "/props", params=self._model_query)

    def metrics_response(self) -> httpx.Response:
        return self._http.get(self.url + "/metrics", params=self._model_query)

    def models(self) -> list[Mapping[str, object]]:
        """GET /models: a router lists each model with its status; a plain server its one."""
        resp = self._http.get(self.url + "/models")
        resp.raise_for_status()
        data = resp.json()
        entries = data.get("data") if isinstance(data, dict) else None
        return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []

    def chat(self, body: JsonObject) -> httpx.Response:
        """One chat completion, not streamed."""
        return self._http.post(self.url + CHAT, json=body)

    @contextmanager
    def stream_chat(self, body: JsonObject) -> Iterator[httpx.Response]:
        """One streamed chat completion (server-sent events); read it inside the ``with``."""
        with self._http.stream("POST", self.url + CHAT, json={**body, "stream": True}) as resp:
            yield resp

    def complete(self, prompt: str, n_predict: int) -> httpx.Response:
        """llama-server's own /completion endpoint (every variant has it)."""
        return self.complete_body({"prompt": prompt, "n_predict": n_predict, "temperature": 0})

    def complete_body(self, body: JsonObject) -> httpx.Response:
        """One raw-text completion (/completion), not streamed: no chat template applies."""
        return self._http.post(self.url + COMPLETION, json=body)

    @contextmanager
    def stream_complete(self, body: JsonObject) -> Iterator[httpx.Response]:
        """One streamed raw-text completion (/completion, server-sent events).

        On its own connection: llama-server ends this stream by closing the socket (unlike the
        chat stream), and a pooled connection reused after it fails the next request with
        "Server disconnected without sending a response"."""
        with self._http.stream(
            "POST",
            self.url + COMPLETION,
            json={**body, "stream": True},
            headers={"Connection": "close"},
        ) as resp:
            yield resp

    # --- what callers share -----------------------------------------------------------------

    def metrics(self) -> MetricsSnapshot | None:
        """The parsed /metrics; None when the server runs without ``--metrics``."""
        resp = self.metrics_response()
        if resp.status_code in (404, 501):
            return None
        resp.raise_for_status()
        return parse_metrics(resp.text)

    def wait_healthy(self, timeout_s: float, alive: Callable[[], bool] | None = None) -> None:
        """Poll /health until it answers 200; NotServing after ``timeout_s`` or once ``alive``
        says the server process is gone."""
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while True:
            try:
                resp = self.health()
                if resp.status_code == 200:
                    return
                last = f"HTTP {resp.status_code}"
            except httpx.TransportError as err:
                last = err.__class__.__name__
            if alive is not None and not alive():
                raise NotServing(f"the server exited before /health answered 200 ({last})")
            if time.monotonic() > deadline:
                raise NotServing(f"/health did not answer 200 within {timeout_s:g}s ({last})")
            time.sleep(POLL_S)
