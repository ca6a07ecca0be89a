"""What `specroute bench live` prints: ratios, decisions and checks from its raw records.

One `Record` per request. Configurations: `adaptive-cold` (a gateway whose policy started
empty at the beginning of this concurrency's measurement), `adaptive-warm` (a gateway
that has served a warm-up and, at later concurrencies, the earlier measurements), and one
per pool pinned with `x-specroute-pool`. Derived, never measured: `oracle` = for each
class the pinned pool with the highest tokens/s in the same run.

Tokens/s = completion tokens / request wall time, summed over a configuration's requests
(at concurrency c a request shares the machine with up to c - 1 others of its own
configuration). A class is (task, temperature) as the workload labels it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import combinations

COLD, WARM = "adaptive-cold", "adaptive-warm"
ADAPTIVE = (COLD, WARM)
BELOW_PLAIN = 0.9  # a pick is a violation when its pool measures below this x plain
CONVERGED_AFTER = 50  # requests of a class the policy has served before picks are checked


@dataclass(frozen=True, slots=True)
class Record:
    concurrency: int
    config: str  # adaptive-cold | adaptive-warm | pool name (pinned) | warmup
    cls: str  # "code/t0"
    tokens: int
    seconds: float
    pool: str  # the pool that served it ("" on error)
    k: int = 0
    seen: int = 0  # requests of this class the gateway had served before this one
    error: str = ""
    reason: str = ""  # the policy's one-line reason, as the response carried it
    item: int = -1  # the prompt's index in the measured workload (-1: warm-up)


def class_name(task: str, temperature: float) -> str:
    return f"{task}/t{temperature:g}"


@dataclass
class Totals:
    tokens: int = 0
    seconds: float = 0.0
    requests: int = 0

    def add(self, tokens: int, seconds: float) -> None:
        self.tokens += tokens
        self.seconds += seconds
        self.requests += 1

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def _by_config_class(records: Iterable[Record]) -> dict[tuple[str, str], Totals]:
    out: dict[tuple[str, str], Totals] = defaultdict(Totals)
    for r in records:
        if not r.error:
            out[(r.config, r.cls)].add(r.tokens, r.seconds)
    return out


def _combined(cells: dict[tuple[str, str], Totals], picks: dict[str, str]) -> float:
    """tokens/s of serving each class in `picks` with its pool's measured cells."""
    tokens = sum(cells[(pool, cls)].tokens for cls, pool in picks.items())
    seconds = sum(cells[(pool, cls)].seconds for cls, pool in picks.items())
    return tokens / seconds if seconds else 0.0


def _best_pool(cells: dict[tuple[str, str], Totals], pools: list[str], cls: str) -> str:
    return max(pools, key=lambda pool: cells[(pool, cls)].rate)


def best_mix(cells: dict[tuple[str, str], Totals], pools: list[str],
             classes: list[str]) -> tuple[float, tuple[str, ...]]:
    """The subset of classes (equal requests each, as measured) on which the per-class
    oracle is furthest above the best single pool: (ratio, classes)."""
    best: tuple[float, tuple[str, ...]] = (1.0, ())
    for size in range(2, len(classes) + 1):
        for subset in combinations(classes, size):
            single = max(_combined(cells, dict.fromkeys(subset, p)) for p in pools)
            oracle = _combined(cells, {c: _best_pool(cells, pools, c) for c in subset})
            if single and oracle / single > best[0]:
                best = (oracle / single, subset)
    return best


