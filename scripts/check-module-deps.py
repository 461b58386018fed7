#!/usr/bin/env python3
"""Checks the files of each host crate for import loops and size.

    scripts/check-module-deps.py            every crate under host/
    scripts/check-module-deps.py host/kafka one crate (or several)
    scripts/check-module-deps.py --graph host/runtime   print its edges
    scripts/check-module-deps.py --self-test            check the checker

Rules (CI runs this; each failure names the files):

1. No loops between files: file A depends on file B when A names a path
   `crate::b::…` or `super::…` that resolves to B (in a `use` line or
   inline). A loop of any length fails, with its files in order.
2. No source file under host/ is over 900 lines (tests inside count).

What is not a dependency: a `mod x;` declaration, and the `pub use`
re-exports of a `lib.rs` or `mod.rs` (the table of contents); a path that
goes through a re-export is followed to the file that defines the name.
`super::` inside an inline `mod tests { … }` means the file itself.
"""

import os
import re
import sys
from collections import defaultdict

MAX_LINES = 900
ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), ".."))

PATH_RE = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
USE_RE = re.compile(r"^\s*(pub(?:\([a-z]+\))?\s+)?use\s+(.*?);", re.S | re.M)
INLINE_MOD_RE = re.compile(r"^\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([a-z]+\))?\s+)?mod\s+\w+\s*\{", re.M)


