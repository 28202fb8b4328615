"""Choice requests: OpenAI / vLLM requests whose output is one of a fixed set of strings
(vLLM's `structured_outputs.choice`, the legacy `guided_choice`, a `response_format`
json_schema of enums and booleans, SGLang's `regex` when it is an alternation of
literals), answered by scoring every choice behind the prompt instead of decoding under a
grammar (docs/openai.md, "Choice requests"). Plain Python: which requests qualify and
the answer's shape (constraints.py, shapes.py, regex_literals.py), how the answer is
picked from the choices' token log-probabilities (selection.py) and how it is written
in OpenAI's formats (rendering.py). The SGLang side is sglang_runtime/choice_requests.py.
Imports scoring/ and single_token/; imported by server/ (the guard's check) and
sglang_runtime/.
"""
