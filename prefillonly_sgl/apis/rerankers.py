"""The built-in rerankers of `/v1/rerank` (and `/v2/rerank`, `/rerank`), and which one a
server uses (plain Python: DSL declarations and a rule).

- ``judge`` (qwen3_reranker): Qwen3-Reranker's own yes/no prompt, P(yes) over yes/no.
  What a generative reranker is trained for; on a general model it ranks badly (a 135M
  instruct model put "The stock market fell sharply" first for "What is the capital of
  France?").
- ``query-likelihood`` (query_likelihood): the mean log-probability of the query's tokens
  after the document and an instruction to write a question about it (Sachan et al. 2022,
  "Improving Passage Retrieval with Zero-Shot Question Generation"). Zero-shot on any
  causal LM. One forward per document: the instruction is the shared prefix (kept in the
  prefix cache), the query the continuation (Engine.continuation_logprobs).

``rerank_method`` picks: the one asked for (`serve --rerank-method`), else by model:
the judge for a model named as a reranker (Qwen3-Reranker-0.6B, ...), query likelihood
for the rest.
"""

from __future__ import annotations

from pathlib import PurePath

from prefillonly_sgl.dsl import Prompt, ranker
from prefillonly_sgl.server.options import RERANK_METHODS

# Qwen3-Reranker's own prompt (its model card): ChatML, a judging system turn, the query
# in the user turn and the document last, then an empty thinking block; labels yes / no.
QWEN3_SYSTEM = (
    "Judge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".'
)
DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
QUESTION_INSTRUCTION = "Please write a question based on this passage."


@ranker(labels=["yes", "no"], score="yes", item="document", path="/v1/rerank/default")
def qwen3_reranker(query: str, document: str, instruction: str = DEFAULT_INSTRUCTION) -> Prompt:
    """Relevance of a document to a query: P(yes) over yes/no, Qwen3-Reranker's format."""
    return Prompt(
        prefix=f"<|im_start|>system\n{QWEN3_SYSTEM}<|im_end|>\n<|im_start|>user\n"
        f"<Instruct>: {instruction}\n<Query>: {query}\n",
        item=f"<Document>: {document}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    )


@ranker(method="likelihood", item="document", path="/v1/rerank/query_likelihood")
def query_likelihood(query: str, document: str, instruction: str = QUESTION_INSTRUCTION) -> Prompt:
    """Relevance of a document to a query: the query's mean log-probability per token
    after the document (query likelihood; ``instruction``: what precedes the passage)."""
    return Prompt(
        prefix=f"{instruction}\n",
        item=f"Passage: {document}\nQuestion:",
        continuation=f" {query}",
    )


BUILTIN_RERANKERS = {"judge": qwen3_reranker, "query-likelihood": query_likelihood}


def rerank_method(requested: str, model: str | None) -> str:
    """The built-in method of a server: ``requested`` unless "auto"; then "judge" for a
    model whose name says it is a reranker, "query-likelihood" otherwise."""
    if requested not in RERANK_METHODS:
        raise ValueError(f"--rerank-method {requested}: expected one of {list(RERANK_METHODS)}")
    if requested != "auto":
        return requested
    name = PurePath(str(model or "")).name.lower()
    return "judge" if "rerank" in name else "query-likelihood"
