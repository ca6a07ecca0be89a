"""`specroute bench memory`: what the `specroute up` stack holds in memory.

Starts `specroute up` on a port and in a work folder of its own, waits until it serves,
sends one short chat request to every pool of the config it wrote (`x-specroute-pool`, greedy, 24 tokens), and
sums the `Pss:` line of `/proc/PID/smaps_rollup` over `up`'s process tree, once when the
stack is ready and once after the requests; then stops the stack (SIGINT to its process
group, SIGKILL after 60 s). PSS counts a page shared by n processes 1/n in each, so the
sum is what the stack costs the machine: the workers' memory-mapped weights count once.
Linux only.

    specroute bench memory [--model smollm2|tiny] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

from workers.processes import free_port, stop_group

READY_LINE = "Ctrl-C stops everything"  # what `specroute up` prints once it serves
FIELDS = ("Pss", "Pss_Anon", "Pss_File", "Rss")


def process_tree(root: int) -> list[int]:
    """`root` and every process below it, from /proc's parent links."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # exited meanwhile
        parent = int(stat.rsplit(")", 1)[1].split()[1])  # the name may hold spaces
        children.setdefault(parent, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def role(cmdline: list[str]) -> str:
    """A stack process's part: worker-<method>, gateway, redis, up, else its command."""
    if "--method" in cmdline[:-1]:
        return "worker-" + cmdline[cmdline.index("--method") + 1]
    if "redis" in Path(cmdline[0]).name:
        return "redis"
    for part in ("gateway", "up"):  # the CLI's subcommand
        if part in cmdline:
            return part
    return " ".join(cmdline)[:40]


def memory_rows(root: int) -> list[dict]:
    """MB of PSS (and its anonymous and file parts) and RSS per process of the tree."""
    rows = []
    for pid in process_tree(root):
        try:
            lines = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
            cmdline = Path(f"/proc/{pid}/cmdline").read_text().split("\0")
        except OSError:
            continue
        kb = {parts[0].rstrip(":"): int(parts[1]) for parts in map(str.split, lines)
              if len(parts) == 3 and parts[2] == "kB"}
        rows.append({"process": role(cmdline), "pid": pid,
                     **{f"{name}_mb": round(kb.get(name, 0) / 1024, 1) for name in FIELDS}})
    return sorted(rows, key=lambda row: row["process"])


def _ask_every_pool(port: int, model: str, pools: list[str]) -> None:
    body = json.dumps({"model": model, "max_tokens": 24, "temperature": 0, "messages": [
        {"role": "user", "content": "Write a Python function that adds two numbers."}]}).encode()
    for pool in pools:
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body,
                                         {"content-type": "application/json",
                                          "x-specroute-pool": pool})
        with urllib.request.urlopen(request, timeout=300) as answer:
            json.load(answer)


def measure(model: str | None) -> dict:
    port = free_port()
    with tempfile.TemporaryDirectory() as workdir:
        command = [sys.executable, "-m", "specroute.cli", "up", "--port", str(port),
                   "--workdir", workdir, *(["--model", model] if model else [])]
        up = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, start_new_session=True)
        try:
            assert up.stdout is not None
            for line in up.stdout:  # until it serves (or exits)
                if READY_LINE in line:
                    break
            else:
                raise RuntimeError(f"specroute up exited ({up.wait()}) before serving")
            ready = memory_rows(up.pid)
            pools = yaml.safe_load((Path(workdir) / "config.yaml").read_text())["pools"]
            names, served = [p["name"] for p in pools], pools[0]["model"]
            _ask_every_pool(port, served, names)
            time.sleep(1)
            return {"model": served, "pools": names, "ready": ready,
                    "after_requests": memory_rows(up.pid)}
        finally:
            stop_group(up, signal.SIGINT)  # `up` stops what it started on Ctrl-C


def format_report(result: dict) -> str:
    lines = [f"specroute up ({result['model']}, pools {', '.join(result['pools'])}): PSS "
             "summed over its processes, MB", "",
             "| process | PSS ready | PSS after a request per pool | of which anonymous | "
             "file | RSS |", "|---|---|---|---|---|---|"]
    ready = {row["pid"]: row for row in result["ready"]}
    for row in result["after_requests"]:
        before = ready.get(row["pid"], {}).get("Pss_mb", "")
        lines.append(f"| {row['process']} | {before} | {row['Pss_mb']} | {row['Pss_Anon_mb']} "
                     f"| {row['Pss_File_mb']} | {row['Rss_mb']} |")
    total = {key: round(sum(row["Pss_mb"] for row in result[key])) for key in
             ("ready", "after_requests")}
    lines.append(f"| **stack** | **{total['ready']}** | **{total['after_requests']}** | | | |")
    result["stack_pss_mb"] = total
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    model = {"smollm2": None, None: None}.get(args.model, args.model)
    result = measure(model)
    print(format_report(result))
    if args.json:
        print(json.dumps(result))
    return 0
