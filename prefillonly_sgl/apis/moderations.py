"""POST /v1/moderations (OpenAI's shape, wire/openai_moderation.py): each input checked by
the served guard model, every category's probability read off the prefill (moderation/;
the server's ScoringFront through sglang_runtime/moderation_calls.py).

The handler parses the body itself (EndpointSpec.raw_body) so every refusal names its
field in OpenAI's error shape, which the openai client reads. The body's `model` is echoed
(the served model's name when absent); one that names a loaded LoRA adapter runs under it
(the guard's model_adapter_paths), as on OpenAI's other doors.
"""

from __future__ import annotations

from prefillonly_sgl.decisions.bodies import parse
from prefillonly_sgl.moderation.moderation_call import ModerationCall
from prefillonly_sgl.server.endpoints import EndpointSpec
from prefillonly_sgl.wire import openai_moderation as wire


def moderations_handler(guard: str | None = None):
    """guard: the server's guard family (`serve --guard`), where a request names none."""

    async def moderations(body: object, context) -> object:
        """Answer OpenAI's /v1/moderations request."""
        request = parse(wire.ModerationRequest, body)
        call = ModerationCall.of(
            request.input,
            request.policies,
            request.categories,
            request.guard or guard,
            request.threshold,
        )
        outcome = await context.moderate(call)
        served = getattr(context.tokenizer_manager, "served_model_name", None)
        return wire.to_response(request.model or served or "", outcome)

    return moderations


def _prompts_in(body: dict) -> int:
    """Prompts a request costs: each input once per policy (a guard's categories are one
    prompt per input, but for Granite Guardian's risks, told only once the model is)."""
    value = body.get("input")
    many = isinstance(value, list) and value and not isinstance(value[0], dict)
    policies = body.get("policies")
    return (len(value) if many else 1) * max(1, len(policies) if isinstance(policies, list) else 1)


def moderation_endpoint(guard: str | None = None) -> EndpointSpec:
    return EndpointSpec(
        "/v1/moderations",
        wire.ModerationRequest,
        wire.ModerationResponse,
        moderations_handler(guard),
        summary="Moderation by an open guard model (OpenAI's /v1/moderations)",
        tags=("moderation",),
        count_prompts=_prompts_in,
        raw_body=True,
        error_shape="openai",
    )
