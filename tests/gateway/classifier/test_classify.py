"""`gateway.classifier.classify`: hard rules, prompt rules, tricky negatives and profile fields."""

from __future__ import annotations

import time

import pytest
from conftest import short_id

from gateway.classifier.classify import classify
from gateway.errors import InvalidRequest
from gateway.schemas import Endpoint, parse_request
from policies.types import RequestProfile


def profile_of(body: dict, endpoint: Endpoint = "chat") -> RequestProfile:
    return classify(parse_request({"model": "m", **body}, endpoint))


def chat(text: str, **extra: object) -> RequestProfile:
    return classify(parse_request({"model": "m", "messages": [{"role": "user", "content": text}],
                                   **extra}, "chat"), "acme")


SCHEMA = {"type": "json_schema",
          "json_schema": {"name": "p", "schema": {"type": "object", "properties": {}}}}
TOOL = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}


def test_response_format_json_schema_is_structured_and_constrained() -> None:
    profile = chat("Tell me about Paris.", response_format=SCHEMA)
    assert profile.task == "structured"
    assert profile.needs_constrained is True
    assert profile.reasons == ("response_format=json_schema",)


def test_response_format_json_object_is_structured_not_constrained() -> None:
    profile = chat("Tell me about Paris.", response_format={"type": "json_object"})
    assert (profile.task, profile.needs_constrained) == ("structured", False)
    assert "response_format=json_object" in profile.reasons


def test_response_format_text_does_not_force_structured() -> None:
    assert chat("Tell me about Paris.", response_format={"type": "text"}).task == "chat"


def test_tools_are_structured_unless_tool_choice_none() -> None:
    profile = chat("What's the weather in Oslo?", tools=[TOOL])
    assert (profile.task, profile.needs_tools) == ("structured", True)
    assert profile.reasons == ("tools (1)",)
    off = chat("What's the weather in Oslo?", tools=[TOOL], tool_choice="none")
    assert (off.task, off.needs_tools) == ("chat", False)


def test_engine_constrained_extras_set_needs_constrained() -> None:
    profile = chat("Pick a colour.", guided_regex="(red|green)")
    assert (profile.task, profile.needs_constrained) == ("structured", True)


@pytest.mark.parametrize("lang, body", [
    ("python", "def add(a, b):\n    return a + b"),
    ("js", "const add = (a, b) => a + b;"),
    ("rust", "fn add(a: i32, b: i32) -> i32 { a + b }"),
    ("go", "func add(a, b int) int { return a + b }"),
    ("sql", "SELECT * FROM users;"),
    ("bash", "ls -la | grep foo"),
    ("", "x = 1"),
])
def test_fenced_code_is_code(lang: str, body: str) -> None:
    profile = chat(f"Why is this wrong?\n```{lang}\n{body}\n```")
    assert profile.task == "code"
    assert profile.reasons == (f"fenced code block ({lang or 'unlabelled'})",)


def test_fenced_json_data_is_not_a_code_fence() -> None:
    profile = chat('Is this a good name for a cat?\n```json\n{"name": "Tom"}\n```')
    assert not any(r.startswith("fenced code") for r in profile.reasons)


@pytest.mark.parametrize("text", [
    "def mean(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total / len(xs)\n"
    "this returns the wrong value for empty lists",
    "public int size() {\n    return items.size();\n}\nwhy is this slow?",
    'Traceback (most recent call last):\n  File "a.py", line 3, in <module>\n'
    "    main()\nZeroDivisionError: division by zero",
    "Exception in thread \"main\" java.lang.IllegalStateException\n"
    "    at com.acme.App.run(App.java:42)",
    "Write a function that checks whether a number is prime.",
    "Can you write a bash script to rotate my logs?",
    "Give me a regex that matches UK postcodes.",
    "What does this function do?\nmystery(a, b) = a ? b : a",
])
def test_unfenced_code_and_code_asks_are_code(text: str) -> None:
    assert chat(text).task == "code"


@pytest.mark.parametrize("text, fmt", [
    ("List three French cheeses. Respond in JSON.", "JSON"),
    ("Describe my dev environment as a YAML file.", "YAML"),
    ("Output CSV with columns name,price for five fruits.", "CSV"),
    ("Return an XML document describing a book.", "XML"),
    ("Answer with a single JSON object: who wrote Hamlet?", "JSON"),
    ("Give me the capitals of Europe in YAML format.", "YAML"),
    ("Summarise the plot of Hamlet, json only", "JSON"),
])
def test_format_asks_are_structured(text: str, fmt: str) -> None:
    profile = chat(text)
    assert profile.task == "structured"
    assert profile.reasons[0].startswith(f"asks for {fmt} output")


