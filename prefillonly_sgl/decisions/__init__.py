"""Typed decisions: a state and typed questions about it (yes/no, one of N options, a level
on a scale), each answered with every option's probability, nothing generated.

    call.py      the call every front builds (DecisionCall) and the answers (QuestionResult)
    prompts.py   the wording and the state's place in the chat template
    plan.py      the call compiled to score requests: the state once, each question an item
    answers.py   probabilities -> answers: normalising, debiasing, calibration, confidence
    execution.py the plan run on a score function (the Engine's or the server's front)
    state_images.py a state's images readied for a vision-language model (placeholders,
                 loaded bytes; the server's side: sglang_runtime/decision_images.py)
(the three wire shapes of a call, OpenAI's, System One's and SGLang's, and their
conversions: wire/openai.py, wire/systemone.py, wire/sglang.py)

Plain Python: the SGLang side is ScoringFront.decide (sglang_runtime/score_front.py);
the HTTP routes are apis/decisions.py; the DSL's decision functions are dsl/decision.py.
See docs/decisions.md.
"""
