#!/usr/bin/env python3
"""Fails when a reference to a document or to a section of one leads nowhere.

Three kinds of reference are checked:

- Markdown links in every `.md` file: `[text](path)`, `[text](path#anchor)` and
  `[text](#anchor)`. The path must exist (relative to the file that links); an anchor must
  be the GitHub anchor of a heading of the target document (lower case, punctuation
  dropped, spaces as `-`, a repeated heading numbered `-1`, `-2`, ...).
- Section names in prose and code comments: `docs/operating.md, "Traces and log records"`
  (the form the contributors' conventions in docs/architecture.md ask for). The quoted name
  must begin a heading of that document, or the bold phrase that opens one of its
  paragraphs or list items (`- **A new subscription** gets ...`), ignoring case and
  backticks, so that a short name of a long heading ("A million keys" for "A million keys
  (`switchyard-bench keys`)") still counts. A bare `operating.md` is looked for beside the
  file, then in `docs/`, then at the root.
- A design document outside the repository (`DESIGN §10`, `DESIGN.md`): a reader of the
  repository has only what is in it, so a reference must name a document here.

Code blocks and inline code are not read for links; external URLs are not fetched.

    python3 .ci/doc-refs.py            # the whole repository
    python3 .ci/doc-refs.py FILE ...   # only these files' references
"""
import os
import re
import sys
import unicodedata

SKIP_DIRS = {".git", "target", ".venv", "node_modules"}
# Fuzz inputs are bytes a parser must survive, not prose.
SKIP_PATHS = {os.path.join("fuzz", "corpus"), os.path.join("fuzz", "artifacts"),
              os.path.join("fuzz", "target")}
MAX_BYTES = 2 * 1024 * 1024
SELF = os.path.join(".ci", "doc-refs.py")

LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
# A line break inside a comment, with the next line's comment marker.
CONTINUATION = r"\n[ \t]*(?:(?://[!/]?|#|\*|--)[ \t]?)?"
OUTSIDE = re.compile(r"\bDESIGN(?:\.md\b|\s*§)")
SECTION = re.compile(r"((?:[\w.-]+/)*[\w.-]+\.md)[,:]?(?:\s|" + CONTINUATION + r")+(?:section\s+)?"
                     r"\"([^\"\n]{2,120}(?:" + CONTINUATION + r"[^\"\n]{1,120})?)\"")


def repo_files(repo):
    for root, dirs, files in os.walk(repo):
        rel_root = os.path.relpath(root, repo)
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS
                         and os.path.normpath(os.path.join(rel_root, d)) not in SKIP_PATHS)
        for f in sorted(files):
            yield os.path.normpath(os.path.join(rel_root, f))


def read_text(path):
    """The file's text, or None for a binary, huge or non-UTF-8 file."""
    try:
        if os.path.getsize(path) > MAX_BYTES:
            return None
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def prose_lines(text):
    """(line number, line) of a Markdown text outside fenced code blocks, inline code blanked."""
    for n, line in prose_lines_raw(text):
        yield n, re.sub(r"(`+)(.+?)\1", lambda c: " " * len(c.group(0)), line)


def prose_lines_raw(text):
    """(line number, line) of a Markdown text outside fenced code blocks."""
    fence = None
    for n, line in enumerate(text.splitlines(), 1):
        m = re.match(r"\s*(`{3,}|~{3,})", line)
        if m:
            if fence is None:
                fence = m.group(1)[0] * len(m.group(1))
            elif m.group(1).startswith(fence):
                fence = None
            continue
        if fence is None:
            yield n, line


def heading_text(raw):
    """A heading as GitHub renders its text: links become their text, markup goes."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", raw)
    text = re.sub(r"<[^>]+>", "", text)
    return re.sub(r"[*`]", "", text).strip()


def slug(text):
    """GitHub's anchor of a heading: letters, numbers, `-` and `_` kept, spaces to `-`."""
    kept = "".join(c for c in text.lower()
                   if c in " -_" or unicodedata.category(c)[0] in "LMN")
    return kept.replace(" ", "-")


