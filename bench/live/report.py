"""What `specroute bench live` prints: per concurrency and stated mix, the adaptive fleet
against the best homogeneous fleet of the same size and against the held-out oracle,
with 95% bootstrap intervals over prompts (bench/live/stats.py), the targets, every
configuration's tokens/s per class, what the adaptive gateway chose, and the audits.

Tokens/s of a configuration on a class = its completion tokens over its requests' wall
time (at concurrency c, each request shares its fleet with up to c - 1 others).
"""

from __future__ import annotations

from collections import Counter, defaultdict

from bench.live.fleets import ADAPTIVE, Record
from bench.live.prompts import MIXES
from bench.live.stats import bootstrap, estimate, from_rows

TARGET_BEST, TARGET_ORACLE, TARGET_NO_HARM = 1.10, 0.95, 0.97
TARGET_MIXES = ("code assistant", "even")


def prompt_rows(records: list[Record]) -> tuple[list[dict], int]:
    """One row per (replicate, item) served without error by every configuration; and how
    many prompts were dropped because some configuration failed on them."""
    cells: dict[tuple[int, int], dict] = {}
    configs = {r.config for r in records}
    failed = set()
    for r in records:
        key = (r.replicate, r.item)
        if r.error:
            failed.add(key)
            continue
        row = cells.setdefault(key, {"cls": r.cls, "fold": r.fold, "replicate": r.replicate,
                                     "cells": {}})
        row["cells"][r.config] = (r.tokens, r.seconds)
    rows = [row for key, row in cells.items()
            if key not in failed and set(row["cells"]) == configs]
    return rows, len({(r.replicate, r.item) for r in records}) - len(rows)


def _round(values: tuple[float, ...]) -> list[float]:
    return [round(v, 3) for v in values]


def summarize(records: list[Record], audits: list[dict], engine: str) -> dict:
    measured = [r for r in records if r.item >= 0]
    out: dict = {"engine": engine, "concurrency": {}, "audits": audits,
                 "json": {engine: {}}}
    for conc in sorted({r.concurrency for r in measured}):
        recs = [r for r in measured if r.concurrency == conc]
        rows, dropped = prompt_rows(recs)
        per_class = _per_class(rows)
        mixes = {}
        for mix, shares in MIXES.items():
            mine = [r for r in rows if r["cls"] in shares]
            if not {r["cls"] for r in mine} >= set(shares) or not any(
                    ADAPTIVE in r["cells"] for r in mine):
                continue
            data = from_rows(mine, ADAPTIVE)
            point = estimate(data, shares)
            ci = bootstrap(data, shares, seed=conc)
            by_replicate = {}
            for rep in sorted({r["replicate"] for r in mine}):
                e = estimate(from_rows([r for r in mine if r["replicate"] == rep], ADAPTIVE),
                             shares)
                by_replicate[rep] = (round(e.vs_best, 3), round(e.vs_oracle, 3))
            counts = Counter(r["cls"] for r in mine)
            mixes[mix] = {"shares": shares, "rates": point.rates, "adaptive": point.adaptive,
                          "best": point.best, "best_name": point.best_name,
                          "oracle": point.oracle, "oracle_picks": point.oracle_picks,
                          "ci": ci, "by_replicate": by_replicate,
                          "requests_per_cell": dict(counts)}
            out["json"][engine].setdefault(mix, {})[str(conc)] = {
                "vs_best_homogeneous": _round(ci["vs_best_homogeneous"]),
                "vs_oracle": _round(ci["vs_oracle"]),
                "oracle_vs_best_homogeneous": _round(ci["oracle_vs_best_homogeneous"]),
                "best_homogeneous": point.best_name,
                "requests_per_cell": min(counts.values()),
                "shares": shares}
        out["concurrency"][conc] = {
            "mixes": mixes, "per_class": per_class, "dropped": dropped,
            "errors": sum(1 for r in recs if r.error),
            "decisions": adaptive_picks([r for r in recs if r.config == ADAPTIVE])}
    return out


def _per_class(rows: list[dict]) -> dict[str, dict[str, float]]:
    tokens: dict[tuple[str, str], float] = defaultdict(float)
    seconds: dict[tuple[str, str], float] = defaultdict(float)
    for row in rows:
        for config, (t, s) in row["cells"].items():
            tokens[(row["cls"], config)] += t
            seconds[(row["cls"], config)] += s
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for (cls, config), t in sorted(tokens.items()):
        out[cls][config] = t / seconds[(cls, config)] if seconds[(cls, config)] else 0.0
    return dict(out)


