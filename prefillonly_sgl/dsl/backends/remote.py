"""The DSL against a server: ``prefillonly serve`` or a stock ``python -m
sglang.launch_server`` (anything speaking SGLang's ``/v1/score``).

The backend also provides the tokenizer that label compilation and chat templates use: it
loads it with transformers' AutoTokenizer from ``tokenizer=`` (a folder or hub name the
client can read) or, by default, from the tokenizer path the server reports at
``/model_info``, which works when client and server share a file system (the same
machine, a shared volume); otherwise pass ``tokenizer=``.

When the server is ``prefillonly serve --app`` serving the called function itself
(``serves``: its /openapi.json lists the function's typed endpoint), a job goes to that
endpoint instead (app_client.py), and needs no tokenizer here. When ``base_url`` is
SGLang's model gateway (`smg`, found by its GET /readiness), which routes neither /v1/score
nor typed endpoints, a job goes through its /v1/rerank or /v1/classify
(gateway_client.py).

A likelihood ranker's continuations go to SGLang's native /generate (prompt and
continuation as token ids, no output token, input logprobs from the prompt's last
position: what sglang_runtime/continuation_logprobs.py sends in-process), which stock
SGLang serves too; on `prefillonly serve` each request also carries its reusable prefix.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from prefillonly_sgl.dsl import app_client, gateway_client
from prefillonly_sgl.dsl.backends.base import Backend
from prefillonly_sgl.dsl.head_route import HeadRoute
from prefillonly_sgl.dsl.request import ContinuationRequest, ScoreRequest
from prefillonly_sgl.dsl.request_sending import CompiledRoute, Route
from prefillonly_sgl.machine import environment
from prefillonly_sgl.scoring.call_context import salt_fields
from prefillonly_sgl.scoring.continuations import (
    generate_fields,
    plan_continuations,
    token_logprobs_of,
    tokenizer_encode,
)
from prefillonly_sgl.scoring.errors import InvalidRequestError, PrefillOnlyError
from prefillonly_sgl.scoring.images import load_image
from prefillonly_sgl.scoring.validation import ModelLimits
from prefillonly_sgl.wire.fields import request_body
from prefillonly_sgl.wire.prefillonly import ScoreLabelsRequest, ScoreLabelsResponse, ScoreUsage


class RemoteBackendError(PrefillOnlyError, RuntimeError):
    """The server could not be reached or failed on a valid request."""


class RemoteBackend(Backend):
    """A server at ``base_url`` (e.g. "http://127.0.0.1:30000") speaking ``/v1/score``.

    tokenizer: a tokenizer object, or a folder / name for AutoTokenizer; None: the
        server's tokenizer path from ``/model_info``, loaded on first use.
    timeout: seconds per HTTP request.
    unavailable_retries: how often a request answered 503 (an overloaded server, or a
        gateway with no replica to route to while one restarts) is sent again, after
        Retry-After or 1, 2, 4, ... s (at most 30 s); scoring is idempotent, so this is
        safe. 0: never.
    typed_endpoints: call a DSL function's own endpoint when the server has it
        (``prefillonly serve --app``, see app_client.py), or the standard route serving it
        behind a gateway (gateway_client.py); False: always /v1/score.
    api_key: sent as ``Authorization: Bearer`` on every call (a server started with
        ``--api-key`` or ``--tenant-keys``, a gateway in front of one); None: the
        PREFILLONLY_API_KEY environment variable, if set. Never shown in errors or repr.
    """

    def __init__(
        self,
        base_url: str,
        tokenizer: Any = None,
        timeout: float = 600.0,
        typed_endpoints: bool = True,
        unavailable_retries: int = 6,
        api_key: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key if api_key is not None else environment.read(environment.API_KEY)
        self.timeout = timeout
        self.unavailable_retries = unavailable_retries
        self.typed_endpoints = typed_endpoints
        self._tokenizer_source = tokenizer
        self._openapi: dict | None = None

    @functools.cached_property
    def tokenizer(self):
        source = self._tokenizer_source
        if source is not None and not isinstance(source, str | Path):
            return source
        if source is None:
            info = self._request("GET", "/model_info")
            source = info.get("tokenizer_path") or info.get("model_path")
            if not source or not Path(source).is_dir():
                raise RemoteBackendError(
                    f"the server at {self.base_url} serves {source!r}, which is not a folder "
                    f"on this machine; pass RemoteBackend(url, tokenizer=<folder or name>)"
                )
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(source))

    # -- where a function's jobs go (asked once per function: Backend.run) -------------
    @functools.cached_property
    def class_labels(self) -> tuple[str, ...] | None:
        """The classes of the server's classification head (its /server_info's
        prefillonly.class_head), or None: the model reads labels, or the server (stock
        SGLang, a gateway) does not say."""
        try:
            info = self._request("GET", "/server_info")
        except (InvalidRequestError, RemoteBackendError):
            return None
        ours = info.get("prefillonly") if isinstance(info, dict) else None
        head = ours.get("class_head") if isinstance(ours, dict) else None
        return tuple(head["labels"]) if isinstance(head, dict) else None

    async def choose_route(self, function) -> Route:
        """Its typed endpoint when the server serves it (``serves``), else the gateway's
        standard route when ``base_url`` is SGLang's gateway, else /v1/score (without
        labels on a server whose model has a classification head: head_route.py)."""
        if self.typed_endpoints:
            if await asyncio.to_thread(self.serves, function):  # reads /openapi.json once
                return app_client.EndpointRoute(self.post)
            if await asyncio.to_thread(lambda: self.is_gateway):
                model = await asyncio.to_thread(lambda: self.gateway_model)
                return gateway_client.GatewayRoute(self.post, model, self.count_usage)
        if not function.scores_continuation:
            labels = await asyncio.to_thread(lambda: self.class_labels)
            if labels is not None:
                return HeadRoute(self, function, labels)
        return CompiledRoute(self)

    def serves(self, function) -> bool:
        """Whether this server exposes ``function``'s typed endpoint, as declared here."""
        return app_client.schema_matches(function, self.endpoint_schema(function.path))

    @functools.cached_property
    def is_gateway(self) -> bool:
        """Whether ``base_url`` is SGLang's model gateway: it answers GET /readiness with
        its workers' count (a server answers 404 there). Not /workers: smg 1.13 opens that
        to its own --api-key only, and refuses the tenant keys it serves."""
        try:
            answer = self._request("GET", "/readiness")
        except InvalidRequestError:
            return False
        return isinstance(answer, dict) and "total_workers" in answer

    @functools.cached_property
    def gateway_model(self) -> str:
        """The model name the gateway registered its replicas under (its /v1/models)."""
        models = self._request("GET", "/v1/models").get("data") or []
        if not models:
            raise RemoteBackendError(f"the gateway at {self.base_url} has no worker yet")
        return models[0]["id"]

    # -- /v1/score ----------------------------------------------------------------------
    async def score(self, request: ScoreRequest) -> list[list[float]]:
        return await asyncio.to_thread(self._post_score, request)

    def _post_score(self, request: ScoreRequest) -> list[list[float]]:
        """The blocking HTTP call of ``score`` (run in a worker thread)."""
        if not request.one_token_labels or request.has_images:  # (and length_normalize)
            return self._score_labels(request)
        body = {
            "query": request.query,
            "items": list(request.items),
            "apply_softmax": request.apply_softmax,
            **salt_fields(),  # this thread runs in the call's context (asyncio.to_thread)
        }
        if request.label_token_ids:  # none: a classification head's request (head_route.py)
            body["label_token_ids"] = list(request.label_token_ids)
        body.update(request.sglang_fields())  # the setwise readout, temperature
        answer = self._request("POST", "/v1/score", body)
        usage = ScoreUsage.model_validate(answer.get("usage") or {})
        self.count_usage(usage.prompt_tokens, usage.cached_tokens)
        return answer["scores"]

    def _score_labels(self, request: ScoreRequest) -> list[list[float]]:
        """Labels of several tokens: prefillonly serve's /v1/score_labels with token ids;
        SGLang's /v1/score carries one token per label."""
        body = request_body(
            ScoreLabelsRequest,
            query=request.query,
            items=list(request.items),
            label_token_ids=list(request.label_token_ids),
            apply_softmax=request.apply_softmax,
            length_normalize=request.length_normalize,
            temperature=request.temperature,
            **salt_fields(),
        )
        if request.lora_path is not None:  # the guard takes it off (scoring/adapters.py)
            body["lora_path"] = request.lora_path
        if request.has_images:  # loaded here, sent as data URLs (the server reads no paths)
            body["image_data"] = [
                _data_url(v, f"images[{k}]") for k, v in enumerate(request.images)
            ]
            if request.item_images is not None:
                body["item_image_data"] = [
                    [_data_url(v, f"item_images[{i}][{k}]") for k, v in enumerate(own)]
                    for i, own in enumerate(request.item_images)
                ]
        try:
            answer = self._request("POST", "/v1/score_labels", body)
        except _NotFound:
            raise RemoteBackendError(
                f"{self.base_url} has no /v1/score_labels: labels of several tokens need a "
                "`prefillonly serve` server; SGLang's /v1/score scores one token per label"
            ) from None
        answer = ScoreLabelsResponse.model_validate(answer)
        if answer.usage is not None:
            self.count_usage(answer.usage.prompt_tokens, answer.usage.cached_tokens)
        return answer.rows

    # -- /generate (likelihood rankers) -------------------------------------------------
    async def continuation_logprobs(self, request: ContinuationRequest) -> list[list[float]]:
        return await asyncio.to_thread(self._post_continuations, request)

    def _post_continuations(self, request: ContinuationRequest) -> list[list[float]]:
        # The server checks the lengths and ids; here only the tokenization is done.
        limits = ModelLimits(vocab_size=len(self.tokenizer), max_prompt_tokens=2**62)
        plan = plan_continuations(
            request.query,
            list(request.items),
            list(request.continuations),
            limits,
            tokenizer_encode(self.tokenizer),
        )
        body = {**generate_fields(plan), **salt_fields()}
        if request.lora_path is not None:  # SGLang's /generate field
            body["lora_path"] = request.lora_path
        answer = self._request("POST", "/generate", body)
        answers = answer if isinstance(answer, list) else [answer]
        metas = [one["meta_info"] for one in answers]
        self.count_usage(
            sum(int(m.get("prompt_tokens") or 0) for m in metas),
            sum(int(m.get("cached_tokens") or 0) for m in metas),
        )
        return [
            token_logprobs_of(meta["input_token_logprobs"], length)
            for meta, length in zip(metas, plan.continuation_lengths(), strict=True)
        ]

    # -- HTTP ---------------------------------------------------------------------------
    def endpoint_schema(self, path: str) -> dict | None:
        """The JSON schema of ``POST path``'s request body as the server's /openapi.json
        lists it (read once), or None: no such endpoint, no OpenAPI document there, or
        typed_endpoints=False."""
        if not self.typed_endpoints:
            return None
        if self._openapi is None:
            try:
                doc = self._request("GET", "/openapi.json")
            except InvalidRequestError:  # 404 and the like: a server without one
                doc = {}
            self._openapi = doc if isinstance(doc, dict) else {}
        operation = (self._openapi.get("paths") or {}).get(path, {}).get("post") or {}
        content = (operation.get("requestBody") or {}).get("content") or {}
        schema = (content.get("application/json") or {}).get("schema") or {}
        prefix = "#/components/schemas/"
        if schema.get("$ref", "").startswith(prefix):
            schemas = (self._openapi.get("components") or {}).get("schemas") or {}
            schema = schemas.get(schema["$ref"][len(prefix) :]) or {}
        return schema or None

    def post(self, path: str, body: dict, headers: dict | None = None) -> Any:
        """``POST path`` with a JSON body (and extra headers); the decoded JSON answer."""
        return self._request("POST", path, body, headers)

    def _request(
        self, method: str, path: str, body: dict | None = None, headers: dict | None = None
    ) -> dict:
        for attempt in range(self.unavailable_retries + 1):
            try:
                return self._request_once(method, path, body, headers)
            except _Unavailable as e:
                if attempt == self.unavailable_retries:
                    raise RemoteBackendError(
                        f"{self.base_url}{path}: HTTP 503 after {attempt + 1} tries: {e.message}"
                    ) from None
                wait = 2.0**attempt if e.retry_after is None else e.retry_after
                time.sleep(min(30.0, wait))
        raise AssertionError("unreachable")

    def _request_once(self, method: str, path: str, body, headers) -> dict:
        data = None if body is None else json.dumps(body).encode()
        sent = {"Content-Type": "application/json", **(headers or {})}
        if self._api_key and not any(k.lower() == "authorization" for k in sent):
            sent["Authorization"] = f"Bearer {self._api_key}"
        req = urllib.request.Request(self.base_url + path, data=data, method=method, headers=sent)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as e:
            message = _error_message(e)
            if e.code in (401, 403):
                sent_key = "Authorization" in sent
                raise _refused(self.base_url + path, e.code, message, sent_key) from None
            if e.code == 503:
                raise _Unavailable(message, _retry_after(e)) from None
            if e.code == 404:
                raise _NotFound(f"{self.base_url}{path}: {message}") from None
            if 400 <= e.code < 500:
                raise InvalidRequestError(f"{self.base_url}{path}: {message}") from None
            raise RemoteBackendError(f"{self.base_url}{path}: HTTP {e.code}: {message}") from None
        except (urllib.error.URLError, OSError) as e:
            raise RemoteBackendError(f"cannot reach {self.base_url}{path}: {e}") from None

    def __repr__(self) -> str:
        return f"RemoteBackend({self.base_url!r})"