def test_format_ask_in_system_prompt_counts() -> None:
    body = {"messages": [{"role": "system", "content": "Always reply in JSON."},
                         {"role": "user", "content": "Who painted the Mona Lisa?"}]}
    assert profile_of(body).task == "structured"


def test_function_returning_json_is_code_not_structured() -> None:
    assert chat("Write a Python function that returns the config as JSON.").task == "code"


def test_structured_beats_code_when_output_format_is_asked() -> None:
    text = "```python\ndef f(x):\n    return x\n```\nList the bugs in this code as a JSON array."
    assert chat(text).task == "structured"


@pytest.mark.parametrize("text", [
    "I'm going to Java island next month. Which volcano should I hike?",
    "My pet python snake sheds its skin in pieces, is that normal?",
    "What is JSON, and why did it replace XML in so many places?",
    "Jason, who everyone calls json, is my best friend. How do I plan his surprise party?",
    "What's the return policy if my shoes don't fit?",
    "How do I get rust off my garden tools?",
    "Write a poem about the sea at night.",
    "Can you recommend a good class for learning pottery?",
    "What's the function of the spleen?",
    "Tell me the history of the C programming language.",
    "What does YAML stand for?",
    "Is a ruby more expensive than a sapphire?",
    "What's the dress code for a black tie wedding?",
])
def test_tricky_chat_negatives_are_chat(text: str) -> None:
    profile = chat(text)
    assert profile.task == "chat", profile.reasons


def test_model_reason_is_explained() -> None:
    (reason,) = chat("How tall is Mount Everest?").reasons
    assert reason.startswith("model: chat p=")


# Hand-written, not templated: a sanity check on prompts unlike the generated set.
REALISTIC = [
    ("Hey! Can you help me plan a birthday dinner for 8 people?", "chat"),
    ("what's the weather usually like in Lisbon in October", "chat"),
    ("Explain how a mortgage works", "chat"),
    ("Give me 5 name ideas for a golden retriever puppy", "chat"),
    ("Summarize the causes of World War I in three bullet points.", "chat"),
    ("I feel stuck in my career, what should I do?", "chat"),
    ("Translate 'good morning, my friend' into Italian", "chat"),
    ("Why do onions make you cry?", "chat"),
    ("How do I reverse a string in Python?", "code"),
    ("my react component re-renders forever when I call setState in useEffect, why?", "code"),
    ("Implement Dijkstra's algorithm in C++", "code"),
    ("why does `git rebase` say 'cannot rebase: You have unstaged changes'?", "code"),
    ("Write a Dockerfile for a Flask app", "code"),
    ("optimize: for i in range(len(a)): if a[i] in b: out.append(a[i])", "code"),
    ("SELECT name FROM users WHERE id IN (SELECT user_id FROM orders) is slow, help", "code"),
    ("Convert this to TypeScript: function add(a, b) { return a + b }", "code"),
    ("Generate a JSON object describing a fictional employee with name, title and salary",
     "structured"),
    ("Give me a list of 10 US states and their capitals in CSV format", "structured"),
    ("Return the answer as JSON: what is the boiling point of water?", "structured"),
    ("Produce a YAML config for a Kubernetes deployment with 3 replicas", "structured"),
    ("Extract all dates from the text below and output them as a JSON array.\n"
     "The fair opens June 3 and closes June 9.", "structured"),
    ("I need this in XML: a bookstore with two books", "structured"),
]


def test_realistic_prompts_mostly_right() -> None:
    wrong = [(text, want, chat(text).reasons) for text, want in REALISTIC
             if chat(text).task != want]
    assert len(wrong) <= 2, wrong


