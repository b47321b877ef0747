#!/usr/bin/env python3
"""Prints SQL functions as sql/ defines them, for an upgrade script.

    scripts/sql-functions.py new NAME...       CREATE FUNCTION blocks
    scripts/sql-functions.py replace NAME...   CREATE OR REPLACE FUNCTION blocks
    scripts/sql-functions.py sync SCRIPT NAME...
                                               rewrites, in place, the last
                                               definition of each function in
                                               an unreleased upgrade SCRIPT as
                                               sql/ defines it now (keeping
                                               its OR REPLACE)

Each block is the function's text exactly as in sql/*.sql, with the
COMMENT ON FUNCTION that follows it. An upgrade script must recreate a
changed function byte for byte, or the release test's catalog comparison
(tests/tests/release.rs, which prints what differs) fails. A new function
also needs its REVOKE ALL ... FROM PUBLIC (or its grant) in the script; a
changed signature needs DROP FUNCTION of the old one first.
"""
import glob
import os
import re
import sys


def blocks(root):
    out = {}
    for path in sorted(glob.glob(os.path.join(root, "sql", "*.sql"))):
        lines = open(path).read().split("\n")
        i = 0
        while i < len(lines):
            m = re.match(r"^CREATE FUNCTION orca\.(\w+)\(", lines[i])
            if m:
                body = []
                while i < len(lines):
                    body.append(lines[i])
                    if lines[i] == "$$;":
                        break
                    i += 1
                j = i + 1
                if j < len(lines) and lines[j].startswith("COMMENT ON FUNCTION"):
                    while j < len(lines):
                        body.append(lines[j])
                        if lines[j].endswith("';"):
                            break
                        j += 1
                    i = j
                out[m.group(1)] = "\n".join(body)
            i += 1
    return out


def sync(found, script, names):
    lines = open(script).read().split("\n")
    for name in names:
        if name not in found:
            sys.exit(f"no function orca.{name} in sql/*.sql")
        head = re.compile(r"^CREATE (OR REPLACE )?FUNCTION orca\." + name + r"\(")
        starts = [i for i, line in enumerate(lines) if head.match(line)]
        if not starts:
            sys.exit(f"{script} does not define orca.{name}: add it by hand (new)")
        i = starts[-1]
        replace = lines[i].startswith("CREATE OR REPLACE")
        j = i
        while lines[j] != "$$;":
            j += 1
        k = j + 1
        if k < len(lines) and lines[k].startswith(f"COMMENT ON FUNCTION orca.{name}("):
            while not lines[k].endswith("';"):
                k += 1
            j = k
        text = found[name]
        if replace:
            text = text.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
        lines[i : j + 1] = text.split("\n")
    open(script, "w").write("\n".join(lines))


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    found = blocks(root)
    if len(sys.argv) >= 4 and sys.argv[1] == "sync":
        sync(found, sys.argv[2], sys.argv[3:])
        return
    if len(sys.argv) < 3 or sys.argv[1] not in ("new", "replace"):
        sys.exit(__doc__)
    for name in sys.argv[2:]:
        if name not in found:
            sys.exit(f"no function orca.{name} in sql/*.sql")
        text = found[name]
        if sys.argv[1] == "replace":
            text = text.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
        print(text)
        print()


main()
