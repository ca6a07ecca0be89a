"""Code snippet and error-trace templates in many languages, for the labelled set.

Pure data. Placeholders are `@slot@` (not `{}` or `$`, which the code itself uses);
`training.data` fills them. Within each language the last template is held out for
the test split, so the test set contains code shapes the model never saw.
"""

from __future__ import annotations

SNIPPETS: dict[str, tuple[str, ...]] = {
    "python": (
        'def @fn@(@arg@, @arg2@=None):\n    """@doc@"""\n    result = []\n    for item in @arg@:\n'
        "        if item is not None and item != @arg2@:\n            result.append(item * @n@)\n"
        "    return result",
        "class @Type@:\n    def __init__(self, @arg@):\n        self.@arg@ = @arg@\n"
        "        self._cache = {}\n\n    def @fn@(self, key):\n        if key not in self._cache:\n"
        "            self._cache[key] = len(self.@arg@) + @n@\n        return self._cache[key]",
        "import os\n\nwith open(@path@) as fh:\n    for line_no, line in enumerate(fh, 1):\n"
        '        parts = line.strip().split(",")\n        if len(parts) > @n@:\n'
        "            print(line_no, parts[0])",
    ),
    "javascript": (
        "function @fnc@(@argc@) {\n  const out = [];\n  for (let i = 0; i < @argc@.length; i++) {\n"
        "    if (@argc@[i] > @n@) out.push(@argc@[i]);\n  }\n  return out;\n}",
        "const @fnc@ = async (@argc@) => {\n  const res = await fetch(`/api/@noun@/${@argc@}`);\n"
        '  if (!res.ok) throw new Error("request failed");\n  return res.json();\n};',
        'document.querySelector("#@noun@").addEventListener("click", (e) => {\n'
        "  e.preventDefault();\n  let count = parseInt(e.target.dataset.count, 10) || 0;\n"
        "  e.target.textContent = `Clicked ${++count} times`;\n});",
    ),
    "typescript": (
        "interface @Type@ {\n  id: number;\n  @argc@: string;\n  tags?: string[];\n}\n\n"
        "export function @fnc@(items: @Type@[]): Map<number, @Type@> {\n"
        "  return new Map(items.map((x) => [x.id, x]));\n}",
        "export class @Type@Service {\n  constructor(private readonly http: HttpClient) {}\n\n"
        "  @fnc@(id: number): Observable<@Type@> {\n"
        "    return this.http.get<@Type@>(`/api/@noun@/${id}`);\n  }\n}",
        "type Result<T> = { ok: true; value: T } | { ok: false; error: string };\n\n"
        "function @fnc@(input: string): Result<number> {\n  const n = Number(input);\n"
        '  return Number.isNaN(n) ? { ok: false, error: "bad number" } : { ok: true, value: n * @n@ };\n}',
    ),
    "java": (
        "public class @Type@ {\n    private final List<String> @argc@ = new ArrayList<>();\n\n"
        "    public void @fnc@(String value) {\n        if (value == null) {\n"
        '            throw new IllegalArgumentException("value");\n        }\n'
        "        @argc@.add(value);\n    }\n}",
        "public static int @fnc@(int[] values) {\n    int total = 0;\n    for (int v : values) {\n"
        "        if (v % @n@ == 0) total += v;\n    }\n    return total;\n}",
        "@Override\npublic boolean equals(Object o) {\n    if (this == o) return true;\n"
        "    if (!(o instanceof @Type@)) return false;\n    @Type@ other = (@Type@) o;\n"
        "    return Objects.equals(@argc@, other.@argc@);\n}",
    ),
    "c": (
        "#include <stdio.h>\n#include <stdlib.h>\n\nint @fn@(const int *arr, size_t len) {\n"
        "    int sum = 0;\n    for (size_t i = 0; i < len; i++) {\n        sum += arr[i] * @n@;\n"
        "    }\n    return sum;\n}",
        "struct @fn@_node {\n    int value;\n    struct @fn@_node *next;\n};\n\n"
        "void @fn@_free(struct @fn@_node *head) {\n    while (head) {\n"
        "        struct @fn@_node *tmp = head->next;\n        free(head);\n        head = tmp;\n    }\n}",
        'char *buf = malloc(@n@ * sizeof(char));\nif (buf == NULL) {\n    perror("malloc");\n'
        '    return -1;\n}\nsnprintf(buf, @n@, "%s-%d", name, id);',
    ),
    "cpp": (
        "#include <vector>\n#include <algorithm>\n\nstd::vector<int> @fn@(std::vector<int> v) {\n"
        "    std::sort(v.begin(), v.end());\n    v.erase(std::unique(v.begin(), v.end()), v.end());\n"
        "    return v;\n}",
        "template <typename T>\nclass @Type@ {\npublic:\n"
        "    explicit @Type@(T value) : value_(std::move(value)) {}\n"
        "    const T& get() const { return value_; }\nprivate:\n    T value_;\n};",
        "for (auto& [key, value] : @arg@) {\n"
        '    std::cout << key << ": " << value << std::endl;\n}',
    ),
    "go": (
        "func @fnc@(items []string) (map[string]int, error) {\n\tcounts := make(map[string]int)\n"
        '\tfor _, it := range items {\n\t\tif it == "" {\n\t\t\treturn nil, fmt.Errorf("empty item")\n'
        "\t\t}\n\t\tcounts[it]++\n\t}\n\treturn counts, nil\n}",
        'type @Type@ struct {\n\tID   int    `json:"id"`\n\tName string `json:"name"`\n}\n\n'
        'func (t *@Type@) @Fnc@() string {\n\treturn fmt.Sprintf("%d:%s", t.ID, t.Name)\n}',
        "ch := make(chan int, @n@)\nvar wg sync.WaitGroup\nfor i := 0; i < @n@; i++ {\n"
        "\twg.Add(1)\n\tgo func(i int) { defer wg.Done(); ch <- i * i }(i)\n}\nwg.Wait()",
    ),
    "rust": (
        "fn @fn@(values: &[i32]) -> Option<i32> {\n    let mut best = None;\n"
        "    for &v in values.iter() {\n        if best.map_or(true, |b| v > b) {\n"
        "            best = Some(v);\n        }\n    }\n    best\n}",
        "#[derive(Debug, Clone)]\npub struct @Type@ {\n    pub name: String,\n    pub count: usize,\n}\n\n"
        "impl @Type@ {\n    pub fn new(name: &str) -> Self {\n"
        "        Self { name: name.to_string(), count: 0 }\n    }\n}",
        "let text = std::fs::read_to_string(&path)?;\n"
        'let words: Vec<&str> = text.split_whitespace().collect();\nprintln!("{} words", words.len());',
    ),
    "sql": (
        "SELECT c.name, COUNT(o.id) AS orders\nFROM customers c\n"
        "LEFT JOIN orders o ON o.customer_id = c.id\nWHERE o.created_at >= '2023-01-01'\n"
        "GROUP BY c.name\nORDER BY orders DESC\nLIMIT @n@;",
        "CREATE TABLE @arg@ (\n    id SERIAL PRIMARY KEY,\n    name VARCHAR(255) NOT NULL,\n"
        "    created_at TIMESTAMP DEFAULT NOW()\n);",
        "UPDATE @arg@ SET status = 'archived' WHERE last_seen < NOW() - INTERVAL '@n@ days';",
    ),
    "bash": (
        '#!/bin/bash\nset -euo pipefail\nfor f in *.log; do\n  if grep -q "ERROR" "$f"; then\n'
        '    echo "$f has errors"\n  fi\ndone',
        'if [ -z "$@ARGU@" ]; then\n  echo "usage: $0 <dir>" >&2\n  exit 1\nfi\n'
        "find \"$@ARGU@\" -name '*.tmp' -mtime +@n@ -delete",
        "tar -czf backup_$(date +%F).tar.gz /var/www && scp backup_*.tar.gz user@host:/backups/",
    ),
    "html": (
        '<div class="@noun@-card">\n  <h2>@Title@</h2>\n  <p>Some text</p>\n'
        '  <button onclick="toggle()">Show more</button>\n</div>',
        '<form action="/@noun@" method="post">\n  <label for="email">Email</label>\n'
        '  <input type="email" id="email" name="email" required>\n'
        '  <input type="submit" value="Send">\n</form>',
        '<!DOCTYPE html>\n<html lang="en">\n<head><meta charset="utf-8"><title>@Title@</title></head>\n'
        '<body><ul id="list"></ul><script src="app.js"></script></body>\n</html>',
    ),
    "css": (
        ".@noun@-card {\n  display: flex;\n  padding: @n@px;\n  border-radius: 4px;\n"
        "  box-shadow: 0 1px 3px rgba(0, 0, 0, 0.2);\n}",
        "@media (max-width: 600px) {\n  nav ul { flex-direction: column; }\n"
        "  .@noun@ { font-size: 0.9rem; }\n}",
        "#header > a:hover {\n  color: #@hex@;\n  text-decoration: underline;\n}",
    ),
    "csharp": (
        "public async Task<IActionResult> @Fnc@(int id)\n{\n"
        "    var item = await _context.@Type@s.FindAsync(id);\n"
        "    if (item == null) return NotFound();\n    return Ok(item);\n}",
        "var names = people.Where(p => p.Age > @n@).Select(p => p.Name).ToList();\n"
        "foreach (var n in names)\n{\n    Console.WriteLine(n);\n}",
        "public record @Type@(string Name, int Count);",
    ),
    "php": (
        "<?php\nfunction @fn@($items) {\n    $out = [];\n    foreach ($items as $key => $value) {\n"
        "        if ($value > @n@) { $out[$key] = $value; }\n    }\n    return $out;\n}",
        '$stmt = $pdo->prepare("SELECT * FROM users WHERE email = ?");\n'
        "$stmt->execute([$email]);\n$user = $stmt->fetch();",
        "echo json_encode(['status' => 'ok', 'count' => count($rows)]);",
    ),
    "ruby": (
        "def @fn@(items)\n  items.select { |x| x > @n@ }.map { |x| x * 2 }\nend",
        "class @Type@ < ApplicationRecord\n  has_many :@arg@s\n  validates :name, presence: true\nend",
        'File.readlines("data.txt").each_with_index do |line, i|\n  puts "#{i}: #{line}"\nend',
    ),
}

