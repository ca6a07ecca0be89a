"""The labelled prompt set the request classifier is trained and tested on.

Built offline and deterministically from templates x vocabulary (plus Python stdlib
source read with `inspect`): no downloads, same seed -> same set. Every template list is
cut in two: templates at index % 4 == 3 (and the last snippet of each language, and a
quarter of the stdlib modules) form the held-out test split, the rest the training
split, and each split has its own seed. So the test set measures phrasings and code
shapes the model never saw, not memorised ones.

Labels follow `gateway.classify`: `structured` = asks for JSON/YAML/CSV/XML output;
`code` = code in the prompt or code asked for; `chat` = everything else, including
tricky negatives (Java the island, python the snake, questions *about* JSON).
"""

from __future__ import annotations

import importlib
import inspect
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from gateway.classifier_snippets import SNIPPETS, STDLIB_MODULES, TRACES
from policies.types import Task

Split = Literal["train", "test"]
SEEDS: dict[Split, int] = {"train": 20240601, "test": 777013}
_SLOT_RE = re.compile(r"@(\w+)@")


@dataclass(frozen=True, slots=True)
class Example:
    text: str
    label: Task
    source: str  # "<label>/<template index>", to trace a misclassification back


CODE_TEMPLATES: tuple[str, ...] = (
    "Write a @lang@ function that can @task@.",
    "How do I @task@ in @lang@?",
    "Fix this bug:\n@code@",
    "Can you write @lang@ code to @task@?",
    "@code@\n\nWhy does this not work?",
    "Refactor this @lang@ code so it is more readable:\n@code@",
    "I'm getting this error:\n@trace@\nHow do I fix it?",
    "What does this code do?\n@code@",
    "Implement a @lang@ program to @task@. Include unit tests.",
    "Optimize this function, it is too slow:\n@code@",
    "Add type hints and comments to the following:\n@code@",
    "Convert this @lang@ code to @lang2@:\n@code@",
    "Review my code and point out problems:\n@code@",
    "@code@",
    "Here is my @lang@ snippet, it crashes with @errname@:\n@code@",
    "@trace@",
    "Write unit tests for this:\n@code@",
    "Create a @lang@ class for a @noun@ with a method to @task@.",
    "What's the time complexity of this?\n@code@",
    "debug pls\n@code@",
    "Show me how to @task@ using @lang@, with an example.",
    "Why do I get @errname@ here?\n@code@",
    "I need a script that will @task@. Use @lang@.",
    "Make this code async and handle errors:\n@code@",
    "rewrite in @lang2@ please:\n@code@",
    "Give me a regex that matches @regex_target@.",
    "Write a SQL query that returns @sql_target@.",
    "This test fails intermittently, can you see why?\n@code@\n@trace@",
    "Could you explain line by line what this @lang@ does?\n@code@",
    "Help me @task@ in @lang@, my attempt is below.\n@code@",
    "Complete this function:\n@code@",
    "Is there a memory leak in this code?\n@code@",
    "How can I @task@ efficiently? I'm using @lang@.",
    "My @lang@ code keeps failing:\n@code@\nWhat am I missing?",
    "What's the idiomatic way to @task@ in @lang@?",
    "Port this to @lang2@, keep the same behaviour:\n@code@",
)

