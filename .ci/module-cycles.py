#!/usr/bin/env python3
"""Fails when the modules of a crate import each other in a circle.

Each source file is a module; an edge A -> B means a path in A's code names something in B
(`use crate::b::..`, `crate::b::f()`, `super::..`). A child module naming its parent counts
too: a module that reaches back up is exactly what the layering forbids. A file's inline
`#[cfg(test)] mod tests` belongs to the file and is not read. The crate root (lib.rs or
main.rs) declares the modules, so its own `mod` lines are not edges, but a module that
imports through the root (`crate::Name`) depends on it.

Prints each crate's layers (modules that depend on nothing above them first) with
`--layers`, and every cycle found; exits 1 if there is one.

docs/architecture.md shows the layers as tables that this script writes, between two marker
comments (`<!-- module-layers: begin ... -->`, `<!-- module-layers: end -->`), so that the
document cannot drift from the code: `--markdown` prints the tables, `--check-doc FILE` exits
1 (with a diff) when FILE's block differs from them, `--update-doc FILE` rewrites the block.

    python3 .ci/module-cycles.py [--layers] [CRATE_DIR ...]
    python3 .ci/module-cycles.py --markdown [CRATE_DIR ...]
    python3 .ci/module-cycles.py --check-doc docs/architecture.md
    python3 .ci/module-cycles.py --update-doc docs/architecture.md
"""
import difflib
import os
import re
import sys

BEGIN = "<!-- module-layers: begin; written by .ci/module-cycles.py --update-doc, checked by .ci/run -->"
END = "<!-- module-layers: end -->"


def workspace_members(repo):
    """The `members` of the workspace's Cargo.toml: every crate is checked, a new one too."""
    import tomllib
    with open(os.path.join(repo, "Cargo.toml"), "rb") as f:
        return tomllib.load(f)["workspace"]["members"]


def strip_comments_and_strings(src):
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif src.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if src.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif src.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c == "r" and re.match(r'r#*"', src[i:i + 10]) and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            m = re.match(r'r(#*)"', src[i:])
            end = '"' + m.group(1)
            j = src.find(end, i + len(m.group(0)))
            i = n if j < 0 else j + len(end)
            out.append('""')
        elif c == '"':
            i += 1
            while i < n and src[i] != '"':
                i += 2 if src[i] == "\\" else 1
            i += 1
            out.append('""')
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", src[i:i + 4]):
            m = re.match(r"'(\\.[^']*|[^\\'])'", src[i:])
            i += len(m.group(0)) if m else 1
            out.append("' '")
        else:
            out.append(c)
            i += 1
    return "".join(out)


def drop_test_modules(src):
    """Removes `#[cfg(test)] mod NAME { ... }` blocks (already comment- and string-free)."""
    while True:
        m = re.search(r"#\[cfg\(test\)\]\s*(#\[[^\]]*\]\s*)*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{", src)
        if not m:
            return src
        depth, i = 1, m.end()
        while i < len(src) and depth:
            depth += {"{": 1, "}": -1}.get(src[i], 0)
            i += 1
        src = src[:m.start()] + src[i:]


def expand_use_tree(tree):
    """`a::{b, c::{d, e}}` -> [a::b, a::c::d, a::c::e]."""
    tree = re.sub(r"\s+", "", tree)
    depth, start = 0, None
    for i, c in enumerate(tree):
        if c == "{":
            if depth == 0:
                start = i
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                prefix, inner = tree[:start], tree[start + 1:i]
                parts, d, last = [], 0, 0
                for j, ch in enumerate(inner):
                    d += {"{": 1, "}": -1}.get(ch, 0)
                    if ch == "," and d == 0:
                        parts.append(inner[last:j])
                        last = j + 1
                parts.append(inner[last:])
                out = []
                for p in parts:
                    if p:
                        out += expand_use_tree(prefix + p)
                return out
    return [tree.split(" as ")[0]]


def module_files(src_dir):
    """Maps module path tuples to files: () is the crate root."""
    mods = {}
    for root, _, files in os.walk(src_dir):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(root, f), src_dir)
            parts = rel[:-3].split(os.sep)
            if parts in (["lib"], ["main"]):
                key = ()
            elif parts[-1] == "mod":
                key = tuple(parts[:-1])
            else:
                key = tuple(parts)
            if parts[0] == "bin":
                continue
            mods[key] = os.path.join(root, f)
    return mods


def resolve(path, here, mods):
    segs = [s for s in path.split("::") if s]
    if not segs:
        return None
    if segs[0] == "crate":
        base, segs = [], segs[1:]
    elif here + (segs[0],) in mods:
        # A path that starts with a child module's name (edition 2018 relative paths).
        base = list(here)
    elif segs[0] in ("super", "self"):
        base = list(here)
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super":
                base = base[:-1]
            segs = segs[1:]
    else:
        return None
    target = tuple(base)
    for s in segs:
        if target + (s,) in mods:
            target = target + (s,)
        else:
            break
    return target


