"""The OpenAI request bodies the server takes (``/v1/completions``, ``/v1/chat/completions``),
checked strictly (a string where a number belongs is an error, not coerced), what a checked
request asks the engine for (``GenerationParams``), and the OpenAI-style error every bad input
becomes (``ApiError``: 400 with ``{"error": {"message", "type", "param", "code"}}``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Literal, Optional, Tuple, Type, TypeVar, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, \
    StrictStr, ValidationError

MAX_STOP_STRINGS = 16


class ApiError(Exception):
    """A request the server answers with ``status`` and an OpenAI-style error body."""

    def __init__(self, message: str, status: int = 400, type: str = "invalid_request_error",
                 param: Optional[str] = None, code: Optional[str] = None,
                 headers: Optional[Dict[str, str]] = None):
        super().__init__(message)
        self.message, self.status, self.type, self.param, self.code = \
            message, status, type, param, code
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


class StreamOptions(BaseModel):
    include_usage: StrictBool = False


class _Request(BaseModel):
    """The fields both endpoints share. Unknown fields are ignored (clients send their own);
    fields for features this server lacks are an error when they ask for something."""

    model_config = ConfigDict(extra="ignore")

    model: StrictStr
    max_tokens: Optional[StrictInt] = Field(None, ge=1)
    temperature: Optional[StrictFloat] = Field(None, ge=0.0, le=2.0)
    top_p: Optional[StrictFloat] = Field(None, gt=0.0, le=1.0)
    top_k: Optional[StrictInt] = Field(None, ge=-1)  # extension (vLLM's): 0 or -1 is off
    seed: Optional[StrictInt] = None
    stop: Union[None, StrictStr, List[StrictStr]] = Field(None)
    stream: StrictBool = False
    stream_options: Optional[StreamOptions] = None
    n: StrictInt = Field(1, ge=1, le=1)  # one sequence a request
    ignore_eos: StrictBool = False  # extension: generate past the eos token
    min_tokens: StrictInt = Field(0, ge=0)  # extension: no eos / stop string before this many
    presence_penalty: Optional[StrictFloat] = None  # only 0: no penalties here
    frequency_penalty: Optional[StrictFloat] = None
    logprobs: Union[None, StrictBool, StrictInt] = None
    user: Optional[StrictStr] = None


class CompletionRequest(_Request):
    """``prompt``: a string or a list of token ids (or a list holding one of either)."""

    prompt: Union[StrictStr, List[StrictInt], List[StrictStr], List[List[StrictInt]]]
    echo: StrictBool = False
    suffix: Optional[StrictStr] = None


class TextPart(BaseModel):
    type: Literal["text"]
    text: StrictStr


class ChatMessage(BaseModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[StrictStr, List[TextPart], None] = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class ChatCompletionRequest(_Request):
    messages: List[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[StrictInt] = Field(None, ge=1)


@dataclass(frozen=True)
class GenerationParams:
    """What a checked request asks of the engine: ``CausalLM.stream_text``'s options."""

    max_tokens: int
    stop: Tuple[str, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: Optional[int] = None

    def stream_options(self) -> dict:
        return dict(stop=self.stop, ignore_eos=self.ignore_eos, min_tokens=self.min_tokens,
                    do_sample=self.do_sample, temperature=self.temperature, top_p=self.top_p,
                    top_k=self.top_k, seed=self.seed)


R = TypeVar("R", bound=_Request)


def parse_request(cls: Type[R], body: bytes) -> R:
    """``body`` as ``cls``, every field checked; the first problem is a 400 ``ApiError`` that
    names the field (``param``)."""
    try:
        req = cls.model_validate_json(body)
    except ValidationError as e:
        raise _as_api_error(e) from None
    if isinstance(req, CompletionRequest):
        if req.echo:
            raise ApiError("echo is not supported", param="echo", code="unsupported")
        if req.suffix:
            raise ApiError("suffix is not supported", param="suffix", code="unsupported")
    if req.logprobs not in (None, False, 0):
        raise ApiError("logprobs are not supported", param="logprobs", code="unsupported")
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(req, name):
            raise ApiError(f"{name} is not supported (only 0)", param=name, code="unsupported")
    if isinstance(req.stop, list) and len(req.stop) > MAX_STOP_STRINGS:
        raise ApiError(f"at most {MAX_STOP_STRINGS} stop strings", param="stop")
    return req


def single_prompt(req: CompletionRequest) -> Union[str, List[int]]:
    """The one prompt of a completion request (a batch of several is an error)."""
    p = req.prompt
    if isinstance(p, list) and p and isinstance(p[0], (str, list)):
        if len(p) != 1:
            raise ApiError("one prompt a request (this server does not batch prompts)",
                           param="prompt", code="unsupported")
        p = p[0]
    return p


def generation_params(req: _Request, max_tokens: int) -> GenerationParams:
    """The sampling options: temperature 0 is greedy; OpenAI's defaults (temperature 1,
    top_p 1, no top-k) otherwise."""
    temperature = 1.0 if req.temperature is None else req.temperature
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    return GenerationParams(max_tokens=max_tokens, stop=tuple(s for s in stop if s),
                            ignore_eos=req.ignore_eos, min_tokens=req.min_tokens,
                            do_sample=temperature > 0, temperature=temperature or 1.0,
                            top_p=1.0 if req.top_p is None else req.top_p,
                            top_k=max(0, req.top_k or 0), seed=req.seed)


# the names pydantic puts in an error's location for the member of a union that failed
_TYPE_LABELS = {"str", "int", "float", "bool", "list", "none", "TextPart"}


def _as_api_error(err: ValidationError) -> ApiError:
    first = err.errors(include_url=False)[0]
    kind, loc = first["type"], [str(x) for x in first["loc"]]
    if kind == "json_invalid":
        return ApiError(f"the body is not valid JSON: {first['msg']}", code="invalid_json")
    if not loc:
        return ApiError("the body must be a JSON object", code="invalid_type")
    param = loc[0]
    where = ".".join(x for x in loc if x not in _TYPE_LABELS and "[" not in x)
    return ApiError(f"{where}: {first['msg']}", param=param,
                    code="missing" if kind == "missing" else
                    "invalid_type" if kind.endswith("_type") else "invalid_value")