STRUCTURED_TEMPLATES: tuple[str, ...] = (
    "List @n@ @things@ as a JSON array.",
    "Respond in JSON with the keys @keys@. @question@",
    "@question@ Answer in @fmt@ format.",
    "Give me a @fmt@ file describing @noun_phrase@.",
    "Extract the @fields@ from this text and return them as JSON:\n@paragraph@",
    "Output a CSV with columns @cols@ for @n@ @things@.",
    "Return an XML document that describes @noun_phrase@.",
    "Create a YAML config for @service@ with @setting@.",
    "Convert the following into JSON:\n@paragraph@",
    "Produce a JSON object with the fields @keys@ for @noun_phrase@.",
    "Reply only with valid JSON. @question@",
    "Generate @n@ fake @things@ records in @fmt@.",
    'Rate the sentiment of this review as JSON {"sentiment": ..., "score": ...}:\n@review@',
    "I need the answer as @fmt@: @question@",
    "Classify the sentiment of '@review@'. Output JSON only.",
    "Turn this list into a CSV table with a header row: @items@",
    "Please format the @things@ as a YAML list.",
    '@question@ Use this schema: {"answer": string, "confidence": number}',
    "Give the result as a JSON object, no prose. @question@",
    "Make a table of @n@ @things@ in CSV format.",
    "Write the details of @noun_phrase@ as JSON lines, one record per line.",
    "Return a @fmt@ representation of @noun_phrase@.",
    'Fill in this JSON template for @person@: {"name": "", "born": 0, "known_for": ""}',
    "Parse this address into JSON fields street, city and zip: @address@",
    "@question@\nFormat your reply as a JSON object with keys @keys@.",
    "Build a @fmt@ document listing @n@ @things@ with @fields@.",
    "Dump @noun_phrase@ as structured @fmt@ I can load in my program.",
    "Can you put @n@ @things@ into a json list? fields: @keys@",
    "Structure this as YAML:\n@paragraph@",
    "Answer with a single JSON object and nothing else: @question@",
    "export the @things@ to csv, columns @cols@",
    "Provide the output in XML with a root element <@xml_root@>. @question@",
    "@question@ (json please)",
    "I want @n@ @things@, formatted as a YAML document.",
    "Send back a JSON payload with @keys@ for @noun_phrase@.",
    "Map each of these to a category and emit CSV: @items@",
)

CHAT_TEMPLATES: tuple[str, ...] = (
    "What is @concept@?",
    "Can you explain @concept@ in simple terms?",
    "Tell me a story about @noun_phrase@.",
    "Write a poem about @noun_phrase@.",
    "How do I @life_task@?",
    "What are some tips for @activity@?",
    "Summarize this paragraph:\n@paragraph@",
    "Translate '@sentence@' into @human_lang@.",
    "Who was @person@?",
    "What's the best way to @life_task@?",
    "Give me ideas for @occasion@.",
    "Compare @concept@ and @concept2@.",
    "Write an email to my @relation@ about @event@.",
    "I'm feeling @emotion@ today. Any advice?",
    "Plan a @n@-day trip to @place@.",
    "Recommend some books about @concept@.",
    "@tricky@",
    "Draft a cover letter for a @job@ position.",
    "Help me write a toast for @occasion@.",
    "@question@",
    "hey, quick question: @question_lc@",
    "Rewrite this to sound more polite:\n@sentence@",
    "What should I know before visiting @place@?",
    "@tricky@ Thanks!",
    "Explain @concept@ like I'm five.",
    "Is it true that @claim@?",
    "My @relation@ says @claim@. Is that right?",
    "What do you think about @concept@?",
    "Write a short speech about @concept@ for @occasion@.",
    "@paragraph@\n\nWhat do you make of this?",
    "Give me a pep talk, I'm @emotion@ about @event@.",
    "Continue the story: @sentence@",
    "What's the difference between @concept@ and @concept2@?",
    "How are @concept@ and @concept2@ related?",
    "Why is @fmt@ so widely used?",
    "When should I use @fmt@ instead of @fmt2@? Just explain.",
    "Who came up with @fmt@, and when?",
    "Is @fmt@ hard to learn for a beginner?",
    "Pros and cons of @activity@?",
    "Describe @place@ and its food.",
    "List some fun facts about @concept@.",
    "Give me an outline for an essay on @concept@.",
    "What is the capital and population of @place@?",
    "My @relation@ and I argued about @concept@ and @concept2@. Who is right?",
    "What's the difference between @fmt@ and @fmt2@?",
    "Compare @fmt@ and @fmt2@ for config files, in a few sentences.",
    "Explain @fmt@ to me like I'm new to computers.",
    "Why do some developers prefer @fmt@ over @fmt2@?",
    "Is @fmt@ a programming language?",
    "What does @fmt@ stand for?",
    "Describe @noun_phrase@ in three sentences.",
    "What can I cook with @things@?",
)

