"""`GET /tokenizer_info`: what a client needs to tokenize like the server (plain Python).

Evaluation harnesses tokenize on the client when they have no local copy of the model's
tokenizer: lm-evaluation-harness's remote tokenizer (`tokenizer_backend="auto"`) asks this
endpoint for the special tokens and the chat template, then `/tokenize` and
`/detokenize` for the rest (SGLang's endpoints). The fields follow vLLM's endpoint of
the same name: the tokenizer's special tokens and their ids, its chat template, the
server's context length.
"""

from __future__ import annotations

_SPECIAL = ("bos", "eos", "pad", "unk")


def tokenizer_info(tokenizer, max_model_len: int) -> dict:
    info: dict = {"tokenizer_class": type(tokenizer).__name__}
    for name in _SPECIAL:
        token = getattr(tokenizer, f"{name}_token", None)
        info[f"{name}_token"] = str(token) if token is not None else None
        token_id = getattr(tokenizer, f"{name}_token_id", None)
        info[f"{name}_token_id"] = int(token_id) if isinstance(token_id, int) else None
    template = getattr(tokenizer, "chat_template", None)
    info["chat_template"] = template if isinstance(template, str) else None
    info["model_max_length"] = int(max_model_len)
    info["vocab_size"] = len(tokenizer)
    return info
