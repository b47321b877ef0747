"""Renders deploy/helm/orca as `helm template` would, for the chart's test:
helm cannot be installed on the test machine (it comes from neither Debian,
PyPI nor npm), so this stands in for it. It implements the part of Go's
text/template and Helm's functions the chart uses, and refuses anything
else, so a template that reaches past it fails the test instead of being
rendered wrong.

    python3 helm_render.py CHART [--set-json JSON] [--release NAME] [--json]

prints each template's documents, as `helm template` does (--json: as one
JSON array of {template, doc}); --set-json merges a JSON object over
values.yaml.
"""

import json
import re
import sys

import yaml

TOKEN = re.compile(r"{{(-?)\s*(.*?)\s*(-?)}}", re.S)


class TemplateError(Exception):
    pass


def lex(src):
    """Text and actions, with {{- and -}} trimming the whitespace beside them."""
    out, pos = [], 0
    for m in TOKEN.finditer(src):
        text = src[pos:m.start()]
        if m.group(1):
            text = text.rstrip()
        out.append(("text", text))
        out.append(("action", m.group(2), bool(m.group(3))))
        pos = m.end()
    out.append(("text", src[pos:]))
    # A -}} trims the whitespace at the start of the next text.
    for i, t in enumerate(out):
        if t[0] == "action" and t[2] and i + 1 < len(out):
            out[i + 1] = ("text", out[i + 1][1].lstrip())
    return [t if t[0] == "text" else ("action", t[1]) for t in out]


def parse(tokens, i=0, stop=("end",)):
    """A tree of nodes up to one of `stop`; returns (nodes, index, stopper)."""
    nodes = []
    while i < len(tokens):
        kind, body = tokens[i][0], tokens[i][1]
        if kind == "text":
            nodes.append(("text", body))
            i += 1
            continue
        word = body.split(None, 1)[0] if body else ""
        if word in stop or body in stop:
            return nodes, i, body
        if word in ("if", "range", "with"):
            inner, i, stopper = parse(tokens, i + 1, ("end", "else"))
            other = []
            if stopper == "else":
                other, i, stopper = parse(tokens, i + 1, ("end",))
            nodes.append((word, body[len(word):].strip(), inner, other))
            i += 1
            continue
        if word in ("end", "else", "define", "template", "block"):
            raise TemplateError(f"unsupported or misplaced action: {{{{ {body} }}}}")
        nodes.append(("expr", body))
        i += 1
    return nodes, i, None


def split_args(s):
    """Terms of a command: strings, parenthesised pipelines, words."""
    out, i = [], 0
    while i < len(s):
        c = s[i]
        if c.isspace():
            i += 1
        elif c == '"':
            j = i + 1
            while s[j] != '"':
                j += 2 if s[j] == "\\" else 1
            out.append(s[i:j + 1])
            i = j + 1
        elif c == "(":
            depth, j = 0, i
            while True:
                depth += {"(": 1, ")": -1}.get(s[j], 0)
                if depth == 0:
                    break
                j += 1
            out.append(s[i:j + 1])
            i = j + 1
        else:
            j = i
            while j < len(s) and not s[j].isspace():
                j += 1
            out.append(s[i:j])
            i = j
    return out


def split_pipe(s):
    parts, depth, quote, cur = [], 0, False, ""
    for c in s:
        if c == '"':
            quote = not quote
        if not quote:
            depth += {"(": 1, ")": -1}.get(c, 0)
            if c == "|" and depth == 0:
                parts.append(cur.strip())
                cur = ""
                continue
        cur += c
    parts.append(cur.strip())
    return parts


def to_yaml(v):
    if v in ({}, [], None):
        return "{}" if v in ({}, None) else "[]"
    return yaml.safe_dump(v, default_flow_style=False, sort_keys=True).rstrip("\n")


def text_of(v):
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (dict, list)):
        return json.dumps(v)
    return str(v)


def truthy(v):
    return v not in (None, False, 0, "", [], {})


FUNCS = {
    "quote": lambda *a: " ".join('"' + text_of(x).replace('"', '\\"') + '"' for x in a),
    "default": lambda d, v=None: v if truthy(v) else d,
    "toYaml": to_yaml,
    "nindent": lambda n, s: "\n" + "\n".join(" " * n + line for line in s.split("\n")),
    "indent": lambda n, s: "\n".join(" " * n + line for line in s.split("\n")),
    "printf": lambda f, *a: re.sub(r"%[sdv]", "{}", f).format(*[text_of(x) for x in a]),
    "eq": lambda a, b: a == b,
    "add": lambda *a: sum(a),
    "not": lambda a: not truthy(a),
}