V: dict[str, tuple[str, ...]] = {
    "lang": ("Python", "JavaScript", "TypeScript", "Java", "C", "C++", "Go", "Rust", "SQL",
             "bash", "shell", "HTML", "CSS", "C#", "PHP", "Ruby", "Kotlin", "Swift", "python",
             "js", "golang", "node"),
    "task": ("reverse a linked list", "parse a CSV file and sum a column", "debounce a function",
             "compute the nth Fibonacci number", "merge two sorted arrays", "read a file line by line",
             "validate an email address", "retry an HTTP request with backoff", "sort a dict by value",
             "find duplicates in a list", "check if a string is a palindrome", "flatten a nested list",
             "implement binary search", "serialize an object to disk", "connect to a Postgres database",
             "upload a file to S3", "compute a moving average", "parse command line arguments",
             "build a REST endpoint for users", "implement an LRU cache", "count word frequencies",
             "spawn worker threads", "detect a cycle in a graph", "convert a timestamp to UTC",
             "rate limit API calls", "paginate query results", "hash a password securely",
             "walk a directory tree", "implement quicksort", "deep copy an object",
             "throttle scroll events", "run a shell command and capture output", "zip two lists",
             "remove whitespace from a string", "draw a bar chart", "implement a trie",
             "load environment variables", "generate a random password", "transpose a matrix"),
    "errname": ("a NullPointerException", "a segfault", "KeyError", "IndexError: list index out of range",
                "TypeError: undefined is not a function", "a borrow checker error", "a stack overflow",
                "ConcurrentModificationException", "panic: nil map", "an off-by-one error"),
    "regex_target": ("US phone numbers", "IPv4 addresses", "dates like 2024-01-31", "hex colors",
                     "email addresses", "URLs starting with https", "words in all caps"),
    "sql_target": ("the top 5 customers by revenue", "users who signed up last month",
                   "duplicate emails in the users table", "the average order value per country",
                   "employees earning more than their manager"),
    "noun": ("user", "invoice", "shopping cart", "bank account", "todo item", "library book",
             "parking lot", "chess board", "playlist", "sensor reading", "order", "ticket"),
    "things": ("countries with their capitals", "books with title and author", "employees",
               "planets and their moons", "recipes", "movies from the 90s", "cities and populations",
               "products with prices", "students and grades", "programming languages",
               "dog breeds", "chemical elements", "customers", "airports", "songs", "events"),
    "keys": ('"name", "age" and "city"', "title, author, year", '"summary" and "tags"',
             "id, label, score", '"question", "answer"', "name and description", "sentiment, confidence"),
    "fields": ("names and dates", "people, places and organisations", "price and quantity",
               "title, author and year", "email addresses and phone numbers", "key facts"),
    "cols": ("name,age,email", "date, amount, category", "id | title | price",
             "country, capital, population", "sku,qty,price"),
    "fmt": ("JSON", "JSON", "JSON", "json", "YAML", "CSV", "XML", "yaml", "csv"),
    "service": ("nginx", "a Postgres database", "a Kubernetes deployment", "GitHub Actions",
                "docker compose with redis", "a Prometheus scrape job", "my home server"),
    "setting": ("two replicas and a health check", "TLS enabled", "a 30 second timeout",
                "three environments", "logging at debug level"),
    "xml_root": ("items", "catalog", "response", "people"),
    "concept": ("photosynthesis", "inflation", "the French revolution", "black holes", "stoicism",
                "compound interest", "climate change", "the immune system", "impressionism",
                "supply and demand", "quantum entanglement", "the Roman empire", "jazz", "meditation",
                "plate tectonics", "democracy", "the water cycle", "game theory", "evolution",
                "the stock market", "sleep hygiene", "the Renaissance", "minimalism", "gravity",
                "cloud computing", "machine learning", "the internet", "open source software"),
    "noun_phrase": ("a lonely lighthouse keeper", "the ocean at night", "my grandmother's garden",
                    "a robot learning to paint", "autumn in Kyoto", "a lost cat", "the first snow",
                    "a dragon who is afraid of fire", "the city of Paris", "a small bakery",
                    "the solar system", "a football team", "the Eiffel Tower", "a vintage car"),
    "life_task": ("get better sleep", "learn to cook rice", "ask for a raise", "train for a marathon",
                  "make friends in a new city", "save money on groceries", "fix a squeaky door",
                  "grow tomatoes on a balcony", "prepare for a job interview", "stop procrastinating",
                  "clean a cast iron pan", "improve my handwriting", "negotiate rent"),
    "activity": ("public speaking", "traveling with kids", "learning piano", "running in winter",
                 "studying for exams", "hosting a dinner party", "working from home", "birdwatching"),
    "sentence": ("The weather is lovely today", "I would like a table for two",
                 "Where is the train station?", "Thank you for your help", "we need to talk",
                 "The meeting has been moved to Friday", "She opened the old letter slowly"),
    "human_lang": ("French", "Spanish", "German", "Japanese", "Italian", "Portuguese", "Korean"),
    "person": ("Ada Lovelace", "Napoleon", "Marie Curie", "Genghis Khan", "Frida Kahlo",
               "Alan Turing", "Cleopatra", "Nelson Mandela", "Leonardo da Vinci", "Grace Hopper"),
    "occasion": ("a birthday party", "a wedding", "a team offsite", "a rainy weekend",
                 "my sister's graduation", "a retirement party", "Halloween"),
    "relation": ("landlord", "boss", "teacher", "neighbour", "coworker", "brother", "doctor"),
    "event": ("the broken heater", "my vacation days", "the group project", "a missed deadline",
              "the noise at night", "my new job", "the wedding"),
    "emotion": ("anxious", "tired", "excited", "overwhelmed", "sad", "nervous", "unmotivated"),
    "place": ("Lisbon", "Japan", "the Scottish highlands", "New York", "Java island", "Iceland",
              "Morocco", "Peru", "Bali", "Vienna"),
    "job": ("nurse", "marketing manager", "teacher", "barista", "product designer", "accountant"),
    "claim": ("we only use 10% of our brains", "goldfish have a 3 second memory",
              "coffee stunts your growth", "lightning never strikes twice",
              "the Great Wall is visible from space"),
}

