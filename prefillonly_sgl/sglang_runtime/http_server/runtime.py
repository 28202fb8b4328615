"""The running server as the guard and the endpoints see it: SGLangRuntime (the guard's
runtime: shutting down, the route checks, aborts; the scoring front once SGLang is up) and
ServerContext (what an EndpointSpec handler gets: the same front as the Engine's)."""

from prefillonly_sgl.scoring.call_context import CallContext, current
from prefillonly_sgl.scoring.image_prompts import with_images_off_the_loop
from prefillonly_sgl.scoring.score_options import ScoreOptions
from prefillonly_sgl.scoring.score_result import ScoreResult
from prefillonly_sgl.scoring.usage import RequestRecord
from prefillonly_sgl.scoring.validation import ModelLimits
from prefillonly_sgl.server.auth import RequestRefusedError, authorization_header, processor_refusal
from prefillonly_sgl.server.endpoints import EndpointSpec
from prefillonly_sgl.server.options import ServeOptions
from prefillonly_sgl.server.request_checks import custom_logit_processors
from prefillonly_sgl.server.route_checks import CheckContext, check_request, route_checks
from prefillonly_sgl.sglang_runtime import sglang_state
from prefillonly_sgl.sglang_runtime.decision_images import decide_with_images
from prefillonly_sgl.sglang_runtime.http_server.processor_check import ProcessorLoadCheck
from prefillonly_sgl.sglang_runtime.moderation_calls import moderate
from prefillonly_sgl.sglang_runtime.score_front import ScoringFront


def _tokenizer_manager():
    from sglang.srt.entrypoints.http_server import get_global_state

    state = get_global_state()
    if state is None:
        raise RuntimeError("SGLang's server is not initialised yet")
    return state.tokenizer_manager


class SGLangRuntime:
    """The GuardRuntime of SGLang's server, and what endpoint contexts are built on."""

    def __init__(self, options: ServeOptions, app_specs: list[EndpointSpec]) -> None:
        self.options = options
        self._checks = route_checks(app_specs)
        self._front: ScoringFront | None = None
        self._processor_check = ProcessorLoadCheck()
        self._checkpoint_handler = None  # /v1/systemone on a decision checkpoint, built once
        # One context for the server's lifetime: what handlers keep per server (the DSL's
        # backend and its calibration priors, dsl/backends/server.server_backend) hangs off it.
        self.context = ServerContext(self)

    @property
    def tokenizer_manager(self):
        return _tokenizer_manager()

    def start(self) -> ScoringFront:
        """Starts the server's scoring path, once SGLang's scheduler has reported its
        limits (the lifespan calls it before the first request)."""
        if self._front is None:
            from sglang.srt.entrypoints.http_server import get_global_state

            from prefillonly_sgl.sglang_runtime.model_limits import limits_from_scheduler_info

            tm = self.tokenizer_manager
            scheduler_info = get_global_state().scheduler_info
            limits = limits_from_scheduler_info(scheduler_info, tm.model_config.vocab_size)
            self._front = ScoringFront(tm, limits)
            _add_our_info(scheduler_info, self._front.facts.info())
        return self._front

    @property
    def front(self) -> ScoringFront:
        return self._front or self.start()

    @property
    def limits(self) -> ModelLimits:
        return self.front.limits

    async def systemone_on_checkpoint(self, body: object, raw_request):
        """/v1/systemone on a decision checkpoint: SGLang's own handler, the state scored
        once where the readout allows it (systemone_checkpoints.py)."""
        from prefillonly_sgl.sglang_runtime.http_server import systemone_checkpoints

        if self._checkpoint_handler is None:
            self._checkpoint_handler = systemone_checkpoints.checkpoint_handler(
                raw_request.app.state, self.front.readout
            )
        return await systemone_checkpoints.answer(self._checkpoint_handler, body, raw_request)

    # -- GuardRuntime --
    def shutting_down(self) -> bool:
        return bool(self.tokenizer_manager.gracefully_exit)

    def check(self, path: str, body: object) -> int:
        """The path's check from the one table (server/route_checks.py)."""
        context = CheckContext(
            limits=self.limits,
            count_prompt_tokens=self.front.count_prompt_tokens,
            max_prompts=self.options.max_pending_prompts,
            labels_required=self.front.facts.reads_labels,
        )
        return check_request(self._checks, path, body, context)

    async def authorize(self, scope, body: object) -> None:
        """After check(): a request carrying custom_logit_processor needs the admin key
        when one is set (server/auth.py), and with --enable-custom-logit-processor its
        processors must load, which is found out in a throwaway process, never here
        (processor_check.py)."""
        texts = custom_logit_processors(body)
        if not texts:
            return
        args = self.tokenizer_manager.server_args
        refusal = processor_refusal(True, authorization_header(scope), args.admin_api_key)
        if refusal is not None:
            raise RequestRefusedError(403, refusal)
        if args.enable_custom_logit_processor:
            await self._processor_check.check(texts)

    def adapter_named(self, model: object) -> str | None:
        """The loaded LoRA adapter a body's `model` names (vLLM's convention: the
        adapter's name as the model), or None: the base model, or not an adapter."""
        loaded = sglang_state.loaded_adapter_names(self.tokenizer_manager)
        return model if isinstance(model, str) and model in loaded else None

    def abort(self, record: RequestRecord) -> None:
        tm = self.tokenizer_manager
        for obj in record.sglang_requests:
            rids = obj.rid if isinstance(obj.rid, list) else [obj.rid]
            for rid in rids:
                if rid:
                    tm.abort_request(rid)


