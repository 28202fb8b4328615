"""The start-up log's settings line without secrets, in every process that starts SGLang
(`serve` and the Engine alike): SGLang logs every ServerArgs field at start
(`server_args=...`, the Engine when its log level is info) and redacts only the
watermark's keys, so an `api_key` / `admin_api_key` given to an Engine or a server was
printed whole. The line's secret fields are redacted by name (server/redaction.py), short
keys included (a field is replaced whatever its length)."""

from __future__ import annotations

from prefillonly_sgl.server.redaction import redact, secret_values

TABLE_NAME = "redacted_settings"


def _server_args_for_logging(original, server_args):
    """AROUND sglang.srt.entrypoints.engine._server_args_for_logging."""
    logged = original(server_args)
    if isinstance(logged, dict):
        return redact(logged, secret_values(logged))
    return logged


HOOKS = {
    "sglang.srt.entrypoints.engine._server_args_for_logging": ("AROUND", _server_args_for_logging),
}


def install_in_this_process() -> None:
    """Applied now (once per process, whichever of the Engine and serve comes first)."""
    from prefillonly_sgl.hooking.hooks import apply_hooks_now

    apply_hooks_now(TABLE_NAME, HOOKS)
