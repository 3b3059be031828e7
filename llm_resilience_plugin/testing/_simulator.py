"""A fault-injecting, OpenAI-compatible chat-completions server for tests, demos and benchmarks.

:class:`ProviderSimulator` runs an aiohttp web server on ``127.0.0.1`` in its own event loop on a
background daemon thread, so synchronous code and asyncio code (on any other loop) can both talk
to it over real HTTP.  Point LiteLLM at it with an ``openai/`` model and the simulator's
``api_base``; every *deployment* (any name you choose) is scripted independently::

    import llm_resilience_plugin  # sets LiteLLM's offline env before litellm is imported
    import litellm
    from llm_resilience_plugin.testing import Fault, ProviderSimulator

    with ProviderSimulator() as sim:  # port 0: a free port is picked
        sim.script("primary", Fault.rate_limit(retry_after=1), Fault.reset())
        sim.set_default("primary", Fault.ok(text="fine now"))
        litellm.completion(
            model="openai/gpt-4o-mini",
            api_base=sim.api_base("primary"),  # http://127.0.0.1:<port>/primary/v1
            api_key="sk-sim",
            messages=[{"role": "user", "content": "hi"}],
            max_retries=0,  # otherwise the OpenAI SDK retries on its own
        )
        assert sim.count("primary") == 1

Running it standalone: ``llm-resilience simulator --port 8900 --deployments a,b`` (or ``python -m
llm_resilience_plugin.testing._simulator`` with the same options) pre-registers the deployments,
prints each one's ``api_base`` and serves until Ctrl-C or SIGTERM.

Server API
----------
``ProviderSimulator(host="127.0.0.1", port=0)``
    ``start()`` (blocks until the socket is bound; returns the simulator), ``stop()`` (cancels
    in-flight handlers, including ones holding a connection open, and returns promptly), or use
    it as a context manager.  After ``stop()`` it can be started again on the same port.
``port`` / ``base_url`` / ``api_base(deployment)``
    ``api_base`` is ``http://127.0.0.1:{port}/{deployment}/v1``.
``script(deployment, *behaviors)``
    Queue behaviours, consumed one per request in FIFO order.
``set_default(deployment, behavior)``
    What a deployment does once its queue is empty (initially ``Fault.ok()``).
``outage(deployment, seconds, behavior=Fault.server_error(503))``
    Every request within the next ``seconds`` (monotonic clock, from the call) gets ``behavior``.
``token_bucket(deployment, rate, burst, retry_after=None)``
    A bucket of ``burst`` tokens (initially full) refilled at ``rate`` tokens/second; a request
    finding it empty gets a 429 (with ``Retry-After`` when ``retry_after`` is given).
``set_context_window(deployment, tokens)``
    A prompt whose estimate (below) exceeds ``tokens`` gets OpenAI's context-length 400.
    ``None`` removes the limit.
``requests(deployment=None)`` / ``count(deployment=None)``
    The request log in arrival order, as frozen :class:`RequestRecord` snapshots.
``clear_log()`` / ``reset()``
    ``reset`` clears the log *and* every script, default, outage, bucket, window and RNG.

For each chat request the first matching rule wins: **outage window > token bucket > context
window > scripted queue > default**.  Requests rejected by an outage, the bucket or the window
do not consume the scripted queue.

Endpoints: ``POST /{deployment}/v1/chat/completions`` (the deployment is the first path
segment), ``POST /v1/chat/completions`` and ``POST /chat/completions`` (the deployment is the
body's ``model``), ``POST /{deployment}/chat/completions``, ``GET /{deployment}/v1/models``,
``GET /v1/models`` and ``GET /health``; ``POST .../embeddings``, ``.../completions``,
``.../images/generations`` and ``.../responses`` (same prefixes, same faults, see
:mod:`._endpoints`), ``.../audio/transcriptions`` (multipart), ``.../audio/speech`` (audio bytes),
``.../moderations`` and Cohere's ``.../v1/rerank`` (see :mod:`._audio`);
``set_embedding_dimension(deployment, n)`` sets a deployment's vector length;
``POST /{deployment}/v1/messages`` in Anthropic's Messages dialect (``anthropic_base(deployment)``,
see :mod:`._anthropic`) and Azure OpenAI's path (see :mod:`._azure`), with the same faults.
Only model requests are logged.  A body that is not a JSON
object with a ``messages`` list gets a plain 400 (logged with behavior ``"bad_request"``) without
consuming any script.  Every chat response carries ``x-simulator-deployment: <deployment>``.

Fault kinds (constructors on :class:`Fault`, all returning a frozen :class:`Behavior`)
---------------------------------------------------------------------------------------
``ok(text=None, latency=0, ttft=0, chunk_delay=0)``
    Success.  Non-stream: the response is sent after ``latency + ttft`` seconds.  Stream:
    ``latency`` delays the response headers, ``ttft`` delays the first chunk after the headers,
    ``chunk_delay`` separates consecutive content chunks.  ``text`` replaces the generated
    reply (and disables tool calls / structured output for that request).
``http_error(status, message=None, retry_after=None, code=None, type=None)``
    An OpenAI-shaped error body ``{"error": {"message", "type", "param": null, "code"}}``.
    ``retry_after`` becomes a ``Retry-After`` header: a number is sent as seconds (``2``,
    ``0.5``), a string as is (for example an HTTP-date).  Shorthands: ``rate_limit()`` (429,
    type and code ``rate_limit_exceeded``), ``server_error(status=500)``, ``overloaded(retry_after=None)``
    (529, Anthropic-style ``overloaded_error`` / ``"Overloaded"``), ``auth()`` (401
    ``invalid_api_key``), ``context_length(limit=8192)`` (400 ``context_length_exceeded`` with
    OpenAI's "This model's maximum context length is ..." message), ``content_filter()`` (400
    ``content_filter`` with Azure's "... content management policy ..." message) and
    ``not_found()`` (404 ``model_not_found``).
``reset()``
    Read the request, then abort the TCP connection with an RST (``SO_LINGER {1, 0}``) before
    any response byte.
``silence(max_hold=60)``
    Send nothing until the client goes away or ``max_hold`` passes (then RST).
``slow_first_token(seconds)``
    ``ok`` with ``ttft=seconds`` (so a non-stream response is also ``seconds`` late).
``stream_cut(after_chunks=2)``
    Stream: headers and ``after_chunks`` content chunks, then the connection is closed in the
    middle of the chunked body (FIN, after the chunks are flushed: no final chunk, no
    ``[DONE]``).  Non-stream: like ``reset``.
``stream_stall(after_chunks=2, seconds=60)``
    Stream: ``after_chunks`` chunks, then silence for ``seconds`` (then RST).  Non-stream: like
    ``silence(seconds)``.
``malformed_chunk(after_chunks=1, content=True, repeat=1)``
    Stream: after ``after_chunks`` good chunks, one ``data:`` event with invalid JSON, then the
    rest of the normal stream (``content=False``: the event shows no text value, a cut role
    chunk; ``repeat``: that many such events, one good chunk between two).  Non-stream: a 200
    whose JSON body is truncated.
``no_done()``
    Stream: every chunk (content, finish, usage if requested), then a clean end of the body and
    connection close without ``data: [DONE]``.  Non-stream: ordinary ``ok``.
``flaky(p, fault, seed=None)``
    With probability ``p`` apply ``fault``, else ``ok``.  Draws come from a per-deployment RNG
    seeded with ``seed`` (or a stable hash of the deployment name), so runs are repeatable.
``refuse_prefill(fault=None, message=None)``
    A model that takes no assistant prefill: a request whose last message is the assistant's
    (chat or Anthropic ``messages``, a Responses ``input`` list; with or without ``"prefix":
    true``) gets a 400 ``invalid_request_error`` with Anthropic's wording, "This model does not
    support assistant message prefill. The conversation must end with a user message." (or
    ``message``); any other request gets ``fault`` (default ``ok``), so it composes with the
    others (``refuse_prefill(stream_cut(3))``).

``after_chunks`` counts content chunks (the first of which also carries ``role``); a value
beyond the reply length applies the fault after the last content chunk.  Invalid arguments
(negative seconds or counts, ``p`` outside [0, 1], a status outside 100-599) raise
``ValueError`` naming the argument.

``RequestRecord.behavior`` names what was applied: ``"ok"``, ``"http_error:<status>"``,
``"reset"``, ``"silence"``, ``"stream_cut"``, ``"stream_stall"``, ``"malformed_chunk"``,
``"no_done"``, ``"flaky:<applied>"`` (``<applied>`` is the inner fault's name or ``"ok"``),
``"prefill_refused"`` (a ``refuse_prefill`` that refused; one that did not logs its ``fault``),
``"outage:<name>"``, ``"token_bucket:429"``, ``"context_window"`` or ``"bad_request"``.

Replies
-------
Responses follow OpenAI's wire format (``chat.completion`` / ``chat.completion.chunk`` with
``data: [DONE]``; ``stream_options.include_usage`` adds a final ``"choices": []`` chunk with
``usage``).  Streams split the content into word chunks (a word plus its trailing whitespace).

* Text: ``"Hello from <deployment>. You said: <first 12 words of the last user message>."``.
* ``max_tokens`` / ``max_completion_tokens`` truncate to that many word chunks (finish
  ``"length"``); ``stop`` cuts the text before the first stop sequence.
* Tools: if the request has ``tools``, ``tool_choice`` is not ``"none"`` and the last message is
  not a ``tool`` message, the reply is one tool call (finish ``"tool_calls"``) to the function
  named by ``tool_choice``, else the tool whose name occurs first in the last user message,
  else the first tool.  Arguments are generated from the JSON schema: integers and numbers take
  the numbers found in the last user message in order (else ``1`` / ``1.0``), strings the
  phrases quoted ('x', "x" or `x`) in that message in order (else ``"example"``; an ``enum``
  gives its first value), booleans ``true``, arrays ``[]`` (``minItems``
  items when required), objects recursively; ``anyOf``/``oneOf`` use the first non-null branch
  and ``$ref`` is resolved.  After a ``tool`` message the text is
  ``"The tool returned: <content>."``.
* ``response_format`` ``json_schema``: the content is an instance generated from the schema as
  above, strings being ``"example <property name>"``.  ``json_object``: an object whose keys are
  the identifiers quoted ('x', "x" or `x`) in the system messages and the last user message,
  else ``{"answer": ...}``.

How LiteLLM surfaces each fault
-------------------------------
Observed with LiteLLM 1.110 (``openai/`` model, ``max_retries=0``), sync and async alike; the
class is from ``litellm.exceptions``, then ``status_code``:

* 429 (any, incl. token bucket): ``RateLimitError`` 429 (``e.response.headers["retry-after"]``
  carries ``Retry-After``); 500: ``InternalServerError`` 500; 502: ``BadGatewayError`` 502;
  503: ``ServiceUnavailableError`` 503; 504: ``Timeout`` 504; 529 ``overloaded()`` and 403:
  plain ``APIError`` 529 / 403; 401: ``AuthenticationError``; 404: ``NotFoundError``;
  ``context_length()``: ``ContextWindowExceededError`` 400; ``content_filter()``: plain
  ``BadRequestError`` 400 (not ``ContentPolicyViolationError`` for ``openai/``); 408 and 422:
  ``Timeout`` 408 and ``BadRequestError`` 422.  Streams raise the same before the first chunk.
* ``reset()`` (and a refused connection): ``InternalServerError`` **500**, message ending
  ``"Connection error."`` -- the only way to tell it from a real 500 is that message or the
  ``openai.APIConnectionError`` in the ``__cause__`` chain.
* ``silence()`` / ``stream_stall()``: ``Timeout`` 408 (``"APITimeoutError - Request timed
  out."``); on a stream the read timeout also fires *during iteration*, for a stall or a
  ``ttft`` longer than the timeout, because the headers arrived in time.
* ``stream_cut()`` / ``malformed_chunk()`` on a stream: ``MidStreamFallbackError`` 500 raised
  while iterating (``generated_content`` holds the text received so far,
  ``is_pre_first_chunk`` whether any arrived, ``original_exception`` is an
  ``APIConnectionError``).  It subclasses ``ServiceUnavailableError`` and is not exported as
  ``litellm.MidStreamFallbackError``.  Non-stream ``malformed_chunk()``: ``InternalServerError``
  500 with the JSON decode error as message.  ``no_done()`` is accepted silently.

Token estimate (deterministic, no tokenizer)
--------------------------------------------
``estimate_tokens(text) = ceil(len(text) / 4)``.  ``prompt_tokens`` (see
:func:`estimate_prompt_tokens`) is the sum over messages of ``4 + estimate_tokens(text)`` plus
85 per image part, plus 2; ``text`` is the string content or the concatenated text parts.
``completion_tokens`` is the number of word chunks, or ``ceil(len(arguments) / 4) + 5`` for a
tool call.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from types import FrameType, TracebackType

from aiohttp import web

from llm_resilience_plugin import _env
from llm_resilience_plugin.testing._anthropic import AnthropicEndpoints
from llm_resilience_plugin.testing._audio import AudioEndpoints
from llm_resilience_plugin.testing._azure import add_azure_routes
from llm_resilience_plugin.testing._endpoints import OtherEndpoints
from llm_resilience_plugin.testing._fault_routes import add_fault_routes
from llm_resilience_plugin.testing._faults import Behavior, Fault
from llm_resilience_plugin.testing._handlers import Endpoints
from llm_resilience_plugin.testing._messages import estimate_prompt_tokens, estimate_tokens
from llm_resilience_plugin.testing._state import RequestRecord, SimulatorState, check_deployment

__all__ = [
    "Behavior",
    "Fault",
    "ProviderSimulator",
    "RequestRecord",
    "build_parser",
    "estimate_prompt_tokens",
    "estimate_tokens",
    "main",
    "parse_deployments",
    "serve",
]

# The module map: _faults (Behavior, Fault), _messages (message text, token estimates), _schema
# (schema faker, tool calls, JSON mode), _replies (reply content, wire format), _state (scripts,
# log), _writers (responses on the wire), _handlers (endpoints); this module runs the server.


class ProviderSimulator:
    """A fault-injecting OpenAI-compatible server on a background thread (see module docs)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"port must be an integer in [0, 65535], got {port!r}")
        self.host = host
        self._requested_port = port
        self._bound_port: int | None = None
        self._state = SimulatorState()
        self._endpoints = Endpoints(self._state)
        self._other = OtherEndpoints(self._state, self._endpoints.active)  # embeddings, images, ...
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> ProviderSimulator:
        """Start serving; returns once the socket is bound.  A no-op if already running."""
        if self._thread is not None:
            return self
        _env.allow_loopback()
        ready = threading.Event()
        errors: list[BaseException] = []
        thread = threading.Thread(
            target=self._run, args=(ready, errors), name="provider-simulator", daemon=True
        )
        thread.start()
        ready.wait()
        if errors:
            thread.join()
            raise errors[0]
        self._thread = thread
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving: cancel in-flight handlers, close connections, join the thread."""
        thread, loop = self._thread, self._loop
        if thread is None:
            return
        if loop is not None and loop.is_running():
            future = asyncio.run_coroutine_threadsafe(self._shutdown(), loop)
            with contextlib.suppress(Exception):
                future.result(timeout)
            loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
        self._thread = None
        self._loop = None

    def __enter__(self) -> ProviderSimulator:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"port={self._bound_port}" if self._thread is not None else "stopped"
        return f"<ProviderSimulator {self.host} {state}>"

    def _run(self, ready: threading.Event, errors: list[BaseException]) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._setup())
        except BaseException as exc:
            errors.append(exc)
            ready.set()
            loop.close()
            return
        self._loop = loop
        ready.set()
        try:
            loop.run_forever()
        finally:
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _setup(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        add_fault_routes(app, self._state)  # before the catch-all /{deployment}/... routes
        add_azure_routes(app, self._endpoints.handle_chat)
        AnthropicEndpoints(self._state, self._endpoints.active).add_routes(app)
        self._endpoints.add_routes(app)
        self._other.add_routes(app)
        AudioEndpoints(self._state, self._endpoints.active).add_routes(app)  # audio, moderation, rerank
        runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            handler_cancellation=True,
            shutdown_timeout=0.25,
        )
        await runner.setup()
        port = self._bound_port if self._bound_port is not None else self._requested_port
        site = web.TCPSite(runner, self.host, port, backlog=1024, reuse_address=True)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self._bound_port = int(runner.addresses[0][1])

    async def _shutdown(self) -> None:
        active = list(self._endpoints.active)
        for task in active:
            task.cancel()
        if active:
            await asyncio.wait(active, timeout=1.0)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        current = asyncio.current_task()
        leftovers = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
        for task in leftovers:
            task.cancel()
        if leftovers:
            await asyncio.wait(leftovers, timeout=1.0)

    # -- addresses ---------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The bound TCP port (only once started)."""
        if self._bound_port is None:
            raise RuntimeError("ProviderSimulator is not started")
        return self._bound_port

    @property
    def base_url(self) -> str:
        """``http://{host}:{port}`` (``127.0.0.1`` when bound to a wildcard address)."""
        host = "127.0.0.1" if self.host in ("", "0.0.0.0", "::") else self.host
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    def api_base(self, deployment: str) -> str:
        """LiteLLM ``api_base`` for an ``openai/`` model served as ``deployment``."""
        return f"{self.base_url}/{check_deployment(deployment)}/v1"

    def anthropic_base(self, deployment: str) -> str:
        """LiteLLM ``api_base`` for an ``anthropic/`` model served as ``deployment`` (Messages
        dialect: LiteLLM posts to ``<api_base>/v1/messages``)."""
        return f"{self.base_url}/{check_deployment(deployment)}"

    # -- scripting (kept in SimulatorState, shared with the server thread) ---------------------

    def script(self, deployment: str, *behaviors: Behavior) -> None:
        """Queue ``behaviors`` for ``deployment``; each request consumes one (FIFO)."""
        self._state.script(deployment, *behaviors)

    def set_default(self, deployment: str, behavior: Behavior) -> None:
        """What ``deployment`` does once its queue is empty."""
        self._state.set_default(deployment, behavior)

    def outage(self, deployment: str, seconds: float, behavior: Behavior | None = None) -> None:
        """Every request in the next ``seconds`` gets ``behavior`` (default: 503)."""
        self._state.outage(deployment, seconds, behavior)

    def token_bucket(
        self, deployment: str, rate: float, burst: int, retry_after: float | None = None
    ) -> None:
        """Rate-limit ``deployment``: ``burst`` tokens, refilled at ``rate`` per second."""
        self._state.token_bucket(deployment, rate, burst, retry_after)

    def rate_limit(
        self,
        deployment: str,
        rpm: float | None = None,
        tpm: float | None = None,
        *,
        burst_s: float = 1.0,
        retry_after: float | None = None,
        headers: bool = True,
    ) -> None:
        """A provider's rate limit on ``deployment``: ``rpm`` requests and ``tpm`` tokens (prompt +
        ``max_tokens``) a minute, ``burst_s`` seconds' worth at once, 429 above them (with
        ``Retry-After`` when given); with ``headers`` every answer and 429 carries OpenAI's
        ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}``."""
        self._state.rate_limit(
            deployment, rpm, tpm, burst_s=burst_s, retry_after=retry_after, headers=headers
        )

    def set_context_window(self, deployment: str, tokens: int | None) -> None:
        """Reject prompts estimated above ``tokens`` with the context-length 400 (None: off)."""
        self._state.set_context_window(deployment, tokens)

    def set_embedding_dimension(self, deployment: str, dimension: int | None) -> None:
        """The length of ``deployment``'s embedding vectors (default 16; None: back to it)."""
        self._other.set_dimension(check_deployment(deployment), dimension)

    # -- log ---------------------------------------------------------------------------------

    def requests(self, deployment: str | None = None) -> list[RequestRecord]:
        """Snapshot of the request log (arrival order), optionally for one deployment."""
        return self._state.requests(deployment)

    def count(self, deployment: str | None = None) -> int:
        """Number of logged chat requests, optionally for one deployment."""
        return self._state.count(deployment)

    def clear_log(self) -> None:
        """Forget logged requests (scripts and settings are kept)."""
        self._state.clear_log()

    def reset(self) -> None:
        """Clear the log and every script, default, outage, bucket and context window."""
        self._state.reset()
        self._other.reset()


