"""The tokenizer endpoints clients tokenize through (main process): SGLang's `/tokenize`
and `/detokenize`, plus our `GET /tokenizer_info` (server/tokenizer_info.py).

`/detokenize` answers `{"text": ...}`; vLLM's endpoint of the same name, which
lm-evaluation-harness's remote tokenizer reads, answers `{"prompt": ...}`. An AROUND hook
on SGLang's handler (a coroutine) adds `prompt` (the same text) so both kinds of client
read it.
"""

from __future__ import annotations

from prefillonly_sgl.server.tokenizer_info import tokenizer_info

HOOK_TABLE_NAME = "tokenizer_endpoints"
_DETOKENIZE = "sglang.srt.entrypoints.openai.serving_tokenize.OpenAIServingDetokenize"


async def _around_detokenize(original, *args, **kwargs):
    response = await original(*args, **kwargs)
    text = getattr(response, "text", None)
    if text is None:  # an error response: as SGLang sends it
        return response
    return {"text": text, "prompt": text}


HOOKS = {f"{_DETOKENIZE}._handle_non_streaming_request": ("AROUND", _around_detokenize)}


def install(app, tokenizer_manager) -> None:
    """GET /tokenizer_info on `app`, and the /detokenize hook in this process.
    tokenizer_manager: a callable giving the running TokenizerManager."""
    from prefillonly_sgl.hooking.hooks import apply_hooks_now
    from prefillonly_sgl.server.auth import NORMAL
    from prefillonly_sgl.sglang_runtime.http_server.access import declare

    apply_hooks_now(HOOK_TABLE_NAME, HOOKS)

    async def get_tokenizer_info() -> dict:
        tm = tokenizer_manager()
        return tokenizer_info(tm.tokenizer, tm.context_len)

    get_tokenizer_info.__doc__ = (
        "The tokenizer's special tokens, chat template and the context length (for clients "
        "that tokenize through the server, e.g. lm-evaluation-harness)."
    )
    # The tokenizer, no settings: what the API key may read.
    app.add_api_route("/tokenizer_info", declare(get_tokenizer_info, NORMAL), methods=["GET"])
