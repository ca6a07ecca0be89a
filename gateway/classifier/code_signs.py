"""`code` means code: whether a message shows any sign of code at all.

The text model leans to `code` on prose with quotes, line breaks or "how to" in it (on
public prompts: translations of short sentences, questions about grammar); a message with
no code-only layout mark and no word only programming uses is not code, whatever the
model says (docs/CLASSIFIER.md, "Public prompts nobody here wrote").
"""

from __future__ import annotations

from gateway.classifier.scorer import marks, window, words

CODE_MARKS = frozenset({"<indent>", "<semi_eol>", "<brace_eol>", "<assign>", "<call>",
                         "<arrow>", "<compare>", "<scope>", "<tag>", "<brace>", "<backtick>",
                         "<underscore>"})
CODE_WORDS = frozenset({
    "code", "coding", "function", "functions", "program", "programming", "script", "scripts",
    "algorithm", "compile", "compiler", "variable", "variables", "array", "arrays", "loop",
    "loops", "recursion", "recursive", "regex", "debug", "bug", "syntax", "api", "sql",
    "query", "database", "python", "javascript", "typescript", "java", "c++", "rust",
    "golang", "html", "css", "json", "xml", "yaml", "latex", "bash", "shell", "linux", "git",
    "docker", "kubernetes", "react", "node", "npm", "pip", "class", "method", "methods",
    "struct", "pointer", "integer", "boolean", "string", "strings", "library", "module",
    "import", "implement", "implementation", "snippet", "terminal", "command", "excel",
    "formula", "spreadsheet", "test", "tests", "unittest", "makefile", "dockerfile",
    "workflow", "systemd", "cmake", "cmakelists", "config", "cron", "crontab", "nginx",
    "webpack", "eslint", "endpoint", "backend", "frontend", "server", "repo", "repository",
    "commit", "deploy", "deployment", "pipeline", "build", "framework", "package", "sdk"})


def code_signs(user: str) -> bool:
    """Any sign of code in the model's window of the message: a code-only layout mark
    (`gateway.classifier.scorer.marks`: indentation, `;`/`{` at a line's end, ` = `,
    `()`, `=>`, `==`, `::`, tags, braces, backticks, `_`) or a word only programming
    uses. Prose punctuation (quotes, colons, parentheses, `?`) is not one."""
    text = window(user)
    if not CODE_MARKS.isdisjoint(marks(text)):
        return True
    return not CODE_WORDS.isdisjoint(words(text))
