"""Tokenizer-process hooks (the process that runs SGLang's TokenizerManager: the Engine's
or the server's main process): each score prompt leaves with its reusable-prefix length R
(features/prefill_kv/policy.py), carried to the scheduler by
features/prefill_kv/messages.py. Prefill-only KV keeps pool KV for those R tokens; the
JCT scheduler groups requests that share them.

SGLang's score_request joins query + item into one prompt per item and tokenizes each in
_create_tokenized_object. R = common prefix of (the query's own tokens, the prompt's
tokens), so the query is tokenized once per score call, in the AROUND hook, and the
AFTER hook of each prompt compares against it. The query's tokens pass from one to the
other in the call's context (scoring/call_context.py: CallContext.query_ids), carried
through SGLang's stack for the score call's asyncio task (SGLang tokenizes the prompts
inside it, so the value never leaks to another call).

keep_whole_prompts(): within it, a score call's prompts are reusable whole (R = the
prompt's length), for labels of several tokens (label_sequences.py), whose continuation
requests then find each prompt in the prefix cache.

Single-token OpenAI requests (sglang_runtime/single_token.py) arrive here with their
reusable prefix's token ids in custom_params (single_token/prefix.py); R = the common
prefix of those and the prompt's tokens, and the ids leave the request (they never reach
the scheduler). A loglikelihood request (echo, max_tokens 0 or 1) is marked WHOLE_PROMPT:
R = its length, so its task's next request finds it in the prefix cache. A request for
n > 1 samples keeps its whole prompt (R = its length): SGLang prefills it once (a
max_new_tokens=0 copy sharing these custom_params, which also gets R) and then
sends the n samples, which are then one-token cache hits of it, sampling the one
distribution, instead of each computing the prompt's tail again.
"""

from __future__ import annotations

import contextlib
import inspect
import uuid

from prefillonly_sgl.features.prefill_kv.messages import (
    with_call,
    with_reusable_len,
    with_shared_len,
)
from prefillonly_sgl.features.prefill_kv.policy import reusable_prefix_len, runs_one_forward
from prefillonly_sgl.features.prefill_kv.setwise import setwise_refusal
from prefillonly_sgl.scoring.call_context import carrying, current
from prefillonly_sgl.scoring.reusable_prefix import WHOLE_PROMPT, prefix_ids_in, without_prefix_ids

_EMBED_OVERRIDES = (
    "query_embed_overrides",
    "item_embed_overrides",
    "stacked_query_item_embed_overrides",
)


async def _around_score_request(original, self, *args, **kwargs):
    bound = inspect.signature(original).bind(self, *args, **kwargs)
    bound.apply_defaults()
    # The query tokens of this score call ((): nothing reusable); outside score calls
    # query_ids is None and generate requests stay stock.
    query_ids = tuple(query_token_ids(self.tokenizer, bound.arguments))
    items = bound.arguments.get("items")
    prompts = len(items) if isinstance(items, list) else 1
    score_call = (uuid.uuid4().hex, prompts)
    with carrying(current().replace(query_ids=query_ids, score_call=score_call)):
        return await original(*bound.args, **bound.kwargs)


@contextlib.contextmanager
def keep_whole_prompts():
    """Score calls made inside keep every prompt's KV (prefill-only KV otherwise keeps
    only the query's): a later request extending a prompt finds all of it cached."""
    with carrying(current().replace(keep_whole=True)):
        yield


def query_token_ids(tokenizer, arguments: dict) -> list[int]:
    """The tokens every prompt of this score call may share ([] when none can)."""
    query = arguments.get("query")
    if arguments.get("item_first") or not query:
        return []  # the item comes first, or there is no query: nothing reusable
    if any(arguments.get(name) is not None for name in _EMBED_OVERRIDES):
        return []
    if isinstance(query, str):
        if tokenizer is None:
            return []
        # Tokenized as SGLang tokenizes the prompt (special tokens included).
        return list(tokenizer.encode(query))
    return list(query)


