#!/usr/bin/env python3
"""code_size_check.py ROOT: passes when no source file under src/ and kernels/ has more than 600
lines and no function more than 80 (data tables excepted, listed below by file and first line).

A function is a brace opened outside any other function whose preceding text ends with a
parameter list (and qualifiers), not a control statement's; its length runs from the first line
of its signature to its closing brace, comments included. Comments and string literals are blanked
before the braces are counted."""
import os
import re
import sys

MAX_FILE, MAX_FUNCTION = 600, 80
# data tables: a table may be long, a function of logic may not
TABLES = {("src/config/deck_keys.cpp", "std::vector<DeckKey> make_table()")}

CONTROL = re.compile(r"\b(if|for|while|switch|catch)\s*\([^;{}]*\)\s*$")
LAMBDA = re.compile(r"=\s*\[[^\]]*\]\s*\([^)]*\)[^{;]*$")
SIGNATURE_END = re.compile(r"\)\s*(const|override|noexcept|final|->[^{;]*|\s)*$")


def blank(text):
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r'"(\\.|[^"\\\n])*"', '""', text)
    return re.sub(r"'(\\.|[^'\\\n])*'", "''", text)


def functions(text):
    """(first line, last line, signature) of each function."""
    stack, line, out = [], 1, []
    for i, ch in enumerate(text):
        if ch == "\n":
            line += 1
        elif ch == "{":
            before = text[max(0, i - 400):i]
            in_function = any(kind == "fn" for kind, _, _ in stack)
            if (not in_function and SIGNATURE_END.search(before) and not CONTROL.search(before)
                    and not LAMBDA.search(before)):
                cut = max(before.rfind(";"), before.rfind("}"), before.rfind("{"))
                sig = before[cut + 1:]
                first = line - sig.count("\n") + (1 if sig.startswith("\n") else 0)
                stack.append(("fn", first, " ".join(sig.split())))
            else:
                stack.append(("block", line, ""))
        elif ch == "}" and stack:
            kind, first, sig = stack.pop()
            if kind == "fn":
                out.append((first, line, sig))
    return out


root = sys.argv[1]
failures, files, count = [], 0, 0
for top in ("src", "kernels"):
    for dirpath, _, names in os.walk(os.path.join(root, top)):
        for name in sorted(names):
            if not name.endswith((".cpp", ".hpp", ".cu", ".cuh")):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            text = open(path, encoding="utf-8").read()
            files += 1
            if text.count("\n") > MAX_FILE:
                failures.append(f"{rel}: {text.count(chr(10))} lines (at most {MAX_FILE})")
            for first, last, sig in functions(blank(text)):
                count += 1
                if last - first + 1 > MAX_FUNCTION and not any(
                        rel == f and sig.startswith(s) for f, s in TABLES):
                    failures.append(f"{rel}:{first}: a function of {last - first + 1} lines "
                                    f"(at most {MAX_FUNCTION}): {sig[:80]}")
for f in failures:
    print("FAIL:", f)
if failures:
    sys.exit(1)
print(f"PASS: {files} files of at most {MAX_FILE} lines, {count} functions of at most "
      f"{MAX_FUNCTION} lines (data tables excepted)")