def headings(text):
    """The document's headings in order: (rendered text, anchor)."""
    out, seen = [], {}
    for _, line in prose_lines_raw(text):
        h = re.match(r" {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not h:
            continue
        text_ = heading_text(h.group(1))
        base = slug(text_)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.append((text_, base if n == 0 else f"{base}-{n}"))
    return out


def bold_leads(text):
    """Paragraphs and list items that open with a bold phrase (`- **A new subscription** ...`):
    the documents name rules this way inside a section, and code cites them like headings."""
    return [(m.group(1), None) for _, line in prose_lines_raw(text)
            for m in [re.match(r"\s*(?:[-*+]\s+|\d+\.\s+)?\*\*([^*]+)\*\*", line)] if m]


def section_matches(name, heads):
    """A quoted section name matches a heading it begins (case and backticks ignored)."""
    def norm(s):
        return re.sub(r"\s+", " ", s.replace("`", "")).strip().lower()

    want = norm(name)
    for text, _ in heads:
        have = norm(text)
        if have == want or (have.startswith(want) and not have[len(want)].isalnum()):
            return True
    return False


class Repo:
    def __init__(self, root):
        self.root = root
        self._heads = {}
        self._names = {}

    def heads(self, rel):
        if rel not in self._heads:
            text = read_text(os.path.join(self.root, rel)) or ""
            self._heads[rel] = headings(text)
            self._names[rel] = self._heads[rel] + bold_leads(text)
        return self._heads[rel]

    def names(self, rel):
        """Headings and bold-led paragraphs: what a quoted section name may refer to."""
        self.heads(rel)
        return self._names[rel]

    def find_doc(self, name, beside):
        """The repository-relative path a document name in `beside` refers to, or None."""
        for base in (os.path.dirname(beside), "docs", ""):
            rel = os.path.normpath(os.path.join(base, name))
            if os.path.isfile(os.path.join(self.root, rel)):
                return rel
        return None


def check_links(repo, rel, text):
    problems = []
    for n, line in prose_lines(text):
        for m in LINK.finditer(line):
            target = m.group(1)
            if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", target):
                continue
            path, _, anchor = target.partition("#")
            if path:
                dest = os.path.normpath(os.path.join(os.path.dirname(rel), path))
                if dest.startswith(".."):
                    problems.append(f"{rel}:{n}: link `{target}` leaves the repository")
                    continue
                if not os.path.exists(os.path.join(repo.root, dest)):
                    problems.append(f"{rel}:{n}: link `{target}`: no file {dest}")
                    continue
            else:
                dest = rel
            if anchor and dest.endswith(".md"):
                anchors = {a for _, a in repo.heads(dest)}
                if anchor not in anchors:
                    problems.append(f"{rel}:{n}: link `{target}`: {dest} has no heading "
                                    f"with the anchor #{anchor}")
    return problems


def check_sections(repo, rel, text):
    problems = []
    for m in SECTION.finditer(text):
        # A section name may be wrapped onto the next line of a comment.
        name = re.sub(CONTINUATION, " ", m.group(2)).strip()
        line = text.count("\n", 0, m.start()) + 1
        doc = m.group(1)
        dest = repo.find_doc(doc, rel)
        if dest is None:
            problems.append(f"{rel}:{line}: `{doc}` (section \"{name}\"): no such document")
        elif not section_matches(name, repo.names(dest)):
            problems.append(f"{rel}:{line}: {dest} has no section \"{name}\"")
    return problems


def check_outside(rel, text):
    if rel == SELF:
        return []  # its own description names the pattern it looks for
    return [f"{rel}:{text.count(chr(10), 0, m.start()) + 1}: `{m.group(0)}` names a design "
            "document outside the repository: cite the document in docs/ that says it"
            for m in OUTSIDE.finditer(text)]


def main(argv):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    repo = Repo(root)
    files = [os.path.relpath(os.path.abspath(a), root) for a in argv] or list(repo_files(root))
    problems = []
    for rel in files:
        text = read_text(os.path.join(root, rel))
        if text is None:
            continue
        if rel.endswith(".md"):
            problems += check_links(repo, rel, text)
        problems += check_sections(repo, rel, text)
        problems += check_outside(rel, text)
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} reference(s) a reader of the repository cannot follow: point "
              "each at a document and heading that exist here")
        return 1
    print("every document and section reference leads somewhere")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
