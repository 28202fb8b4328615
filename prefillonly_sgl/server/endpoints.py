"""Typed JSON endpoints added to the server: the extension point behind `serve --app`.

An endpoint is an EndpointSpec: a path, a pydantic request model, a pydantic response
model and an async handler(request, context) -> response (a plain function works too).
The server registers each as `POST path` on SGLang's FastAPI app, so the request and
response schemas appear in /openapi.json, malformed bodies get a 400 naming the field,
and the request goes through the same admission control, disconnect handling and usage
reporting as /v1/score.

`serve --app X` imports X (a module name or a .py file) and collects, in definition order,
every module-level object that is
  - an EndpointSpec, or
  - an object with a method `__prefillonly_endpoint__()` returning an EndpointSpec or an
    iterable of them (the protocol a DSL classifier/ranker implements), or
  - a list/tuple named PREFILLONLY_ENDPOINTS of either of the above.
Classes themselves are skipped (only their instances are endpoints). Two endpoints on one
path are an error at start-up.

The handler's context (ServerContext) is the running server: `await context.score(...)`
scores with the same validation as /v1/score; `context.tokenizer`, `context.limits` and
`context.usage` (this request's RequestUsage so far) are there too, and
`context.tokenizer_manager` is SGLang's TokenizerManager for anything else. Handlers raise
prefillonly_sgl.scoring.errors.InvalidRequestError (-> 400) for bad input.

    from pydantic import BaseModel
    from prefillonly_sgl.server.endpoints import EndpointSpec

    class Review(BaseModel):
        text: str

    class Sentiment(BaseModel):
        positive: float

    async def sentiment(request: Review, context) -> Sentiment:
        yes, no = (context.tokenizer.encode(w, add_special_tokens=False)[0]
                   for w in (" positive", " negative"))
        result = await context.score(f"Review: {request.text}\\nSentiment:", [""],
                                     [yes, no])  # one item: the query alone
        return Sentiment(positive=result.scores[0][0])

    SENTIMENT = EndpointSpec("/classify/sentiment", Review, Sentiment, sentiment)
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

ENDPOINT_PROTOCOL = "__prefillonly_endpoint__"
ENDPOINT_LIST_NAME = "PREFILLONLY_ENDPOINTS"


class ServerContext(Protocol):
    """What an endpoint handler gets (implemented in sglang_runtime/http_server/)."""

    @property
    def tokenizer(self) -> Any: ...  # the Hugging Face tokenizer SGLang uses

    @property
    def limits(self) -> Any: ...  # prefillonly_sgl.scoring.validation.ModelLimits

    @property
    def usage(self) -> Any: ...  # prefillonly_sgl.scoring.usage.RequestUsage or None

    @property
    def tokenizer_manager(self) -> Any: ...  # SGLang's TokenizerManager (escape hatch)

    @property
    def class_head(self) -> Any: ...  # scoring/class_head.ClassHead of a head model, or None

    @property
    def image_placeholder(self) -> Any: ...  # scoring/image_prompts.ImagePlaceholder; None: text

    @property
    def image_refusal(self) -> str | None: ...  # why this engine refuses images, or None

    async def score(
        self,
        query: Any,
        items: Any,
        label_token_ids: list | None = None,  # per label a token id or ids; None: a head's
        apply_softmax: bool = True,
        item_first: bool = False,
        length_normalize: bool = False,
        score_extraction_token: str | int | None = None,  # the setwise readout
        temperature: float = 1.0,  # with apply_softmax (scoring/score_options.py)
        lora_path: str | None = None,  # the LoRA adapter (scoring/adapters.py)
        images: Any = None,  # a VLM: the query's images, URLs or data URLs (docs/images.md)
        item_images: Any = None,  # per item, its own
    ) -> Any: ...  # prefillonly_sgl.scoring.score_result.ScoreResult

    async def continuation_logprobs(
        self, query: Any, items: Any, continuation: Any, lora_path: str | None = None
    ) -> Any: ...  # prefillonly_sgl.scoring.continuations.ContinuationResult

    async def decide(
        self, call: Any, lora_path: str | None = None
    ) -> Any: ...  # decisions.call: DecisionCall -> DecisionOutcome

    async def moderate(
        self, call: Any, lora_path: str | None = None
    ) -> Any: ...  # moderation.moderation_call.ModerationCall -> moderation_calls.ModerationOutcome


@dataclass(frozen=True)
class EndpointSpec:
    """One typed endpoint: `POST path` with body `request_model`, answering
    `response_model` (or a dict of its fields).

    count_prompts(body_json) -> int: how many prompts a request costs for admission control
        (default 1); it gets the raw JSON object, before validation.
    check_tokenizer(tokenizer): called before SGLang starts, with the tokenizer the server
        will use; raising refuses the start in seconds, not after the engine's (the DSL's
        endpoints check that their labels can be scored).
    on_startup(context): called once when the server is ready (e.g. to turn label words
        into token ids and fail at start-up if one cannot be scored).
    raw_body: the handler gets the JSON object itself (a path that takes more than one
        body shape parses it; `request_model` then only documents the main shape) and its
        answer goes out as it returns it (a dict or a pydantic model).
    error_shape: "sglang" (SGLang's error object), "openai" ({"error": {...}}, what
        OpenAI's clients read) or "vllm" (the same envelope, SGLang's / vLLM's type names):
        the shape of this path's 4xx/5xx bodies.
    claims(body_json) -> bool: another peer's shape on a path SGLang already serves
        (/v1/score: vLLM's beside SGLang's): this spec (raw_body) answers the bodies it
        claims, SGLang's route every other one; its checks, count_prompts, apply to the
        claimed bodies only. Decided by the body alone (docs/server.md, "Peer conventions
        on one path").
    auth_level: who may call it with --api-key / --admin-api-key set, as SGLang's routes
        declare it (server/auth.py; docs/server.md, "Keys"): "normal" (the API key, or the
        admin key), "admin_optional" (the admin key when one is set, else the API key) or
        "admin_force" (the admin key only).
    """

    path: str
    request_model: type
    response_model: type
    handler: Callable[[Any, ServerContext], Awaitable[Any] | Any]
    summary: str | None = None
    description: str | None = None
    tags: Sequence[str] = ("apps",)
    count_prompts: Callable[[dict], int] | None = None
    on_startup: Callable[[ServerContext], Any] | None = None
    check_tokenizer: Callable[[Any], None] | None = None
    raw_body: bool = False
    error_shape: str = "sglang"
    claims: Callable[[object], bool] | None = None
    auth_level: str = "normal"

    def __post_init__(self) -> None:
        from pydantic import BaseModel

        from prefillonly_sgl.server.auth import LEVELS

        if self.auth_level not in LEVELS:
            raise ValueError(f"{self.path}: auth_level must be one of {LEVELS}")

        if not self.path.startswith("/") or " " in self.path:
            raise ValueError(f"endpoint path must start with '/': {self.path!r}")
        for name in ("request_model", "response_model"):
            model = getattr(self, name)
            if not (isinstance(model, type) and issubclass(model, BaseModel)):
                raise TypeError(f"{self.path}: {name} must be a pydantic BaseModel subclass")
        if not callable(self.handler):
            raise TypeError(f"{self.path}: handler must be callable (an async function)")
        if self.claims is not None and not self.raw_body:
            raise ValueError(f"{self.path}: a spec that claims bodies parses them (raw_body)")


def endpoints_of(obj: object) -> list[EndpointSpec]:
    """The EndpointSpecs an object declares ([] if it declares none)."""
    if isinstance(obj, EndpointSpec):
        return [obj]
    if inspect.isclass(obj) or inspect.ismodule(obj):
        return []
    method = getattr(obj, ENDPOINT_PROTOCOL, None)
    if method is None or not callable(method):
        return []
    declared = method()
    specs = [declared] if isinstance(declared, EndpointSpec) else list(declared)
    for spec in specs:
        if not isinstance(spec, EndpointSpec):
            raise TypeError(
                f"{obj!r}.{ENDPOINT_PROTOCOL}() must return EndpointSpec objects, got {spec!r}"
            )
    return specs


def collect_endpoints(module: ModuleType) -> list[EndpointSpec]:
    specs: list[EndpointSpec] = []
    for name, obj in vars(module).items():
        if name == ENDPOINT_LIST_NAME and isinstance(obj, list | tuple):
            for entry in obj:
                specs += endpoints_of(entry)
        elif not name.startswith("__"):
            specs += endpoints_of(obj)
    unique: dict[int, EndpointSpec] = {}
    for spec in specs:  # the same object reachable under two names counts once
        unique.setdefault(id(spec), spec)
    return list(unique.values())


def load_app_module(target: str) -> ModuleType:
    """Imports `target`: a path to a .py file, or a module name (importable from the
    current directory too, like `python -m`)."""
    path = Path(target)
    if target.endswith(".py") or path.is_file():
        if not path.is_file():
            raise FileNotFoundError(f"--app {target}: no such file")
        name = f"prefillonly_app_{path.stem}"
        loaded = sys.modules.get(name)
        if loaded is not None and Path(getattr(loaded, "__file__", "")) == path.resolve():
            return loaded  # one module object per file: its DSL functions stay the same
        spec = importlib.util.spec_from_file_location(name, path.resolve())
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    return importlib.import_module(target)


def load_app_endpoints(targets: Iterable[str]) -> list[EndpointSpec]:
    specs: list[EndpointSpec] = []
    for target in targets:
        found = collect_endpoints(load_app_module(target))
        if not found:
            raise ValueError(
                f"--app {target}: declares no endpoints (expected EndpointSpec objects or "
                f"objects with a {ENDPOINT_PROTOCOL}() method at module level)"
            )
        specs += found
    check_unique_paths(specs)
    return specs


def check_unique_paths(specs: Iterable[EndpointSpec], taken: Iterable[str] = ()) -> None:
    """Two endpoints on one path are an error, except a spec that claims its bodies on a
    path SGLang serves (EndpointSpec.claims)."""
    taken = set(taken)
    seen = {path: "SGLang" for path in taken}
    for spec in specs:
        if spec.claims is not None and spec.path in taken:
            continue
        if spec.path in seen:
            raise ValueError(f"two endpoints on {spec.path} ({seen[spec.path]} and {spec!r})")
        seen[spec.path] = repr(spec.handler)
