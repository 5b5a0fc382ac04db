"""The results as a table on stdout, a JSON file and PNG charts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

BASELINE = "sqsq-grpc"
# Same-run ratios the issues ask for, (numerator, denominator), printed when both ran: the
# replicated sqsq against NATS JetStream R3, more shards against one, more nodes per host
# label against one.
RATIOS = (("sqsq-r3", "nats-r3"), ("sqsq-cluster", "nats-r3"), ("sqsq-cluster-4", "nats-r3"),
          ("sqsq-cluster-4", "sqsq-cluster"), ("sqsq-cluster-4-2ph", "sqsq-cluster-4"),
          ("sqsq-cluster-4-3ph", "sqsq-cluster-4"))


def op_rows(result: dict[str, Any]) -> list[list[str]]:
    """One row per (target, workload, operation)."""
    rows = []
    for tname, t in result["targets"].items():
        if t.get("status") != "ok":
            continue
        for wname, w in t["workloads"].items():
            if "skipped" in w:
                continue
            for op, s in w.get("ops", {}).items():
                rows.append([tname, wname, op, f"{s['msgs_per_s']:,.0f}", f"{s['p50_ms']:.2f}",
                             f"{s['p99_ms']:.2f}", f"{s['p999_ms']:.2f}", str(s["errors"])])
    return rows


def headline(result: dict[str, Any]) -> tuple[list[str], list[str], dict]:
    """Targets that ran, workloads seen, and {(target, workload): msgs/s}."""
    names, workloads, values = [], [], {}
    for tname, t in result["targets"].items():
        if t.get("status") != "ok":
            continue
        names.append(tname)
        for wname, w in t["workloads"].items():
            if wname not in workloads:
                workloads.append(wname)
            if "skipped" not in w:
                values[(tname, wname)] = w.get("msgs_per_s", 0.0)
    return names, workloads, values


def median_of_rounds(rounds: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """Each target's workloads as measured in the round with the median headline rate (the
    lower middle one for an even count): a whole measurement, so its rate, latencies and CPU
    figures belong together. Each keeps every round's rate as ``rounds_msgs_per_s``."""
    combined: dict[str, Any] = {}
    for name in names:
        runs = [r["targets"][name] for r in rounds if name in r["targets"]]
        ok = [t for t in runs if t.get("status") == "ok"]
        if not ok:
            combined[name] = runs[0]
            continue
        entry = {k: v for k, v in ok[0].items() if k != "workloads"}
        entry["workloads"] = {}
        for wname in ok[0]["workloads"]:
            measured = [t["workloads"][wname] for t in ok if wname in t["workloads"]]
            ran = [w for w in measured if "skipped" not in w]
            if not ran:
                entry["workloads"][wname] = measured[0]
                continue
            by_rate = sorted(ran, key=lambda w: w.get("msgs_per_s", 0.0))
            chosen = dict(by_rate[(len(ran) - 1) // 2])
            chosen["rounds_msgs_per_s"] = [w.get("msgs_per_s", 0.0) for w in ran]
            entry["workloads"][wname] = chosen
        combined[name] = entry
    return combined


def rounds_table(result: dict[str, Any]) -> list[list[str]]:
    """Per workload and target: every round's headline rate, in the order they ran."""
    names, workloads, _ = headline(result)
    rows = []
    for wname in workloads:
        cells = []
        for n in names:
            seen = result["targets"][n]["workloads"].get(wname, {}).get("rounds_msgs_per_s")
            cells.append(" / ".join(f"{v:,.0f}" for v in seen) if seen else "-")
        if any(c != "-" for c in cells):
            rows.append([wname, *cells])
    return rows


def _table(header: list[str], rows: list[list[str]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(x) for x in col) for col in zip(header, *rows, strict=False)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join(fmt.format(*r) for r in [header, *rows])


def render(result: dict[str, Any], markdown: bool = False) -> str:
    """The per-operation table, the headline table, ratios and skipped targets."""
    parts = [_table(["target", "workload", "op", "msgs/s", "p50 ms", "p99 ms", "p999 ms",
                     "errors"], op_rows(result), markdown)]
    names, workloads, values = headline(result)
    rows = [[w, *(f"{values[(n, w)]:,.0f}" if (n, w) in values else "-" for n in names)]
            for w in workloads]
    parts.append(_table(["headline msgs/s", *names], rows, markdown))
    per_round = rounds_table(result)
    if per_round:
        parts.append(_table(["msgs/s in each round", *names], per_round, markdown))
    if BASELINE in names:
        peers = [n for n in names if n != BASELINE]
        ratio_rows = []
        for w in workloads:
            base = values.get((BASELINE, w))
            cells = []
            for n in peers:
                other = values.get((n, w))
                if base and other and other >= 1.0:
                    cells.append(f"{base / other:.2f}x")
                else:  # a peer under 1 msg/s gives no meaningful ratio
                    cells.append("-")
            ratio_rows.append([w, *cells])
        if peers:
            parts.append(_table([f"{BASELINE} / peer", *peers], ratio_rows, markdown))
    pairs = [(a, b) for a, b in RATIOS if a in names and b in names]
    if pairs:
        rows = [[w, *(f"{values[(a, w)] / values[(b, w)]:.2f}x"
                      if values.get((a, w)) and (values.get((b, w)) or 0) >= 1.0 else "-"
                      for a, b in pairs)] for w in workloads]
        parts.append(_table(["same-run ratio", *(f"{a} / {b}" for a, b in pairs)], rows,
                            markdown))
    cpu_rows = cpu_table(result)
    if cpu_rows:
        parts.append(_table(["CPU us per headline msg", *names], cpu_rows, markdown))
    meta_rows = [[n, t.get("status", "?"), t.get("version", ""),
                  t.get("durability", "") if t.get("status") == "ok" else
                  t.get("reason", "") + (f" (logs: {t['logs']})" if t.get("logs") else "")]
                 for n, t in result["targets"].items()]
    parts.append(_table(["target", "status", "version", "durability / reason"], meta_rows,
                        markdown))
    return "\n\n".join(parts)


def cpu_table(result: dict[str, Any]) -> list[list[str]]:
    """Per workload and target: CPU microseconds per headline message, "system + clients"
    (a system measured from outside, such as ``--sqsq-endpoint``, shows "-" for itself)."""
    names, workloads, _ = headline(result)
    rows = []
    for wname in workloads:
        cells = [cpu_cell(result["targets"][n]["workloads"].get(wname, {})) or "-"
                 for n in names]
        if any(c != "-" for c in cells):
            rows.append([wname, *cells])
    return rows


def cpu_cell(workload: dict[str, Any]) -> str | None:
    """A workload's CPU microseconds per headline message as "system + clients" ("-" for a
    system measured from outside), and the gateway's share of the system's, if it has one;
    None if it has no such figures."""
    cpu = workload.get("cpu_us_per_msg") or {}
    if cpu.get("clients") is None:
        return None
    system = "-" if cpu.get("server") is None else f"{cpu['server']:,.0f}"
    gateway = "" if cpu.get("gateway") is None else f" (gw {cpu['gateway']:,.0f})"
    return f"{system}{gateway} + {cpu['clients']:,.0f}"


def write_json(result: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2, sort_keys=False))
    tmp.replace(path)


def charts(result: dict[str, Any], out_dir: Path) -> list[Path]:
    """One PNG per system (throughput and latency per workload) and one comparison PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    names, workloads, values = headline(result)
    for tname in names:
        t = result["targets"][tname]
        ran = [(w, d) for w, d in t["workloads"].items() if "skipped" not in d]
        if not ran:
            continue
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 5))
        labels = [w for w, _ in ran]
        ax1.barh(labels, [d.get("msgs_per_s", 0) for _, d in ran], color="tab:blue")
        ax1.set_xlabel("messages/s (send: sent; recv/steady: deleted)")
        ax1.invert_yaxis()
        op_of = {w: ("send" if d["mode"] == "send" else "receive") for w, d in ran}
        p50 = [d["ops"].get(op_of[w], {}).get("p50_ms", 0) for w, d in ran]
        p99 = [d["ops"].get(op_of[w], {}).get("p99_ms", 0) for w, d in ran]
        ys = range(len(ran))
        ax2.barh([y - 0.2 for y in ys], p50, height=0.4, label="p50")
        ax2.barh([y + 0.2 for y in ys], p99, height=0.4, label="p99")
        ax2.set_yticks(list(ys), [f"{w} ({op_of[w]})" for w in labels])
        ax2.invert_yaxis()
        ax2.set_xscale("log")
        ax2.set_xlabel("latency per call, ms (log)")
        ax2.legend()
        fig.suptitle(f"{tname}: {t.get('durability', '')}", fontsize=9)
        fig.tight_layout()
        path = out_dir / f"{tname}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        paths.append(path)
    if names:
        fig, ax = plt.subplots(figsize=(14, 6))
        width = 0.8 / len(names)
        for i, n in enumerate(names):
            xs = [j + i * width for j in range(len(workloads))]
            ax.bar(xs, [values.get((n, w), 0) for w in workloads], width, label=n)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(workloads))], workloads,
                      rotation=30, ha="right")
        ax.set_yscale("log")
        ax.set_ylabel("messages/s (log)")
        ax.legend()
        ax.set_title("headline throughput per workload")
        fig.tight_layout()
        path = out_dir / "compare.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        paths.append(path)
    return paths
