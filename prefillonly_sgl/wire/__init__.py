"""Every JSON contract a client of ours or of a peer's parses, one module per client
family (plain Python, pydantic, no SGLang): the server's routes and our clients both
import these models, so a body is declared once.

    fields.py        the `cache_salt` field and request_body, shared by every module here
    prefillonly.py   our own bodies: /v1/score's usage, /v1/score_labels, the APIs' usage
    cohere.py        Cohere's rerank v1 and v2
    tei.py           Hugging Face TEI's /rerank
    sglang.py        SGLang's: native rerank answer and gateway meta, /v1/classify, /v1/decisions
    openai.py        OpenAI's /v1/decisions
    systemone.py     System One's /v1/systemone
    vllm.py          vLLM's conventions where they meet another peer's on one path
    rerank_content.py  a rerank query or document with images (SGLang's, vLLM's, Jina's shapes)
    chat_images.py   the image parts of an OpenAI chat: where each is, its URL

May import scoring/ and decisions/call.py (the call a decisions body becomes); the fronts
(apis/, dsl/, sglang_runtime/, engine.py) import it.
"""
