"""The report: results.json and results.md, and the environment they are measured in."""

from __future__ import annotations

import json
from pathlib import Path


def write(results: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    (out / "results.md").write_text(markdown(results))


def _load_table(entry: dict, unit: float, what: str) -> list[str]:
    lines = [
        f"p99 bound {entry.get('p99_bound_s')} s; rates from {entry.get('capacity_measured_on')}'s "
        f"burst capacity ({entry.get('burst_capacity_per_s', 0):.2f} requests/s)",
        "",
        "| system | rate /s | held s | done | p50 s | p99 s | cache hits | forwards | "
        "tokens / forward | packed | step ms p50 |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for system, data in entry.get("systems", {}).items():
        for row in data["rows"]:
            fwd = row.get("forwards") or {}
            lines.append(
                f"| {system} | {row['rate']:.2f} | {row.get('held_s', 0):.1f} | "
                f"{row['completed']}/{row['requests']} | {row['p50']:.3f} | {row['p99']:.3f} | "
                f"{row['cache_hit_share']:.0%} | {fwd.get('count', '')} | "
                f"{fwd.get('tokens_mean', 0):.0f} | {fwd.get('packed_share', 0):.0%} | "
                f"{fwd.get('step_ms_p50', 0):.1f} |"
            )
    lines.append("")
    rates = {}
    for system, data in entry.get("systems", {}).items():
        if not data["rows"]:
            lines.append(f"- {system}: no rate ran (the deadline)")
            continue
        rates[system] = data["rate_at_p99"]
        tag = "" if data["rate_exact"] else " (a bound)"
        lines.append(f"- {system}: {data['rate_at_p99'] * unit:.1f} {what} at the bound{tag}")
        if data.get("rates_not_run"):
            lines.append(f"  (rates not run, the deadline: {data['rates_not_run']})")
    stocks = {s: r for s, r in rates.items() if s.startswith("stock") and r}
    ours = next((s for s in rates if s.startswith("ours")), None)
    if ours is not None and stocks:
        for system, rate in stocks.items():
            lines.append(f"- {ours} / {system}: {rates[ours] / rate:.2f}x")
        if len(stocks) > 1:
            best = max(stocks, key=stocks.get)
            lines.append(f"- {ours} / stock's best ({best}): {rates[ours] / stocks[best]:.2f}x")
    bursts = {s: d["burst"] for s, d in entry.get("systems", {}).items() if d.get("burst")}
    if bursts:
        lines += [
            "",
            "Saturation (a burst of the same requests, all sent at once): input tokens/s as "
            "Prelude reports them (each item's query + item), distinct tokens/s (a query once)",
            "",
            "| system | requests/s | input tokens/s | distinct tokens/s | done |",
            "| --- | ---: | ---: | ---: | ---: |",
        ]
        for system, b in bursts.items():
            lines.append(
                f"| {system} | {b['requests_per_s']:.2f} | {b['input_tokens_per_s']:.0f} | "
                f"{b['distinct_tokens_per_s']:.0f} | {b['completed']}/{b['requests']} |"
            )
    return lines + [""]


def _f(value, fmt: str = ".2f", empty: str = "") -> str:
    return empty if value is None else format(value, fmt)


def _grid_table(entry: dict, per: int) -> list[str]:
    """The items figure: the grid's rates, each system's rows per pass, its crossing per
    pass and the reported figure (the worse pass)."""
    grid = entry.get("grid")
    if grid is None:  # the bursts ran, the grid not (yet)
        grid = {"rates": [], "factors": [], "requests_per_rate": 0, "held_s": [], "passes": 0}
    bursts = len(next(iter(entry["systems"].values()), {}).get("bursts", []))
    lines = [
        f"p99 bound {entry.get('p99_bound_s')} s. Every system's burst "
        f"({entry.get('burst_requests')} requests, {bursts} times), "
        f"then a grid of {len(grid['rates'])} rates from the best system's capacity "
        f"({entry.get('capacity_measured_on')}, {entry.get('burst_capacity_per_s', 0):.2f} "
        f"requests/s): factors {grid['factors']}, rates {grid['rates']} requests/s, "
        f"**{grid['requests_per_rate']} requests per rate** (held "
        f"{', '.join(f'{s:.1f}' for s in grid['held_s'])} s), the whole grid "
        f"{grid['passes']} times (pass 1 on every system, then pass 2); a system's pass stops "
        f"above a rate whose p99 is far past the bound. **The figure is a system's worse pass.**",
        "",
        "| system | pass | rate /s | held s | done | p50 s | p99 s | forwards | tokens / forward "
        "| packed | step ms p50 |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for system, data in entry["systems"].items():
        for grid_pass in data.get("passes", []):
            for row in grid_pass["rows"]:
                fwd = row.get("forwards") or {}
                lines.append(
                    f"| {system} | {grid_pass['pass']} | {row['rate']:.2f} | "
                    f"{row.get('held_s', 0):.1f} | {row['completed']}/{row['requests']} | "
                    f"{row['p50']:.3f} | {row['p99']:.3f} | {fwd.get('count', '')} | "
                    f"{fwd.get('tokens_mean', 0):.0f} | {fwd.get('packed_share', 0):.0%} | "
                    f"{fwd.get('step_ms_p50', 0):.1f} |"
                )
    lines += [
        "",
        "| system | capacity req/s (bursts) | pass 1 items/s | pass 2 items/s | **items/s at "
        "the bound (worse pass)** |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    figures = {}
    for system, data in entry["systems"].items():
        bursts = " / ".join(f"{b['requests_per_s']:.1f}" for b in data.get("bursts", []))
        by_pass = {p["pass"]: p for p in data.get("passes", [])}
        cells = []
        for k in range(1, grid["passes"] + 1):
            done = by_pass.get(k)
            if data.get("bursts_only"):  # a fused-ops A/B engine
                cells.append("")
                continue
            if done is None or not done.get("rows"):
                cells.append("not run")
                continue
            tag = "" if done["rate_exact"] else " (a bound)"
            cells.append(f"{done['rate_at_p99'] * per:.0f}{tag}")
        while len(cells) < 2:
            cells.append("")
        cells = cells[:2] if grid["passes"] <= 2 else [cells[0], " / ".join(cells[1:])]
        if not data.get("bursts_only") and "rate_at_p99" in data:
            figures[system] = data["rate_at_p99"]
            tag = "" if data.get("rate_exact") else " (a bound)"
            figure = f"**{data['rate_at_p99'] * per:.0f}**{tag}"
        elif data.get("bursts_only"):
            figure = "bursts only (fused-ops A/B)"
        else:
            figure = "no pass ran"
        lines.append(
            f"| {system} | {data.get('capacity', 0):.2f} ({bursts}) | {cells[0]} | {cells[1]} "
            f"| {figure} |"
        )
    lines.append("")
    for system, data in entry["systems"].items():
        for grid_pass in data.get("passes", []):
            if grid_pass.get("rates_not_run"):
                lines.append(
                    f"- {system} pass {grid_pass['pass']}: rates not run (the deadline): "
                    f"{grid_pass['rates_not_run']}"
                )
            if grid_pass.get("rates_skipped"):
                lines.append(
                    f"- {system} pass {grid_pass['pass']}: rates skipped (p99 far past the "
                    f"bound below them): {grid_pass['rates_skipped']}"
                )
    stocks = {s: r for s, r in figures.items() if s.startswith("stock") and r}
    for ours in [s for s in figures if s.startswith("ours")]:
        for system, rate in stocks.items():
            lines.append(f"- {ours} / {system}: {figures[ours] / rate:.2f}x")
        if len(stocks) > 1:
            best = max(stocks, key=stocks.get)
            lines.append(f"- {ours} / stock's best ({best}): {figures[ours] / stocks[best]:.2f}x")
    for label, data in entry["systems"].items():
        base = label.rsplit("-", 1)[0]
        if label.endswith(("-compile", "-torch")) and base in entry["systems"]:
            mine, theirs = data.get("capacity") or 0, entry["systems"][base].get("capacity")
            if theirs:
                lines.append(
                    f"- fused-ops A/B: {label} (fused ops {data.get('fused_ops')}) / {base} "
                    f"({entry['systems'][base].get('fused_ops')}): saturation "
                    f"{mine / theirs:.2f}x"
                )
    lines += [
        "",
        "Saturation (each burst: the same requests in every system, all sent at once): input "
        "tokens/s as Prelude reports them (each item's query + item), distinct tokens/s",
        "",
        "| system | fused ops | burst | requests/s | input tokens/s | distinct tokens/s | done |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for system, data in entry["systems"].items():
        for k, b in enumerate(data.get("bursts", []), 1):
            lines.append(
                f"| {system} | {data.get('fused_ops', '')} | {k} | {b['requests_per_s']:.2f} | "
                f"{b['input_tokens_per_s']:.0f} | {b['distinct_tokens_per_s']:.0f} | "
                f"{b['completed']}/{b['requests']} |"
            )
    return lines + [""]


def _forwards_section(report: dict) -> list[str]:
    """Item 1 of issue 83: per engine and part, at matched forward sizes."""
    peak = report.get("peak_tflops")
    lines = [
        "## Forwards per engine and part (the scheduler's forward log)",
        "",
        "Bucketed by computed tokens per forward. device us / token: device_ms (CUDA events "
        "around run_batch) over the computed tokens; host ms: run_batch's host seconds "
        "(p50); cycle ms: the gap between consecutive forwards' launches inside a burst "
        "(p50). FLOPs: 2 x linear weights per token + 4 x heads x head_dim x layers per "
        "causal query-key pair (multi-item scoring: its item mask's pairs) + the LM head "
        "per scored row.",
        "",
        "| engine | part | tokens / forward | forwards | requests / forward | device us / "
        "token | device ms p50 | host ms p50 | cycle ms p50 (cycles) |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, parts in report["engines"].items():
        for part, entry in parts.items():
            for b in entry["buckets"]:
                device = (
                    _f(b["device_us_per_token"], ".2f")
                    if entry["device_timing"]
                    else "no device timing"
                )
                cycle = (
                    "" if b["cycle_ms_p50"] is None else f"{b['cycle_ms_p50']:.1f} ({b['cycles']})"
                )
                lines.append(
                    f"| {label} | {part} | {b['bucket']} ({b['tokens_mean']:.0f}) | "
                    f"{b['forwards']} | {b['requests_mean']:.1f} | {device} | "
                    f"{_f(b['device_ms_p50'], '.2f')} | {b['host_ms_p50']:.2f} | {cycle} |"
                )
    lines += [
        "",
        "Roofline ("
        + (
            f"the card's dense bf16 peak: {peak:.0f} TFLOP/s"
            if peak
            else "no peak known for this device"
        )
        + "): FLOPs per device second (every forward with device time) and per second of "
        "burst wall (the bursts' forwards over the bursts' seconds)",
        "",
        "| engine | part | TFLOP | TFLOP/s (device) | % of peak | TFLOP/s (burst wall) | % of "
        "peak |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, parts in report["engines"].items():
        for part, entry in parts.items():
            r = entry["roofline"]
            device = _f(r["tflops_device"], ".3g") if entry["device_timing"] else "no device timing"
            lines.append(
                f"| {label} | {part} | {r['tflop']:.3g} | {device} | "
                f"{_f(r['pct_peak_device'], '.1f')} | {_f(r['tflops_burst_wall'], '.3g')} | "
                f"{_f(r['pct_peak_burst_wall'], '.1f')} |"
            )
    return lines + [""]


def _profile_section(entry: dict) -> list[str]:
    """Item 2 of issue 83: one forward of each system at a matched size, per stage."""
    lines = [
        "## Where a forward's time goes (the engine's kernel profile, torch.profiler)",
        "",
        f"Each system armed for its next forwards, then bursts of the same items-shaped "
        f"requests (target {entry.get('target_tokens')} tokens per forward); per system the "
        "median over its profiled forwards of the matched size (within 25% of the target; "
        "all when none is).",
        "",
    ]
    for label, system in entry["systems"].items():
        summary = system.get("summary")
        for error in system.get("errors", []):
            lines.append(f"- {label}: the profiler failed on a forward: {error[:200]}")
        if not summary:
            lines.append(
                f"- {label}: {system.get('note', 'no profiled forward')} "
                f"({len(system.get('lines', []))} lines, {system.get('bursts', 0)} bursts)"
            )
            continue
        size = "matched size" if summary["matched_size"] else "no forward of the matched size"
        lines += [
            f"### {label}: {summary['forwards']} forwards ({size}), {summary['tokens']:.0f} "
            f"tokens, {_f(summary['requests'], '.0f')} requests; device "
            f"{_f(summary['device_ms'], '.2f')} ms (busy {_f(summary.get('busy_ms'), '.2f')}), "
            f"wall {_f(summary['wall_ms'], '.2f')} ms, host (device idle) "
            f"{_f(summary['host_ms'], '.2f')} ms",
            "",
            "| stage | ms | share | us / token |",
            "| --- | ---: | ---: | ---: |",
        ]
        for stage, ms in summary["stages_ms"].items():
            lines.append(
                f"| {stage} | {ms:.3f} | {summary['stages_share'][stage]:.0%} | "
                f"{_f(summary['stages_us_per_token'][stage], '.3f')} |"
            )
        lines.append("")
        if summary.get("top_kernels"):
            lines.append(
                "Top kernels: "
                + "; ".join(
                    f"{n[:60]} {ms:.3f} ms x{c:g}" for n, ms, c in summary["top_kernels"][:6]
                )
            )
            lines.append("")
    if entry.get("comparison"):
        labels = [k for k in entry["comparison"][0] if k != "stage"]
        lines += [
            "Per stage, us per computed token; ours' excess over stock, in ms at ours' forward "
            "size:",
            "",
            "| stage | " + " | ".join(labels) + " |",
            "| --- | " + " | ".join("---:" for _ in labels) + " |",
        ]
        for row in entry["comparison"]:
            lines.append(
                f"| {row['stage']} | " + " | ".join(_f(row.get(k), ".3f") for k in labels) + " |"
            )
        lines.append("")
    return lines


def _checks_section(checks: dict) -> list[str]:
    lines = [
        "## The card checks (side jobs: checks.json / checks.md, query_chunk_test.txt)",
        "",
        f"Started with the engines, done in {checks.get('seconds')} s (limit "
        f"{checks.get('limit_s')} s); gpu_checks.py exit: {checks.get('checks_exit')}.",
        "",
    ]
    for name, entry in checks.get("checks", {}).items():
        verdict = "ok" if entry["ok"] else "FAILED"
        error = f": {entry['error'][-200:]}" if entry.get("error") else ""
        lines.append(f"- {name}: {verdict} ({entry.get('seconds')} s){error}")
    test = checks.get("query_chunk_test", {})
    lines.append(
        f"- tests/test_flashinfer_query_chunk.py: exit {test.get('exit')}: {test.get('summary')}"
    )
    return lines + [""]


def markdown(results: dict) -> str:
    lines = [f"# The engine on {results['environment'].get('device_name', 'CPU')}", ""]
    lines += ["```", json.dumps(results["environment"], indent=1), "```", ""]
    lines.append(f"model {results.get('model')}; command `{results.get('command')}`")
    lines.append("")
    graphs, warmups = results.get("graphs", {}), results.get("warmup", {})
    seconds = results.get("part_seconds", {})
    if graphs or results.get("skipped"):
        lines += ["## Systems", ""]
        lines += [
            "| system | engine start s | prefill CUDA graphs | SGLang resolved | warm-up s |",
            "| --- | ---: | --- | --- | --- |",
        ]
        for system, info in graphs.items():
            start = seconds.get(f"{system} start")
            warm = ", ".join(f"{p} {w['seconds']:.1f}" for p, w in warmups.get(system, {}).items())
            resolved = results.get("resolved", {}).get(system, {}).get("prefill_graphs", "")
            lines.append(
                f"| {system} | {'' if start is None else f'{start:.1f}'} | {info['prefill']} | "
                f"{resolved} | {warm} |"
            )
        if graphs:
            decode = {info["decode"] for info in graphs.values()}
            lines += ["", f"Decode CUDA graphs: {'; '.join(sorted(decode))}."]
        for system, reason in results.get("skipped", {}).items():
            lines.append(f"- {system}: skipped: {reason}")
        for system, note in results.get("notes", {}).items():
            lines.append(f"- {system}: {note}")
        fused = results.get("fused_ops")
        if fused:
            ab = ", ".join(fused.get("ab", [])) or "none"
            lines.append(
                f"- SGLang's fused ops: {fused['backend']} in every system "
                f"(SGLANG_FORCE_FUSED_OP_BACKEND={fused.get('SGLANG_FORCE_FUSED_OP_BACKEND')}); "
                f"the other backend's engines (A/B) for: {ab}"
            )
        lines.append("")
    if results.get("engines"):
        lines += ["## Engines as they resolved", ""]
        lines += [
            "| engine | features | prefill-only KV | job-time model | warnings at start |",
            "| --- | --- | --- | --- | --- |",
        ]
        for label, facts in results["engines"].items():
            jct = facts.get("jct_model", {}).get("source", "")
            kv = facts.get("prefill_only_kv_active")
            kv = "" if kv is None else "active" if kv else "off"
            warned = "; ".join(w[:160] for w in facts.get("start_warnings", []))
            features = ", ".join(facts.get("features", []))
            lines.append(f"| {label} | {features} | {kv} | {jct} | {warned} |")
        lines.append("")
    if results.get("graph_check"):
        check = results["graph_check"]
        lines += ["## Prefill graphs on and off (sglang #37606)", ""]
        for system, entry in check.items():
            if isinstance(entry, dict) and entry.get("max_diff") is not None:
                lines.append(
                    f"- {system}: max |logprob diff| on/off {entry['max_diff']:.2e} "
                    f"({entry['case']})"
                )
            elif isinstance(entry, dict):
                lines.append(f"- {system}: {entry.get('note', entry)}")
        lines += [f"- decision: {check.get('decision', 'none')}", ""]
    if results.get("correctness", {}).get("rows"):
        lines += ["## Correctness: max |label logprob diff| against float32 transformers", ""]
        lines += [
            "| system | case | tokens | cached | forwards (items in the call) | max diff | "
            "vs query + item |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for row in results["correctness"]["rows"]:
            plain = row.get("vs_query_item")
            forwards = row.get("forwards")
            calls = "" if forwards is None else f"{forwards} ({row.get('items_in_call', 1)})"
            lines.append(
                f"| {row['system']} | {row['case']} | {row['tokens']} | {row['cached_tokens']} | "
                f"{calls} | {row['max_abs_logprob_diff']:.2e} | "
                f"{'' if plain is None else f'{plain:.2e}'} |"
            )
        lines.append("")
        if any("vs_query_item" in row for row in results["correctness"]["rows"]):
            lines += [
                "stock-mis against the sequence it scores (query, delimiter, item at its MIS "
                "positions); the last column, against query + item's.",
                "",
            ]
    if "items" in results:
        per = results["sizes"]["items"]["per_request"]
        lines += ["## Items (SGLang #9748's shape)", ""]
        if any("bursts" in s for s in results["items"].get("systems", {}).values()):
            lines += _grid_table(results["items"], per)
        else:
            lines += _load_table(results["items"], per, "items/s")
    if "recommendation" in results:
        lines += ["## Recommendation (users behind long profiles)", ""]
        lines += _load_table(results["recommendation"], 1, "requests/s")
    if results.get("long", {}).get("systems"):
        lines += [f"## A cold {results['long']['tokens']}-token prompt", ""]
        lines += [
            "| system | s | forwards | peak MiB above resident |",
            "| --- | ---: | ---: | ---: |",
        ]
        for system, row in results["long"]["systems"].items():
            lines.append(
                f"| {system} | {row['seconds']:.2f} | {row['forwards']} | "
                f"{row['peak_above_resident_mib']:.0f} |"
            )
        lines.append("")
    if results.get("profile", {}).get("systems"):
        lines += _profile_section(results["profile"])
    if results.get("forwards", {}).get("engines"):
        lines += _forwards_section(results["forwards"])
    if results.get("checks"):
        lines += _checks_section(results["checks"])
    for part, error in results.get("errors", {}).items():
        lines += [f"## {part}: failed", "", "```", error[-3000:], "```", ""]
    return "\n".join(lines) + "\n"


def environment(device: str) -> dict:
    import platform

    import torch
    import transformers

    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": device,
    }
    try:
        import sglang

        env["sglang"] = sglang.__version__
    except ImportError:
        pass
    if device == "cuda":
        env["device_name"] = torch.cuda.get_device_name()
        env["cuda"] = torch.version.cuda
        try:
            import flashinfer

            env["flashinfer"] = flashinfer.__version__
        except ImportError:
            pass
    return env
