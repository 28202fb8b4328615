"""The processes: a child runs one system's engine and the turns the parent gives it
(files in the run's turns folder); the parent starts the children, decides which engines
run the load parts (the graph check), hands out the turns part by part and merges what
comes back into the results."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

from harness import process_group, stats

from card_engine.diagnostics import engine_facts, save_diagnostics, set_forward_log
from card_engine.model import build_model, reference_logprobs
from card_engine.parts import (
    LATE_CORRECTNESS,
    context,
    load_turn,
    part_correctness,
    run_long,
    warm_up,
)
from card_engine.report import environment, write
from card_engine.systems import (
    GRACE,
    GRAPH_CHECK_TOLERANCE,
    GRAPH_CHECKED,
    LOAD_PARTS,
    NO_GRAPHS,
    SYSTEM_PARTS,
    SYSTEMS,
    resolved_settings,
    skip_reason,
    start_engine,
)

# The script each child runs (its own arguments: --system, --turns, ...).
ENTRY = Path(__file__).resolve().parents[1] / "gpu_engine.py"


def _write_json(path: Path, data: dict) -> None:
    """Whole or not at all (the other side polls for the file)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, default=str))
    os.replace(tmp, path)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------- a child: one system


def run_system(args) -> int:
    """A child: one system's engine. It starts, runs correctness's early cases (not
    timed) and the warm-ups of its load parts, says it is ready (LABEL.status.json in
    args.turns), then runs the turns the parent gives it (LABEL.turnK.json ->
    LABEL.outK.json), one at a time, until told to exit. LABEL: the system, or
    SYSTEM-nographs for a graph check's second engine. Its forward and hybrid logs are
    LABEL.forwards.jsonl and LABEL.hybrid.jsonl beside them (the run's diagnostics)."""
    started = time.perf_counter()
    system, turns, label = args.system, args.turns, args.label or args.system
    status_path = turns / f"{label}.status.json"
    folder = args.work / args.model
    ctx = context(args, folder, _read_json(turns / "context.json") or {})
    report = {"errors": {}, "warmup": {}, "correctness_rows": []}

    def log(message: str) -> None:
        print(f"[{label} {time.perf_counter() - started:6.1f} s] {message}", flush=True)

    if args.parts == ["long"]:
        _write_json(status_path, {"phase": "done", "report": run_long(args, folder, ctx, log)})
        return 0
    _write_json(status_path, {"phase": "starting"})
    from prefillonly_sgl.machine.environment import FORWARD_LOG, HYBRID_LOG

    forward_log = turns / f"{label}.forwards.jsonl"
    forward_log.unlink(missing_ok=True)
    set_forward_log(forward_log)
    os.environ[FORWARD_LOG] = str(forward_log)  # read by the engine's scheduler at start
    os.environ[HYBRID_LOG] = str(turns / f"{label}.hybrid.jsonl")
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings(record=True) as start_warnings:
            warnings.simplefilter("always")
            engine, report["graphs"] = start_engine(system, folder, args, args.sizes, args.graphs)
    except Exception:
        report["errors"][f"{label} start"] = traceback.format_exc()
        log(report["errors"][f"{label} start"])
        _write_json(status_path, {"phase": "failed", "report": report})
        return 1
    report["start_s"] = time.perf_counter() - t0
    # the engine's own warnings (prefill-only KV off and why, a family's features off),
    # not the libraries' deprecation notices
    ours = {str(w.message) for w in start_warnings if issubclass(w.category, RuntimeWarning)}
    report["engine"] = engine_facts(engine, sorted(ours))
    log(f"engine started in {report['start_s']:.1f} s: {json.dumps(report['engine'])}")
    with engine:
        report["resolved"] = resolved_settings(engine)
        if "correctness" in args.parts:
            log("correctness")
            try:
                report["correctness_rows"] = part_correctness(engine, label, ctx, log)
            except Exception:
                report["errors"][f"{label} correctness"] = traceback.format_exc()
                log(report["errors"][f"{label} correctness"])
        for part in [p for p in args.parts if p in LOAD_PARTS]:
            try:
                report["warmup"][part] = warm_up(engine, part, ctx, log)
            except Exception:
                report["errors"][f"{label} {part} warm-up"] = traceback.format_exc()
                log(report["errors"][f"{label} {part} warm-up"])
        _write_json(status_path, {"phase": "ready", "report": report})
        k = 0
        while True:
            turn = _wait_for(turns / f"{label}.turn{k}.json", args.ends_at + GRACE)
            if turn is None or turn.get("exit"):
                break
            part = turn["part"]
            log(f"{part} (turn {k})")
            try:
                if part == LATE_CORRECTNESS:
                    out = {"part": part, "rows": part_correctness(engine, label, ctx, log, True)}
                else:
                    out = load_turn(
                        engine, system, part, ctx, turn.get("rates"), turn["ends_at"], log
                    )
            except Exception:
                out = {"part": part, "error": traceback.format_exc()}
                log(out["error"])
            _write_json(turns / f"{label}.out{k}.json", out)
            k += 1
    _write_json(status_path, {"phase": "done", "report": report})
    return 0


