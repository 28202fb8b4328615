"""POST /v1/decisions (OpenAI's shape, or SGLang's own body on the same path) and POST
/v1/systemone (System One's): typed questions about a state, every question an item
behind the state computed once (decisions/; the server's ScoringFront.decide).

The handlers parse the body themselves (EndpointSpec.raw_body): /v1/decisions takes two
shapes, told apart by the body (wire/sglang.is_sglang_body), and every
refusal names the field. Errors go out in OpenAI's shape (`{"error": {...}}`), which the
openai client and System One's both read. A request whose `model` names a decision
function of the `--app` modules and that brings no questions asks that function's
questions (dsl/decision_endpoint.py). On a decision checkpoint (decisions/checkpoints.py)
/v1/systemone is SGLang's own handler and /v1/decisions refuses, as SGLang's does.
"""

from __future__ import annotations

from prefillonly_sgl.decisions.bodies import parse
from prefillonly_sgl.decisions.checkpoints import DECISIONS_REFUSAL
from prefillonly_sgl.dsl.decision import DecisionFunction
from prefillonly_sgl.dsl.decision_endpoint import arguments_from
from prefillonly_sgl.scoring.errors import InvalidRequestError
from prefillonly_sgl.server.endpoints import EndpointSpec, load_app_module
from prefillonly_sgl.wire import openai as openai_wire
from prefillonly_sgl.wire import sglang as sglang_wire
from prefillonly_sgl.wire import systemone as systemone_wire


def _served(body: object, functions: dict[str, DecisionFunction]) -> DecisionFunction | None:
    if isinstance(body, dict) and not body.get("questions"):
        model = body.get("model")  # any JSON: only a name can name a function
        return functions.get(model) if isinstance(model, str) else None
    return None


def decisions_handler(functions: dict[str, DecisionFunction]):
    async def decisions(body: object, context) -> object:
        """Answer OpenAI's /v1/decisions request (or SGLang's own body, in its shape)."""
        if context.decision_readout.is_checkpoint:
            raise InvalidRequestError(DECISIONS_REFUSAL)
        function = _served(body, functions)
        if function is not None:
            call = function.call(**arguments_from(function, body.get("input"), "input"))
            return openai_wire.to_response(function.name, await context.decide(call))
        if sglang_wire.is_sglang_body(body):
            request = parse(sglang_wire.SGLangDecisionRequest, body)
            outcome = await context.decide(sglang_wire.to_call(request))
            return sglang_wire.to_response(request, outcome)
        request = parse(openai_wire.DecisionsRequest, body)
        outcome = await context.decide(openai_wire.to_call(request))
        return openai_wire.to_response(request.model, outcome)

    return decisions


def systemone_handler(functions: dict[str, DecisionFunction], conventions: str = "systemone"):
    async def systemone(body: object, context) -> object:
        """Answer System One's request (vLLM's answer with ``conventions="vllm"``); on a
        decision checkpoint, SGLang's own answer (its readout, prompt and temperature)."""
        if context.decision_readout.is_checkpoint:
            return await context.systemone_on_checkpoint(body)
        function = _served(body, functions)
        if function is not None:
            call = function.call(**arguments_from(function, body.get("state"), "state"))
            outcome = await context.decide(call)
            return systemone_wire.to_response(function.name, outcome, None, conventions)
        request = parse(systemone_wire.SystemOneRequest, body)
        outcome = await context.decide(systemone_wire.to_call(request, conventions))
        return systemone_wire.to_response(request.model, outcome, request, conventions)

    return systemone


def _questions_in(body: dict) -> int:
    questions = body.get("questions")
    return len(questions) if isinstance(questions, list | dict) else 1


def served_functions(modules) -> dict[str, DecisionFunction]:
    """The decision functions of the --app modules, by name."""
    found = {}
    for module in modules:
        for value in vars(module).values():
            if isinstance(value, DecisionFunction):
                found[value.name] = value
    return found


def decision_endpoints(
    apps: list[str] = (), systemone_conventions: str = "systemone"
) -> list[EndpointSpec]:
    """The two routes; the decision functions of the ``apps`` modules are served on them
    by name (their own typed endpoints come with the --app endpoints).
    ``systemone_conventions``: System One's answer on /v1/systemone, or vLLM's."""
    functions = served_functions(load_app_module(app) for app in apps)
    common = dict(
        tags=("decisions",),
        count_prompts=_questions_in,
        raw_body=True,
        error_shape="openai",
    )
    return [
        EndpointSpec(
            "/v1/decisions",
            openai_wire.DecisionsRequest,
            openai_wire.Decision,
            decisions_handler(functions),
            summary="Typed decisions (OpenAI's /v1/decisions; SGLang's body too)",
            **common,
        ),
        EndpointSpec(
            "/v1/systemone",
            systemone_wire.SystemOneRequest,
            systemone_wire.SystemOneResponse,
            systemone_handler(functions, systemone_conventions),
            summary="Typed decisions (System One's /v1/systemone)",
            **common,
        ),
    ]
