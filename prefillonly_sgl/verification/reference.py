"""Independent reference for label probabilities: a plain transformers forward.

Used by the parity tests and the benchmarks. Nothing here touches SGLang: the prompt is
tokenized with the model folder's own tokenizer the way SGLang documents it (query and
item concatenated as text, special tokens added), the model runs one full forward, and
the label logits at the last position are softmaxed over the labels (apply_softmax=True)
or over the whole vocabulary (apply_softmax=False), as SGLang defines the two modes.

Labels of several tokens (score_sequences): one forward of the prompt followed by the
whole label per label, the log-probabilities of its tokens read at the positions before
each and summed: the chain rule, computed without the engine's trie or prefix cache.
"""

from __future__ import annotations

from functools import cached_property


class TransformersReference:
    """device: where the model runs (its forwards' inputs go there too); "cpu" by default,
    "cuda" for a model too slow on a CPU (benchmarks/gpu_engine.py on a card)."""

    def __init__(self, model_path: str, dtype: str = "float32", device: str = "cpu") -> None:
        self.model_path = str(model_path)
        self.dtype = dtype
        self.device = device

    @cached_property
    def tokenizer(self):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.model_path)

    @cached_property
    def model(self):
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

        dtype = getattr(torch, self.dtype)
        config = AutoConfig.from_pretrained(self.model_path)
        if (
            type(config) in AutoModelForImageTextToText._model_mapping
            and type(config) not in AutoModelForCausalLM._model_mapping
        ):
            # a vision-language model (Qwen2.5-VL): its text path, in its own class
            model = AutoModelForImageTextToText.from_pretrained(self.model_path, dtype=dtype)
        else:
            model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=dtype)
        return model.to(self.device).eval()

    def _ids(self, ids):
        import torch

        return torch.tensor([list(ids)], device=self.device)

    def prompt_ids(self, query, item, item_first: bool = False) -> list[int]:
        if isinstance(query, str):
            text = f"{item}{query}" if item_first else f"{query}{item}"
            return self.tokenizer.encode(text)
        return list(item) + list(query) if item_first else list(query) + list(item)

    def next_token_logprobs(
        self, prompt_ids, logit_bias: dict[int, float] | None = None, embeds_at=None
    ):
        """The log-softmax over the vocabulary at the prompt's last position (float64), of
        the logits plus `logit_bias` ({token id: bias}) when given: what a single-token
        request's logprobs are at temperature 0. embeds_at ({position: vector}): those
        positions' input embeddings replaced by the vectors (SGLang's embedding overrides)."""
        import torch

        with torch.no_grad():
            if embeds_at:
                embeds = self.model.get_input_embeddings()(self._ids(prompt_ids))
                for position, vector in embeds_at.items():
                    embeds[0, position] = torch.as_tensor(vector, dtype=embeds.dtype)
                inputs = {"inputs_embeds": embeds}
            else:
                inputs = {"input_ids": self._ids(prompt_ids)}
            logits = self.model(**inputs, logits_to_keep=1).logits[0, -1]
        logits = logits.double().cpu()
        for token, bias in (logit_bias or {}).items():
            logits[int(token)] += bias
        return torch.log_softmax(logits, dim=-1)

    def anchor_logprobs(self, prompt_ids, anchor: int, label_ids) -> list[list[float]]:
        """The labels' log-probabilities (over the vocabulary, float64) after every
        occurrence of the token `anchor` in the prompt: what SGLang's setwise readout
        (score_extraction_token) reads, one row per occurrence."""
        import torch

        ids = list(prompt_ids)
        with torch.no_grad():
            logits = self.model(input_ids=self._ids(ids)).logits[0].double().cpu()
        logprobs = torch.log_softmax(logits, dim=-1)
        rows = [i for i, token in enumerate(ids) if token == anchor]
        return [logprobs[i, list(label_ids)].tolist() for i in rows]

    def prompt_logprobs(self, prompt_ids, split_at: int = 0) -> list[float | None]:
        """Each prompt token's log-probability given the tokens before it (None for the
        first): what an echo request returns per prompt position. ``split_at`` (0 < it <
        the length): two forwards, the tokens before it and then the rest after its cache,
        as an engine that ends the first forward there computes them."""
        import torch

        ids = self._ids(prompt_ids)
        with torch.no_grad():
            if 0 < split_at < ids.shape[1]:
                first = self.model(input_ids=ids[:, :split_at], use_cache=True)
                rest = self.model(
                    input_ids=ids[:, split_at:], past_key_values=first.past_key_values
                )
                logits = torch.cat([first.logits[0], rest.logits[0]]).double()
            else:
                logits = self.model(input_ids=ids).logits[0].double()
        logprobs = torch.log_softmax(logits[:-1], dim=-1)
        picked = logprobs.gather(1, ids[0, 1:, None])[:, 0]
        return [None, *picked.tolist()]

    def continuation_logprobs(
        self, query, items, continuation, split_at_query: bool = False
    ) -> list[list[float]]:
        """Per item, each continuation token's log-probability after query + item (text:
        the prompt tokenized whole, the continuation on its own; token ids concatenated).
        ``split_at_query``: computed in two forwards split where the query's tokens end
        (the reusable prefix), as the Engine computes a recurrent family's prompt."""
        continuations = (
            continuation
            if isinstance(continuation, list) and not all(type(t) is int for t in continuation)
            else [continuation] * len(items)
        )
        rows = []
        for item, cont in zip(items, continuations, strict=True):
            prompt = self.prompt_ids(query, item)
            if isinstance(cont, str):
                cont = self.tokenizer.encode(cont, add_special_tokens=False)
            split = self._reusable_len(query, prompt) if split_at_query else 0
            rows.append(self.prompt_logprobs(list(prompt) + list(cont), split)[len(prompt) :])
        return rows

    def _reusable_len(self, query, prompt) -> int:
        """The Engine's R for ``prompt``: prefill-only KV's own rule, with the query
        tokenized as the Engine tokenizes it (whole, special tokens included)."""
        from prefillonly_sgl.features.prefill_kv.policy import reusable_prefix_len

        own = self.tokenizer.encode(query) if isinstance(query, str) else list(query)
        return reusable_prefix_len(own, prompt)

    def score(self, query, items, label_token_ids, apply_softmax: bool = True, item_first=False):
        """One list per item, like Engine.score."""
        import torch

        rows = []
        for item in items:
            ids = self._ids(self.prompt_ids(query, item, item_first))
            with torch.no_grad():
                logits = self.model(input_ids=ids).logits[0, -1].double()
            if apply_softmax:
                rows.append(torch.softmax(logits[label_token_ids], dim=-1).tolist())
            else:
                rows.append(torch.softmax(logits, dim=-1)[label_token_ids].tolist())
        return rows

    @cached_property
    def head_model(self):
        """The checkpoint under its classification head (AutoModelForSequenceClassification)."""
        import torch
        from transformers import AutoModelForSequenceClassification

        model = AutoModelForSequenceClassification.from_pretrained(
            self.model_path, dtype=getattr(torch, self.dtype)
        )
        return model.to(self.device).eval()

    def class_scores(
        self,
        query,
        items,
        apply_softmax: bool = True,
        item_first: bool = False,
        temperature: float = 1.0,
        hidden: bool = False,
    ):
        """A classification head's answer per item (Engine.score on a head model): the
        head's logits at the prompt's last position (float64), their softmax over
        temperature with apply_softmax; hidden=True: (rows, each prompt's last hidden
        state under the head)."""
        import torch

        rows, states = [], []
        for item in items:
            ids = self._ids(self.prompt_ids(query, item, item_first))
            with torch.no_grad():
                out = self.head_model(input_ids=ids, output_hidden_states=True)
            logits = out.logits[0].double().cpu()
            if apply_softmax:
                logits = torch.softmax((logits - logits.max()) / temperature, dim=-1)
            rows.append(logits.tolist())
            states.append(out.hidden_states[-1][0, -1].double().cpu())
        return (rows, states) if hidden else rows

    def score_sequences(
        self,
        query,
        items,
        labels,
        apply_softmax: bool = True,
        length_normalize: bool = False,
        item_first: bool = False,
    ):
        """Engine.score with labels of any length (each a token id or a list of them)."""
        import torch

        labels = [[label] if isinstance(label, int) else list(label) for label in labels]
        rows = []
        for item in items:
            prompt = self.prompt_ids(query, item, item_first)
            sums = []
            for label in labels:
                ids = self._ids(prompt + list(label))
                with torch.no_grad():
                    logits = self.model(input_ids=ids).logits[0].double()
                logprobs = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
                total = logprobs[torch.arange(len(label)), torch.tensor(label)].sum()
                sums.append(total / len(label) if length_normalize else total)
            s = torch.stack(sums)
            rows.append((torch.softmax(s, dim=0) if apply_softmax else s.exp()).tolist())
        return rows
