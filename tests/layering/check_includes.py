#!/usr/bin/env python3
"""The layering check: no source file includes a header of a floor above its own.

Reads every `#include "X/..."` line of the C sources and headers under the module folders and
fails when X sits on a higher floor than the including file, or on the same floor but in another
folder (siblings do not know each other: compress and security, report and worker). Also fails on
`#include <mpi.h>` outside intra/ (MPI stays behind intra/intra.h), except the raw-MPI baseline
of bench/bench_allreduce.c. Programs under examples/ are a user's: of nebula they include only
<nebula.h> (no module header, quoted or angled, and no quoted path out of their folder).
tests/, deploy/ and docs/ are not checked.

  check_includes.py ROOT          check the tree; prints each violation, exits 1 on any
  check_includes.py --self-test   plants upward includes in a temp tree and checks they fail
  check_includes.py --graph ROOT  prints the module include graph (docs/architecture.md's table)

The floor order is also written down in docs/architecture.md; keep the two in step.
"""
import os
import re
import sys
import tempfile

# Lowest floor first; folders on one floor may not include each other.
FLOORS = [
    ("common",),
    ("kernels",),
    ("compress", "proto"),
    ("security", "intra"),
    ("inter",),
    ("train",),
    ("jobs",),
    ("api",),  # libnebula (its public header include/nebula.h sits below all: see FLOOR)
    ("report", "worker", "bench"),
    ("gateway",),
    ("cli",),
]
# Generated protobuf-c headers are included as "nebula/v1/x.pb-c.h" (and the standard health
# service's as "grpc/health/v1/health.pb-c.h"): they are proto's.
ALIAS = {"nebula": "proto", "grpc": "proto"}
MPI_ALLOWED = ("bench/bench_allreduce.c",)

FLOOR = {m: i for i, ms in enumerate(FLOORS) for m in ms}
# include/ holds the public header of api/ (users write #include <nebula.h>). It is installed
# alone, so it includes nothing of the tree: that puts it below every floor, and common/status.h
# takes the status codes from it (their one definition).
FLOOR["include"] = -1
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
ANY_INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]')
MPI = re.compile(r"^\s*#\s*include\s+<mpi\.h>")


def role(path):
    """The module a repository path (or include path) belongs to, or None."""
    top = path.split("/", 1)[0]
    top = ALIAS.get(top, top)
    return top if top in FLOOR else None


def check(root):
    bad = []
    for module in sorted(set(FLOOR) | set(ALIAS)):
        base = os.path.join(root, module)
        for dirpath, _, files in os.walk(base):
            for name in sorted(files):
                if not name.endswith((".c", ".h", ".cu")):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/")
                me = role(rel)
                with open(os.path.join(dirpath, name), errors="replace") as f:
                    for n, line in enumerate(f, 1):
                        if MPI.match(line) and me != "intra" and rel not in MPI_ALLOWED:
                            bad.append(f"{rel}:{n}: includes <mpi.h> outside intra/")
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        them = role(m.group(1))
                        if them is None or them == me:
                            continue
                        if FLOOR[them] >= FLOOR[me]:
                            how = "a sibling on its floor" if FLOOR[them] == FLOOR[me] else "up"
                            bad.append(f"{rel}:{n}: includes \"{m.group(1)}\" ({them}, floor "
                                       f"{FLOOR[them]}) from {me} (floor {FLOOR[me]}): {how}")
    return bad + check_examples(root)