def edges_of(mod, path, mods):
    src = drop_test_modules(strip_comments_and_strings(open(path, encoding="utf-8").read()))
    paths = []
    for m in re.finditer(r"\buse\s+([^;]+);", src):
        paths += expand_use_tree(m.group(1))
    body = re.sub(r"\buse\s+[^;]+;", "", src)
    paths += re.findall(r"\b((?:crate|super|self)(?:::\w+)+)", body)
    children = {k[-1] for k in mods if len(k) == len(mod) + 1 and k[:len(mod)] == mod}
    paths += [p for p in re.findall(r"(?<![:\w])(\w+(?:::\w+)+)", body) if p.split("::")[0] in children]
    out = set()
    for p in paths:
        t = resolve(p, mod, mods)
        if t is None or t == mod:
            continue
        out.add(t)
    return out


def find_cycles(graph):
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
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
                sccs.append(comp)

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            strong(v)
    return sccs


def layers(graph):
    done, out, rest = set(), [], set(graph)
    while rest:
        layer = sorted(v for v in rest if all(w in done or w == v for w in graph[v]))
        if not layer:
            return out + [sorted(rest)]
        out.append(layer)
        done |= set(layer)
        rest -= set(layer)
    return out


def name(m):
    return "::".join(m) if m else "(root)"


def markdown(layered):
    """The layer tables of docs/architecture.md: one table per crate of several modules, in
    the workspace's order, then one line for the crates that are a single module."""
    out, single = [], []
    for crate, crate_layers in layered:
        if sum(len(layer) for layer in crate_layers) <= 1:
            single.append(crate)
            continue
        out += [f"**{crate}**", "", "| layer | modules |", "|---|---|"]
        for i, layer in enumerate(crate_layers):
            out.append(f"| {i} | {', '.join(name(m) if not m else f'`{name(m)}`' for m in layer)} |")
        out.append("")
    if single:
        names = [f"`{c}`" for c in single]
        listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
        out.append(f"{listed} {'is one module' if len(names) == 1 else 'are one module each'}.")
    # Blank lines around the tables, so that the marker comments stay HTML blocks of their own.
    return "\n" + "\n".join(out) + "\n\n"


def doc_block(text, path):
    """(before, block, after) of a document around its generated layer tables."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{path}: no generated block (a line `{BEGIN}`, then `{END}`)")
    body = start + len(BEGIN) + 1
    return text[:body], text[body:end], text[end:]


def sync_doc(path, tables, write):
    """`--update-doc` (write) rewrites the document's block; `--check-doc` compares it."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        before, block, after = doc_block(text, path)
    except OSError as e:
        print(f"{path}: {e.strerror}")
        return 1
    except ValueError as e:
        print(e)
        return 1
    if write:
        with open(path, "w", encoding="utf-8") as f:
            f.write(before + tables + after)
        print(f"{path}: module layer tables written")
        return 0
    if block == tables:
        print(f"{path}: the module layer tables match the code")
        return 0
    sys.stdout.writelines(difflib.unified_diff(
        block.splitlines(keepends=True), tables.splitlines(keepends=True),
        f"{path} (as written)", "the code's layers"))
    print(f"{path}: the module layer tables differ from the code's layers: run "
          f"`python3 .ci/module-cycles.py --update-doc {path}` and commit the result")
    return 1


def main(argv):
    show_layers = "--layers" in argv
    doc_mode, doc_path, crates = None, None, []
    args = iter(argv)
    for a in args:
        if a in ("--check-doc", "--update-doc"):
            doc_mode, doc_path = a, next(args, None)
            if doc_path is None:
                print(f"{a} needs the document's path, e.g. {a} docs/architecture.md")
                return 2
        elif a == "--markdown":
            doc_mode = a
        elif a.startswith("--") and a != "--layers":
            print(f"unknown flag {a} (known: --layers, --markdown, --check-doc FILE, "
                  "--update-doc FILE)")
            return 2
        else:
            crates.append(a)
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(here)
    crates = crates or workspace_members(repo)
    failed = False
    layered = []
    for crate in crates:
        src = os.path.join(repo, crate, "src")
        if not os.path.isdir(src):
            continue
        mods = module_files(src)
        graph = {m: edges_of(m, p, mods) for m, p in mods.items()}
        layered.append((crate, layers(graph)))
        if doc_mode:
            continue
        for comp in find_cycles(graph):
            failed = True
            members = sorted(comp)
            detail = "; ".join(
                f"{name(a)} -> {', '.join(name(b) for b in sorted(graph[a]) if b in comp)}"
                for a in members)
            print(f"{crate}: modules in a cycle: {detail}")
        if show_layers:
            print(f"{crate} (lowest first):")
            for i, layer in enumerate(layered[-1][1]):
                print(f"  {i}: {', '.join(name(m) for m in layer)}")
    if doc_mode == "--markdown":
        sys.stdout.write(markdown(layered))
        return 0
    if doc_mode in ("--check-doc", "--update-doc"):
        return sync_doc(doc_path, markdown(layered), write=doc_mode == "--update-doc")
    if failed:
        print("module cycles found: give the shared item a home below both modules")
        return 1
    print("no module cycles")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