TRACES: tuple[str, ...] = (
    'Traceback (most recent call last):\n  File "@path@", line @n@, in <module>\n    @fn@(data)\n'
    '  File "@path@", line @n2@, in @fn@\n    return data["@arg@"]\nKeyError: \'@arg@\'',
    'Exception in thread "main" java.lang.NullPointerException: Cannot invoke "String.length()"'
    ' because "@argc@" is null\n    at com.example.@Type@.@fnc@(@Type@.java:@n@)\n'
    "    at com.example.Main.main(Main.java:@n2@)",
    "TypeError: Cannot read properties of undefined (reading '@argc@')\n"
    "    at @fnc@ (app.js:@n@:15)\n"
    "    at processTicksAndRejections (node:internal/process/task_queues:95:5)",
    "error[E0382]: borrow of moved value: `@arg@`\n --> src/main.rs:@n@:20\n  |\n"
    "@n@ |     let b = @arg@;\n  |             - value moved here",
    "Segmentation fault (core dumped)\n(gdb) bt\n#0  0x0000555555555189 in @fn@ (arr=0x0) at main.c:@n@\n"
    "#1  0x00005555555551c4 in main () at main.c:@n2@",
    "panic: runtime error: index out of range [@n@] with length @n2@\n\ngoroutine 1 [running]:\n"
    "main.@fnc@(...)\n\t/home/user/main.go:@n@ +0x1d",
)

# Python stdlib modules whose function sources become pasted-code examples.
STDLIB_MODULES: tuple[str, ...] = (
    "textwrap", "heapq", "bisect", "statistics", "fractions", "shlex", "glob", "fnmatch",
    "colorsys", "calendar", "difflib", "string", "json.encoder", "json.decoder", "csv",
    "base64", "ipaddress", "uuid", "dataclasses", "functools", "posixpath", "random",
    "tokenize", "html", "urllib.parse", "email.utils", "pprint", "graphlib", "secrets",
    "gzip", "configparser", "copy",
)  # fmt: skip
