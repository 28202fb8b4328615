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

from card_engine.diagnostics import (
    engine_facts,
    forward_report,
    peak_tflops,
    save_diagnostics,
    set_forward_log,
    summarize_profiles,
)
from card_engine.model import build_model, reference_logprobs
from card_engine.parts import (
    LATE_CORRECTNESS,
    context,
    load_turn,
    part_correctness,
    part_profile,
    run_long,
    warm_up,
)
from card_engine.report import environment, write
from card_engine.systems import (
    AB_PARTS,
    FUSED_OPS,
    FUSED_OPS_VARIABLE,
    GRACE,
    GRAPH_CHECK_TOLERANCE,
    GRAPH_CHECKED,
    LOAD_PARTS,
    NO_GRAPHS,
    SHAPES,
    SYSTEM_PARTS,
    SYSTEMS,
    ab_label,
    resolved_settings,
    skip_reason,
    start_engine,
    system_env,
    system_note,
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
    SYSTEM-nographs for a graph check's second engine, SYSTEM-compile (-torch) for a
    fused-ops A/B's. Its forward, hybrid and kernel-profile logs are LABEL.forwards.jsonl,
    LABEL.hybrid.jsonl and LABEL.kernels.jsonl beside them (the run's diagnostics)."""
    started = time.perf_counter()
    system, turns, label = args.system, args.turns, args.label or args.system
    status_path = turns / f"{label}.status.json"
    folder = args.work / args.model
    ctx = context(args, folder, _read_json(turns / "context.json") or {})
    report = {"errors": {}, "warmup": {}, "correctness_rows": []}

    def log(message: str) -> None:
        print(f"[{label} {time.perf_counter() - started:6.1f} s] {message}", flush=True)

    # the fused ops' backend and the variant's switches, for the engine's processes
    os.environ.update(system_env(system, args.fused_ops))
    if args.fused_ops == "compile":
        # inductor compiles in-process: a pool of compile workers per engine would crowd
        # the card machine's 16 cores while every engine starts
        os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    if args.parts == ["long"]:
        _write_json(status_path, {"phase": "done", "report": run_long(args, folder, ctx, log)})
        return 0
    _write_json(status_path, {"phase": "starting"})
    from prefillonly_sgl.machine.environment import FORWARD_LOG, HYBRID_LOG

    profile_path = None
    if "profile" in args.parts:
        # the engine's kernel profile (issue 83, item 2: forward_profile/kernel_profile.py),
        # armed by the profile part
        from prefillonly_sgl.machine import environment

        profile_path = turns / f"{label}.kernels.jsonl"
        profile_path.unlink(missing_ok=True)
        Path(f"{profile_path}.arm").unlink(missing_ok=True)
        os.environ[getattr(environment, "KERNEL_PROFILE", "PREFILLONLY_KERNEL_PROFILE")] = str(
            profile_path
        )

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
                elif part == "profile":
                    out = part_profile(engine, ctx, profile_path, log)
                else:
                    out = load_turn(engine, label, part, ctx, turn, log)
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
        fused_ops: str | None = None,
    ):
        self.system, self.parts, self.turns, self.graphs = system, parts, turns, graphs
        self.fused_ops = fused_ops or args.fused_ops
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
        command += ["--bursts", str(args.sizes["grid"]["bursts"])]
        command += ["--fused-ops", self.fused_ops]
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

    def run_turn(self, turn: dict, hard_end: float) -> dict | None:
        """Hands it a turn ({"part", "ends_at", ...}) and waits for its result."""
        k = self.turn
        self.turn += 1
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


def grid_requests(rates: list[float], capacities: list[float], grid: dict, seconds: float) -> int:
    """Requests per rate of the items grid, so that its passes fit `seconds`: a rate's run
    lasts its arrivals (n / rate) or, past a system's capacity, its service (n /
    capacity), plus grid["overhead_s"]; clamped to [least, most] (a rate that still
    cannot end in time is not started: rate_runs)."""
    per_request = sum(max(1 / r, 1 / c) for r in rates for c in capacities)
    overhead = grid["overhead_s"] * len(rates) * len(capacities)
    fit = (seconds / grid["passes"] - overhead) / per_request if per_request else grid["most"]
    return int(max(grid["least"], min(grid["most"], fit)))


def worst_of_passes(system: dict, passes: int) -> None:
    """A system's items figure: the lower of its passes' crossings (a pass that did not
    run counts as missing, and the figure says so)."""
    done = [p for p in system.get("passes", []) if p.get("rows")]
    if not done:
        system.update(rate_at_p99=0.0, rate_exact=False, worst_pass=None)
        return
    worst = min(done, key=lambda p: (p["rate_at_p99"], p["rate_exact"]))
    system.update(
        rate_at_p99=worst["rate_at_p99"],
        rate_exact=worst["rate_exact"],
        worst_pass=worst["pass"],
        passes_run=len(done),
        passes_asked=passes,
    )


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
            "notes": {},
            "fused_ops": {
                "backend": args.fused_ops,
                FUSED_OPS_VARIABLE: FUSED_OPS[args.fused_ops],
                "ab": list(args.fused_ops_ab),
            },
        }
        # the card checks (side jobs of the call, started by main): waited for before
        # the timed parts
        self.side = None

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
                note = system_note(system, args.device)
                if note:
                    results["notes"][system] = note
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
        self.forward_report()
        self.save()
        save_diagnostics(self.turns, self.out, self.side.folder if self.side else None)
        return results

    def forward_report(self) -> None:
        """Each engine's forwards per part, from its forward log and the parts' windows
        (diagnostics.forward_report), and each system's kernel-profile summary."""
        try:
            shape = SHAPES[self.model]
            peak = peak_tflops(self.results["environment"].get("device_name", ""))
            self.results["forwards"] = forward_report(
                self.results, self.turns, shape, self.args.sizes["items"], peak
            )
            if self.results.get("profile", {}).get("systems"):
                summarize_profiles(self.results["profile"])
        except Exception:  # an instrument: never the run's end
            self.results["errors"]["forward report"] = traceback.format_exc()

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
        variants = {}
        if graphs == "auto":
            for system, parts in systems:
                ab_parts = [p for p in parts if p in AB_PARTS]
                if system in self.args.fused_ops_ab and ab_parts:
                    label = ab_label(system, self.args.fused_ops)
                    other = label.rsplit("-", 1)[1]
                    self.log(f"starting {label} (the fused-ops A/B: {other})")
                    variants[label] = Child(
                        self.args, self.model, system, ab_parts, self.turns, graphs, label, other
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
        self.wait_side()
        order = [active[s] for s in SYSTEMS if s in active]
        # the items figure first: every system's bursts, the grid from the best, its passes
        self.items_grid([c for c in order if "items" in c.parts], variants)
        for part in [p for p in LOAD_PARTS if p != "items"]:
            for child in [c for c in order if part in c.parts]:
                self.turn(child, part)
        # the fused-ops A/B engines (started with the others, waited for only now)
        measured = list(order)
        for child in variants.values():
            if self._wait(child, until=min(self.ends, time.time() + 30)):
                measured.append(child)
                if "items" in child.parts:
                    self.items_bursts(child, self.results.setdefault("items", {}), True)
        for child in [c for c in measured if "profile" in c.parts]:
            self.profile(child)
        for child in [c for c in order if "correctness" in c.parts]:
            self.late_correctness(child)
        everyone = [*ready.values(), *checked.values(), *variants.values()]
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

    def _wait(self, child: Child, until: float | None = None) -> bool:
        """Waits for a child's engine (until its model's deadline, or `until`); its start-up
        report into the results. False (and the child killed) when it is not ready."""
        phase = child.wait_ready(self.ends if until is None else until)
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
        out = child.run_turn(
            {"part": part, "rates": rates, "ends_at": self.ends}, self.args.ends_at + GRACE
        )
        results["part_seconds"][f"{child.label} {part}"] = time.perf_counter() - t0
        why = "the process ended" if not child.alive() else "past the deadline"
        merge_turn(results, child.label, part, out, why)
        self.save()

    def wait_side(self) -> None:
        """The card checks (side jobs) end, or are killed at their limit, before the
        first timed turn: a check's engine beside a measured one would share the card."""
        if self.side is not None:
            t0 = time.perf_counter()
            if self.side.wait(self.log):
                self.results["part_seconds"]["waiting for the card checks"] = (
                    time.perf_counter() - t0
                )
                self.results["checks"] = self.side.collect(self.out)
                self.save()

    def reserve_after_items(self, children: list[Child], variants: dict) -> float:
        """The seconds the parts after the items grid are expected to take (sizes'
        reserve): kept out of the grid's sizing, so that they still run."""
        r = self.args.sizes["reserve"]
        every = [*children, *variants.values()]
        rec = sum("recommendation" in c.parts for c in children)
        late = sum("correctness" in c.parts for c in children)
        profile = sum("profile" in c.parts for c in every)
        bursts = sum("items" in c.parts for c in variants.values())
        return (
            rec * r["rec_turn"]
            + bursts * r["burst_turn"]
            + profile * r["profile_turn"]
            + (r["late_first"] + late * r["late_turn"] if late else 0.0)
            + r["exit"]
        )

    def items_grid(self, children: list[Child], variants: dict) -> None:
        """The items figure (issue 83, item 8): every system's bursts (grid["bursts"], the
        same requests in every system), then the grid's rates from the best system's
        capacity, then the grid run `passes` times over every system (pass 1 on each, then
        pass 2 on each), each rate's requests sized so that the grid and the parts after it
        fit the call. Per system the figure is its worse pass (results: rate_at_p99,
        worst_pass; both passes beside it)."""
        if not children:
            return
        results, sizes = self.results, self.args.sizes
        grid = sizes["grid"]
        entry = results.setdefault("items", {})
        entry.update(p99_bound_s=sizes["items"]["p99"], systems=entry.get("systems", {}))
        capacities = {}
        for child in children:
            capacity = self.items_bursts(child, entry)
            if capacity:
                capacities[child.label] = capacity
        if not capacities:
            return
        best = max(capacities, key=capacities.get)
        rates = [round(capacities[best] * f, 3) for f in grid["factors"]]
        measured = [c for c in children if c.label in capacities]
        available = self.ends - time.time() - self.reserve_after_items(measured, variants)
        requests = grid_requests(rates, [capacities[c.label] for c in measured], grid, available)
        entry.update(
            capacity_measured_on=best,
            burst_capacity_per_s=capacities[best],
            burst_requests=sizes["burst"],
            rates=rates,
            grid={
                "factors": list(grid["factors"]),
                "rates": rates,
                "passes": grid["passes"],
                "requests_per_rate": requests,
                "held_s": [round(requests / r, 2) for r in rates],
                "sized_for_s": round(available, 1),
                "figure": "a system's worse pass (the lower items/s at the p99 bound)",
            },
        )
        self.log(
            f"items grid from {best}'s capacity {capacities[best]:.2f}/s: rates {rates}, "
            f"{requests} requests each, {grid['passes']} passes (~{available:.0f} s for it)"
        )
        self.save()
        for k in range(1, grid["passes"] + 1):
            for child in measured:
                system = entry["systems"][child.label]
                turn = {"part": "items", "phase": "grid", "rates": rates, "pass": k}
                turn["requests"] = requests
                need = requests / rates[0] + sizes["drain_seconds"]
                out = self.timed_turn(child, f"items pass {k}", turn, need)
                if out is not None:
                    system["passes"].append(out)
                worst_of_passes(system, grid["passes"])
                self.save()

    def items_bursts(self, child: Child, entry: dict, only: bool = False) -> float | None:
        """One system's items bursts into the items entry (only: a fused-ops A/B engine,
        measured on its bursts alone); its capacity (None: failed)."""
        out = self.timed_turn(
            child, "items bursts", {"part": "items", "phase": "burst"}, self.burst_need()
        )
        if out is None:
            return None
        entry.setdefault("systems", {})[child.label] = {
            "bursts": out["bursts"],
            "capacity": out["capacity"],
            "passes": [],
            "fused_ops": child.fused_ops,
            **({"bursts_only": True} if only else {}),
        }
        self.save()
        return out["capacity"]

    def burst_need(self) -> float:
        return self.args.sizes["reserve"]["burst_turn"]

    def profile(self, child: Child) -> None:
        out = self.timed_turn(
            child, "profile", {"part": "profile"}, self.args.sizes["reserve"]["profile_turn"]
        )
        if out is not None:
            entry = self.results.setdefault("profile", {"systems": {}})
            entry["target_tokens"] = self.args.sizes["profile"]["target_tokens"]
            entry["systems"][child.label] = {k: v for k, v in out.items() if k != "part"}
            self.save()

    def timed_turn(self, child: Child, what: str, turn: dict, need: float) -> dict | None:
        """A turn that needs ~`need` s (not started past the deadline); its result, or
        None (the error in the results)."""
        results = self.results
        key = f"{child.label} {what}"
        if time.time() + need > self.ends:
            results["errors"][key] = f"not started: past its model's deadline (~{need:.0f} s)"
            self.log(f"{key}: not started (deadline)")
            return None
        self.log(f"{key}")
        t0 = time.perf_counter()
        out = child.run_turn({**turn, "ends_at": self.ends}, self.args.ends_at + GRACE)
        results["part_seconds"][key] = time.perf_counter() - t0
        if out is None:
            why = "the process ended" if not child.alive() else "past the deadline"
            results["errors"][key] = f"no result: {why}"
            return None
        if "error" in out:
            results["errors"][key] = out["error"]
            return None
        return out

    def late_correctness(self, child: Child) -> None:
        """Correctness's late cases (first-time kernel paths) on a measured engine."""
        results = self.results
        if time.time() > self.ends - 5:
            results["errors"][f"{child.label} {LATE_CORRECTNESS}"] = "not started: deadline"
            return
        self.log(f"{child.label}: {LATE_CORRECTNESS}")
        t0 = time.perf_counter()
        out = child.run_turn(
            {"part": LATE_CORRECTNESS, "ends_at": self.ends}, self.args.ends_at + GRACE
        )
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
