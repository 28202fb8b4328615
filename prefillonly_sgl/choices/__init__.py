"""Choice requests: OpenAI / vLLM requests whose output is one of a fixed set of strings
(vLLM's `structured_outputs.choice`, the legacy `guided_choice`, a `response_format`
json_schema of enums and booleans, SGLang's `regex` when it is an alternation of
literals), answered by scoring every choice behind the prompt instead of decoding under a
grammar (docs/openai.md, "Choice requests"). Plain Python: which requests qualify and
the answer's shape (constraints.py, shapes.py, regex_literals.py), which way a request
goes and vLLM's constraint fields (routing.py), how the answer is written part by part
(answering.py) and picked from the choices' token log-probabilities (selection.py), and
how it is written in OpenAI's formats with its usage (rendering.py). The SGLang side,
sglang_runtime/choice_requests.py, keeps only the translation to and from SGLang's
request objects and calls.
Imports scoring/ and single_token/; imported by server/ (the guard's check) and
sglang_runtime/.
"""
