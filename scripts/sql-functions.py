#!/usr/bin/env python3
"""Prints SQL functions as sql/ defines them, for an upgrade script.

    scripts/sql-functions.py new NAME...       CREATE FUNCTION blocks
    scripts/sql-functions.py replace NAME...   CREATE OR REPLACE FUNCTION blocks

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


def main():
    if len(sys.argv) < 3 or sys.argv[1] not in ("new", "replace"):
        sys.exit(__doc__)
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    found = blocks(root)
    for name in sys.argv[2:]:
        if name not in found:
            sys.exit(f"no function orca.{name} in sql/*.sql")
        text = found[name]
        if sys.argv[1] == "replace":
            text = text.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
        print(text)
        print()


main()
