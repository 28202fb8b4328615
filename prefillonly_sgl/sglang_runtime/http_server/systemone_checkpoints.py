"""/v1/systemone on a decision checkpoint (decisions/checkpoints.py), in the server's
process: SGLang 0.5.23's own handler (SystemOneServing: its prompts, layouts, heads,
temperatures, refusals, usage and x_label_mass rules), with two changes.

A decision_config checkpoint with causal attention scores its questions' prompts as the
state once and each question behind it: SGLang's score_request with the prompts' shared
prefix as the query, which the project's hooks compute once and keep in the prefix cache
(features/prefill_kv/tokenizer_process.py), where SGLang's handler sends whole prompts that
each compute the state. The same tokens are scored either way, so the answers are SGLang's.
A Kev checkpoint's per-question prompts carry their reusable prefix (the state), so the
state is computed once and each question continues from it; its pointer head reads behind
the cached prefix (features/prefill_kv/scheduler_process.py), where SGLang serves Kev with
the prefix cache off. A noncausal checkpoint (full attention reads the whole prompt) and
any request with images keep whole prompts; Clef runs SGLang's handler unchanged (one
prompt holds every question: one prefill per request, its head reading every token's
hidden state).
"""

from __future__ import annotations

from prefillonly_sgl.decisions.checkpoints import Readout, readout_of, shared_prefix_len


def served_readout(tokenizer_manager) -> Readout:
    """What SGLang's ModelConfig found beside the weights."""
    config = tokenizer_manager.model_config
    return readout_of(config.decision_config, config.joint_head_config, config.pointer_head)


def checkpoint_handler(app_state, readout: Readout):
    """SGLang's SystemOneServing for this app, its scoring split at the state where the
    readout allows it, built as SGLang's app builds its own (from its chat serving, so it
    renders with the same template manager and reasoning settings)."""
    from sglang.srt.entrypoints.openai.serving_decisions import _encode_all
    from sglang.srt.entrypoints.systemone.kev import _DELIMITERS as KEV_DELIMITERS
    from sglang.srt.entrypoints.systemone.serving import SystemOneServing

    from prefillonly_sgl.features.prefill_kv.messages import with_reusable_len

    class StateOnceSystemOne(SystemOneServing):
        def _pointer_request(self, request, views):
            """Kev: each question's prompt marked with its reusable prefix R, the state
            and its delimiter (everything before the question delimiter, which SGLang's
            encoder escapes out of the state's text), as a score prompt carries R
            (features/prefill_kv/messages.py): the state is computed once and cached,
            every question continues from it."""
            adapted = super()._pointer_request(request, views)
            if readout.shares_the_state:
                tokenizer = self.tokenizer_manager.tokenizer
                question = tokenizer.convert_tokens_to_ids(KEV_DELIMITERS[1])
                adapted.sampling_params = [
                    {"custom_params": with_reusable_len(None, ids.index(question))}
                    for ids in adapted.input_ids
                ]
            return adapted

        async def _score(self, adapted_request, raw_request, temperature=1.0):
            prompts, label_token_ids, image_data = await _encode_all(adapted_request)
            images = any(image_data)
            shared = 0 if images or not readout.shares_the_state else shared_prefix_len(prompts)
            result = await self.tokenizer_manager.score_request(
                query=prompts[0][:shared] if shared else [],
                items=[prompt[shared:] for prompt in prompts],
                label_token_ids=label_token_ids,
                apply_softmax=True,
                item_first=False,
                request=raw_request,
                temperature=temperature,
                return_token_logprobs=True,
                image_data=image_data if images else None,
            )
            return prompts, label_token_ids, result

    return StateOnceSystemOne(app_state.openai_serving_chat)


async def answer(handler, body: object, raw_request):
    """SGLang's answer (a Response: its JSON or its error) to a /v1/systemone body, parsed
    by SGLang's own request model; a body it refuses raises FastAPI's validation error,
    which the app answers as SGLang's route does."""
    from fastapi.exceptions import RequestValidationError
    from pydantic import ValidationError
    from sglang.srt.entrypoints.systemone.protocol import SystemOneRequest

    try:
        request = SystemOneRequest.model_validate(body)
    except ValidationError as e:
        # As FastAPI reports a body model's errors (no links, located in the body), which
        # SGLang's handler for this route then formats.
        errors = [
            {**error, "loc": ("body", *error["loc"])} for error in e.errors(include_url=False)
        ]
        raise RequestValidationError(errors, body=body) from None
    return await handler.handle_request(request, raw_request)