class Renderer:
    def __init__(self, root):
        self.root = root

    def term(self, t, dot, scope):
        if t.startswith('"'):
            return json.loads(t)
        if t.startswith("("):
            return self.pipeline(t[1:-1], dot, scope)
        if re.fullmatch(r"-?\d+", t):
            return int(t)
        if t in ("true", "false"):
            return t == "true"
        if t == ".":
            return dot
        if t.startswith("$"):
            name, _, path = t.partition(".")
            if name == "$":
                base = self.root
            elif name in scope:
                base = scope[name]
            else:
                raise TemplateError(f"undefined variable {name}")
            return self.walk(base, path)
        if t.startswith("."):
            return self.walk(dot, t[1:])
        raise TemplateError(f"unsupported term {t!r}")

    @staticmethod
    def walk(v, path):
        for key in filter(None, path.split(".")):
            v = v.get(key) if isinstance(v, dict) else None
        return v

    def command(self, cmd, dot, scope, piped=None):
        args = split_args(cmd)
        if args[0] in FUNCS:
            vals = [self.term(a, dot, scope) for a in args[1:]]
            if piped is not None:
                vals.append(piped[0])
            return FUNCS[args[0]](*vals)
        if len(args) != 1 or piped is not None:
            raise TemplateError(f"unknown function in {cmd!r}")
        return self.term(args[0], dot, scope)

    def pipeline(self, p, dot, scope):
        value = None
        for i, cmd in enumerate(split_pipe(p)):
            value = self.command(cmd, dot, scope, None if i == 0 else (value,))
        return value

    def run(self, nodes, dot, scope):
        out = []
        for n in nodes:
            kind = n[0]
            if kind == "text":
                out.append(n[1])
            elif kind == "expr":
                m = re.fullmatch(r"(\$\w+)\s*(:?=)\s*(.+)", n[1], re.S)
                if m:
                    if m.group(2) == "=" and m.group(1) not in scope:
                        raise TemplateError(f"assignment to undeclared {m.group(1)}")
                    scope[m.group(1)] = self.pipeline(m.group(3), dot, scope)
                else:
                    out.append(text_of(self.pipeline(n[1], dot, scope)))
            else:
                _, arg, inner, other = n
                v = self.pipeline(arg, dot, scope)
                if kind == "if":
                    out.append(self.run(inner if truthy(v) else other, dot, scope))
                elif kind == "with":
                    out.append(self.run(inner, v, scope) if truthy(v) else self.run(other, dot, scope))
                else:
                    items = v if isinstance(v, list) else sorted(v.items()) if isinstance(v, dict) else []
                    if not items:
                        out.append(self.run(other, dot, scope))
                    for item in items:
                        out.append(self.run(inner, item, scope))
        return "".join(out)


def merge(base, over):
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            merge(base[k], v)
        else:
            base[k] = v
    return base


def render(chart, overrides=None, release="orca"):
    import os

    with open(os.path.join(chart, "Chart.yaml")) as f:
        meta = yaml.safe_load(f)
    with open(os.path.join(chart, "values.yaml")) as f:
        values = merge(yaml.safe_load(f), overrides or {})
    root = {
        "Values": values,
        "Release": {"Name": release, "Namespace": "default"},
        "Chart": {"Name": meta["name"], "Version": meta["version"], "AppVersion": meta["appVersion"]},
    }
    out = {}
    tdir = os.path.join(chart, "templates")
    for name in sorted(os.listdir(tdir)):
        with open(os.path.join(tdir, name)) as f:
            nodes, _, stopper = parse(lex(f.read()))
        if stopper is not None:
            raise TemplateError(f"{name}: unmatched {{{{ {stopper} }}}}")
        out[name] = Renderer(root).run(nodes, root, {})
    return out


if __name__ == "__main__":
    args = sys.argv[1:]
    chart = args[0]
    overrides = json.loads(args[args.index("--set-json") + 1]) if "--set-json" in args else None
    release = args[args.index("--release") + 1] if "--release" in args else "orca"
    rendered = render(chart, overrides, release)
    if "--json" in args:
        # Every document of every template, parsed: what a test checks.
        docs = []
        for name, text in rendered.items():
            for d in yaml.safe_load_all(text):
                if d is not None:
                    docs.append({"template": name, "doc": d})
        print(json.dumps(docs))
    else:
        for name, text in rendered.items():
            print(f"---\n# Source: orca/templates/{name}\n{text}")
