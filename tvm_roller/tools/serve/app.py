"""The ASGI app (FastAPI): OpenAI's ``/v1/models``, ``/v1/completions`` and
``/v1/chat/completions`` (``stream: true``: server-sent events), ``/health`` and ``/metrics``.
A request is checked and tokenized here, in the event loop, then queued with the engine; every
bad input is a 4xx with an OpenAI error body, a full queue a 429. The app keeps nothing between
requests (a replica behind a load balancer needs no shared state)."""
from __future__ import annotations

import asyncio
import secrets
import time
from contextlib import asynccontextmanager
from typing import AsyncIterator, List, Optional, Sequence, Tuple, Union

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from tvm_roller.tools.serve.engine import Engine, EngineClosed, Job, QueueFull
from tvm_roller.tools.serve.responses import DONE, Reply, sse
from tvm_roller.tools.serve.schemas import ApiError, ChatCompletionRequest, \
    CompletionRequest, generation_params, parse_request, single_prompt

# how often a non-streaming request looks whether its client is still there
_DISCONNECT_POLL_S = 0.25


def create_app(engine: Engine, lm, model_name: str, api_key: Optional[str] = None,
               worker=None, aliases: Sequence[str] = ()) -> FastAPI:
    """The app over ``engine`` (``lm``: the compiled ``CausalLM`` with its tokenizer; its
    tokenizer, context and vocabulary check requests). ``worker`` (``start`` / ``stop`` /
    ``alive``) runs for the app's lifespan. ``api_key``: the ``/v1`` routes need
    ``Authorization: Bearer <api_key>``. Requests name the model ``model_name`` (or an alias)."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if worker is not None:
            worker.start()
        yield
        if worker is not None:
            await asyncio.to_thread(worker.stop)

    app = FastAPI(title="tvm-roller", lifespan=lifespan)
    _add_error_handlers(app)
    names = {model_name, *aliases}
    created = int(time.time())

    async def authorize(request: Request) -> None:
        if api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip(), api_key):
            raise ApiError("a valid API key is required (Authorization: Bearer <key>)", 401,
                           code="invalid_api_key")

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(authorize)])

    @v1.get("/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": model_name, "object": "model",
                                            "created": created, "owned_by": "tvm-roller",
                                            "max_model_len": lm.max_seq_len}]}

    @v1.post("/completions")
    async def completions(request: Request) -> Response:
        req = parse_request(CompletionRequest, await request.body())
        _check_model(req.model, names)
        ids = _prompt_ids(lm, single_prompt(req))
        return await _answer(request, engine, lm, req, ids, Reply(model_name, False, ""))

    @v1.post("/chat/completions")
    async def chat_completions(request: Request) -> Response:
        req = parse_request(ChatCompletionRequest, await request.body())
        _check_model(req.model, names)
        messages = [{"role": m.role, "content": m.text()} for m in req.messages]
        try:
            ids = lm.tokenizer.chat(messages)
        except Exception as e:  # noqa: BLE001 - no template, or the template refused them
            raise ApiError(f"the chat template cannot render these messages: {e}",
                           param="messages") from None
        if req.max_completion_tokens is not None:
            req.max_tokens = req.max_completion_tokens
        return await _answer(request, engine, lm, req, ids, Reply(model_name, True, ""))

    @app.get("/health")
    async def health() -> Response:
        ok = worker is None or worker.alive()
        return JSONResponse({"status": "ok" if ok else "engine stopped",
                             "queue_depth": engine.depth}, 200 if ok else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(engine.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    app.include_router(v1)
    return app


def _add_error_handlers(app: FastAPI) -> None:
    """Every error as OpenAI's JSON: ours, FastAPI's own checks (400, not its 422), an unknown
    route or method, and anything unexpected (500)."""

    def reply(e: ApiError) -> JSONResponse:
        return JSONResponse(e.body(), e.status, headers=e.headers)

    app.add_exception_handler(ApiError, lambda _r, e: reply(e))
    app.add_exception_handler(RequestValidationError, lambda _r, e: reply(
        ApiError(f"invalid request: {e.errors()[:1]}")))
    app.add_exception_handler(HTTPException, lambda _r, e: reply(
        ApiError(str(e.detail), e.status_code, code="not_found" if e.status_code == 404
                 else None)))
    app.add_exception_handler(Exception, lambda _r, e: reply(
        ApiError(f"internal error: {type(e).__name__}", 500, "server_error")))


def _check_model(name: str, names: set) -> None:
    if name not in names:
        raise ApiError(f"the model {name!r} does not exist (this server has "
                       f"{', '.join(sorted(names))})", 404, param="model",
                       code="model_not_found")


def _prompt_ids(lm, prompt: Union[str, List[int]]) -> List[int]:
    if isinstance(prompt, str):
        return lm.tokenizer.encode(prompt)
    bad = [t for t in prompt if not 0 <= t < lm.vocab]
    if bad:
        raise ApiError(f"token id {bad[0]} is outside the vocabulary [0, {lm.vocab})",
                       param="prompt", code="invalid_value")
    return list(prompt)


def _max_tokens(req, n_prompt: int, context: int) -> int:
    """The request's ``max_tokens``; when absent, OpenAI's 16 for a completion and the rest of
    the context for a chat, cut to what the context leaves. A prompt that leaves no room, or a
    ``max_tokens`` past the context, is a 400."""
    room = context - n_prompt
    if n_prompt == 0:
        raise ApiError("the prompt is empty", param="prompt", code="invalid_value")
    if room < 1 or req.max_tokens is not None and req.max_tokens > room:
        asked = n_prompt + (req.max_tokens or 1)
        raise ApiError(f"this model's maximum context length is {context} tokens; the request "
                       f"asks for {asked} ({n_prompt} in the prompt, {asked - n_prompt} for the "
                       f"completion)", param="messages" if isinstance(
                           req, ChatCompletionRequest) else "prompt",
                       code="context_length_exceeded")
    if req.max_tokens is not None:
        return req.max_tokens
    return room if isinstance(req, ChatCompletionRequest) else min(16, room)


async def _answer(request: Request, engine: Engine, lm, req, ids: List[int],
                  reply: Reply) -> Response:
    params = generation_params(req, _max_tokens(req, len(ids), lm.max_seq_len))
    if params.min_tokens > params.max_tokens:
        raise ApiError(f"min_tokens ({params.min_tokens}) is more than max_tokens "
                       f"({params.max_tokens})", param="min_tokens", code="invalid_value")
    try:
        job = engine.submit(ids, params)
    except QueueFull as e:
        raise ApiError(f"the server is busy: {e}; try again later", 429, "rate_limit_error",
                       code="queue_full", headers={"Retry-After": "1"}) from None
    except EngineClosed as e:
        raise ApiError(str(e), 503, "server_error", code="shutting_down") from None
    reply.request_id = job.id
    if req.stream:
        usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(_events(job, reply, usage), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache",
                                          "X-Request-Id": job.id})
    text, finish, usage_, timings = await _collect(job, request)
    if finish is None:  # the client left: nobody reads this
        return Response(status_code=499)
    return JSONResponse(reply.whole(text, finish, usage_, timings),
                        headers={"X-Request-Id": job.id})


async def _collect(job: Job, request: Request) -> Tuple[str, Optional[str], dict, dict]:
    """A non-streaming request's text, finish reason, usage and timings (finish None: the
    client disconnected, and the job was cancelled)."""
    parts: List[str] = []
    try:
        while True:
            try:
                event = await asyncio.wait_for(job.events.get(), _DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    return "", None, {}, {}
                continue
            if event.kind == "text":
                parts.append(event.text)
            elif event.kind == "done":
                return "".join(parts), event.finish_reason, event.usage, event.timings
            else:
                raise ApiError(event.message, 500, "server_error")
    finally:
        job.cancel()  # a finished job ignores it; a running one stops at its next token


async def _events(job: Job, reply: Reply, include_usage: bool) -> AsyncIterator[str]:
    """The SSE stream: text chunks, a last chunk with the finish reason and the timings, the
    usage chunk when asked for, ``[DONE]``; an error as an ``error`` event. The client going
    away cancels this generator (Starlette), which cancels the job."""
    try:
        if reply.chat:
            yield reply.chunk("", first=True)
        while True:
            event = await job.events.get()
            if event.kind == "text":
                if event.text:
                    yield reply.chunk(event.text)
            elif event.kind == "done":
                yield reply.chunk(None if reply.chat else "", event.finish_reason,
                                  timings=event.timings)
                if include_usage:
                    yield reply.usage_chunk(event.usage)
                break
            else:
                yield sse(ApiError(event.message, 500, "server_error").body())
                break
        yield DONE
    finally:
        job.cancel()
