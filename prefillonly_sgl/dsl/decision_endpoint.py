"""Decision functions served by `prefillonly serve --app FILE` (plain Python; the server's
context runs the call):

    POST /decisions/<name>   the function's arguments -> {value, probabilities,
                             confidence, label_mass}   (its typed endpoint)
    POST /v1/decisions, /v1/systemone with "model": "<name>" and no questions: the
        function's questions about the state it renders from the request's input
        (OpenAI's `input` text, System One's `state`: text for a one-parameter
        function, an object of arguments otherwise), answered in that protocol's shape.
"""

from __future__ import annotations

from pydantic import BaseModel, create_model

from prefillonly_sgl.scoring.errors import InvalidRequestError
from prefillonly_sgl.server.endpoints import EndpointSpec


def decision_function_endpoint(function) -> EndpointSpec:
    answer_model = results_model(function)

    async def handler(request, context):
        call = function.call(**request.model_dump())
        outcome = await context.decide(call, lora_path=function.lora_path)
        decided = function.decided(outcome.results)
        return answer_model(
            value=decided.value,
            probabilities={
                k: {str(v): p for v, p in a.probabilities.items()}
                for k, a in decided.answers.items()
            },
            confidence={k: a.confidence for k, a in decided.answers.items()},
            label_mass={k: a.label_mass for k, a in decided.answers.items()},
        )

    return EndpointSpec(
        function.path,
        function.inputs.model,
        answer_model,
        handler,
        summary=f"Decision function {function.name}: {', '.join(f.name for f in function.fields)}",
        tags=("apps",),
    )


def arguments_from(function, given, field: str) -> dict:
    """The function's arguments from a decision request's input / state."""
    params = function.inputs.params
    if isinstance(given, dict):
        return given
    if isinstance(given, str) and len(params) == 1:
        return {params[0]: given}
    raise InvalidRequestError(
        f"{field}: {function.name} takes {params}: give them as an object"
        + (" (System One's state)" if len(params) != 1 else "")
    )


def results_model(function) -> type[BaseModel]:
    """The typed endpoint's answer: the value and each field's probabilities."""
    return create_model(
        f"{function.name}_decision",
        value=(function.model, ...),
        probabilities=(dict[str, dict[str, float]], ...),
        confidence=(dict[str, float], ...),
        label_mass=(dict[str, float], ...),
    )