def check_examples(root):
    """examples/ builds against the installed header and library only: <nebula.h>, the system's
    headers, and files of the example's own folder."""
    bad = []
    for dirpath, _, files in os.walk(os.path.join(root, "examples")):
        for name in sorted(files):
            if not name.endswith((".c", ".h", ".cc", ".cpp", ".cu")):
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/")
            with open(os.path.join(dirpath, name), errors="replace") as f:
                for n, line in enumerate(f, 1):
                    m = ANY_INCLUDE.match(line)
                    if not m:
                        continue
                    kind, path = m.groups()
                    top = path.split("/", 1)[0]
                    tree = "/" in path and ALIAS.get(top, top) in FLOOR
                    if tree or (kind == '"' and (path.startswith("/") or ".." in path.split("/"))):
                        bad.append(f"{rel}:{n}: includes {kind}{path}{'>' if kind == '<' else kind}"
                                   ": an example includes only <nebula.h> of nebula")
    return bad


def graph(root):
    deps = {}
    for module in list(FLOOR) + list(ALIAS):
        for dirpath, _, files in os.walk(os.path.join(root, module)):
            for name in files:
                if not name.endswith((".c", ".h", ".cu")):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/")
                me = role(rel)
                with open(os.path.join(dirpath, name), errors="replace") as f:
                    for line in f:
                        m = INCLUDE.match(line)
                        them = role(m.group(1)) if m else None
                        if them and them != me:
                            deps.setdefault(me, set()).add(them)
    for me in sorted(deps, key=lambda x: (FLOOR[x], x)):
        print(f"| `{me}/` | {FLOOR[me]} | " +
              ", ".join(sorted(deps[me], key=lambda x: (FLOOR[x], x))) + " |")
    return 0


def self_test():
    cases = [  # (file, line, must fail)
        ("common/a.c", '#include "cli/cli.h"', True),
        ("compress/b.c", '#include "security/seal.h"', True),
        ("jobs/c.c", '#include "worker/worker.h"', True),
        ("report/d.c", '#include "worker/worker.h"', True),
        ("gateway/launcher.c", '#include "cli/cli.h"', True),
        ("jobs/acl.c", '#include "gateway/gateway.h"', True),
        ("report/j.c", '#include "gateway/store.h"', True),
        ("worker/e.c", "#include <mpi.h>", True),
        ("train/l.c", '#include "api/x.h"', True),
        ("include/nebula.h", '#include "worker/worker.h"', True),
        ("include/nebula.h", '#include "common/status.h"', True),
        ("common/status.h", '#include "include/nebula.h"', False),
        ("api/m.c", '#include "train/hybrid.h"', False),
        ("cli/f.c", '#include "gateway/gateway.h"', False),
        ("gateway/k.c", '#include "report/report.h"', False),
        ("train/g.c", '#include "compress/compress.h"', False),
        ("inter/h.c", '#include "nebula/v1/exchange.pb-c.h"', False),
        ("intra/i.c", "#include <mpi.h>", False),
        ("examples/c/a.c", '#include "train/hybrid.h"', True),
        ("examples/c/a.c", "#include <common/status.h>", True),
        ("examples/c/a.c", '#include "../../api/session.h"', True),
        ("examples/c/a.c", "#include <nebula.h>", False),
        ("examples/c/a.c", '#include "model.h"', False),
        ("examples/c/a.c", "#include <stdio.h>", False),
    ]
    ok = True
    for path, line, must_fail in cases:
        with tempfile.TemporaryDirectory() as root:
            os.makedirs(os.path.join(root, os.path.dirname(path)))
            with open(os.path.join(root, path), "w") as f:
                f.write(line + "\n")
            failed = bool(check(root))
            if failed != must_fail:
                ok = False
                print(f"self-test: {path}: '{line}' {'passed' if not failed else 'failed'}, "
                      f"expected it to {'fail' if must_fail else 'pass'}")
    print("self-test: ok" if ok else "self-test: FAILED")
    return 0 if ok else 1


def main(argv):
    if len(argv) == 2 and argv[1] == "--self-test":
        return self_test()
    if len(argv) == 3 and argv[1] == "--graph":
        return graph(argv[2])
    if len(argv) != 2:
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    bad = check(argv[1])
    for b in bad:
        print(b)
    print(f"check_includes: {len(bad)} upward include(s)" if bad else "check_includes: ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