class RemoteAuthenticationError(RemoteBackendError):
    """The server wants an API key this client did not send, or refused the one it sent."""


def _refused(where: str, code: int, message: str, sent_key: bool) -> RemoteAuthenticationError:
    if not sent_key:
        return RemoteAuthenticationError(
            f"{where}: the server wants an API key (HTTP {code}: {message}); pass "
            f"RemoteBackend(url, api_key=...) or set {environment.API_KEY}"
        )
    return RemoteAuthenticationError(
        f"{where}: the server refused this client's API key (HTTP {code}: {message}); "
        "the key is not shown"
    )


class _NotFound(InvalidRequestError):
    """HTTP 404: no such endpoint on this server (callers that can say more catch it)."""


class _Unavailable(Exception):
    def __init__(self, message: str, retry_after: float | None) -> None:
        self.message, self.retry_after = message, retry_after


def _retry_after(error: urllib.error.HTTPError) -> float | None:
    try:
        return float(error.headers.get("Retry-After"))
    except (TypeError, ValueError):
        return None


def _error_message(error: urllib.error.HTTPError) -> str:
    raw = error.read().decode(errors="replace")
    try:
        payload = json.loads(raw)
    except ValueError:
        return raw
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict) and error.get("message"):  # OpenAI's shape
        return str(error["message"])
    return str(payload.get("message") or payload.get("detail") or payload)


def _data_url(value, where: str) -> str:
    """An image (a path, URL, data URL, bytes or PIL image) as a data URL: a URL stays one
    (the server fetches it), anything else is loaded here."""
    if isinstance(value, str) and value.startswith(("http://", "https://", "data:")):
        return value
    data = load_image(value, where, allow_paths=True)
    return "data:image/png;base64," + base64.b64encode(data).decode()
