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
