"""The prompt set (fetched public text, built by `python -m bench.traces.sources --clones
DIR`, not in git): public sources only, none of the held-out judging sets, every category
of issue 41, each item in the recorder's shape. The held-out prompts
(bench/traces/data/heldout/): only the judging sets, and never in anything trained on.
Checks of the files themselves skip where they are not built; what tells a user how to
build them runs everywhere."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from bench.traces import heldout
from bench.traces.record import main as record_main
from bench.traces.sources import CATEGORIES, EXTRA, PROMPTS, SOURCES, rebuild_hint
from bench.training.classifier.data import build_dataset

ROOT = Path(__file__).resolve().parents[3]
HELD_OUT_DIR = ROOT / "bench" / "traces" / "data" / "heldout"

HELD_OUT = ("spec-bench", "specdecode", "mt-bench", "mt_bench", "wmt", "cnn", "dailymail",
            "natural_questions", "natural-questions", "gsm8k", "sharegpt", "instructcoder")


def _training_items() -> list[dict]:
    if not PROMPTS.exists():
        pytest.skip(f"{PROMPTS} not built here (python -m bench.traces.sources --clones DIR)")
    return [json.loads(line) for line in PROMPTS.read_text().splitlines()]


def test_prompt_file_covers_every_category_from_public_sources() -> None:
    items = _training_items()
    assert len({i["id"] for i in items}) == len(items)
    assert len({i["messages"][0]["content"] for i in items}) == len(items)
    counts = Counter(i["category"] for i in items)
    assert set(counts) == set(CATEGORIES) | set(EXTRA) and min(counts.values()) >= 15
    assert counts["code_edit"] >= 60  # the second draw's code edits
    for item in items:
        assert item["source"] in SOURCES and item["id"].startswith(item["source"] + ":")
        assert [m["role"] for m in item["messages"]] == ["user"]
        assert item["messages"][0]["content"].strip()


def test_no_source_is_a_held_out_set() -> None:
    for name, source in SOURCES.items():
        text = f"{name} {source.repo} {source.path}".lower()
        assert not any(word in text for word in HELD_OUT), name


def _held_out_items() -> list[dict]:
    """The held-out prompts: fetched public text, kept out of the repository (rebuilt with
    `python -m bench.traces.heldout --clones DIR`); without them there is nothing to check."""
    path = HELD_OUT_DIR / "prompts.jsonl"
    if not path.exists():
        pytest.skip(f"{path} not built here (python -m bench.traces.heldout --clones DIR)")
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_held_out_prompts_come_from_the_judging_sets_only() -> None:
    items = _held_out_items()
    assert len({i["id"] for i in items}) == len(items)
    counts = Counter(i["category"] for i in items)
    assert set(counts) == {"mt_bench", "translation", "summarization", "qa", "math_reasoning",
                           "rag", "code_edit"} and min(counts.values()) >= 10
    for item in items:
        assert item["source"] in heldout.SOURCES and item["id"].startswith(item["source"] + ":")
        assert [m["role"] for m in item["messages"]] == ["user"]


def test_held_out_prompts_never_enter_training() -> None:
    """No id, no text, not one run of `heldout.RUN` words shared with what is trained on:
    the trace prompts, the classifier's generated data and its sources' literal text, the
    test fixtures; no training module reads the held-out folder; no training trace
    records a held-out id."""
    items = _held_out_items()
    training = _training_items()
    assert not {i["id"] for i in items} & {t["id"] for t in training}
    texts = [m["content"] for t in training for m in t["messages"]]
    texts += [e.text for split in ("train", "test") for e in build_dataset(split, 400)]
    code = [*(ROOT / "bench" / "training").rglob("*.py"), ROOT / "tests" / "smollm2_prompts.py"]
    texts += [path.read_text() for path in [*code, *(ROOT / "tests" / "data").glob("*.jsonl")]]
    seen = set().union(*map(heldout.word_runs, texts))
    whole = set(texts)
    for item in items:
        text = item["messages"][0]["content"]
        assert text not in whole and not heldout.word_runs(text) & seen, item["id"]
    names = ("data/heldout", '/ "heldout"', "traces.heldout", "traces import heldout")
    for path in code:
        assert not any(name in path.read_text() for name in names), path
    ids = {i["id"] for i in items}
    for traces in (ROOT / "bench" / "traces" / "data").glob("smollm2*/traces.jsonl"):
        assert not {json.loads(line)["id"] for line in traces.open()} & ids, traces
    recorded = HELD_OUT_DIR / "smollm2" / "traces.jsonl"
    if recorded.exists():
        assert {json.loads(line)["id"] for line in recorded.open()} <= ids


def test_a_missing_prompts_file_names_the_command_that_builds_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "python -m bench.traces.sources --clones DIR" in rebuild_hint(PROMPTS)
    assert "python -m bench.traces.heldout --clones DIR" in rebuild_hint(
        HELD_OUT_DIR / "prompts.jsonl")
    assert rebuild_hint(tmp_path / "prompts.jsonl") is None  # not a fetched file of ours
    assert rebuild_hint(None) is None
    missing = PROMPTS if not PROMPTS.exists() else tmp_path / "absent.jsonl"
    assert record_main(["--out", str(tmp_path), "--prompts", str(missing)]) == 2
    assert "is not here" in capsys.readouterr().err


def test_bench_traces_without_its_prompts_says_how_to_build_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from bench.traces import sources
    from specroute.cli import build_parser

    missing = (tmp_path / "prompts.jsonl").resolve()  # stands for the default, not built
    monkeypatch.setitem(sources.REBUILD, missing, "python -m bench.traces.sources --clones DIR")
    args = build_parser().parse_args(["bench", "traces", "--quick", "--prompts", str(missing)])
    assert args.func(args) == 2
    err = capsys.readouterr().err
    assert "python -m bench.traces.sources --clones DIR" in err and "Traceback" not in err


def _git_repo(folder: Path, files: dict[str, str]) -> str:
    """A git repository holding `files` in one commit; its hash."""
    import subprocess

    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    run = lambda *args: subprocess.run(["git", "-C", str(folder), *args], check=True,  # noqa: E731
                                       capture_output=True, text=True).stdout
    run("init", "-q")
    run("add", ".")
    run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "data")
    return run("rev-parse", "HEAD").strip()


def test_the_second_draw_reads_its_sources_at_their_pinned_commits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Builders of the second draw on clones written here: DebugBench's single-bug files
    with its own instruction, Code Alpaca's edit rows with code, self-instruct's rows with
    an input, Tatoeba's pairs from a clone; one bug per item, no ports of multi-bug files."""
    from bench.traces import sources

    code = ("def area(width, height):\n    # the area of a rectangle, in square metres\n"
            "    return width + height\n\n\nprint(area(2, 3), area(4, 5), area(6, 7))\n")
    bug = {"slug": "two-sum", "buggy_code": "class Solution:\n    def f(self): return 1\n"}
    clones = tmp_path / "clones"
    debug = _git_repo(clones / "thunlp+DebugBench" / "repo", {
        "benchmark/python3_variable error.json": json.dumps([bug]),
        "benchmark/python3_double.json": json.dumps([bug])})
    alpaca = _git_repo(clones / "sahil280114+codealpaca" / "repo", {
        "data/new_codealpaca.json": json.dumps([
            {"instruction": "Use multiplication in the following function.", "input": code},
            {"instruction": "Write a haiku.", "input": ""},
            {"instruction": "Fix the typo.", "input": "Teh cat."}])})
    tasks = _git_repo(clones / "yizhongw+self-instruct" / "repo", {
        "human_eval/user_oriented_instructions.jsonl": "".join(json.dumps(row) + "\n" for row in [
            {"id": "t1", "instruction": "Give the email a subject.",
             "instances": [{"input": "Hi all, the meeting moves to Friday."}]},
            {"id": "t2", "instruction": "Tell a joke.", "instances": [{"input": ""}]}])})
    pairs = "".join(f"eng\tfra\tThis sentence has at least eight words, number {i}.\tPhrase {i}.\n"
                    for i in range(3)) + "eng\tfra\tToo short.\tTrop court.\n"
    tatoeba = _git_repo(clones / "Helsinki-NLP+Tatoeba-Challenge" / "repo",
                        {"data/test/eng-fra/test.txt": pairs})
    for name, repo, commit in (("debugbench", "thunlp/DebugBench", debug),
                               ("codealpaca-new", "sahil280114/codealpaca", alpaca),
                               ("self-instruct-input", "yizhongw/self-instruct", tasks),
                               ("tatoeba", "Helsinki-NLP/Tatoeba-Challenge", tatoeba)):
        old = sources.SOURCES[name]
        monkeypatch.setitem(sources.SOURCES, name,
                            sources.Source(repo, commit, old.path, old.licence))
    edits = list(sources.more_code_edits(clones))
    assert [(s, k) for s, k, _ in edits] == [("codealpaca-new", "0"),
                                             ("debugbench", "python3-variable-error:two-sum")]
    assert edits[0][2] == f"Use multiplication in the following function.\n\n{code.strip()}"
    assert edits[1][2].startswith("Observe the following Python3 faulty code")
    assert edits[1][2].endswith(bug["buggy_code"].strip())
    assert list(sources.input_tasks(clones)) == [
        ("self-instruct-input", "t1", "Give the email a subject.\n\nHi all, the meeting moves "
                                      "to Friday.")]
    assert sources.tatoeba_pairs(clones) == [
        (f"This sentence has at least eight words, number {i}.", f"Phrase {i}.") for i in range(3)]
    drawn = sources.draw_extra(clones, 41, frozenset({"codealpaca-new:0"}))
    assert {i["id"] for i in drawn} == {"debugbench:python3-variable-error:two-sum",
                                        "self-instruct-input:t1"}


def test_unseen_prompts_are_none_of_the_training_files(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """`--unseen`: prompts of the training sources for the classes no held-out source
    covers, never one the training file holds."""
    from bench.traces import sources

    def rows(clones: Path):  # noqa: ANN202 - one source of 30 items
        for i in range(30):
            yield "humaneval", str(i), f"prompt {i}"

    monkeypatch.setitem(sources.CATEGORIES, "code_generation", rows)
    taken = tmp_path / "prompts.jsonl"
    taken.write_text("".join(json.dumps({"id": f"humaneval:{i}"}) + "\n" for i in range(25)))
    drawn = sources.draw_unseen(tmp_path, ["code_generation"], 10, 45, taken)
    assert sorted(item["id"] for item in drawn) == [f"humaneval:{i}" for i in range(25, 30)]
    assert all(item["category"] == "code_generation" for item in drawn)