def summarize(records: list[Record], pools: list[str], plain: str) -> dict:
    """Per concurrency: rows, ratios, per-class rates, decisions and violations."""
    out = {}
    for conc in sorted({r.concurrency for r in records}):
        recs = [r for r in records if r.concurrency == conc]
        cells = _by_config_class(recs)
        classes = sorted({r.cls for r in recs if r.config in pools})
        measured = [c for c in (*ADAPTIVE, *pools) if any((c, cls) in cells for cls in classes)]
        rates = {c: _combined(cells, dict.fromkeys(classes, c)) for c in measured}
        oracle_picks = {cls: _best_pool(cells, pools, cls) for cls in classes}
        rates["oracle"] = _combined(cells, oracle_picks)
        best_single = max(pools, key=lambda p: rates[p])
        b, o = rates[best_single], rates["oracle"]
        ratios = {}
        for a in ADAPTIVE:
            if a in rates:
                gain = (rates[a] - b) / (o - b) if o > b else None
                ratios[a] = {"vs_oracle": rates[a] / o, "vs_best_single": rates[a] / b,
                             "gain_captured": gain}
        mix_ratio, mix = best_mix(cells, pools, classes)
        out[conc] = {
            "rates": rates, "plain": plain, "best_single": best_single, "ratios": ratios,
            "oracle_picks": oracle_picks,
            "per_class": {cls: {c: cells[(c, cls)].rate for c in measured} for cls in classes},
            "requests": {c: sum(cells[(c, cls)].requests for cls in classes) for c in measured},
            "errors": sum(1 for r in recs if r.error),
            "decisions": {a: decisions(recs, a) for a in ADAPTIVE},
            "violations": {a: violations(records, a, conc, cells, plain) for a in ADAPTIVE},
            "best_mix": {"ratio": mix_ratio, "classes": list(mix)},
        }
    return out


def decisions(records: list[Record], config: str) -> dict[str, dict]:
    """Per class: how often each pool was picked, and how often the pick changed from
    one request of the class to its next (in dispatch order)."""
    out: dict[str, dict] = {}
    for r in records:
        if r.config != config or r.error:
            continue
        entry = out.setdefault(r.cls, {"picks": defaultdict(int), "changes": 0, "last": None})
        entry["picks"][r.pool] += 1
        if entry["last"] is not None and entry["last"] != r.pool:
            entry["changes"] += 1
        entry["last"], entry["reason"] = r.pool, f"k={r.k}: {r.reason}"
    return {cls: {"picks": dict(e["picks"]), "changes": e["changes"], "last_reason": e["reason"]}
            for cls, e in out.items()}


def violations(records: list[Record], config: str, conc: int,
               cells: dict[tuple[str, str], Totals], plain: str) -> dict:
    """Picks, after the gateway had served `CONVERGED_AFTER` requests of the class, of a
    pool this concurrency's pinned rows measure below `BELOW_PLAIN` x plain for that class.
    Counts the gateway's own warm-up too (`warmup` records, at the highest concurrency)."""
    own = (config, "warmup") if config == WARM else (config,)
    checked = bad = 0
    seen_max: dict[str, int] = defaultdict(int)
    for r in records:
        if r.concurrency != conc or r.config not in own or r.error:
            continue
        seen_max[r.cls] = max(seen_max[r.cls], r.seen + 1)
        if r.seen < CONVERGED_AFTER:
            continue
        checked += 1
        floor = BELOW_PLAIN * cells[(plain, r.cls)].rate
        if (r.pool, r.cls) in cells and cells[(r.pool, r.cls)].rate < floor:
            bad += 1
    return {"checked": checked, "violations": bad, "most_seen": max(seen_max.values(), default=0),
            "as_served": as_served(records, config, conc, plain)}


def as_served(records: list[Record], config: str, conc: int, plain: str) -> dict:
    """The same check with the pool measured as `config` used it (its own k): for each
    class and pool it picked after `CONVERGED_AFTER` requests of the class, its requests
    there against pinned plain on the same prompts; a pick is a violation when that pool,
    so served, measures below `BELOW_PLAIN` x plain. (The pinned rows run a pool at its
    configured k; a per-request-k pool served at k = 2 is another operating point.)"""
    here = [r for r in records if r.concurrency == conc and not r.error]
    plain_by_item = {r.item: r for r in here if r.config == plain and r.item >= 0}
    served: dict[tuple[str, str], list[Record]] = defaultdict(list)
    for r in here:
        if r.config == config and r.seen >= CONVERGED_AFTER and r.item in plain_by_item:
            served[(r.cls, r.pool)].append(r)
    checked = bad = 0
    slow: list[str] = []
    for (cls, pool), mine in sorted(served.items()):
        base = [plain_by_item[r.item] for r in mine]
        rate = sum(r.tokens for r in mine) / sum(r.seconds for r in mine)
        plain_rate = sum(r.tokens for r in base) / sum(r.seconds for r in base)
        checked += len(mine)
        if rate < BELOW_PLAIN * plain_rate:
            bad += len(mine)
            slow.append(f"{cls} on {pool.removeprefix('embedded-')} ({rate / plain_rate:.2f}x)")
    return {"checked": checked, "violations": bad, "slow": slow}