# Written after the templates and rules were final, never tuned on (28/30 at the time).
FRESH = [
    ("What are the symptoms of vitamin D deficiency?", "chat"),
    ("Help me write a thank-you note to my neighbour who watered my plants", "chat"),
    ("Which is healthier, brown rice or quinoa?", "chat"),
    ("Can you suggest a name for my bakery? It's in a small coastal town.", "chat"),
    ("Explain the offside rule in football", "chat"),
    ("Is it rude to leave a party without saying goodbye?", "chat"),
    ("What's a good itinerary for 3 days in Rome?", "chat"),
    ("Tell me about the Java programming language's history and who created it", "chat"),
    ("Describe the plot of Pride and Prejudice in two paragraphs", "chat"),
    ("How do vaccines train the immune system?", "chat"),
    ("I'm learning to bake sourdough. Why is my bread so dense?", "chat"),
    ("Recommend three podcasts about economics", "chat"),
    ("Why does my Node server return CORS errors when called from localhost:3000?", "code"),
    ("How do I center a div horizontally and vertically?", "code"),
    ("Write a Go HTTP handler that returns the current time", "code"),
    ("What's wrong with: for (int i = 0; i <= arr.length; i++) sum += arr[i];", "code"),
    ("Use pandas to group this dataframe by month and sum the sales column", "code"),
    ("Explain what this regex does: ^(?=.*[A-Z])(?=.*\\d).{8,}$", "code"),
    ("My Kotlin coroutine never completes, here's the launch block:\nscope.launch {\n    val x = fetch()\n    println(x)\n}", "code"),
    # an edit of the code it provides: copy-heavy since issue 41's code-edit cue
    ("Add error handling to my fetch call: const r = await fetch(url); const j = await r.json();", "edit"),
    ("How do I make a git alias for 'log --oneline --graph'?", "code"),
    ("Write a unit test in Jest for a sum(a, b) function", "code"),
    ("Respond with JSON containing fields city and country for the Eiffel Tower", "structured"),
    ("Please return the 5 largest oceans as a YAML list with name and area", "structured"),
    ("Format the following contacts as CSV: Ann 555-1234, Bob 555-9876", "structured"),
    ("Create an XML sitemap entry for https://example.com/about", "structured"),
    ("Give me a JSON array of three fictional users, each with id, email and signup_date", "structured"),
    ("Classify these tweets as positive/negative and output JSON lines", "structured"),
    ("What's the population of Canada? Reply in json: {\"population\": number}", "structured"),
    ("Convert this recipe into a structured YAML document with ingredients and steps: 2 eggs, 1 cup flour, mix and bake 20 min", "structured"),
]


def test_fresh_prompts_mostly_right() -> None:
    wrong = [(text, want) for text, want in FRESH if chat(text).task != want]
    assert len(wrong) <= 3, wrong


def test_profile_defaults_follow_openai() -> None:
    profile = profile_of({"model": "llama", "messages": [{"role": "user", "content": "hi"}]})
    assert (profile.temperature, profile.top_p) == (1.0, 1.0)
    assert (profile.max_tokens, profile.stream, profile.tenant) == (0, False, "default")
    assert profile.model == "llama"
    assert profile.temperature_bucket == "thigh"


def test_profile_reads_sampling_fields() -> None:
    profile = chat("hi", temperature=0, top_p=0.9, max_completion_tokens=77, max_tokens=5,
                   stream=True)
    assert (profile.temperature, profile.top_p, profile.max_tokens) == (0.0, 0.9, 77)
    assert profile.stream is True and profile.tenant == "acme"
    assert chat("hi", max_tokens=5).max_tokens == 5


def test_prompt_tokens_estimate_is_bytes_over_four_plus_message_overhead() -> None:
    body = {"messages": [{"role": "system", "content": "s" * 40},
                         {"role": "user", "content": [{"type": "text", "text": "u" * 80},
                                                      {"type": "image_url", "image_url": {}}]}]}
    assert profile_of(body).prompt_tokens == 30 + 2 * 4


def test_content_parts_are_read() -> None:
    body = {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "Fix this:"},
        {"type": "text", "text": "```go\nfunc main() {}\n```"}]}]}
    assert profile_of(body).task == "code"


def test_completions_prompt_string_and_list() -> None:
    single = profile_of({"prompt": "def fib(n):\n    ```", "max_tokens": 32}, "completions")
    assert single.max_tokens == 32
    listed = profile_of({"prompt": ["Respond in JSON: name a fruit. " + "x" * 400]},
                        "completions")
    assert listed.task == "structured"
    assert listed.max_tokens == 16  # the /v1/completions default
    assert listed.prompt_tokens == (len("Respond in JSON: name a fruit. ") + 400 + 3) // 4
    tokens = profile_of({"prompt": [1, 2, 3, 4, 5]}, "completions")
    assert tokens.prompt_tokens == 5


@pytest.mark.parametrize("body", [
    {},
    {"messages": None},
    {"messages": ["not a dict", {"role": "user"}]},
    {"messages": [{"role": "user", "content": None}], "temperature": "hot", "top_p": None,
     "max_tokens": None, "stream": "yes", "response_format": "json", "tools": {}},
])
def test_malformed_bodies_never_reach_the_classifier(body: dict) -> None:
    """`classify` takes the typed request: a malformed body is a 400 before it."""
    with pytest.raises(InvalidRequest):
        profile_of(body)


@pytest.mark.parametrize("text", [
    "\n    at " + "a (b:" * 2000,
    "```" * 3000,
    "write " + "a" * 8000 + " function",
    "respond " * 1500 + "in json",
    "x;\n" * 3000,
], ids=short_id)
def test_pathological_prompts_stay_fast(text: str) -> None:
    chat("warm up")
    start = time.perf_counter()
    chat(text)
    assert time.perf_counter() - start < 0.05