TRICKY_CHAT: tuple[str, ...] = (
    "I'm planning a trip to Java island, which volcanoes can I hike?",
    "My ball python snake hasn't eaten in two weeks, should I worry?",
    "What is JSON and why is it so popular?",
    "Explain the difference between JSON and YAML in plain words.",
    "My friend Jason, we call him JSON, turns 30 soon. Gift ideas?",
    "How much Java coffee is too much per day?",
    "What is the return policy for shoes bought online?",
    "How do import taxes work when I buy a car abroad?",
    "The class schedule at my gym changed, how should I adapt my routine?",
    "How do I remove rust from my bike chain?",
    "Ruby or sapphire for an engagement ring?",
    "What's a good shell to collect on the beach for a kid?",
    "What is the function of the liver?",
    "Who invented the Python programming language and why the name?",
    "Is learning Rust or Go better for my career? Just your opinion, no code.",
    "Tell me about Monty Python's most famous sketches.",
    "Why do people say XML is verbose compared to JSON?",
    "What does a database administrator do all day?",
    "How do I print photos at home without streaks?",
    "Explain what an API is to my grandmother.",
    "Should I study computer science or mathematics?",
    "Is YAML or TOML nicer for config files? I just want your opinion.",
    "Can you recommend a good CSV of... I mean a good CV template tip?",
    "What's the history of the C programming language?",
    "My cobra plant looks sad, how do I save it?",
    "How do I go about asking for a promotion?",
    "Write a haiku about a snake named Python.",
    "What's the difference between a swift and a swallow (the birds)?",
    "How do I format a wedding invitation politely?",
    "What's a good structure for a persuasive essay?",
    "My boss wants a report in a table, how do I tell him it's late?",
    "Describe the Kotlin island near St. Petersburg.",
)
V["lang2"] = V["lang"]
V["concept2"] = V["concept"]
V["fmt2"] = V["fmt"]
V["question"] = tuple(
    f"What is {c}?" for c in V["concept"][:10]
) + ("Why is the sky blue?", "How far is the moon?", "What causes earthquakes?",
     "Why do cats purr?", "How do vaccines work?", "What is the tallest mountain?",
     "Who painted the Mona Lisa?", "What are the benefits of walking daily?")  # fmt: skip

