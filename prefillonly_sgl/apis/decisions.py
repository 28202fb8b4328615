"""POST /v1/decisions (OpenAI's shape, or SGLang's own body on the same path) and POST
/v1/systemone (System One's): typed questions about a state, every question an item
behind the state computed once (decisions/; the server's ScoringFront.decide).

The handlers parse the body themselves (EndpointSpec.raw_body): /v1/decisions takes two
shapes, told apart by the body (decisions/sglang_wire.is_sglang_body), and every
refusal names the field. Errors go out in OpenAI's shape (`{"error": {...}}`), which the
openai client and System One's both read.
"""

from __future__ import annotations

from prefillonly_sgl.decisions import openai_wire, sglang_wire, systemone_wire
from prefillonly_sgl.decisions.bodies import parse
from prefillonly_sgl.server.endpoints import EndpointSpec


async def decisions(body: object, context) -> object:
    """Answer OpenAI's /v1/decisions request (or SGLang's own body, in its shape)."""
    if sglang_wire.is_sglang_body(body):
        request = parse(sglang_wire.SGLangDecisionRequest, body)
        outcome = await context.decide(sglang_wire.to_call(request))
        return sglang_wire.to_response(request, outcome)
    request = parse(openai_wire.DecisionsRequest, body)
    outcome = await context.decide(openai_wire.to_call(request))
    return openai_wire.to_response(request.model, outcome)


async def systemone(body: object, context) -> object:
    """Answer System One's request."""
    request = parse(systemone_wire.SystemOneRequest, body)
    outcome = await context.decide(systemone_wire.to_call(request))
    return systemone_wire.to_response(request, outcome)


def _questions_in(body: dict) -> int:
    questions = body.get("questions")
    return len(questions) if isinstance(questions, list | dict) else 1


def decision_endpoints() -> list[EndpointSpec]:
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
            decisions,
            summary="Typed decisions (OpenAI's /v1/decisions; SGLang's body too)",
            **common,
        ),
        EndpointSpec(
            "/v1/systemone",
            systemone_wire.SystemOneRequest,
            systemone_wire.SystemOneRequest,
            systemone,
            summary="Typed decisions (System One's /v1/systemone)",
            **common,
        ),
    ]