def _rate(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def render(summary: dict, settings: str) -> str:
    lines = [f"live benchmark: {settings}"]
    for conc, s in summary.items():
        rates, plain = s["rates"], s["rates"][s["plain"]]
        lines += ["", f"### concurrency {conc}", "",
                  "| configuration | requests | tokens/s | vs plain |", "|---|---|---|---|"]
        order = sorted(rates, key=lambda c: -rates[c])
        for c in order:
            n = s["requests"].get(c, "")
            name = "oracle (per class: best pinned)" if c == "oracle" else c
            lines.append(f"| {name} | {n} | {rates[c]:.1f} | {rates[c] / plain:.2f}x |")
        lines += ["", f"best single pool: {s['best_single']}; oracle / best single: "
                  f"{rates['oracle'] / rates[s['best_single']]:.3f}", "",
                  "| adaptive | / oracle | / best single | oracle gain captured |",
                  "|---|---|---|---|"]
        for a, r in s["ratios"].items():
            gain = r["gain_captured"]
            lines.append(f"| {a} | {r['vs_oracle']:.3f} | {r['vs_best_single']:.3f} | "
                         f"{'n/a (oracle = best single)' if gain is None else f'{gain:.0%}'} |")
        lines += _per_class(s)
        if "cold_audit" in s:
            audit = s["cold_audit"]
            lines.append(f"adaptive-cold learned from {audit['telemetry_records']} telemetry "
                         f"records; it served {audit['own_requests']} requests"
                         f"{'' if audit['same_pools'] else ' (pools differ!)'}")
        for a in ADAPTIVE:
            v = s["violations"][a]
            slow = [cls for cls, r in s["per_class"].items()
                    if a in r and r[a] < BELOW_PLAIN * r[s["plain"]]]
            lines.append(f"{a}: {v['violations']} of {v['checked']} picks made after "
                         f"{CONVERGED_AFTER} requests of the class went to a pool that pinned "
                         f"(at its configured k) measures below {BELOW_PLAIN}x plain (most "
                         f"requests of one class seen: {v['most_seen']}); classes where "
                         f"{a} itself measured below {BELOW_PLAIN}x plain: "
                         f"{', '.join(slow) or 'none'}")
            served = v["as_served"]
            lines.append(f"{a}, each pool as it served it (its own k, against pinned plain on the "
                         f"same prompts): {served['violations']} of {served['checked']} picks "
                         f"after {CONVERGED_AFTER} requests of the class below {BELOW_PLAIN}x "
                         f"plain{': ' + ', '.join(served['slow']) if served['slow'] else ''}")
        lines += ["", f"{WARM}'s last decision per class (k, reason):", ""]
        lines += [f"- {cls}: {d['last_reason']}" for cls, d in sorted(s["decisions"][WARM].items())]
        lines.append("")
        mix = s["best_mix"]
        lines.append(f"widest mix: oracle / best single = {mix['ratio']:.3f} on "
                     f"{' + '.join(mix['classes']) or 'no mix (one pool wins every class)'}")
        if s["errors"]:
            lines.append(f"errors: {s['errors']} requests failed (left out)")
    return "\n".join(lines)


def _per_class(s: dict) -> list[str]:
    configs = [c for c in next(iter(s["per_class"].values()))]
    short = [c.removeprefix("embedded-") for c in configs]
    lines = ["", "| class | " + " | ".join(short) + " | best pinned | cold chose | warm chose "
             "(changes) |", "|---|" + "---|" * (len(configs) + 3)]
    for cls, rates in s["per_class"].items():
        best = s["oracle_picks"][cls]
        cells = [f"**{_rate(rates[c])}**" if c == best else _rate(rates[c]) for c in configs]
        chose = []
        for a in ADAPTIVE:
            d = s["decisions"][a].get(cls, {"picks": {}, "changes": 0})
            picks = ", ".join(f"{p.removeprefix('embedded-')} x{n}"
                              for p, n in sorted(d["picks"].items(), key=lambda kv: -kv[1]))
            chose.append(picks + (f" ({d['changes']})" if a == WARM else ""))
        lines.append(f"| {cls} | " + " | ".join(cells) + f" | {best.removeprefix('embedded-')} "
                     f"| {chose[0]} | {chose[1]} |")
    return lines + [""]
