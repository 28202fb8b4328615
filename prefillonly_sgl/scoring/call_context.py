"""One call's settings, decided once where it enters (plain Python).

A call enters at one of three doors: the server's guard (an HTTP request: its tenant, from
the key check, and the body's `cache_salt` / `lora_path`), the Engine (a method's keyword
arguments) or the DSL (a function's adapter, the caller's `with cache_salt(...)`). The door
builds a CallContext; our code passes it on explicitly (ScoringFront's methods take it),
and the one module that writes SGLang's requests (sglang_runtime/request_recording.py)
writes its salt, its adapter and its usage record into every request that reaches SGLang's
generate_request.

Where a call crosses code that is not ours (SGLang's handlers and tasks between its
score_request and the requests it builds; FastAPI between the guard and a route; a user's
function between the DSL's `cache_salt` block and the call inside it), the context rides
in the one context variable of this module, the carrier: `carrying(ctx)` around the
crossing, `current()` on the far side. asyncio tasks copy it, so SGLang's own tasks see
the call's context and no other call's. No other per-request context variable exists.

    door:  ctx = current().entering(salt=..., adapter=...)   # checked here, once
    ours:  front.score(..., ctx=ctx)  ->  with carrying(ctx.for_sglang("score")): SGLang
    SGLang's stack:  request_recording writes current()'s salt, adapter, record
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from dataclasses import dataclass

from prefillonly_sgl.scoring.adapters import check_lora_path
from prefillonly_sgl.scoring.cache_salts import check_salt, effective_salt
from prefillonly_sgl.scoring.errors import InvalidRequestError
from prefillonly_sgl.scoring.usage import RequestRecord


@dataclass(frozen=True)
class CallContext:
    """What one call runs under. Frozen: a part of a call that changes something (a score
    call inside an HTTP request, SGLang's tokenization of one score call) gets a copy."""

    # the tenant of the HTTP request (its API key's name), None without tenant keys
    tenant: str | None = None
    # the caller's own prefix-cache salt (scoring/cache_salts.py), checked
    salt: str | None = None
    # the LoRA adapter's name the call runs under (scoring/adapters.py), checked
    adapter: str | None = None
    # where SGLang's per-prompt usage and rids land (scoring/usage.py)
    record: RequestRecord | None = None
    # the HTTP request being answered (SGLang watches it for disconnects), if any
    http_request: object = None
    # inside SGLang's score_request for one score call (features/prefill_kv/
    # tokenizer_process.py): the query's tokens every prompt may share, None elsewhere
    query_ids: tuple[int, ...] | None = None
    # a score call whose prompts are reusable whole (labels of several tokens)
    keep_whole: bool = False
    # inside SGLang's score_request: (the call's id, its number of prompts), sent with
    # each prompt so the scheduler admits them together (jct_scheduler/call_arrival.py)
    score_call: tuple[str, int] | None = None

    @property
    def sglang_salt(self) -> str | None:
        """The salt SGLang gets: the tenant's namespace and the caller's salt together."""
        return effective_salt(self.tenant, self.salt)

    def entering(self, *, salt: object = None, adapter: object = None) -> CallContext:
        """This context with a door's own salt / adapter where given (checked; None keeps
        the enclosing one); InvalidRequestError naming a bad one."""
        try:
            salt = check_salt(salt)
            adapter = check_lora_path(adapter)
        except ValueError as e:
            raise InvalidRequestError(str(e)) from None
        return dataclasses.replace(
            self,
            salt=self.salt if salt is None else salt,
            adapter=self.adapter if adapter is None else adapter,
        )

    def for_sglang(self, name: str) -> CallContext:
        """The context of one call into SGLang: its own usage record, a child of the
        enclosing one (an HTTP request's), which sees everything it records."""
        record = self.record.child(name) if self.record is not None else RequestRecord(name)
        return dataclasses.replace(self, record=record)

    def replace(self, **changes) -> CallContext:
        return dataclasses.replace(self, **changes)


_CARRIER: contextvars.ContextVar[CallContext | None] = contextvars.ContextVar(
    "prefillonly_call", default=None
)
_OUTSIDE = CallContext()  # outside every call: no tenant, salt, adapter or record


def current() -> CallContext:
    """The context carried here (an empty one outside every call)."""
    return _CARRIER.get() or _OUTSIDE


@contextlib.contextmanager
def carrying(ctx: CallContext):
    """Code run inside (and the asyncio tasks it starts) sees `ctx` as current()."""
    token = _CARRIER.set(ctx)
    try:
        yield ctx
    finally:
        _CARRIER.reset(token)


@contextlib.contextmanager
def cache_salt(salt: str | None):
    """Calls made inside use `salt` as their cache salt (None: keep the enclosing one):
    the DSL's and the batch runner's way to salt a call, as `cache_salt=` is the
    Engine's (scoring/cache_salts.py says what a salt does). ValueError naming a bad one."""
    salt = check_salt(salt)
    if salt is None:
        yield
        return
    with carrying(current().replace(salt=salt)):
        yield


def salt_fields() -> dict:
    """{"cache_salt": the salt of the enclosing call} ({} for none): what a client adds to
    a body it posts, so the call's salt reaches the server (the DSL's remote backends)."""
    salt = current().salt
    return {} if salt is None else {"cache_salt": salt}