_SENTENCES = (
    "John Smith, 42, moved from Boston to Denver in March 2021.",
    "The quarterly revenue grew by 12 percent while costs stayed flat.",
    "Acme Corp announced a new office in Berlin led by Maria Lopez.",
    "The river flooded twice last spring, damaging forty homes.",
    "Our team meets every Tuesday at 10am to review the roadmap.",
    "Tickets cost 25 euros and go on sale on June 3rd.",
    "The museum reopens after a two-year renovation of its east wing.",
    "Dr. Chen published a study on sleep and memory in teenagers.",
    "Heavy rain is expected over the weekend across the northern region.",
    "The bakery on Elm Street sells out of croissants by 9am.",
)

Slot = Callable[[random.Random], str]


class _Slots(dict):
    """Fills `@slot@` placeholders; a slot keeps one value within one example."""

    def __init__(self, rng: random.Random, split: Split) -> None:
        super().__init__()
        self.rng, self.split = rng, split

    def __missing__(self, key: str) -> str:
        value = _DYNAMIC[key](self) if key in _DYNAMIC else self.rng.choice(V[key])
        self[key] = value
        return value


def _fill(template: str, slots: _Slots) -> str:
    return _SLOT_RE.sub(lambda m: slots[m.group(1)], template)


_WORDS = ("user", "order", "item", "value", "record", "node", "config", "price", "token", "cache")
_VERBS = ("get", "load", "parse", "compute", "update", "find", "build", "merge", "check", "send")


def _ident(s: _Slots, style: str) -> str:
    verb, noun = s.rng.choice(_VERBS), s.rng.choice(_WORDS)
    if style == "snake":
        return f"{verb}_{noun}"
    if style == "camel":
        return verb + noun.capitalize()
    return verb.capitalize() + noun.capitalize()


def _snippet(s: _Slots) -> str:
    """A code snippet for this split, in the language slot `lang` (or a random one)."""
    rng = s.rng
    if rng.random() < 0.25:
        body = _stdlib_source(rng, s.split)
        tag = "python"
    else:
        tag = rng.choice(sorted(SNIPPETS))
        shapes = SNIPPETS[tag]
        pool = shapes[-1:] if s.split == "test" else shapes[:-1]
        body = _fill(rng.choice(pool), s)
    roll = rng.random()
    if roll < 0.35:
        return f"```{tag}\n{body}\n```"
    if roll < 0.45:
        return f"```\n{body}\n```"
    return body


_STDLIB_CACHE: dict[Split, list[str]] = {}


def _stdlib_source(rng: random.Random, split: Split) -> str:
    """The first lines of a stdlib function's source (modules split between train/test)."""
    if split not in _STDLIB_CACHE:
        mods = [m for i, m in enumerate(STDLIB_MODULES) if (i % 4 == 3) == (split == "test")]
        sources = []
        for name in mods:
            module = importlib.import_module(name)
            for _, obj in sorted(vars(module).items()):
                if inspect.isfunction(obj) and obj.__module__ == module.__name__:
                    try:
                        sources.append(inspect.getsource(obj))
                    except (OSError, TypeError):
                        continue
        _STDLIB_CACHE[split] = sources
    lines = rng.choice(_STDLIB_CACHE[split]).splitlines()
    return "\n".join(lines[: rng.randint(4, 25)])


