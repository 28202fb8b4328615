"""The plain rules behind keys on the server (no SGLang): which settings are secrets and
answers with them redacted (server/redaction.py), and who may call what
(server/auth.py). The real server with keys: tests/test_fuzz_endpoints.py."""

from __future__ import annotations

import asyncio
import enum

import pytest

from prefillonly_sgl.server import auth
from prefillonly_sgl.server.redaction import (
    REDACTED,
    RedactSecrets,
    is_secret_name,
    redact,
    redact_command_line,
    secret_values,
)


@pytest.mark.parametrize(
    "name, value",
    [
        ("api_key", "k"),
        ("admin_api_key", "a"),
        ("watermark_key_b", "b"),
        ("ssl_keyfile_password", "p"),
        ("hf_token", "hf_x"),
        ("access_token", "t"),
        ("client_secret", "s"),
        ("aws_credentials", "c"),
        ("openai-api-key", "k"),
        ("APIKEY", "k"),
    ],
)
def test_secret_settings_are_found_by_name(name, value):
    assert is_secret_name(name, value)


@pytest.mark.parametrize(
    "name, value",
    [
        ("max_total_tokens", 4096),
        ("max_prefill_tokens", 16384),
        ("num_reserved_decode_tokens", 512),
        ("kt_max_deferred_experts_per_token", 2),  # a count, though its last word is token
        ("bucket_time_to_first_token", [0.1, 0.5]),
        ("speculative_token_map", "/maps/t.json"),
        ("tokenizer_path", "/models/tiny"),
        ("skip_tokenizer_init", False),
        ("ssl_keyfile", "/etc/ssl/server.key"),  # a path; its password is the secret
        ("model_path", "/models/tiny"),
    ],
)
def test_token_counts_and_paths_are_not_secrets(name, value):
    assert not is_secret_name(name, value)


SETTINGS = {
    "model_path": "/models/tiny",
    "api_key": "sk-ordinary-123",
    "admin_api_key": "sk-admin-456",
    "hf_token": None,
    "max_total_tokens": 4096,
    "kt_max_deferred_experts_per_token": 2,
    "launch_command": "prefillonly serve --api-key sk-ordinary-123 --admin-api-key=sk-admin-456",
    "internal_states": [{"copied": "key sk-admin-456 in a string", "max_total_tokens": 4096}],
}


def test_server_info_keeps_no_key_and_every_count():
    secrets = secret_values(SETTINGS)
    assert secrets == ["sk-ordinary-123", "sk-admin-456"]
    answer = redact(SETTINGS, secrets)
    text = repr(answer)
    assert "sk-ordinary-123" not in text and "sk-admin-456" not in text
    assert answer["api_key"] == answer["admin_api_key"] == REDACTED
    assert answer["hf_token"] is None  # unset stays unset
    assert answer["max_total_tokens"] == 4096
    assert answer["kt_max_deferred_experts_per_token"] == 2
    assert answer["model_path"] == "/models/tiny"
    assert answer["launch_command"] == (
        f"prefillonly serve --api-key {REDACTED} --admin-api-key={REDACTED}"
    )
    assert SETTINGS["api_key"] == "sk-ordinary-123"  # the input is not changed


def test_a_short_key_is_redacted_where_it_is_a_whole_value():
    settings = {"api_key": "K", "admin_api_key": "A", "served_model_name": "Kestrel"}
    answer = redact({**settings, "launch_command": "x --api-key K --admin-api-key A"},
                    secret_values(settings))  # fmt: skip
    assert answer["api_key"] == answer["admin_api_key"] == REDACTED
    assert answer["served_model_name"] == "Kestrel"  # not mangled
    assert answer["launch_command"] == f"x --api-key {REDACTED} --admin-api-key {REDACTED}"


def test_a_command_line_with_a_secret_token_flag():
    assert redact_command_line("serve --hf-token hf_abcdef --max-total-tokens 10") == (
        f"serve --hf-token {REDACTED} --max-total-tokens 10"
    )


def _asgi_answer(body_parts: list[bytes], secrets: list[str]):
    async def app(scope, receive, send):
        length = sum(map(len, body_parts))
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(length).encode())]})  # fmt: skip
        for i, part in enumerate(body_parts):
            await send({"type": "http.response.body", "body": part,
                        "more_body": i < len(body_parts) - 1})  # fmt: skip

    sent = []

    async def send(message):
        sent.append(message)

    asyncio.run(RedactSecrets(app, lambda: secrets)({"type": "http"}, None, send))
    return sent


def test_every_answer_is_scrubbed_and_keeps_a_true_length():
    sent = _asgi_answer([b'{"echo": "sk-admin-456"}'], ["sk-admin-456"])
    body = sent[1]["body"]
    assert body == b'{"echo": "<redacted>"}'
    assert dict(sent[0]["headers"])[b"content-length"] == str(len(body)).encode()
    streamed = _asgi_answer([b"data: sk-admin-456\n", b"data: done\n"], ["sk-admin-456"])
    assert streamed[1]["body"] == b"data: ************\n"  # same length: the header holds


def test_auth_rules():
    assert auth.bearer_token("Bearer abc") == "abc"
    assert auth.bearer_token("Basic abc") is None and auth.bearer_token(None) is None
    assert auth.admin_key_opens("normal", "Bearer A", "A")

    class Level(str, enum.Enum):  # as SGLang's AuthLevel: str() is not the value
        NORMAL = "normal"

    assert auth.admin_key_opens(Level.NORMAL, "Bearer A", "A")
    assert not auth.admin_key_opens("normal", "Bearer K", "A")
    assert not auth.admin_key_opens("admin_force", "Bearer A", "A")  # SGLang decides those
    assert not auth.admin_key_opens("normal", "Bearer A", None)
    # A custom logit processor: the admin key whenever one is set.
    assert auth.processor_refusal(True, "Bearer K", "A")
    assert auth.processor_refusal(True, None, "A")
    assert auth.processor_refusal(True, "Bearer A", "A") is None
    assert auth.processor_refusal(True, "Bearer K", None) is None  # no admin key set
    assert auth.processor_refusal(False, None, "A") is None


def test_an_endpoint_declares_a_known_auth_level():
    from pydantic import BaseModel

    from prefillonly_sgl.server.endpoints import EndpointSpec

    class M(BaseModel):
        x: int = 0

    assert EndpointSpec("/a", M, M, lambda r, c: r).auth_level == "normal"
    assert EndpointSpec("/a", M, M, lambda r, c: r, auth_level="admin_force").auth_level
    with pytest.raises(ValueError, match="auth_level"):
        EndpointSpec("/a", M, M, lambda r, c: r, auth_level="admin")