def _after_create_tokenized_object(result, *args, **kwargs):
    """Each score prompt of the call, and each single-token request, leaves with its R
    (0 when nothing is reusable)."""
    from sglang.srt.managers.io_struct import (
        TokenizedEmbeddingReqInput,
        TokenizedGenerateReqInput,
    )

    if isinstance(result, TokenizedEmbeddingReqInput):
        return _head_prompt(result)
    if not isinstance(result, TokenizedGenerateReqInput):
        return result
    params = result.sampling_params
    # a prompt with images holds each expanded (one pad token per image token): an image
    # in the reusable prefix counts in those positions (policy.image_expanded_prefix_len)
    has_images = getattr(result, "mm_inputs", None) is not None
    image_pad = getattr(args[0], IMAGE_PAD, None) if args and has_images else None
    prefix_ids = prefix_ids_in(params.custom_params)
    if prefix_ids is not None:  # a single-token or loglikelihood OpenAI request
        custom = without_prefix_ids(params.custom_params)
        if result.input_ids is not None and runs_one_forward(params.max_new_tokens):
            ids = result.input_ids
            if prefix_ids == WHOLE_PROMPT or params.n > 1:
                r = len(ids)
            else:
                r = reusable_prefix_len(prefix_ids, ids, image_pad)
            custom = with_reusable_len(custom, r)
        params.custom_params = custom or None
        return result
    call = current()
    query_ids = call.query_ids
    if query_ids is None:
        return result
    if result.input_ids is None or params.max_new_tokens != 0:
        return result
    shared = reusable_prefix_len(query_ids, result.input_ids, image_pad)
    r = len(result.input_ids) if call.keep_whole else shared
    params.custom_params = with_reusable_len(params.custom_params, r)
    if r > shared:  # kept whole: grouped with the call's other prompts by the query
        params.custom_params = with_shared_len(params.custom_params, shared)
    if call.score_call is not None and call.score_call[1] > 1:
        params.custom_params = with_call(params.custom_params, *call.score_call)
    anchors = getattr(result, "token_indices_to_pool", None)
    if anchors and args and getattr(args[0], SETWISE_WITH_CACHE, False):
        # A setwise prompt: its labels are read at every anchor, so the prefix cache may
        # give it only what comes before the first (SGLang bounds a match by the logprob
        # start), and SGLang's own 0 would forbid the cache altogether.
        result.logprob_start_len = min(anchors)
    return result


def _head_prompt(result):
    """A score prompt of a model with a classification head (SGLang sends those as
    embedding requests): it leaves with its R as a label-token prompt does."""
    query_ids = current().query_ids
    if query_ids is None or result.input_ids is None:
        return result
    params = result.sampling_params
    params.custom_params = with_reusable_len(
        params.custom_params, reusable_prefix_len(query_ids, list(result.input_ids))
    )
    return result


# -- images: the pad token a vision-language model's processor expands ---------------------
IMAGE_PAD = "_prefillonly_image_pad"


def mark_image_pad(tokenizer_manager, pad_token_id: int | None) -> None:
    """The served model's image pad token (ScoringFront, from its model facts), read by the
    reusable-prefix hook of a prompt with images; None for a text model."""
    setattr(tokenizer_manager, IMAGE_PAD, pad_token_id)


# -- the setwise readout with the prefix cache on -----------------------------------------
# On a TokenizerManager whose scheduler runs prefill-only KV (its start-up info says so:
# the Engine's and the server's ScoringFront set it).
SETWISE_WITH_CACHE = "_prefillonly_setwise_with_cache"


def allow_setwise_with_cache(tokenizer_manager, prefill_only_kv_active: bool) -> None:
    """Where prefill-only KV runs, a setwise score request (score_extraction_token) keeps
    the prefix cache and chunked prefill: its prompt is never chunked and its anchors are
    read as rows of what its forward computes (scheduler_process._after_new_req,
    _after_prepare_for_extend). Elsewhere SGLang's own refusal stands."""
    setattr(tokenizer_manager, SETWISE_WITH_CACHE, bool(prefill_only_kv_active))


