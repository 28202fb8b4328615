"""Credit verification on German credit: each applicant's record rendered as text behind
a shared few-shot instruction, classified good / bad by ``@classifier``; accuracy and ROC
AUC (of P(bad)) against the recorded creditability, with and without contextual
calibration, next to the majority-class baseline.

    python examples/credit_scoring.py [--limit 200] [--shots 4] [--model FOLDER]
"""

from __future__ import annotations

import random
import time

from prefillonly_sgl.batch import run_batch
from prefillonly_sgl.data.german_credit import load_german_credit
from prefillonly_sgl.dsl import Prompt, classifier
from prefillonly_sgl.pipelines.common import engine_for, output_dir, read_results
from prefillonly_sgl.verification.quality_metrics import accuracy, balanced_accuracy, roc_auc

LABELS = ["good", "bad"]
FIELDS = {  # column -> how the prompt names it (the most telling half of the 20)
    "status_of_existing_checking_account": "checking account",
    "duration_in_month": "duration in months",
    "credit_history": "credit history",
    "purpose": "purpose",
    "credit_amount": "amount (DM)",
    "savings_account_and_bonds": "savings",
    "present_employment_since": "employed",
    "age_in_years": "age",
    "housing": "housing",
    "other_installment_plans": "other installment plans",
}
INSTRUCTION = "Assess each loan applicant's credit risk as good or bad.\n\n"


def describe(record: dict) -> str:
    return "; ".join(f"{name}: {record[column]}" for column, name in FIELDS.items())


def credit_risk_prompt(applicant: str, examples: str) -> Prompt:
    return Prompt(prefix=examples, item=f"Applicant: {applicant}\nCredit risk:")


credit_risk = classifier(labels=LABELS)(credit_risk_prompt)
credit_risk_calibrated = classifier(labels=LABELS, calibrate="applicant")(credit_risk_prompt)


def split(shots: int, limit: int, seed: int = 0) -> tuple[str, list[dict]]:
    """The few-shot prefix (shots, half good and half bad) and `limit` other applicants."""
    applicants = load_german_credit()
    random.Random(seed).shuffle(applicants)
    examples = []
    for label in LABELS:
        examples += [a for a in applicants if a["creditability"] == label][: shots // 2]
    random.Random(seed).shuffle(examples)
    prefix = INSTRUCTION + "".join(
        f"Applicant: {describe(a)}\nCredit risk: {a['creditability']}\n\n" for a in examples
    )
    rest = [a for a in applicants if a not in examples][:limit]
    return prefix, [{"applicant": describe(a), "truth": a["creditability"]} for a in rest]


def metrics(results: list[dict]) -> dict:
    truth = [r["truth"] for r in results]
    return {
        "accuracy": accuracy(truth, [r["label"] for r in results]),
        "balanced_accuracy": balanced_accuracy(truth, [r["label"] for r in results]),
        "roc_auc": roc_auc([t == "bad" for t in truth], [r["probs"]["bad"] for r in results]),
        "predicted_bad": sum(r["label"] == "bad" for r in results) / len(results),
    }


def run(limit=200, shots=4, engine=None, model=None, device=None, out=None, progress=True):
    prefix, records = split(shots, limit)
    for record in records:
        record["examples"] = prefix
    folder = output_dir(out, "credit")
    truth = [r["truth"] for r in records]
    report = {"applicants": len(records), "bad_share": truth.count("bad") / len(truth)}
    report["majority_accuracy"] = max(report["bad_share"], 1 - report["bad_share"])
    with engine_for(engine, model, device) as engine:
        for name, function in (("plain", credit_risk), ("calibrated", credit_risk_calibrated)):
            path = folder / f"credit_{name}.jsonl"
            started = time.perf_counter()
            batch = run_batch(function, records, path, engine=engine, keep=["truth"],
                              overwrite=True, progress=progress)  # fmt: skip
            report[name] = {**metrics(read_results(path)), "seconds": time.perf_counter() - started,
                            "cache_hit_share": batch.cache_hit_share}  # fmt: skip
    report["output"] = str(folder)
    return report


def print_report(report: dict) -> None:
    print(f"[credit] {report['applicants']} German credit applicants "
          f"({report['bad_share']:.0%} bad); majority-class accuracy "
          f"{report['majority_accuracy']:.3f}")  # fmt: skip
    for name in ("plain", "calibrated"):
        m = report[name]
        print(f"[credit] {name:<10} accuracy {m['accuracy']:.3f}  balanced "
              f"{m['balanced_accuracy']:.3f}  ROC AUC {m['roc_auc']:.3f}  "
              f"predicted bad {m['predicted_bad']:.0%}  {m['seconds']:.1f} s")  # fmt: skip
    print(f"[credit] results in {report['output']}")
