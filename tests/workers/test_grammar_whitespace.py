"""The grammars the worker builds leave no free whitespace (issue 24: a small model left
free to pad inside JSON pads until its budget): JSON schemas and tool calls use fixed
separators, as llguidance's `whitespace_flexible: false` (xgrammar's `any_whitespace=False`)
gives; only the separators' own single space is allowed."""

from __future__ import annotations

import json
from pathlib import Path

import llguidance
import pytest
from tokenizers import Tokenizer

from workers.embedded import tools
from workers.embedded.api import Constraint
from workers.embedded.grammar import GrammarCompiler
from workers.models import BUNDLED_MODEL_DIR

TOKENIZER = Path(BUNDLED_MODEL_DIR) / "tokenizer.json"
WHITESPACE = (" ", "\n", "  ", "\t", "\n\n")
PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}},
              "required": ["city"]}


@pytest.fixture(scope="module")
def compiler() -> tuple[GrammarCompiler, Tokenizer]:
    tokenizer = Tokenizer.from_file(str(TOKENIZER))
    return GrammarCompiler(TOKENIZER, (0,), tokenizer.get_vocab_size()), tokenizer


def free_whitespace(compiler: GrammarCompiler, tokenizer: Tokenizer, constraint: Constraint,
                    prefix: str) -> list[str]:
    matcher = llguidance.LLMatcher(compiler.tokenizer, compiler.compile(constraint),
                                   log_level=0)
    for token in tokenizer.encode(prefix).ids:
        assert matcher.consume_token(token), prefix
    return [ws for ws in WHITESPACE
            if matcher.validate_tokens(tokenizer.encode(ws).ids) > 0]


@pytest.mark.parametrize("prefix", ['<tool_call>', '<tool_call>{',
                                    '<tool_call>{"name": "get_weather"',
                                    '<tool_call>{"name": "get_weather", "arguments": {}',
                                    '<tool_call>{"name": "get_weather", "arguments": '
                                    '{"city": "Paris"}}'])
def test_tool_call_grammar_has_no_free_whitespace(compiler: tuple, prefix: str) -> None:
    request = tools.ToolRequest(tools=(tools.Tool("get_weather", "w", PARAMETERS),),
                                mode="forced")
    constraint = tools.constraint(request)
    assert constraint is not None
    if prefix.endswith('"arguments": {}'):
        prefix = prefix[:-1]  # inside the arguments object
    assert free_whitespace(*compiler, constraint, prefix) == []


@pytest.mark.parametrize("prefix", ["", "{", '{"city": "Paris"', '{"city": "Paris"}'])
def test_json_schema_grammar_has_no_free_whitespace(compiler: tuple, prefix: str) -> None:
    constraint = Constraint("json_schema", json.dumps(PARAMETERS))
    assert free_whitespace(*compiler, constraint, prefix) == []
