"""An embedding request's prefix-cache salt on its scheduler Req (every prefillonly
scheduler, whatever its features).

SGLang 0.5.23 builds an embedding request's Req without a cache_salt (its tokenized form
has none), so embeddings of every tenant matched one another's cached prefixes. The salt
rides in the request's custom_params (scoring/cache_salts.py, SALT_PARAM, written by
request_recording.py); here it becomes the Req's cache_salt right after SGLang builds the
Req, before the Req is queued and matched against the radix cache. Generate requests
carry their salt in SGLang's own field and are left alone.
"""

from __future__ import annotations

from prefillonly_sgl.scoring.cache_salts import salt_param

TABLE_NAME = "embedding_salts"


def _after_namespace(result, scheduler, req):
    """AFTER Scheduler._maybe_namespace_elastic_radix_cache(req): called on every new Req
    (generate and embedding) right after it is built."""
    if getattr(req, "cache_salt", None) is None:
        salt = salt_param(getattr(req.sampling_params, "custom_params", None))
        if salt is not None:
            req.cache_salt = salt
    return result


HOOKS = {
    "sglang.srt.managers.scheduler.Scheduler._maybe_namespace_elastic_radix_cache": (
        "AFTER",
        _after_namespace,
    ),
}