def adaptive_picks(records: list[Record]) -> dict[str, dict[str, int]]:
    """Per class: how many of the adaptive gateway's requests each (pool, k) served,
    marked where the gateway took them for another task or explored."""
    out: dict[str, Counter] = defaultdict(Counter)
    for r in records:
        if not r.error:
            misread = r.routed and r.routed != r.cls.split("/", 1)[0]
            out[r.cls][f"{r.pool.split('-', 1)[-1]} k={r.k}"
                       + (f" as {r.routed}" if misread else "")
                       + (" exploring" if r.explored else "")] += 1
    return {cls: dict(c.most_common()) for cls, c in sorted(out.items())}


def _ci(values: tuple[float, float, float]) -> str:
    return f"{values[0]:.3f} [{values[1]:.3f}, {values[2]:.3f}]"


def targets(engine: str, mix: str, ci: dict) -> str:
    best, oracle = ci["vs_best_homogeneous"], ci["vs_oracle"]
    if mix in TARGET_MIXES:
        ok = best[0] >= TARGET_BEST and best[1] >= 1.0 and oracle[0] >= TARGET_ORACLE
        beyond = ci["oracle_vs_best_homogeneous"][2] < TARGET_BEST
        return (f"{'met' if ok else 'missed'} (>= {TARGET_BEST}x best, low >= 1.0; "
                f">= {TARGET_ORACLE}x oracle)"
                + ("; out of reach of per-class routing here (ceiling's interval below "
                   f"{TARGET_BEST})" if beyond and not ok else ""))
    if engine == "embedded" and mix == "chat product":
        return f"{'met' if best[0] >= TARGET_NO_HARM else 'missed'} (>= {TARGET_NO_HARM}x best)"
    return "-"


def render(summary: dict, settings: str) -> str:
    engine = summary["engine"]
    lines = [f"live benchmark: {settings}"]
    for conc, s in summary["concurrency"].items():
        lines += ["", f"### concurrency {conc}", "",
                  "| mix (shares) | adaptive tok/s | best homogeneous | oracle tok/s (held out) "
                  "| adaptive / best [95%] | adaptive / oracle [95%] | ceiling: oracle / best "
                  "[95%] | per replicate (/best, /oracle) | target |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for mix, m in s["mixes"].items():
            shares = ", ".join(f"{c} {w:.0%}" for c, w in m["shares"].items())
            reps = "; ".join(f"{b:.2f}, {o:.2f}" for b, o in m["by_replicate"].values())
            lines.append(f"| {mix} ({shares}) | {m['adaptive']:.1f} | {m['best_name']} "
                         f"{m['best']:.1f} | {m['oracle']:.1f} | "
                         f"{_ci(m['ci']['vs_best_homogeneous'])} | {_ci(m['ci']['vs_oracle'])} "
                         f"| {_ci(m['ci']['oracle_vs_best_homogeneous'])} "
                         f"| {reps} | {targets(engine, mix, m['ci'])} |")
        lines += _class_table(s)
        lines += ["", "oracle picks per class (fold 0, fold 1; each chosen on the other "
                  "fold), even mix: " + "; ".join(
                      f"{c}: {a} / {b}" for c, (a, b) in
                      s["mixes"].get("even", {}).get("oracle_picks", {}).items())]
        lines += ["", "adaptive gateway's picks (pool k=..: requests):"]
        lines += [f"- {cls}: " + ", ".join(f"{p} x{n}" for p, n in d.items())
                  for cls, d in s["decisions"].items()]
        per_cell = {c: n for m in s["mixes"].values() for c, n in m["requests_per_cell"].items()}
        lines.append("requests per configuration and class: " + ", ".join(
            f"{c} {n}" for c, n in sorted(per_cell.items())))
        if min(per_cell.values(), default=0) < 4:
            lines.append("(fewer than 2 prompts per class and fold: the intervals cannot "
                         "show the spread over prompts)")
        if s["errors"] or s["dropped"]:
            lines.append(f"errors: {s['errors']} requests failed; {s['dropped']} prompts left "
                         f"out of every configuration")
    lines += ["", "telemetry audits (what each fleet's policy learned from):"]
    for a in summary["audits"]:
        lines.append(f"- replicate {a['replicate']} {a['fleet']}: learned from "
                     f"{a['learned_from']} records, {a['pinned']} pinned; adaptive requests "
                     f"served {a['adaptive_requests']}: {'clean' if a['clean'] else 'LEAK'}")
    return "\n".join(lines)


def _class_table(s: dict) -> list[str]:
    per = s["per_class"]
    if not per:
        return []
    configs = list(next(iter(per.values())))
    configs.sort(key=lambda c: (c != ADAPTIVE, c))
    lines = ["", "| class | " + " | ".join(configs) + " |", "|---|" + "---|" * len(configs)]
    for cls, rates in per.items():
        top = max((c for c in configs if c != ADAPTIVE), key=lambda c: rates.get(c, 0.0))
        cells = [f"**{rates[c]:.1f}**" if c == top else f"{rates.get(c, 0.0):.1f}"
                 for c in configs]
        lines.append(f"| {cls} | " + " | ".join(cells) + " |")
    return lines