# --------------------------------------------------------------------------------------------
# Command line (``llm-resilience simulator`` defines the same options; a test keeps them equal)
# --------------------------------------------------------------------------------------------


def build_parser(prog: str = "python -m llm_resilience_plugin.testing._simulator") -> argparse.ArgumentParser:
    """The standalone simulator's options: ``--host``, ``--port``, ``--deployments``."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Serve a fault-injecting OpenAI-compatible chat-completions endpoint.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="TCP port (0: pick a free one)")
    parser.add_argument(
        "--deployments",
        default="a",
        help="comma-separated deployment names to pre-register and print (a)",
    )
    return parser


def parse_deployments(text: str) -> list[str]:
    """The names in a comma-separated ``--deployments`` value (blanks dropped); ValueError on a bad one."""
    return [check_deployment(name.strip()) for name in text.split(",") if name.strip()]


def wait_forever(simulator: ProviderSimulator) -> None:
    """Block until Ctrl-C (a seam: tests replace it to act while the server runs)."""
    while True:
        time.sleep(3600)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """Make SIGTERM stop the server like Ctrl-C does (main thread only; restored on exit)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def serve(simulator: ProviderSimulator, deployments: Sequence[str]) -> int:
    """Start ``simulator``, pre-register and print ``deployments``, serve until Ctrl-C or SIGTERM.

    Returns the exit code: 0 after an interrupt, 1 when the address cannot be bound.
    """
    for name in deployments:
        simulator.set_default(name, Fault.ok())  # listed by GET /v1/models from the start
    # An interrupt at any point ends cleanly: before the server thread is recorded it dies with
    # the process (a daemon), after that stop() closes the sockets.
    with _sigterm_interrupts(), contextlib.suppress(KeyboardInterrupt):
        try:
            simulator.start()
        except OSError as exc:
            print(
                f"error: cannot listen on {simulator.host}:{simulator._requested_port}: {exc}",
                file=sys.stderr,
            )
            return 1
        try:
            print(f"ProviderSimulator listening on {simulator.base_url}", flush=True)
            for name in deployments:
                print(f"  {name}: {simulator.api_base(name)}", flush=True)
            print("Press Ctrl-C to stop.", flush=True)
            wait_forever(simulator)
        finally:
            simulator.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the simulator standalone until interrupted (Ctrl-C or SIGTERM)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        names = parse_deployments(args.deployments)
        simulator = ProviderSimulator(host=args.host, port=args.port)
    except ValueError as exc:
        parser.error(str(exc))
    return serve(simulator, names)


if __name__ == "__main__":
    sys.exit(main())
