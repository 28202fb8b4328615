"""Single-token OpenAI requests (`/v1/chat/completions`, `/v1/completions` with one output
token) as prefill-only requests: which requests qualify and what they may ask for
(requests.py), their reusable prefix (prefix.py), and the label logprobs they return
whatever their rank (logprobs.py). Plain Python; the SGLang side is
sglang_runtime/single_token.py (docs/openai.md)."""
