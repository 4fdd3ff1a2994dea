#!/usr/bin/env python3
"""Lists the longest C functions of the tree: name, file, lines (from the line that names the
function to its closing brace). Reads the clang-formatted sources as text (a top-level `{`
after a `name(` opens a function); tests/, deploy/, build folders and generated code are
skipped.

  scripts/long_functions.py [ROOT] [--most N] [--over LINES]   (defaults: ., 10, 0)
Exits 1 when --over is given and a function is longer.
"""
import os
import re
import sys

SKIP = {"tests", "deploy", "docs", ".git", "data"}
NAME = re.compile(r"\b([A-Za-z_]\w*)\s*\(")


def strip(line):
    line = re.sub(r'"(\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(\\.|[^'\\])*'", "''", line)
    return re.sub(r"//.*", "", line)


def functions(path):
    out, depth, start, name, in_comment = [], 0, 0, None, False
    pending = None  # (line number, name) of the last top-level `name(`
    with open(path, errors="replace") as f:
        lines = f.read().split("\n")
    for n, raw in enumerate(lines, 1):
        line = strip(raw)
        if in_comment:
            if "*/" not in line:
                continue
            line, in_comment = line.split("*/", 1)[1], False
        line = re.sub(r"/\*.*?\*/", "", line)
        if "/*" in line:
            line, in_comment = line.split("/*", 1)[0], True
        if depth == 0 and not line.startswith((" ", "#")):
            m = NAME.search(line)
            if m and not line.lstrip().startswith(("typedef", "struct", "enum", "#")):
                pending = (n, m.group(1))
        for ch in line:
            if ch == "{":
                if depth == 0 and pending and "=" not in line.split("{")[0]:
                    start, name = pending
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0 and name:
                    out.append((n - start + 1, name, path, start))
                    name, pending = None, None
        if depth == 0 and line.rstrip().endswith(";"):
            pending = None
    return out


def main(argv):
    root, most, over = ".", 10, 0
    args = argv[1:]
    while args:
        a = args.pop(0)
        if a == "--most":
            most = int(args.pop(0))
        elif a == "--over":
            over = int(args.pop(0))
        else:
            root = a
    found = []
    for dirpath, dirs, files in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        top = rel.split(os.sep)[0]
        if top in SKIP or top.startswith("build") or "gen" in rel.split(os.sep):
            dirs[:] = []
            continue
        for fn in files:
            if fn.endswith((".c", ".cu")):
                found += functions(os.path.join(dirpath, fn))
    found.sort(reverse=True)
    for length, name, path, start in found[:most]:
        print(f"{length:5d}  {name}  {os.path.relpath(path, root)}:{start}")
    if over and found and found[0][0] > over:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
