#!/usr/bin/env python3
"""Fails when a module of a workspace crate imports a module that imports it back.

A module is one source file (`a/b.rs` or `a/b/mod.rs` is `a::b`). It depends on another when it
names it through `crate::`, `super::` or a sibling path (`use` lines and paths in code; comments
and `#[cfg(test)] mod tests` are left out). A module and its ancestors are one unit here: a child
using its parent's types while the parent declares the child is how Rust modules nest. Any
other cycle (a -> b -> a, or longer) is printed and fails the check.

    scripts/check-module-cycles.py [CRATE_SRC_DIR ...]
"""
import os
import re
import sys

DEFAULT = [
    "analysis-core/src",
    "analysis-core/trace/src",
    "analysis-core/torch-import/src",
    "viewer/src",
    "collector/src",
    "collector/inject/src",
    "collector/inject/ring/src",
    "tests/accuracy/src",
]


def modules(root):
    mods = {}
    for dp, _, fns in os.walk(root):
        for f in fns:
            if not f.endswith(".rs"):
                continue
            p = os.path.join(dp, f)
            rel = os.path.relpath(p, root)[:-3].split(os.sep)
            if rel[-1] == "mod":
                rel = rel[:-1]
            if rel in (["lib"], ["main"]):
                rel = []
            text = open(p, encoding="utf-8").read()
            text = re.split(r"#\[cfg\(test\)\]\s*mod tests", text)[0]
            text = "\n".join(l.split("//")[0] if not l.lstrip().startswith("//") else "" for l in text.split("\n"))
            mods[tuple(rel)] = text
    return mods


def resolve(mods, path):
    """The longest known module that is a prefix of `path`."""
    for n in range(len(path), -1, -1):
        if tuple(path[:n]) in mods:
            return tuple(path[:n])
    return ()


def edges(mods):
    g = {m: set() for m in mods}
    for m, text in mods.items():
        for ref in re.findall(r"\bcrate((?:::[a-z_][a-z_0-9]*)+)", text):
            g[m].add(resolve(mods, ref.split("::")[1:]))
        for sup, ref in re.findall(r"\b((?:super::)+)([a-z_][a-z_0-9]*(?:::[a-z_][a-z_0-9]*)*)", text):
            up = sup.count("super::")
            base = list(m[:-up]) if up <= len(m) else []
            g[m].add(resolve(mods, base + ref.split("::")))
        # `use self::x` / `x::y` relative to this module's children are child edges: ignored.
    return g


def related(a, b):
    return a[: len(b)] == b or b[: len(a)] == a


def cycles(g):
    found = set()
    # Tarjan's strongly connected components on edges between unrelated modules.
    adj = {m: [d for d in ds if d in g and not related(m, d)] for m, ds in g.items()}
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in adj[v]:
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
    for v in adj:
        if v not in index:
            visit(v)
    return out


def main():
    roots = sys.argv[1:] or DEFAULT
    bad = 0
    for root in roots:
        mods = modules(root)
        for comp in cycles(edges(mods)):
            bad += 1
            names = ", ".join("::".join(c) or "crate" for c in comp)
            print(f"{root}: modules that import each other: {names}")
    if bad:
        print(f"{bad} module cycle(s): make one side depend on the other only (see ARCHITECTURE.md)")
        sys.exit(1)
    print(f"no module cycles in {', '.join(roots)}")


if __name__ == "__main__":
    main()