def _around_validate_score_extraction(original, self, is_generation, *args, **kwargs):
    """SGLang's own check, except for a causal LM where prefill-only KV runs
    (allow_setwise_with_cache): there its conditions on the prefix cache and chunked
    prefill are met by prefill-only KV instead, and its other two conditions are checked
    with its messages (setwise.py). A classification head's setwise request keeps SGLang's
    whole check."""
    if not is_generation or not getattr(self, SETWISE_WITH_CACHE, False):
        return original(self, is_generation, *args, **kwargs)
    from sglang.srt.runtime_context import get_serving

    item_first = kwargs["item_first"] if "item_first" in kwargs else bool(args and args[0])
    why = setwise_refusal(item_first, get_serving().allow_auto_truncate)
    if why is not None:
        raise ValueError(why)


_SCORE_MIXIN = "sglang.srt.managers.tokenizer_manager_score_mixin.TokenizerManagerScoreMixin"
_SCORE_REQUEST = f"{_SCORE_MIXIN}.score_request"
HOOKS = {
    _SCORE_REQUEST: ("AROUND", _around_score_request),
    f"{_SCORE_MIXIN}._validate_score_extraction": ("AROUND", _around_validate_score_extraction),
    "sglang.srt.managers.tokenizer_manager.TokenizerManager._create_tokenized_object": (
        "AFTER",
        _after_create_tokenized_object,
    ),
}


def install_in_this_process() -> None:
    """Applies these hooks in this process now.

    SGLang loads plugins once per process, so in a process that first started a stock
    engine (or imported SGLang's server before the runtime configuration was set) the plugin
    never runs again; the Engine and `serve` call this before starting SGLang. The hooks
    then stay for later engines of this process too: a stock engine's score prompts carry
    R in custom_params, which its scheduler (without our hooks) ignores.
    """
    from prefillonly_sgl.hooking.hooks import apply_hooks_now

    apply_hooks_now(HOOK_TABLE_NAME, HOOKS)


HOOK_TABLE_NAME = "reusable_prefix"


# -- a Kev checkpoint keeps SGLang's prefix cache ----------------------------------------
KEV_SOURCE = "prefillonly: prefill-only KV continues a Kev checkpoint's questions from its state"
_resolution_installed = False


def _keep_prefix_cache_for_kev(server_args, previous) -> None:
    """SGLang serves a Kev checkpoint (head.pt's pointer head) with its prefix cache off, as
    its pooler reads prompts computed from position 0. Ours reads them behind a cached
    prefix too (scheduler_process._around_pointer_pooler), so the cache stays on, unless
    the user turned it off: every question then continues from the state computed once."""
    previous(server_args)
    from sglang.srt.arg_groups.model_override_base import model_config_of
    from sglang.srt.arg_groups.overrides import declare_resolution, resolving_view

    if server_args.disable_radix_cache:  # the raw argument: the user's own choice
        return
    if model_config_of(server_args).pointer_head is not None:
        # SGLang also turns chunked prefill off (-1), but a Qwen3.5 backbone's state is
        # split at the state's end as SGLang's own chunk (scheduler_process._split_at_prefix),
        # whose continuation needs a chunk budget: one prefill's worth, the longest prompt
        # SGLang's Kev encoder accepts (max_joint_prompt_tokens), so no prompt is cut
        # elsewhere (prefill-only KV never chunks a prompt behind its prefix).
        declare_resolution(
            server_args,
            KEV_SOURCE,
            disable_radix_cache=False,
            chunked_prefill_size=resolving_view(server_args).max_prefill_tokens,
        )


def install_resolution_hook() -> None:
    """Registers the wrapper once per process, where SGLang resolves its arguments (SGLang
    keeps registrations for good; the wrapper changes nothing for other models)."""
    global _resolution_installed
    if _resolution_installed:
        return
    from sglang.srt.arg_groups.resolution_hooks import register_resolution_hook

    register_resolution_hook("handle_model_capability_adjustments")(_keep_prefix_cache_for_kev)
    _resolution_installed = True