def _wait_for(path: Path, until: float) -> dict | None:
    while time.time() < until:
        data = _read_json(path)
        if data is not None:
            return data
        time.sleep(0.2)
    return None


# ---------------------------------------------------------------- the parent


class Child:
    """One system's process (a session of its own: killing it kills its engine's workers,
    which hold the card)."""

    def __init__(
        self,
        args,
        model: str,
        system: str,
        parts: list[str],
        turns: Path,
        graphs: str,
        label: str | None = None,
    ):
        self.system, self.parts, self.turns, self.graphs = system, parts, turns, graphs
        self.label = label = label or system
        self.status_path = turns / f"{label}.status.json"
        self.status_path.unlink(missing_ok=True)
        for old in turns.glob(f"{label}.turn*.json"):
            old.unlink()
        for old in turns.glob(f"{label}.out*.json"):
            old.unlink()
        command = [sys.executable, str(ENTRY), "--model", model, "--device", args.device]
        command += ["--work", str(args.work), "--system", system, "--parts", ",".join(parts)]
        command += ["--label", label]
        command += ["--turns", str(turns), "--graphs", graphs, "--ends-at", str(args.ends_at)]
        command += ["--rec-p99", str(args.rec_p99), "--burst", str(args.sizes["burst"])]
        command += ["--pool-tokens", str(args.sizes["pool_tokens"])]
        command += ["--hold-seconds", str(args.sizes["hold_seconds"])]
        command += ["--hold-requests", str(args.sizes["hold_requests"])]
        command += ["--rate-factors", ",".join(str(f) for f in args.sizes["rate_factors"])]
        command += ["--tiny"] if args.tiny else []
        self.process = subprocess.Popen(command, start_new_session=True)
        self.turn = 0

    def status(self) -> dict:
        return _read_json(self.status_path) or {}

    def alive(self) -> bool:
        return self.process.poll() is None

    def wait_ready(self, until: float) -> str:
        """ "ready", "failed" (its report says why), "exited" or "late"."""
        while time.time() < until:
            phase = self.status().get("phase")
            if phase in ("ready", "failed"):
                return phase
            if not self.alive():
                return "exited"
            time.sleep(0.2)
        return "late"

    def run_turn(self, part: str, rates, ends_at: float, hard_end: float) -> dict | None:
        k = self.turn
        self.turn += 1
        turn = {"part": part, "rates": rates, "ends_at": ends_at}
        _write_json(self.turns / f"{self.label}.turn{k}.json", turn)
        out_path = self.turns / f"{self.label}.out{k}.json"
        while time.time() < hard_end and self.alive():
            out = _read_json(out_path)
            if out is not None:
                return out
            time.sleep(0.2)
        return _read_json(out_path)

    def request_exit(self) -> None:
        """Tells it to exit (once): its engine shuts down while the parent goes on."""
        if self.alive() and not getattr(self, "exiting", False):
            self.exiting = True
            k = self.turn
            self.turn += 1
            _write_json(self.turns / f"{self.label}.turn{k}.json", {"exit": True})

    def finish(self, limit: float) -> str:
        """Tells it to exit and waits up to `limit` s (then kills it); what happened."""
        self.request_exit()
        try:
            code = self.process.wait(timeout=max(1.0, limit))
        except subprocess.TimeoutExpired:
            self.kill()
            return f"the process ran past its time ({limit:.0f} s left) and was killed"
        return f"the process ended with code {code}"

    def kill(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()


def run_in_group(command: list[str], limit: float) -> tuple[int | None, str]:
    """Runs a command in a process group of its own: one that runs past `limit` seconds
    (a hung engine) is killed with its engine's workers, which hold the card, and so is one
    the user interrupts. Returns its exit code (None: killed) and what to report."""
    code = process_group.run_in_group(command, limit)
    if code is None:
        return None, f"the process ran past {limit:.0f} s and was killed"
    return code, f"the process ended with code {code} (the log has its error)"


def merge_ready(results: dict, system: str, report: dict) -> None:
    """A child's start-up report (engine start, graphs, correctness, warm-ups) into results."""
    if "start_s" in report:
        results["part_seconds"][f"{system} start"] = report["start_s"]
    if "graphs" in report:
        results["graphs"][system] = report["graphs"]
    if report.get("resolved"):
        results["resolved"][system] = report["resolved"]
    if report.get("warmup"):
        results["warmup"][system] = report["warmup"]
    if report.get("correctness_rows"):
        results["correctness"].setdefault("rows", []).extend(report["correctness_rows"])
    if report.get("engine"):
        results["engines"][system] = report["engine"]
    results["errors"].update(report.get("errors", {}))


def merge_turn(results: dict, system: str, part: str, out: dict | None, why: str) -> None:
    if out is None:
        results["errors"][f"{system} {part}"] = f"no result: {why}"
        return
    if "error" in out:
        results["errors"][f"{system} {part}"] = out["error"]
        return
    entry = results.setdefault(part, {})
    if "capacity" in out:
        entry.update(out["capacity"])
    entry.setdefault("systems", {})[system] = out["entry"]


def graph_difference(rows: list[dict], first: str, second: str) -> tuple[float | None, str]:
    """The largest |label log-probability difference| between two engines' answers to the
    same correctness cases, and its case; None when they share no case."""
    answers = {(r["system"], r["case"]): r.get("logprobs") for r in rows}
    worst, where = None, ""
    for (system, case), mine in answers.items():
        theirs = answers.get((second, case))
        if system != first or not mine or not theirs:
            continue
        diff = max(abs(a - b) for a, b in zip(mine, theirs, strict=True))
        if worst is None or diff > worst:
            worst, where = diff, case
    return worst, where


def turn_seconds(sizes: dict, rates) -> float:
    """What a load turn needs at least: its burst and its first rate's hold, each with its
    drain (the first system, before any rate is known: a hold and a drain). rate_runs
    then starts each further rate only where it fits."""
    drain = sizes["drain_seconds"]
    if not rates:
        return sizes["hold_seconds"] + drain
    capacity = rates[0] / sizes["rate_factors"][0]
    held = stats.held_requests(
        rates[0], sizes["hold_seconds"], sizes["hold_requests"], sizes["least_requests"]
    )
    return sizes["burst"] / capacity + drain + held / rates[0] + drain


class ModelRun:
    """One model's systems: started (together, or one after another without --overlap),
    then their timed parts, part by part, then the long prompt's engines."""

    def __init__(self, args, model: str, out: Path, started: float, ends: float, log) -> None:
        self.args, self.model, self.out, self.log = args, model, out, log
        self.started, self.ends = started, ends
        self.turns = args.work / "turns" / model
        if self.turns.exists():  # an earlier call's on the same machine: not this run's
            shutil.rmtree(self.turns)
        self.turns.mkdir(parents=True, exist_ok=True)
        self.results = {
            "environment": environment(args.device),
            "command": " ".join(["benchmarks/gpu_engine.py", *args.argv]),
            "model": model,
            "sizes": args.sizes,
            "deadline_s": args.deadline,
            "overlap": args.overlap,
            "errors": {},
            "part_seconds": {},
            "skipped": {},
            "graphs": {},
            "resolved": {},
            "warmup": {},
            "correctness": {},
            "engines": {},
        }

    def save(self) -> None:
        write(self.results, self.out)

    def run(self) -> dict:
        args, results = self.args, self.results
        folder = build_model(self.model, args.work / self.model, args.device, args.dtype)
        self.log(f"model {self.model} at {folder}")
        systems = []
        for system in [s for s in SYSTEMS if s in args.systems]:
            parts = [p for p in args.parts if p in SYSTEM_PARTS[system]]
            reason = skip_reason(system, args.device) if parts else None
            if reason:
                results["skipped"][system] = reason
                self.log(f"{system}: skipped: {reason}")
            elif parts:
                systems.append((system, parts))
        references = {}
        ctx = context(args, folder, {})
        if "correctness" in args.parts:
            cases, labels = ctx["correctness_cases"], ctx["labels"]
            references["reference"] = reference_logprobs(folder, cases, labels, args.device)
            if any(s == "stock-mis" and "correctness" in p for s, p in systems):
                references["reference_mis"] = reference_logprobs(
                    folder, cases, labels, args.device, mis=True
                )
            results["correctness"] = dict(references)
        _write_json(self.turns / "context.json", references)
        engine_systems = [(s, [p for p in parts if p != "long"]) for s, parts in systems]
        engine_systems = [(s, parts) for s, parts in engine_systems if parts]
        if args.overlap:
            self.engines(engine_systems)
        else:
            for system, parts in engine_systems:
                self.engines([(system, parts)])
        for system, parts in systems:
            if "long" in parts:
                self.long(system)
        self.save()
        save_diagnostics(self.turns, self.out)
        return results

    def engines(self, systems: list[tuple[str, list[str]]], graphs: str = "auto") -> None:
        """Starts these systems' engines together (with a graph check's second engine,
        graphs off, beside each of GRAPH_CHECKED), waits for them to be ready, decides
        which engine of a checked system runs the load parts (graph_decision), then runs
        the load parts part by part, system by system, then correctness's late cases; a
        system that failed to start with prefill graphs and has no second engine is
        retried alone without them."""
        results = self.results
        if time.time() > self.ends - self.args.sizes["hold_seconds"]:
            for system, parts in systems:
                results["errors"][f"{system} {'+'.join(parts)}"] = "not started: past the deadline"
            return
        note = " (prefill graphs off)" if graphs == "off" else ""
        self.log(f"starting {', '.join(s for s, _ in systems)}{note}")
        children = {
            system: Child(self.args, self.model, system, parts, self.turns, graphs)
            for system, parts in systems
        }
        checks = {}
        if graphs == "auto" and self.args.graphs_check:
            for system, parts in systems:
                if system in GRAPH_CHECKED and "correctness" in parts:
                    label = f"{system}-{NO_GRAPHS}"
                    self.log(f"starting {label} (the graph check)")
                    checks[system] = Child(
                        self.args, self.model, system, parts, self.turns, "off", label
                    )
        ready, retry = {}, []
        for system, child in children.items():
            if self._wait(child):
                ready[system] = child
            elif graphs == "auto" and self.args.device == "cuda" and system != "stock-mis":
                if system not in checks:
                    retry.append((system, child.parts))
        checked = {s: c for s, c in checks.items() if self._wait(c)}
        active = self.graph_decision(ready, checked)
        for child in [*ready.values(), *checked.values()]:
            if child not in active.values():
                child.request_exit()  # not measured: its memory back to the card now
        self.save()
        order = [s for s in SYSTEMS if s in active]
        for part in LOAD_PARTS:
            for system in [s for s in order if part in active[s].parts]:
                self.turn(active[system], part)
        for system in [s for s in order if "correctness" in active[s].parts]:
            self.late_correctness(active[system])
        everyone = [*ready.values(), *checked.values()]
        for child in everyone:  # every engine shuts down at once
            child.request_exit()
        for child in everyone:
            ended = child.finish(self.args.ends_at + GRACE - time.time())
            if "killed" in ended:
                results["errors"][f"{child.label} exit"] = ended
            results["errors"].update(child.status().get("report", {}).get("errors", {}))
        self.save()
        for system, parts in retry:
            retried = results.setdefault("retried_without_graphs", [])
            retried.append(system)
            self.engines([(system, parts)], graphs="off")

    def _wait(self, child: Child) -> bool:
        """Waits for a child's engine; its start-up report into the results. False (and
        the child killed) when it is not ready."""
        phase = child.wait_ready(self.ends)
        merge_ready(self.results, child.label, child.status().get("report", {}))
        if phase == "ready":
            return True
        if phase == "late":
            self.results["errors"][f"{child.label} start"] = "not ready by its model's deadline"
        elif phase == "exited":
            self.results["errors"].setdefault(f"{child.label} start", child.finish(5))
        self.log(f"{child.label}: {phase}")
        child.kill()
        return False

    def graph_decision(self, ready: dict, checked: dict) -> dict:
        """Which engine of each system runs the load parts. The graph check (sglang
        #37606): each checked system's correctness answers with prefill graphs and
        without; if any system's differ by more than GRAPH_CHECK_TOLERANCE, every checked
        system runs without graphs (both systems alike), and the results say why. A
        system whose graph engine did not start runs on its second engine."""
        active = dict(ready)
        if not checked:
            return active
        rows = self.results["correctness"].get("rows", [])
        check = self.results.setdefault("graph_check", {"tolerance": GRAPH_CHECK_TOLERANCE})
        differ = []
        for system, second in checked.items():
            if system not in ready:
                active[system] = second
                check[system] = {"note": "its engine with graphs did not start"}
                continue
            diff, case = graph_difference(rows, system, second.label)
            check[system] = {"max_diff": diff, "case": case}
            self.log(f"graph check {system}: max |logprob diff| on/off {diff:.2e} ({case})")
            if diff is None or diff > GRAPH_CHECK_TOLERANCE:
                differ.append(system)
        if differ:
            check["decision"] = (
                f"prefill graphs off for {', '.join(checked)}: {', '.join(differ)} answered "
                f"differently with graphs (over {GRAPH_CHECK_TOLERANCE} nats, or no answer to "
                "compare; sglang #37606)"
            )
            active.update(checked)
        else:
            check["decision"] = "prefill graphs on: each checked system answered the same"
        self.log(f"graph check: {check['decision']}")
        return active

    def turn(self, child: Child, part: str) -> None:
        results, sizes = self.results, self.args.sizes
        rates = results.get(part, {}).get("rates")
        need = turn_seconds(sizes, rates)
        if time.time() + need > self.ends:
            results["errors"][f"{child.label} {part}"] = (
                f"not started: past its model's deadline (it needs ~{need:.0f} s)"
            )
            self.log(f"{child.label} {part}: not started (deadline)")
            return
        self.log(f"{child.label}: {part}")
        t0 = time.perf_counter()
        out = child.run_turn(part, rates, self.ends, self.args.ends_at + GRACE)
        results["part_seconds"][f"{child.label} {part}"] = time.perf_counter() - t0
        why = "the process ended" if not child.alive() else "past the deadline"
        merge_turn(results, child.label, part, out, why)
        self.save()

    def late_correctness(self, child: Child) -> None:
        """Correctness's late cases (first-time kernel paths) on a measured engine."""
        results = self.results
        if time.time() > self.ends - 5:
            results["errors"][f"{child.label} {LATE_CORRECTNESS}"] = "not started: deadline"
            return
        self.log(f"{child.label}: {LATE_CORRECTNESS}")
        t0 = time.perf_counter()
        out = child.run_turn(LATE_CORRECTNESS, None, self.ends, self.args.ends_at + GRACE)
        results["part_seconds"][f"{child.label} {LATE_CORRECTNESS}"] = time.perf_counter() - t0
        if out is None or "error" in out:
            why = "the process ended" if not child.alive() else "past the deadline"
            results["errors"][f"{child.label} {LATE_CORRECTNESS}"] = (
                out["error"] if out else f"no result: {why}"
            )
        else:
            results["correctness"].setdefault("rows", []).extend(out["rows"])
        self.save()

    def long(self, system: str) -> None:
        results = self.results
        if time.time() > self.ends - (0 if self.args.tiny else 60):
            results["errors"][f"{system} long"] = "not started: past its model's deadline"
            return
        self.log(f"{system}: long")
        t0 = time.perf_counter()
        child = Child(self.args, self.model, system, ["long"], self.turns, "auto")
        ended = child.finish(self.args.ends_at + GRACE - time.time())
        results["part_seconds"][f"{system} long"] = time.perf_counter() - t0
        report = child.status().get("report")
        if report is None:
            results["errors"][f"{system} long"] = ended
            return
        results["errors"].update(report.get("errors", {}))
        if "long" in report:
            entry = results.setdefault("long", {"tokens": report["long"]["tokens"], "systems": {}})
            entry["systems"][system] = {k: v for k, v in report["long"].items() if k != "tokens"}
            entry["systems"][system]["warmup_s"] = report.get("warmup_s")
        self.save()