def strip_comments(text):
    """Blanks out comments and string literals, keeping line numbers."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'r(#*)"', text[i:])
            end = '"' + m.group(1)
            j = text.find(end, i + len(m.group(0)))
            j = n if j < 0 else j + len(end)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j = min(n, j + 1)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:i + 4]):
            m = re.match(r"'(\\.|[^\\'])'", text[i:i + 4])
            out.append(" " * len(m.group(0)))
            i += len(m.group(0))
        else:
            out.append(c)
            i += 1
    return "".join(out)


def expand_use(tree):
    """`a::{b, c::{d, e}}` -> ['a::b', 'a::c::d', 'a::c::e']."""
    tree = re.sub(r"\s+", "", tree)

    def split_top(s):
        parts, depth, cur = [], 0, ""
        for ch in s:
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
            else:
                cur += ch
        if cur:
            parts.append(cur)
        return parts

    def go(prefix, s):
        i = s.find("{")
        if i < 0:
            s = re.sub(r"as\w+$", "", s) if "as" in s and not s.endswith("::as") else s
            s = s.split(" as ")[0]
            return [prefix + s]
        head, body = s[:i], s[i + 1:s.rfind("}")]
        out = []
        for part in split_top(body):
            out.extend(go(prefix + head, part))
        return out

    return [p.rstrip(":") for p in go("", tree)]


class Crate:
    def __init__(self, path):
        self.path = path
        self.src = os.path.join(path, "src")
        self.files = {}  # module path (tuple) -> file path
        for dirpath, _, names in os.walk(self.src):
            for name in names:
                if not name.endswith(".rs"):
                    continue
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, self.src)[:-3].split(os.sep)
                if rel in (["lib"], ["main"]):
                    mod = ()
                elif rel[-1] == "mod":
                    mod = tuple(rel[:-1])
                else:
                    mod = tuple(rel)
                if mod == () and rel == ["main"] and () in self.files:
                    continue  # a binary beside a library: its own root
                self.files[mod] = full
        self.texts = {m: strip_comments(open(f, encoding="utf-8").read()) for m, f in self.files.items()}
        self.reexports = {m: self._reexports(m) for m in self.files}

    def is_toc(self, mod):
        f = self.files[mod]
        return os.path.basename(f) in ("lib.rs", "mod.rs", "main.rs")

    def _reexports(self, mod):
        """name -> absolute path (tuple of segments) for `pub use` in a table of contents."""
        out = {}
        if not self.is_toc(mod):
            return out
        for m in USE_RE.finditer(self.texts[mod]):
            if not m.group(1):
                continue
            for p in expand_use(m.group(2)):
                segs = p.split("::")
                if segs[-1] == "*":
                    continue
                name = segs[-1]
                absolute = self._absolute(mod, segs, in_inline=False)
                if absolute is not None:
                    out[name] = absolute
        return out

    def _absolute(self, mod, segs, in_inline):
        """Turns a path as written in `mod` into an absolute tuple, or None (an external crate)."""
        segs = [s for s in segs if s]
        if not segs:
            return None
        head = segs[0]
        if head == "crate":
            return tuple(segs[1:])
        if head == "self":
            return tuple(mod) + tuple(segs[1:])
        if head == "super":
            base = list(mod)
            rest = segs
            if in_inline:
                rest = rest[1:]  # super of an inline module is the file itself
            while rest and rest[0] == "super":
                base = base[:-1]
                rest = rest[1:]
            return tuple(base) + tuple(rest)
        # A relative path from a table of contents: `use coordinator::X` in lib.rs.
        if self.is_toc(mod) and tuple(mod) + (head,) in self.files:
            return tuple(mod) + tuple(segs)
        return None

    def resolve(self, path, seen=None):
        """The file (module tuple) that defines an absolute path."""
        seen = seen or set()
        path = tuple(path)
        if path in seen:
            return None
        seen.add(path)
        best = ()
        for i in range(len(path), -1, -1):
            if path[:i] in self.files:
                best = path[:i]
                break
        rest = path[len(best):]
        if rest and rest[0] in self.reexports.get(best, {}):
            target = self.reexports[best][rest[0]] + rest[1:]
            got = self.resolve(target, seen)
            if got is not None:
                return got
        return best

    def edges(self):
        out = defaultdict(set)
        for mod, text in self.texts.items():
            toc = self.is_toc(mod)
            inline_spans = []
            for m in INLINE_MOD_RE.finditer(text):
                depth, j = 0, m.end() - 1
                while j < len(text):
                    if text[j] == "{":
                        depth += 1
                    elif text[j] == "}":
                        depth -= 1
                        if depth == 0:
                            break
                    j += 1
                inline_spans.append((m.start(), j))
            reexport_spans = []
            if toc:
                for m in USE_RE.finditer(text):
                    if m.group(1):
                        reexport_spans.append((m.start(), m.end()))
            for m in USE_RE.finditer(text):
                if any(a <= m.start() < b for a, b in reexport_spans):
                    continue
                inline = any(a <= m.start() < b for a, b in inline_spans)
                for p in expand_use(m.group(2)):
                    segs = [s for s in p.split("::") if s != "*"]
                    absolute = self._absolute(mod, segs, inline)
                    if absolute is None:
                        continue
                    target = self.resolve(absolute)
                    if target is not None and target != mod:
                        out[mod].add(target)
            use_spans = [(m.start(), m.end()) for m in USE_RE.finditer(text)]
            for m in PATH_RE.finditer(text):
                if any(a <= m.start() < b for a, b in use_spans):
                    continue
                if m.group(1) == "self":
                    continue
                inline = any(a <= m.start() < b for a, b in inline_spans)
                segs = [m.group(1)] + m.group(2).split("::")[1:]
                absolute = self._absolute(mod, segs, inline)
                if absolute is None:
                    continue
                target = self.resolve(absolute)
                if target is not None and target != mod:
                    out[mod].add(target)
        return out


def cycles(edges, nodes):
    """Strongly connected components of more than one file (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def name(crate, mod):
    return os.path.relpath(crate.files[mod], ROOT)


def self_test():
    """Builds small crates in a temporary directory: a loop through `use`,
    a loop through an inline path, a parent `mod.rs` importing a child that
    imports it back, and clean ones (re-exports, `super::` in tests) — and
    checks that exactly the loops are found."""
    import tempfile

    def crate(files):
        root = tempfile.mkdtemp()
        for path, text in files.items():
            full = os.path.join(root, "src", path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            open(full, "w").write(text)
        c = Crate(root)
        return [[os.path.relpath(c.files[m], root) for m in comp] for comp in cycles(c.edges(), c.files.keys())]

    cases = [
        ("use loop", {"lib.rs": "mod a;\nmod b;\n", "a.rs": "use crate::b::B;\npub struct A;\n",
                      "b.rs": "use crate::a::A;\npub struct B;\n"}, 1),
        ("inline path loop", {"lib.rs": "mod a;\nmod b;\n", "a.rs": "fn f() { crate::b::g() }\npub fn h() {}\n",
                              "b.rs": "pub fn g() { crate::a::h() }\n"}, 1),
        ("parent and child", {"lib.rs": "mod p;\n", "p/mod.rs": "mod c;\nuse c::C;\npub struct P;\n",
                              "p/c.rs": "use super::P;\npub struct C;\n"}, 1),
        ("re-exports are not edges", {"lib.rs": "mod a;\nmod b;\npub use a::A;\npub use b::B;\n",
                                      "a.rs": "pub struct A;\n", "b.rs": "use crate::A;\npub struct B;\n"}, 0),
        ("super in tests is the file", {"lib.rs": "mod a;\n", "a.rs": "pub fn f() {}\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\n"}, 0),
        ("comments and strings are not paths", {"lib.rs": "mod a;\nmod b;\n", "a.rs": "// crate::b::x\npub fn f() {}\n",
                                                "b.rs": "pub fn g() { let _ = \"crate::a::f\"; crate::a::f() }\n"}, 0),
    ]
    failed = 0
    for name, files, loops in cases:
        got = crate(files)
        ok = len(got) == loops
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {len(got)} loop(s), expected {loops} {got if got else ''}")
    return 1 if failed else 0


def main(argv):
    if "--self-test" in argv:
        return self_test()
    graph = "--graph" in argv
    targets = [a for a in argv if not a.startswith("--")]
    if not targets:
        host = os.path.join(ROOT, "host")
        targets = [os.path.join(host, d) for d in sorted(os.listdir(host)) if os.path.isdir(os.path.join(host, d, "src"))]
    failures = 0
    for t in targets:
        crate = Crate(os.path.abspath(t))
        edges = crate.edges()
        if graph:
            for a in sorted(edges):
                for b in sorted(edges[a]):
                    print(f"{name(crate, a)} -> {name(crate, b)}")
        for comp in cycles(edges, crate.files.keys()):
            failures += 1
            files = ", ".join(name(crate, m) for m in comp)
            pairs = [f"{name(crate, a)} -> {name(crate, b)}" for a in comp for b in sorted(edges.get(a, ())) if b in comp]
            print(f"import loop: {files}\n    " + "\n    ".join(pairs))
        for mod, f in sorted(crate.files.items()):
            lines = sum(1 for _ in open(f, encoding="utf-8"))
            if lines > MAX_LINES:
                failures += 1
                print(f"too long: {os.path.relpath(f, ROOT)} has {lines} lines (at most {MAX_LINES})")
    if failures:
        print(f"check-module-deps: {failures} problem(s)")
        return 1
    print(f"check-module-deps: {len(targets)} crate(s), no import loops, no file over {MAX_LINES} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
