"""Single-token OpenAI requests (`/v1/chat/completions`, `/v1/completions` with one output
token) as prefill-only requests: which requests qualify and what they may ask for
(requests.py), the fields our request models add to SGLang's and their parse-time checks
(request_fields.py), their reusable prefix (prefix.py), the label logprobs they return
whatever their rank (logprobs.py), vLLM's allowed_token_ids (allowed_tokens.py) and a
whole answer sent as one stream (streaming.py). Plain Python; the SGLang side, the
translation to and from SGLang's request models, handlers and outputs, is
sglang_runtime/single_token.py (docs/openai.md)."""