def _add_our_info(scheduler_info: dict, facts: dict) -> None:
    """/server_info merges the scheduler's start-up info into its answer: ours joins it
    under "prefillonly" (the model family, the features running and those the family
    switched off, with why; how the model answers decisions; a classification head's
    architecture and classes, or null), as the Engine's get_server_info() reports it. The
    configuration is this process's own (serve set it before SGLang started)."""
    from prefillonly_sgl.config.runtime_config import WorkerConfig

    worker = WorkerConfig.from_environment()
    if worker is not None:
        scheduler_info["prefillonly"] = {**worker.info(), **facts}


class ServerContext:
    """What an EndpointSpec handler gets (protocol: server/endpoints.ServerContext): one
    per runtime. Its calls run under the context of the request being answered
    (scoring/call_context.py: the route set it around the handler, which is a DSL
    function's or an API's code between the route and here)."""

    def __init__(self, runtime: SGLangRuntime) -> None:
        self._runtime = runtime

    @property
    def tokenizer_manager(self):
        return self._runtime.tokenizer_manager

    @property
    def tokenizer(self):
        return self._runtime.tokenizer_manager.tokenizer

    @property
    def limits(self) -> ModelLimits:
        return self._runtime.limits

    @staticmethod
    def call(lora_path: str | None = None) -> CallContext:
        """The context of a call the handler makes: the request's, with the call's own
        adapter where it names one (a DSL function's)."""
        return current().entering(adapter=lora_path)

    @property
    def usage(self):
        record = current().record
        return record.usage if record is not None else None

    @property
    def class_head(self):
        """The served model's classification head (scoring/class_head.ClassHead), or None."""
        return self._runtime.front.head

    @property
    def image_placeholder(self):
        """How the served model marks an image in text (scoring/image_prompts.py), or None:
        it reads text only."""
        return self._runtime.front.facts.image_placeholder

    @property
    def image_refusal(self) -> str | None:
        """Why this engine refuses images although its model reads them, or None."""
        return self._runtime.front.facts.image_refusal

    async def score(
        self,
        query,
        items,
        label_token_ids=None,
        apply_softmax=True,
        item_first=False,
        length_normalize=False,
        score_extraction_token=None,
        temperature=1.0,
        lora_path=None,
        images=None,
        item_images=None,
    ) -> ScoreResult:
        """prefillonly_sgl.Engine.score semantics, on the server's engine (the same
        ScoringFront, so the same checks, result and cached_tokens). images /
        item_images: URLs or data URLs (never the server's own files)."""
        front = self._runtime.front
        image_data = None
        if images is not None or item_images is not None:
            query, items, image_data = await with_images_off_the_loop(
                query, items, images, item_images, front.facts.image_placeholder, False
            )
        return await front.score(
            self.call(lora_path),
            query,
            items,
            label_token_ids,
            apply_softmax,
            item_first,
            length_normalize,
            score_extraction_token=score_extraction_token,
            options=ScoreOptions(temperature=temperature, image_data=image_data),
        )

    async def continuation_logprobs(self, query, items, continuation, lora_path=None):
        """prefillonly_sgl.Engine.continuation_logprobs semantics, on the server's engine."""
        return await self._runtime.front.continuation_logprobs(
            self.call(lora_path), query, items, continuation
        )

    async def decide(self, call, lora_path=None):
        """A decisions.call.DecisionCall answered on the server's engine (Engine.decide's
        path: the state computed once, each question an item); a state with images on a
        vision-language model (decision_images.py; refused on a text-only one)."""
        if call.images:
            return await decide_with_images(self._runtime.front, self.call(lora_path), call)
        return await self._runtime.front.decide(self.call(lora_path), call)

    async def moderate(self, call, lora_path=None):
        """A moderation.moderation_call.ModerationCall answered on the server's engine
        (Engine.moderate's path: sglang_runtime/moderation_calls.py)."""
        return await moderate(self._runtime.front, self.call(lora_path), call)

    @property
    def decision_readout(self):
        """How the served model answers decisions (decisions/checkpoints.Readout)."""
        return self._runtime.front.readout

    async def systemone_on_checkpoint(self, body: object):
        """SGLang's answer (a Response) to /v1/systemone on a decision checkpoint."""
        return await self._runtime.systemone_on_checkpoint(body, current().http_request)