def _paragraph(s: _Slots) -> str:
    return " ".join(s.rng.sample(_SENTENCES, s.rng.randint(2, 4)))


_DYNAMIC: dict[str, Callable[[_Slots], str]] = {
    "code": _snippet,
    "tricky": lambda s: s.rng.choice(_split_pool(TRICKY_CHAT, s.split)),
    "trace": lambda s: _fill(s.rng.choice(_split_pool(TRACES, s.split)), s),
    "paragraph": _paragraph,
    "review": lambda s: s.rng.choice(("The food was cold and the waiter rude.",
                                      "Absolutely loved it, would come back!",
                                      "It was fine, nothing special.",
                                      "Battery died after two days. Disappointed.")),
    "items": lambda s: ", ".join(s.rng.sample(V["person"], 4)),
    "address": lambda s: f"{s.rng.randint(1, 999)} Main St, Springfield, IL {s.rng.randint(10000, 99999)}",
    "question_lc": lambda s: s.rng.choice(V["question"]).lower(),
    "n": lambda s: str(s.rng.randint(2, 20)),
    "n2": lambda s: str(s.rng.randint(21, 300)),
    "fn": lambda s: _ident(s, "snake"),
    "fnc": lambda s: _ident(s, "camel"),
    "Fnc": lambda s: _ident(s, "pascal"),
    "Type": lambda s: s.rng.choice(_WORDS).capitalize() + s.rng.choice(("", "Item", "Model", "Info")),
    "arg": lambda s: s.rng.choice(_WORDS) + "s",
    "arg2": lambda s: s.rng.choice(("default", "skip", "limit", "key")),
    "argc": lambda s: s.rng.choice(_WORDS) + s.rng.choice(("List", "Id", "Name", "")),
    "ARGU": lambda s: s.rng.choice(("1", "DIR", "TARGET", "SRC")),
    "doc": lambda s: s.rng.choice(("Return the scaled items.", "Filter and scale.", "Helper.")),
    "Title": lambda s: s.rng.choice(("Welcome", "Our Products", "Contact us", "Dashboard")),
    "hex": lambda s: f"{s.rng.randint(0, 0xFFFFFF):06x}",
    "path": lambda s: s.rng.choice(('"data.csv"', '"/tmp/out.txt"', "sys.argv[1]", "path")),
}


def _split_pool(items: tuple[str, ...], split: Split) -> list[str]:
    return [t for i, t in enumerate(items) if (i % 4 == 3) == (split == "test")]


_PREFIXES = ("", "", "", "", "Hi! ", "Please: ", "hello, ", "Quick one. ", "Hey there, ")
_SUFFIXES = ("", "", "", "", " Thanks!", " thx", "\n\nThank you in advance.", " :)")


def _vary(text: str, rng: random.Random) -> str:
    """Surface noise so the model keys on content, not on one exact phrasing."""
    text = rng.choice(_PREFIXES) + text + rng.choice(_SUFFIXES)
    return text.lower() if rng.random() < 0.12 else text


TEMPLATES: dict[Task, tuple[str, ...]] = {
    "code": CODE_TEMPLATES,
    "structured": STRUCTURED_TEMPLATES,
    "chat": CHAT_TEMPLATES,
}


def build_dataset(split: Split, per_class: int = 2000, seed: int | None = None) -> list[Example]:
    """`per_class` examples of each task for `split`, deterministic for a given seed."""
    rng = random.Random(SEEDS[split] if seed is None else seed)
    pools = {task: list(enumerate(t)) for task, t in TEMPLATES.items()}
    pools = {
        task: [(i, t) for i, t in items if (i % 4 == 3) == (split == "test")]
        for task, items in pools.items()
    }
    out: list[Example] = []
    for task, items in pools.items():
        for _ in range(per_class):
            index, template = rng.choice(items)
            text = _vary(_fill(template, _Slots(rng, split)), rng)
            out.append(Example(text, task, f"{task}/{index}"))
    rng.shuffle(out)
    return out
