"""Request classification: a validated `GenerationRequest` -> `RequestProfile`.

Why: speculative drafts are accepted far more often on code and JSON than on free chat,
so the policy needs to know which one a request is before choosing a pool and `k`.

Order of evidence (first that fires decides the task; every rule that fires is listed
in `reasons`):

1. hard request fields -> `structured`: `response_format` json_object / json_schema
   (json_schema, and the engines' `guided_json`/`guided_regex`/`guided_grammar`/`regex`/
   `ebnf`/`json_schema` extras, also set `needs_constrained`), non-empty `tools` /
   `functions` with `tool_choice` other than "none" (`needs_tools`).
2. the prompt asks for JSON/YAML/CSV/XML output ("respond in JSON", "as a YAML file",
   "au format JSON", "JSON格式") -> `structured`, unless the ask is for a function/script
   that emits it ("write a Python function that returns JSON" is code) or sits in a
   how-to question.
3. an edit of material the message provides ("fix the spelling in this paragraph:
   ...", "rename x in this function: ```...```") -> `edit`
   (gateway/classifier/grounded.py): the answer copies the input.
4. code in the prompt: a fenced block in a programming language (or unlabelled), a
   stack trace, or >= 3 code-looking lines; or an explicit "write a function/script/
   query/regex", "show me the code", the same ask in another language, or a how-to
   question about a programming tool -> `code`.
5. otherwise the linear text model (`gateway.classifier.scorer`) picks the class; a
   `structured` pick with no output format named falls to the likelier of the others.

Structured beats code because a requested output format is the strongest signal about
what will be decoded. Rules read the system messages plus the last user message (head
1.5 KB + tail 512 characters; the multilingual and how-to rules its first 512), every
regex only on bounded pieces; the model reads only the last user message (its own
head/tail window). `prompt_tokens` is the request's own estimate
(`GenerationRequest.prompt_tokens_estimate`). The model loads lazily on first use
(`load_classifier`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from itertools import islice
from pathlib import Path

from gateway.classifier.code_signs import code_signs
from gateway.classifier.features import request_features
from gateway.classifier.grounded import CopyCues, copy_cues, edit_evidence
from gateway.classifier.parts import context_chars, prompt_parts
from gateway.classifier.prediction import cached_predictor, profile_fields
from gateway.classifier.scorer import LinearTextModel
from gateway.schemas import GenerationRequest
from policies.predictor import Predictor
from policies.request_limits import COMPLETIONS_DEFAULT_MAX_TOKENS
from policies.types import RequestProfile, Task

DEFAULT_MODEL_PATH = Path(__file__).resolve().parent / "assets" / "classifier.npz"
RULE_HEAD_CHARS = 1536  # bounded scans: a format or code ask sits at either end of a
RULE_TAIL_CHARS = 512  # prompt; pasted code or a trace shows in any 2 KB of it
MAX_FENCES = 16  # fenced blocks inspected per prompt

_CONSTRAINED_EXTRAS = ("guided_json", "guided_regex", "guided_grammar", "regex", "ebnf",
                       "json_schema")
_FMT = r"(?:json(?:\s+lines|l)?|ya?ml|csv|tsv|xml)"
_VERB = (r"\b(?:respond|reply|answer|output|return|format|give|provide|produce|generate|emit|"
         r"print|write|convert|export|structure|dump|serialize|list|put|express|encode|turn|"
         r"make|create|build|fill|save|transform|parse|extract|send|render|describe|represent|"
         r"show|present|display|deliver|reformat|rewrite|translate|summari[sz]e|organi[sz]e|"
         r"arrange|compile|tabulate|need|want)\w*\b")
_EMIT = r"\b(?:respond|reply|answer|output|return|emit|produce|generate|give|send|print|dump|export)\w*\b"
_ADJ = r"(?:(?:a|an|the|valid|strict|proper|well-formed|pure|plain|raw|structured|only|single)\s+)*"
_FORMAT_ASK = re.compile(
    rf"{_VERB}[^.?!\n]{{0,60}}?\b(?:in|as|into|to|using|with)\s+{_ADJ}(?P<a>{_FMT})\b"
    rf"|{_VERB}[^.?!\n]{{0,40}}?\b{_ADJ}(?P<b>{_FMT})\s+(?:object|array|document|file|list|"
    r"table|config\w*|representation|string|lines|records?|payload|output|response|format)\b"
    rf"|{_EMIT}\s+{_ADJ}(?P<f>{_FMT})\b(?!\s*(?:parser|librar|module|serializ|encoder|decoder|"
    r"schema valid))"
    rf"|\b(?P<c>{_FMT})\s+only\b|\b(?:only|nothing but)\s+(?:valid\s+)?(?P<d>{_FMT})\b"
    rf"|\bin\s+(?:valid\s+)?(?P<e>{_FMT})\s+format\b"
    # "write a docker-compose YAML", "give me an XML sitemap": the format names the output
    rf"|\b(?:write|give|make|create|generate|produce|build)\s+(?:me\s+)?(?:a|an|the)\s+"
    rf"(?:[\w-]+\s+){{0,2}}?(?P<g>{_FMT})\b(?!\s+(?:parser|librar|module|file format))"
    # other languages: "au format JSON", "en formato CSV", "als JSON", "в формате JSON",
    # "un objeto JSON", "JSON格式", "JSON形式", "JSON-Format"
    rf"|(?<![^\W\d_])(?:format[oa]?|формате?|als|em|como|comme|objeto|objet|objekt|oggetto)"
    rf"\s+(?:de\s+)?(?P<h>{_FMT})(?![A-Za-z])"
    rf"|(?<![A-Za-z])(?P<i>{_FMT})\s*(?:格式|形式|フォーマット|형식|-format)",
    re.IGNORECASE,
)
# A how-to question names a format without asking for output ("how do I pretty-print a
# JSON file with jq?").
_HOW_QUESTION = re.compile(r"\bhow\s+(?:do|can|should|would)\s+(?:i|you|we)\b|\bhow\s+to\b",
                           re.IGNORECASE)
# Code asks in other languages: a programming language next to the word for a function,
# method, script or query (either order; no \b, which CJK text next to Latin lacks).
_LANG_NAME = (r"(?<![A-Za-z+#])(?:python|javascript|typescript|java|go|golang|rust|c\+\+|c#|"
              r"sql|bash|ruby|php|kotlin|swift)(?![A-Za-z])")
_FUNCTION_WORD = (r"(?:funci[oó]n|fonction|funktion|funzione|fun[cç][aã]o|функци\w*|函数|関数|"
                  r"メソッド|함수|método|méthode|methode|metodo|метод|script|スクリプト|脚本|"
                  r"consulta|requête|abfrage|запрос|查询|クエリ|程序|プログラム)")
_CODE_ASK_INTL = re.compile(rf"{_LANG_NAME}[^.?!\n。？！]{{0,40}}?{_FUNCTION_WORD}"
                            rf"|{_FUNCTION_WORD}[^.?!\n。？！]{{0,40}}?{_LANG_NAME}",
                            re.IGNORECASE)
# A how-to or show-me question about a programming tool: its answer is code. Only
# unambiguous names (not rust, go, ruby: "how do I get rust off my tools?").
_TECH = (r"(?<![\w.+#-])(?:python|java|javascript|typescript|c\+\+|c#|sql|bash|powershell|css|"
         r"html|react|node(?:\.js)?|git|github|docker|kubernetes|kubectl|vim|emacs|npm|pip|"
         r"pandas|numpy|django|flask|linux|command line|terminal|regex|jq|curl|flexbox)"
         r"(?![\w+#])")
_EXAMPLES = (r"\bshow\s+(?:me\s+)?(?:an?\s+|some\s+)?examples?\b"
             r"|\bwith\s+(?:an?\s+)?(?:small\s+|short\s+|simple\s+)?examples?\b")
_TECH_HOWTO = re.compile(
    rf"(?:\bhow\s+(?:do|can|should)\s+(?:i|you|we)\b|\bhow\s+to\b|{_EXAMPLES})"
    rf"[^.?!\n]{{0,80}}?{_TECH}"
    rf"|{_TECH}[^\n]{{0,80}}?(?:{_EXAMPLES})"
    r"|\bexplain\s+what\s+(?:this|these)\s+(?:does|do|means):\s*\S",
    re.IGNORECASE)
_HOWTO_CUES = ("how", "example", "explain")
# Necessary substrings: an ASCII text (lowercased) holding none of a regex's cannot match
# it, so the regex is not run (each would be a large share of a short chat prompt's
# classification, and most prompts are short chat). Only on ASCII text, where ignoring
# case is lowercasing; elsewhere the regexes run as they are (Unicode's case folding has
# "ſ" for "s", "K" for "k").
_FUNCTION_NEEDLES = ("fun", "fonction", "methode", "metodo", "script", "consulta", "abfrage")
_TECH_NEEDLES = ("python", "java", "typescript", "c++", "c#", "sql", "bash", "powershell",
                 "css", "html", "react", "node", "git", "docker", "kubernetes", "kubectl",
                 "vim", "emacs", "npm", "pip", "pandas", "numpy", "django", "flask", "linux",
                 "command line", "terminal", "regex", "jq", "curl", "flexbox")
_ASK_VERBS = ("write", "implement", "create", "generate", "code", "build", "give", "show",
              "make", "send")  # one of them opens every `_CODE_ASK` alternative
INTL_CHARS = 512  # the head of the prompt the multilingual and how-to rules read
_FENCE = re.compile(r"```[ \t]*([\w+#.-]*)")
_DATA_FENCES = frozenset({"json", "jsonl", "yaml", "yml", "csv", "tsv", "xml", "toml", "text",
                          "txt", "markdown", "md", "plaintext"})
_TRACES = tuple(re.compile(p, re.MULTILINE) for p in (  # separate: one alternation is slower
    r"Traceback \(most recent call last\)|Exception in thread \"|Segmentation fault",
    r"^[ \t]+at [\w$.<>]+\([^\n]*\)[ \t]*$",  # Java / C#
    r"^[ \t]+at [^\n]{1,200} \([^\n]{1,200}:\d+:\d+\)$",  # JavaScript (bounded: no blow-up)
    r"^error\[E\d{4}\]|^panic: |^goroutine \d+ \[",  # Rust, Go
))
_TRACE_MARKERS = ("Traceback (most", "Exception in thread", "error[E", "panic: ", "goroutine ",
                  "Segmentation fault", "\n    at ", "\n\tat ", "\n  at ")
_CODE_LINE_START = re.compile(
    r"\n[ \t]*(?:def \w+\(|class \w+[:(]|import \w|from [\w.]+ import|#include\b|public |"
    r"private |func |fn \w|package \w|let |const |var |if \(|for \(|while \(|return\b|"
    r"SELECT\b|CREATE TABLE|<\?php|<div|<html|#!/|@\w+)"
)
_CODE_LINE_END = re.compile(r"[;{}][ \t]*\n")
_LANGS = (r"python|javascript|typescript|js|ts|jsx|tsx|java|kotlin|swift|golang|go|rust|c\+\+|"
          r"c#|c|php|ruby|sql|bash|shell|sh|powershell|html|css|react|node(?:\.js)?|scala|"
          r"haskell|lua|perl|dart|elixir|julia|matlab|r")
_CODE_ASK = re.compile(
    r"\b(?:write|implement|create|generate|code|build|give me|show me|make)\b[^.?!\n]{0,40}?"
    r"(?:\b(?:function|script|method|unit tests?|regex|regular expression|sql query|"
    rf"code snippet)\b|(?<![\w+#])(?:{_LANGS})\s+(?:code|program|class|snippet)\b)"
    r"|\b(?:show|give|send|write)\s+(?:me\s+|us\s+)?(?:the|some|working|example)\s+code\b",
    re.IGNORECASE,
)
_PASTED_CODE = re.compile(
    r"\b(?:this|my|the following|following|below|attached)\s+(?:\w+\s+)?(?:code|function|"
    r"script|snippet|query|program|method)\b(?!\s+of\b)[^\n]{0,80}\n",
    re.IGNORECASE,
)
_CODE_ASK_WORDS = ("function", "script", "method", "test", "regex", "regular expression",
                   "query", "snippet", "code", "program", "class")
_FORMAT_WORDS = ("json", "yaml", "yml", "csv", "tsv", "xml")
_ASK_BEFORE, _ASK_AFTER = 110, 40  # chars around a format word where an output ask can sit
# Around a code word: a verb <= 40 chars before it (`_CODE_ASK`), or the pasted-code
# phrase before it and the rest of its line after it (`_PASTED_CODE`).
_CODE_BEFORE, _CODE_AFTER = 64, 96
MAX_WORD_HITS = 4  # occurrences of one trigger word inspected

_MODEL: LinearTextModel | None = None


def load_classifier(path: Path | str | None = None) -> LinearTextModel:
    """Load (and cache for `classify`) the text model, the shipped one by default, and the
    shipped drafter predictor (gateway/classifier/prediction.py) if none is loaded yet."""
    global _MODEL
    _MODEL = LinearTextModel.load(Path(path) if path is not None else DEFAULT_MODEL_PATH)
    cached_predictor()
    return _MODEL


def classify(request: GenerationRequest, tenant: str = "default", *,
             model: LinearTextModel | None = None,
             predictor: Predictor | None = None) -> RequestProfile:
    """Profile a request `gateway.schemas.parse_request` has validated, with the drafter
    predictor's per-request prediction (policies/predictor.py).

    `model` and `predictor` override the cached ones (training evaluates fresh ones).
    """
    (task, reasons, constrained, tools), features = _analyse(request, model)
    predicted, scales, pooled = profile_fields(predictor or cached_predictor(), task,
                                               features)
    if request.max_tokens is not None:
        max_tokens = request.max_tokens
    else:
        # chat: 0 = unset (the gateway budgets it per pool)
        max_tokens = COMPLETIONS_DEFAULT_MAX_TOKENS if request.endpoint == "completions" else 0
    return RequestProfile(
        task=task,
        temperature=1.0 if request.temperature is None else request.temperature,
        top_p=1.0 if request.top_p is None else request.top_p,
        prompt_tokens=request.prompt_tokens_estimate,
        max_tokens=max_tokens,
        stream=request.stream,
        tenant=tenant,
        model=request.model,
        needs_constrained=constrained,
        needs_tools=tools,
        reasons=tuple(reasons),
        predicted_accept=predicted,
        drafter_scales=scales,
        pooled_scales=pooled,
    )


def request_vector(request: GenerationRequest, *, model: LinearTextModel | None = None
                   ) -> tuple[str, tuple[float, ...]]:
    """The task and the drafter predictor's feature vector (gateway/classifier/
    features.py) exactly as `classify` computes them; what the predictor is trained on."""
    decided, features = _analyse(request, model)
    return decided[0], features


def _analyse(request: GenerationRequest, model: LinearTextModel | None
             ) -> tuple[tuple[Task, list[str], bool, bool], tuple[float, ...]]:
    """`_decide`'s verdict and the predictor's features, the copy cues read once for both."""
    system, user = prompt_parts(request)
    cues = copy_cues(user)
    decided = _decide(request, system, user, model, cues)
    return decided, request_features(decided[0], user, context_chars(request, user), cues)


def _decide(request: GenerationRequest, system: str, user: str,
            model: LinearTextModel | None, cues: CopyCues | None = None
            ) -> tuple[Task, list[str], bool, bool]:
    """Task, reasons, needs_constrained, needs_tools — rules first, then the model."""
    reasons: list[str] = []
    fmt_type = request.response_format["type"] if request.response_format else None
    constrained = fmt_type == "json_schema"
    if fmt_type in ("json_object", "json_schema"):
        reasons.append(f"response_format={fmt_type}")
    extras = [k for k in _CONSTRAINED_EXTRAS if request.body.get(k)]  # engine pass-through
    if extras:
        constrained = True
        reasons.append(f"constrained decoding ({', '.join(extras)})")
    tool_list = request.tools or request.body.get("functions")  # functions: legacy, unchecked
    tools = (isinstance(tool_list, list) and bool(tool_list)
             and request.tool_choice != "none")
    if tools:
        reasons.append(f"tools ({len(tool_list)})")  # type: ignore[arg-type]
    if reasons:
        return "structured", reasons, constrained, tools

    text = f"{system}\n{_bounded(user)}" if system else _bounded(user)
    lower = text.lower()
    ask, named_format = _format_ask(text, lower)
    if ask:
        return "structured", [ask], False, False
    edit = edit_evidence(user, cues)
    if edit:
        return "edit", [edit], False, False
    code = _code_evidence(text, lower) or _code_ask_intl(text) or _tech_howto(text)
    if code:
        return "code", [code], False, False
    model = model or _MODEL or load_classifier()
    prediction = model.predict(user)
    label, probability = prediction.label, prediction.probability
    why = ""
    if label == "structured" and not (named_format or '{"' in text or '":' in text):
        # structured output needs a format: none named, so the likelier of the others
        odds = dict(zip(model.classes, prediction.probabilities, strict=True))
        label = "code" if odds.get("code", 0.0) > odds.get("chat", 0.0) else "chat"
        probability = odds.get(label, 0.0)
        why = "; no output format named"
    if label == "code" and not code_signs(user):
        # `code` means code: prose the model leans to code on (quotes, line breaks,
        # "how to") with no sign of code in it is chat
        label, why = "chat", f"{why}; model said code (p={probability:.2f}), no sign of code"
        probability = dict(zip(model.classes, prediction.probabilities, strict=True)).get(
            "chat", 0.0)
    explained = f" ({', '.join(prediction.top_features)})" if prediction.top_features else ""
    return label, [f"model: {label} p={probability:.2f}{explained}{why}"], False, False  # type: ignore[return-value]


def _code_ask_intl(text: str) -> str | None:
    """A code ask in another language ("escribe una función en Python", "用Python写一个
    函数"); reads the head of the prompt, where an ask sits."""
    if text.isascii() and len(text) > INTL_CHARS:
        return None  # long English prompts: the English rules have read them
    head = text[:INTL_CHARS]
    if head.isascii() and not _holds_any(head.lower(), _FUNCTION_NEEDLES):
        return None
    match = _CODE_ASK_INTL.search(text, 0, INTL_CHARS)
    return f"asks for code: {match.group(0)[:60]!r}" if match else None


def _tech_howto(text: str) -> str | None:
    """A how-to question about a programming tool ("how do I undo a commit in git?")."""
    head = text[:INTL_CHARS]
    lower = head.lower()
    if not _holds_any(lower, _HOWTO_CUES):
        return None
    if head.isascii() and not _holds_any(lower, _TECH_NEEDLES) \
            and not ("explain" in lower and ":" in head):  # "explain what this does: ..."
        return None
    match = _TECH_HOWTO.search(head)
    return f"programming question: {match.group(0)[:60]!r}" if match else None


def _format_ask(text: str, lower: str) -> tuple[str | None, bool]:
    """An output-format request near a format word (regex only around those words), and
    whether any format word occurs at all."""
    named = False
    for word in _FORMAT_WORDS:
        start = lower.find(word)
        named = named or start >= 0
        for _ in range(8):
            if start < 0:
                break
            begin = max(0, start - _ASK_BEFORE)
            piece = text[begin: start + _ASK_AFTER]
            for match in _FORMAT_ASK.finditer(piece):
                if _CODE_ASK.search(match.group(0)):  # "write a function ... JSON"
                    continue
                sentence = re.split(r"[.?!\n]", piece[:match.start()])[-1]
                if _HOW_QUESTION.search(sentence + match.group(0)):
                    continue
                fmt = next(g for g in match.groups() if g)
                return f"asks for {fmt.upper()} output: {match.group(0).strip()[:60]!r}", True
            start = lower.find(word, start + len(word))
    return None, named


def _code_evidence(text: str, lower: str) -> str | None:
    if "```" in text:
        fences = islice(_FENCE.finditer(text), 2 * MAX_FENCES)
        for match in islice(fences, 0, None, 2):  # openings; every second one closes a block
            lang = match.group(1).lower()
            if lang not in _DATA_FENCES:
                return f"fenced code block ({lang or 'unlabelled'})"
    if text.find("\n", text.find("\n") + 1) > 0:  # traces and code lines are several lines
        if any(m in text for m in _TRACE_MARKERS) and any(t.search(text) for t in _TRACES):
            return "stack trace"
        lines = len(_CODE_LINE_START.findall("\n" + text))
        if ";" in text or "{" in text or "}" in text:
            lines += len(_CODE_LINE_END.findall(text + "\n"))
        if lines >= 3:
            return f"code-like lines ({lines})"
    return _code_ask(text, lower)


def _code_ask(text: str, lower: str) -> str | None:
    """A code ask or a pointer to pasted code near a code word: the regexes run only on
    windows around those words (a whole-prompt scan pays for every character of a long
    prompt whenever a common code word appears in it)."""
    asked = pasted = None
    for piece in code_word_windows(text, lower):
        plain = piece.isascii()
        if not asked and (not plain or _holds_any(piece.lower(), _ASK_VERBS)):
            asked = _CODE_ASK.search(piece)
        if not pasted and (not plain or "\n" in piece):
            pasted = _PASTED_CODE.search(piece)
    if asked:
        return f"asks for code: {asked.group(0)[:60]!r}"
    if pasted:
        return f"refers to pasted code: {pasted.group(0).strip()[:60]!r}"
    return None


def code_word_windows(text: str, lower: str) -> Iterator[str]:
    """The text around each code word's first `MAX_WORD_HITS` occurrences."""
    for word in _CODE_ASK_WORDS:
        start = lower.find(word)
        for _ in range(MAX_WORD_HITS):
            if start < 0:
                break
            yield text[max(0, start - _CODE_BEFORE): start + len(word) + _CODE_AFTER]
            start = lower.find(word, start + len(word))


def _holds_any(text: str, needles: tuple[str, ...]) -> bool:
    """Whether `text` holds one of `needles` (lowercased once by the caller, not per
    needle as a generator over `text.lower()` would)."""
    return any(needle in text for needle in needles)


def _bounded(text: str) -> str:
    if len(text) <= RULE_HEAD_CHARS + RULE_TAIL_CHARS:
        return text
    return text[:RULE_HEAD_CHARS] + "\n" + text[-RULE_TAIL_CHARS:]
