"""A decision call sent to a server of either protocol (plain Python, urllib through the
DSL's RemoteBackend: its retries on 503 and errors naming the server):

    DecisionServer("http://host:30000")                       # OpenAI's /v1/decisions
    DecisionServer("https://api.typesafe.ai", protocol="systemone", api_key="...")

The call becomes the protocol's request (the state as OpenAI's messages / System One's
state text, the questions in its types) and each answer comes back as a QuestionResult
in the question's option order. Our extensions (debias, calibrate) are sent only when
set, so a server that does not know them is asked nothing it would refuse.
"""

from __future__ import annotations

import asyncio

from prefillonly_sgl.decisions.call import DecisionCall, Question, QuestionResult
from prefillonly_sgl.scoring.call_context import salt_fields
from prefillonly_sgl.scoring.errors import InvalidRequestError

PROTOCOLS = ("openai", "systemone")


class DecisionServer:
    def __init__(
        self,
        url: str,
        protocol: str = "openai",
        model: str = "default",
        api_key: str | None = None,
        timeout: float = 600.0,
    ) -> None:
        if protocol not in PROTOCOLS:
            raise InvalidRequestError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
        from prefillonly_sgl.dsl.backends.remote import RemoteBackend

        # the key lives in the HTTP client only (sent on every call, never shown)
        self.url, self.protocol, self.model = url.rstrip("/"), protocol, model
        self._http = RemoteBackend(self.url, timeout=timeout, api_key=api_key)

    def body(self, call: DecisionCall) -> dict:
        extras = {}
        if call.debias != "none":
            extras["debias"] = call.debias
        if call.calibrate:
            extras["calibrate"] = True
        if self.protocol == "openai":
            questions = [_openai_question(q) for q in call.questions]
            return {
                "model": self.model,
                "input": _openai_input(call),
                "questions": questions,
                **extras,
            }
        asked = {_key(i, q): _systemone_question(q) for i, q in enumerate(call.questions)}
        return {"model": self.model, "state": _state_text(call), "questions": asked, **extras}

    async def decide(
        self, call: DecisionCall, lora_path: str | None = None
    ) -> tuple[list[QuestionResult], dict]:
        """The call's answers and usage. The caller's cache salt (``with
        prefillonly.cache_salt(...)``) and the function's adapter go in the body where
        given (`cache_salt`, `lora_path`: fields our server takes on both paths)."""
        path = "/v1/decisions" if self.protocol == "openai" else "/v1/systemone"
        body = {**self.body(call), **salt_fields()}
        if lora_path is not None:
            body["lora_path"] = lora_path
        answer = await asyncio.to_thread(self._http.post, path, body)
        if self.protocol == "openai":
            answers = answer.get("answers") or []
            if len(answers) != len(call.questions):
                raise InvalidRequestError(
                    f"{self.url}{path}: {len(answers)} answers to {len(call.questions)} questions"
                )
            results = [_from_openai(q, a) for q, a in zip(call.questions, answers)]
        else:
            by_id = answer.get("answers") or {}
            results = [
                _from_systemone(q, by_id.get(_key(i, q))) for i, q in enumerate(call.questions)
            ]
        return results, answer.get("usage") or {}

    def run(self, coroutine):
        return asyncio.run(coroutine)

    def __repr__(self) -> str:
        return f"DecisionServer({self.url!r}, protocol={self.protocol!r})"


def _openai_input(call: DecisionCall):
    if len(call.messages) == 1 and call.messages[0].role == "user":
        return call.messages[0].content
    return [{"role": m.role, "content": m.content} for m in call.messages]


def _state_text(call: DecisionCall) -> str:
    """System One's state is one text: the messages in order, non-user turns named."""
    if len(call.messages) == 1 and call.messages[0].role == "user":
        return call.messages[0].content
    names = {"system": "System: ", "assistant": "Assistant: ", "user": ""}
    return "\n\n".join(f"{names[m.role]}{m.content}" for m in call.messages)


def _key(i: int, q: Question) -> str:
    return q.name or str(i)


def _openai_question(q: Question) -> dict:
    out = {"type": q.kind, "instructions": q.instructions}
    if q.name:
        out["name"] = q.name
    if q.kind == "choice":
        out["choices"] = [_described({"value": _plain(o.value)}, o.description) for o in q.options]
    elif q.kind == "score":
        out["levels"] = [_described({"label": o.text}, o.description) for o in q.options]
    return out


def _systemone_question(q: Question) -> dict:
    out = {"type": {"predicate": "noul"}.get(q.kind, q.kind), "instructions": q.instructions}
    if q.kind == "choice":
        out["criteria"] = {o.text: o.description for o in q.options}
    elif q.kind == "score":
        out["criteria"] = [
            f"{o.text}: {o.description}" if o.description else o.text for o in q.options
        ]
    return out


def _described(entry: dict, description: str | None) -> dict:
    return {**entry, "description": description} if description else entry


def _plain(value):
    return value if isinstance(value, str | bool) else str(getattr(value, "value", value))


def _result(q: Question, probabilities: list[float], answer: dict) -> QuestionResult:
    total = sum(probabilities)
    if total > 0:
        probabilities = [p / total for p in probabilities]
    mass = answer.get("label_mass", answer.get("x_label_mass"))
    return QuestionResult(
        question=q,
        probabilities=tuple(probabilities),
        label_mass=float(mass) if mass is not None else float("nan"),
        confidence=float(answer.get("confidence", max(probabilities) if probabilities else 0.0)),
    )


def _refused(q: Question, reason: str) -> QuestionResult:
    n = len(q.options)
    return QuestionResult(q, tuple([1.0 / n] * n), float("nan"), 0.0, refusal=reason)


def _from_openai(q: Question, a: dict) -> QuestionResult:
    if a.get("type") == "refusal":
        return _refused(q, a.get("reason") or "the server refused this question")
    if q.kind == "predicate":
        p = float(a["probability"])
        return _result(q, [p, 1 - p], a)
    listed = a.get("probabilities") or []
    if q.kind == "choice":
        by_value = {(type(x["value"]), x["value"]): x["probability"] for x in listed}
        probs = [by_value.get((type(_plain(o.value)), _plain(o.value)), 0.0) for o in q.options]
    else:
        by_index = {x["value"]: x["probability"] for x in listed}
        probs = [by_index.get(k, 0.0) for k in range(len(q.options))]
    return _result(q, probs, a)


def _from_systemone(q: Question, a: dict | None) -> QuestionResult:
    if not a or a.get("type") not in ("noul", "choice", "score"):
        return _refused(q, (a or {}).get("reason") or "the server gave no answer to this question")
    if q.kind == "predicate":
        p = float(a["noul"])
        return _result(q, [p, 1 - p], a)
    listed = a.get("probabilities") or {}
    if q.kind == "choice":
        probs = [listed.get(o.text, 0.0) for o in q.options]
    else:
        probs = [listed.get(str(k), 0.0) for k in range(len(q.options))]
    return _result(q, probs, a)
