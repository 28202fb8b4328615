"""LoRA adapters per request on the scoring paths (plain Python): which adapter a call's
prompts run under.

SGLang 0.5.23 takes `lora_path` (an adapter's name, as loaded with --lora-paths NAME=PATH or
its /load_lora_adapter route) on /generate, completions, chat and embeddings, but its score
API has no such field: its score_request builds the prompts' requests itself. Here the
adapter of a call travels like its cache salt, in the call's context
(scoring/call_context.py): set per Engine call (`lora_path=`), per DSL function, or per
HTTP request by the server's guard (the body's `lora_path` on the scoring doors,
LORA_BODY_PATHS, whose request models have no such field), and
sglang_runtime/request_recording.py writes it into every request that reaches SGLang's
generate_request without an adapter of its own. SGLang resolves the name to its adapter
id, which it puts in the request's radix-cache key (a prefix computed under one adapter is
never read under another), and which the JCT scheduler and packing group by.
"""

from __future__ import annotations

MAX_NAME_CHARS = 256
# The scoring doors: their request models (SGLang's ScoringRequest, ours) have no lora_path.
LORA_BODY_PATHS = frozenset(
    {
        "/v1/score",
        "/v1/score_labels",
        "/v1/rerank",
        "/rerank",
        "/v2/rerank",
        "/v1/classify",
        "/v1/decisions",
        "/v1/systemone",
        "/v1/moderations",
        "/generative_scoring",
    }
)

# vLLM's and OpenAI's doors: vLLM names an adapter as the request's `model` (SGLang's own
# OpenAI handlers read only "base:adapter" and lora_path); the guard asks the runtime
# whether the body's model is a loaded adapter's name.
MODEL_ADAPTER_PATHS = frozenset(
    {
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/embeddings",
        "/v1/score",
        "/v1/rerank",
        "/rerank",
        "/v2/rerank",
        "/v1/classify",
        "/v1/moderations",
        "/generative_scoring",
    }
)


def check_lora_path(value: object) -> str | None:
    """`value` as an adapter name (None or "" for the base model); ValueError naming the
    problem."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ValueError(f"lora_path must be an adapter's name (a string), got {value!r}")
    if len(value) > MAX_NAME_CHARS:
        raise ValueError(f"lora_path is longer than {MAX_NAME_CHARS} characters")
    return value


def take_body_lora(body: object) -> tuple[object, str | None]:
    """(the body without its `lora_path`, that name checked); ValueError naming a bad one."""
    if not isinstance(body, dict) or "lora_path" not in body:
        return body, None
    rest = {name: value for name, value in body.items() if name != "lora_path"}
    return rest, check_lora_path(body["lora_path"])


def lora_request(obj, name: str | None) -> None:
    """Gives SGLang's request `obj` the call's adapter `name` where it names none itself."""
    if name is not None and hasattr(obj, "lora_path") and obj.lora_path is None:
        obj.lora_path = name
