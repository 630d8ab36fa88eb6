"""``OpenAIPolicy``: a text-level policy backed by an OpenAI-compatible chat-completions endpoint.

Works with a vLLM server started with hermes tool parsing, so tool calls come back as native ``tool_calls``::

    vllm serve Qwen/Qwen2.5-7B-Instruct --enable-auto-tool-choice --tool-call-parser hermes

    policy = OpenAIPolicy.for_env(env, "http://localhost:8000/v1", model="Qwen/Qwen2.5-7B-Instruct")
    [gen] = await policy.generate([Request(trajectory)])
    obs, reward, terminated, truncated, info = await env.astep(gen.text)

**Messages.** Each request is rebuilt from the :class:`~rstar_env.trajectory.Trajectory` (the chat API is
stateless): ``system``, ``user`` (the problem), then per turn an ``assistant`` message and the tool results.

* ``native_tools=True`` (default): the assistant message's ``content`` is the action with its ``<tool_call>`` blocks
  removed, and each call the env could read (a name and an arguments object) becomes a ``tool_calls`` entry with
  the deterministic id ``call_{turn}_{i}`` (``i`` counts the turn's calls in order, readable or not) and JSON-encoded
  arguments, answered by a ``tool`` message with that id and the result text (errors included, e.g. an unknown
  tool). A call the env could *not* read (bad JSON, no name, arguments not an object) has no native form: its raw
  ``<tool_call>`` block stays in the assistant content where the model wrote it, and its error result goes in one
  ``user`` message of ``<tool_response>`` blocks after the tool messages (the OpenAI API allows nothing else between
  an assistant's tool calls and their tool messages). So the model sees what it wrote and what was wrong with it.
* ``native_tools=False``: the assistant content is the action verbatim, and all results of a turn go in one
  ``user`` message of ``<tool_response>`` blocks, exactly as the env renders feedback for chatml models.

Either way tool output and earlier model text are data (:func:`~rstar_env.format.neutralize_markers`): a chat
marker in them (``<|im_start|>``, ``</tool_response>``, any ``<|name|>``, ...) is broken by a zero-width space, so
the server's template and tokenizer cannot read it as a turn. A model's own ``<tool_call>`` blocks stay as written.

**Responses.** ``Generation.text`` is ``message.content`` followed by each native tool call rendered back to hermes
text (:func:`~rstar_env.format.format_tool_call`), so the env parses and records it as if the model had written it.
Arguments that are not valid JSON are kept verbatim in a block the env reports as a ``bad_call``: nothing is lost.
Token usage, the server's raw finish reason and the number of attempts go into ``Generation.metadata``.

**Token ids and log-probs.** With ``return_token_ids=True`` each request asks for ``logprobs`` and vLLM's
``return_token_ids`` extension, and ``Generation.token_ids`` / ``Generation.logprobs`` are the completion's sampled
ids (``choices[0].token_ids``) and their log-probs (``choices[0].logprobs.content[i].logprob``), so the env records
them in the turn as it does for a local engine. Ids written as ``token_id:N`` (vLLM's
``return_tokens_as_token_ids``) are read as well. A response without them (a server that lacks the extension, such
as ``transformers serve``, which refuses the field with HTTP 422) or with a different count of ids and log-probs is
an error of that request, not silently dropped. The log-probs are what the server computes: vLLM's default is the
model's raw distribution; ``--logprobs-mode processed_logprobs`` gives the sampling distribution (after temperature
and top-p), as :class:`~rstar_env.rollout.vllm.VLLMPolicy` records. The ids are what the model sampled even when a
tool parser turned them into native ``tool_calls`` (then ``text`` is the re-rendered call, not their decoding).

**Failures.** 429, 408, 5xx, dropped connections and timeouts are retried with exponential backoff and full
jitter (``Retry-After`` honoured, capped), at most ``max_retries`` times; other errors (400: bad request, context
too long, ...) are not. A request that still fails comes back as ``Generation(text="", finish_reason="error",
metadata={"error": ...})``; ``generate`` never raises for one bad request.

``httpx`` is an optional dependency: ``pip install 'rstar-env[openai]'``.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import os
import random
import re
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rstar_env.format import (
    DEFAULT_SYSTEM_PROMPT,
    TURN_MARKERS,
    format_tool_call,
    has_tool_call,
    neutralize_markers,
    render_tool_responses,
)
from rstar_env.rollout.policy import FinishReason, Generation, Request, SamplingParams
from rstar_env.trajectory import Trajectory

if TYPE_CHECKING:
    import httpx

_TOOL_CALL_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)  # as rstar_env.format parses
_RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
_FINISH: dict[str, FinishReason] = {"stop": "stop", "tool_calls": "tool_call", "length": "length"}


def _import_httpx() -> Any:
    try:
        import httpx
    except ImportError:
        raise ImportError("OpenAIPolicy needs httpx, an optional dependency: pip install 'rstar-env[openai]'") from None
    return httpx


class _RetryableError(Exception):
    def __init__(self, message: str, retry_after: float | None = None, *, connection: bool = False) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.connection = connection


class _FatalError(Exception):
    def __init__(self, message: str, *, retryable: bool = False, connection: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable  # a failure of the server (another server may answer), not of the request
        self.connection = connection


class OpenAIPolicy:
    """A :class:`~rstar_env.rollout.policy.Policy` that asks an OpenAI-compatible chat-completions endpoint.

    Args:
        base_url: the API root, e.g. ``http://localhost:8000/v1``.
        model: the served model name.
        api_key: sent as a bearer token; default ``$OPENAI_API_KEY``, else ``"EMPTY"`` (what vLLM accepts).
        sampling: temperature, top-p, per-turn token cap, seed. Each request is sent with a ``seed`` (vLLM and
            OpenAI take one per request): the request's own (the collector derives it from run seed, problem id,
            sample index and turn, so a rerun draws the same tokens whatever the order of requests), else
            ``seed + n`` for the n-th request this policy sends; none when neither is set.
        tools: OpenAI tool schemas sent as ``tools=`` so the server's tool parser returns native ``tool_calls``;
            ``None`` sends none (the system prompt must then describe the tools, and calls come back as text).
        native_tools: how earlier turns are sent back: assistant ``tool_calls`` + ``tool`` messages (``True``), or
            the raw action text + a ``user`` message of ``<tool_response>`` blocks (``False``). See the module doc.
        system_prompt: the system message. Use :meth:`for_env` to take it from an env: with native tools the
            server's chat template describes the tools, so it is the env's prompt *without* the tool preamble.
        max_concurrency: requests in flight at once (per event loop).
        timeout_s: wall-clock limit of one attempt (connect + generate + read).
        max_retries: further attempts after a retryable failure.
        backoff_s / max_backoff_s: the first backoff and the cap of one wait (``Retry-After`` is capped too).
        extra_body: merged into every request body (vLLM's ``skip_special_tokens``, ``stop``, ``top_k``, ...).
        headers: extra HTTP headers.
        return_token_ids: ask for and return the sampled token ids and their log-probs (vLLM; see the module doc).
        transport: the ``httpx`` transport the client sends through (default: httpx's own, over the network); the
            client closes it in :meth:`aclose`. An ``httpx.MockTransport`` answers in process: scripted endpoints
            for tests and benchmarks, with no server.
    """

    tokenizer: object | None = None

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        sampling: SamplingParams | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        native_tools: bool = True,
        system_prompt: str | None = None,
        max_concurrency: int = 64,
        timeout_s: float = 600.0,
        max_retries: int = 4,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        extra_body: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        return_token_ids: bool = False,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._httpx = _import_httpx()
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, got {max_concurrency}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if backoff_s < 0 or max_backoff_s < 0:
            raise ValueError("backoff_s and max_backoff_s must be >= 0")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY") or "EMPTY"
        self.sampling = sampling if sampling is not None else SamplingParams()
        self.tools = [dict(t) for t in tools] if tools else None
        self.native_tools = native_tools
        self.system_prompt = system_prompt if system_prompt is not None else DEFAULT_SYSTEM_PROMPT
        self.max_concurrency = max_concurrency
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.extra_body = dict(extra_body or {})
        self.headers = dict(headers or {})
        self.return_token_ids = return_token_ids
        self.transport = transport
        self._rng = random.Random(self.sampling.seed)  # backoff jitter
        self._sent = 0  # requests issued, for per-request seeds
        # Bound to the event loop that first uses them; rebuilt if a later call runs on another loop.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: httpx.AsyncClient | None = None
        self._semaphore: asyncio.Semaphore | None = None

    @classmethod
    def for_env(cls, env: Any, base_url: str, model: str, *, native_tools: bool = True, **kwargs: Any) -> OpenAIPolicy:
        """A policy that speaks to ``env`` (a MathToolEnv, wrapped or not, or the vector env): its tools and prompt.

        With ``native_tools`` the schemas go in ``tools=`` and the system prompt is the env's configured prompt
        without the hermes tool preamble (the server's chat template adds its own); without, no ``tools=`` is sent
        and the system prompt is ``env.system_prompt`` (tools described in text, as the env's own prompt does).
        """
        env = getattr(env, "unwrapped", env)  # a gymnasium.make wrapper
        if not hasattr(env, "system_prompt") and getattr(env, "envs", None):  # the vector env: its envs share tools
            env = env.envs[0]
        settings = getattr(env, "settings", None)
        base_prompt = getattr(settings, "system_prompt", None) or DEFAULT_SYSTEM_PROMPT
        schemas = [tool.schema for tool in getattr(env, "tools", {}).values()]
        if native_tools:
            kwargs.setdefault("tools", schemas or None)
            kwargs.setdefault("system_prompt", base_prompt)
        else:
            kwargs.setdefault("tools", None)
            kwargs.setdefault("system_prompt", env.system_prompt)
        return cls(base_url, model, native_tools=native_tools, **kwargs)

    # -- Policy API ------------------------------------------------------------------------------------------------
    async def generate(self, requests: Sequence[Request]) -> list[Generation]:
        """One generation per request, run concurrently (at most ``max_concurrency`` in flight)."""
        client, semaphore = self._bind()
        seeds = []
        for request in requests:  # seeds in request order, before any concurrency
            if request.seed is not None:
                seeds.append(request.seed)
            else:
                seeds.append(None if self.sampling.seed is None else self.sampling.seed + self._sent)
            self._sent += 1
        jobs = [self._generate_one(client, semaphore, r, s) for r, s in zip(requests, seeds, strict=True)]
        return list(await asyncio.gather(*jobs))

    async def aclose(self) -> None:
        client, loop = self._client, self._loop
        self._client = self._semaphore = self._loop = None
        if client is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is running:
            await client.aclose()
        elif loop is not None and not loop.is_closed() and loop.is_running():
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(client.aclose(), loop))

    # -- messages --------------------------------------------------------------------------------------------------
    def build_messages(self, trajectory: Trajectory) -> list[dict[str, Any]]:
        """The chat messages for the next turn of ``trajectory`` (see the module doc)."""
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": trajectory.problem},
        ]
        for t, turn in enumerate(trajectory.turns):
            # What the model wrote earlier goes back as its text, never as turns: a chat marker in it (or in its
            # code, or in a tool's output) would be read as a real one by the server's template and tokenizer.
            action = neutralize_markers(turn.action, TURN_MARKERS)
            if not self.native_tools:
                messages.append({"role": "assistant", "content": action})
                if turn.tool_calls:
                    results = [call.result.text for call in turn.tool_calls]
                    messages.append({"role": "user", "content": render_tool_responses(results)})
                continue
            blocks = list(_TOOL_CALL_BLOCK.finditer(action))
            native: list[dict[str, Any]] = []
            replies: list[dict[str, Any]] = []
            unreadable: list[str] = []
            content, cursor = [], 0
            for i, block in enumerate(blocks):
                call = turn.tool_calls[i] if i < len(turn.tool_calls) else None
                content.append(action[cursor : block.start()])
                cursor = block.end()
                if call is not None and call.name is not None and isinstance(call.arguments, dict):
                    call_id = f"call_{t}_{i}"
                    # Markers only ever sit inside the JSON's strings, so the arguments stay valid JSON.
                    arguments = neutralize_markers(json.dumps(call.arguments, ensure_ascii=False))
                    native.append(
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {"name": neutralize_markers(call.name), "arguments": arguments},
                        }
                    )
                    replies.append(
                        {"role": "tool", "tool_call_id": call_id, "content": neutralize_markers(call.result.text)}
                    )
                else:  # no native form: keep what the model wrote, answer it in text
                    content.append(block.group(0))
                    if call is not None:
                        unreadable.append(call.result.text)
            content.append(action[cursor:])
            # Results the env recorded beyond the blocks found here (should not happen) are still shown.
            unreadable.extend(call.result.text for call in turn.tool_calls[len(blocks) :])
            text = "".join(content).strip() if native else "".join(content)
            assistant: dict[str, Any] = {"role": "assistant", "content": text if text or not native else None}
            if native:
                assistant["tool_calls"] = native
            messages.append(assistant)
            messages.extend(replies)
            if unreadable:
                messages.append({"role": "user", "content": render_tool_responses(unreadable)})
        return messages

    def build_body(self, request: Request, seed: int | None = None) -> dict[str, Any]:
        """The JSON body of the chat-completions request for ``request``."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": self.build_messages(request.trajectory),
            "temperature": self.sampling.temperature,
            "top_p": self.sampling.top_p,
            "max_tokens": request.max_new_tokens or self.sampling.max_new_tokens,
        }
        if seed is not None:
            body["seed"] = seed
        if self.tools:
            body["tools"] = self.tools
        if self.return_token_ids:
            body.update(logprobs=True, return_token_ids=True)
        body.update(self.extra_body)
        return body

    # -- responses -------------------------------------------------------------------------------------------------
    @staticmethod
    def parse_response(payload: Mapping[str, Any], *, token_ids: bool = False) -> Generation:
        """A chat-completion response body as a :class:`Generation` (native tool calls rendered as hermes text).
        Token ids and log-probs are read when the response has them; ``token_ids=True`` requires them."""
        choices = payload.get("choices") or []
        if not choices or not isinstance(choices[0], Mapping):
            raise _FatalError(f"the response has no choices: {json.dumps(payload)[:300]}", retryable=True)
        choice = choices[0]
        message = choice.get("message") or {}
        content = message.get("content") or ""
        blocks = []
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            name = function.get("name")
            arguments = function.get("arguments")
            if isinstance(arguments, dict):
                blocks.append(format_tool_call(name, arguments))
                continue
            raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
            try:
                blocks.append(format_tool_call(name, json.loads(raw) if raw.strip() else {}))
            except json.JSONDecodeError:  # kept verbatim: the env reports it as a bad_call
                blocks.append(f'<tool_call>\n{{"name": {json.dumps(name)}, "arguments": {raw}}}\n</tool_call>')
        text = content
        if blocks:
            sep = "\n" if content and not content.endswith("\n") else ""
            text = content + sep + "\n".join(blocks)
        raw_finish = choice.get("finish_reason")
        finish: FinishReason = _FINISH.get(raw_finish or "", "stop")
        if finish != "length" and (blocks or has_tool_call(text)):
            finish = "tool_call"  # e.g. "stop" on a "</tool_call>" stop string
        metadata: dict[str, object] = {"finish_reason_raw": raw_finish}
        usage = payload.get("usage") or {}
        for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
            if isinstance(usage.get(key), int):
                metadata[key] = usage[key]
        if message.get("reasoning_content"):
            metadata["reasoning_content"] = message["reasoning_content"]
        if blocks:
            metadata["native_tool_calls"] = len(blocks)
        ids, logprobs = _sampled_tokens(choice)
        if token_ids and (ids is None or logprobs is None):
            raise _FatalError(
                "the response has no token ids and log-probs (vLLM's return_token_ids and logprobs): the server "
                "does not support them; ask without (OpenAIPolicy(return_token_ids=False), no --token-ids)"
            )
        return Generation(text=text, token_ids=ids, logprobs=logprobs, finish_reason=finish, metadata=metadata)

    # -- internals -------------------------------------------------------------------------------------------------
    def _bind(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._client is None or self._semaphore is None:
            old, old_loop = self._client, self._loop
            if old is not None and old_loop is not None and old_loop.is_running() and not old_loop.is_closed():
                asyncio.run_coroutine_threadsafe(old.aclose(), old_loop)  # its loop lives on in another thread
            httpx = self._httpx
            self._client = httpx.AsyncClient(
                base_url=self.base_url,
                headers={"Authorization": f"Bearer {self.api_key}", **self.headers},
                timeout=httpx.Timeout(self.timeout_s, connect=min(self.timeout_s, 30.0)),
                limits=httpx.Limits(
                    max_connections=self.max_concurrency, max_keepalive_connections=self.max_concurrency
                ),
                transport=self.transport,
            )
            self._semaphore = asyncio.Semaphore(self.max_concurrency)
            self._loop = loop
        return self._client, self._semaphore

    async def _generate_one(
        self, client: httpx.AsyncClient, semaphore: asyncio.Semaphore, request: Request, seed: int | None
    ) -> Generation:
        start = time.perf_counter()
        attempts = 0
        try:
            body = self.build_body(request, seed)
            while True:
                attempts += 1
                try:
                    async with semaphore:
                        payload = await self._post(client, body)
                    generation = self.parse_response(payload, token_ids=self.return_token_ids)
                    break
                except _RetryableError as exc:
                    if attempts > self.max_retries:
                        raise _FatalError(
                            f"{exc} (gave up after {attempts} attempts)", retryable=True, connection=exc.connection
                        ) from None
                    await asyncio.sleep(self._backoff(attempts, exc.retry_after))
        except _FatalError as exc:
            return self._error(str(exc), attempts, start, retryable=exc.retryable, connection=exc.connection)
        except Exception as exc:  # a bug or an unexpected payload must not sink the batch
            return self._error(f"{type(exc).__name__}: {exc}", attempts, start, retryable=True)
        generation.metadata.update(attempts=attempts, latency_s=round(time.perf_counter() - start, 6))
        return generation

    async def _post(self, client: httpx.AsyncClient, body: dict[str, Any]) -> Any:
        httpx = self._httpx
        try:
            async with asyncio.timeout(self.timeout_s):
                response = await client.post("/chat/completions", json=body)
        except TimeoutError:
            raise _RetryableError(f"timed out after {self.timeout_s:g}s") from None
        except httpx.TimeoutException as exc:
            raise _RetryableError(f"timed out ({type(exc).__name__})") from None
        except httpx.TransportError as exc:  # refused, reset, dropped without a response, ...
            raise _RetryableError(f"connection error ({type(exc).__name__}: {exc})", connection=True) from None
        if response.status_code != 200:
            detail = _error_detail(response)
            message = f"HTTP {response.status_code}: {detail}"
            if response.status_code in _RETRY_STATUS:
                raise _RetryableError(message, _retry_after(response.headers.get("retry-after")))
            raise _FatalError(message)
        try:
            return response.json()
        except ValueError:
            raise _FatalError(f"the response is not JSON: {response.text[:300]!r}", retryable=True) from None

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_backoff_s)
        ceiling = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
        return self._rng.uniform(ceiling / 2, ceiling)  # "equal jitter": never zero, never above the cap

    @staticmethod
    def _error(
        message: str, attempts: int, start: float, *, retryable: bool = False, connection: bool = False
    ) -> Generation:
        # ``retryable``: the server failed (another may answer); ``connection``: it could not be reached at all.
        # A multi-engine dispatcher fails over on these and marks an unreachable server down at once.
        return Generation(
            text="",
            finish_reason="error",
            metadata={
                "error": message,
                "attempts": attempts,
                "latency_s": round(time.perf_counter() - start, 6),
                "retryable": retryable,
                "connection_error": connection,
            },
        )

    def __repr__(self) -> str:
        return f"OpenAIPolicy(base_url={self.base_url!r}, model={self.model!r}, native_tools={self.native_tools})"


def _sampled_tokens(choice: Mapping[str, Any]) -> tuple[list[int] | None, list[float] | None]:
    """``(token ids, log-probs)`` of a choice, both or neither (``None``): the ids from vLLM's ``token_ids``, else
    from log-prob entries written ``token_id:N``; the log-probs from ``logprobs.content``. Counts that differ are an
    error: ids and log-probs must pair up one to one."""
    content = (choice.get("logprobs") or {}).get("content")
    entries = content if isinstance(content, list) else None
    raw = choice.get("token_ids")
    ids = [int(t) for t in raw] if isinstance(raw, list) else None
    if ids is None and entries and all(str(e.get("token", "")).startswith("token_id:") for e in entries):
        ids = [int(str(e["token"]).removeprefix("token_id:")) for e in entries]
    logprobs = [float(e["logprob"]) for e in entries] if entries is not None else None
    if ids is None or logprobs is None:
        return None, None
    if len(ids) != len(logprobs):
        raise _FatalError(f"the response has {len(ids)} token ids but {len(logprobs)} log-probs")
    return ids, logprobs


def _error_detail(response: httpx.Response) -> str:
    try:
        payload = response.json()
        error = payload.get("error", payload) if isinstance(payload, dict) else payload
        message = error.get("message") if isinstance(error, dict) else None
        return str(message if message is not None else error)[:500]
    except ValueError:
        return response.text[:500]


def _retry_after(value: str | None) -> float | None:
    """``Retry-After`` in seconds: a number, or an HTTP date."""
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
