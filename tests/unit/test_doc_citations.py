"""Comments and pages cite the docs by page and heading (`docs/architecture.md, "One planner"`): every such citation
in the tracked files names a page that exists and a heading of it (a heading that starts with the cited words, as
"The image" cites "The image (`tests/harness/images/vllm-cpu`)"). A renamed or moved heading fails here until its
citations follow it (docs/architecture.md keeps the design; docs/vllm-requirements.md the facts it rests on)."""
import ast
import re
import subprocess

from test_support.paths import REPO

CITATION = re.compile(r'docs/([\w-]+\.md)[,:]?\s*\(?"([A-Z][^"]*)"((?:(?:, | and )"[A-Z][^"]*")*)')
SUFFIXES = (".py", ".yml", ".md", ".j2", ".sh", ".txt", ".cfg")
THIS = "tests/unit/test_doc_citations.py"  # its own example of a wrong citation


def _headings(page):
    path = REPO / "docs" / page
    if not path.is_file():
        return None
    return [re.sub(r"^#+\s*", "", line).strip() for line in path.read_text().splitlines() if line.startswith("#")]


def citations():
    """(file, page, heading) of every citation in the tracked files (comments folded onto one line)."""
    files = subprocess.run(["git", "-C", str(REPO), "ls-files"], capture_output=True, text=True,
                           check=True).stdout.split()
    found = []
    for name in files:
        if not name.endswith(SUFFIXES) or name.startswith(("tests/fixtures/", "changelogs/")) or name == THIS:
            continue
        text = re.sub(r"\s*\n\s*(?:#\s*)?", " ", (REPO / name).read_text(errors="replace"))
        for match in CITATION.finditer(text):
            more = re.findall(r'"([^"]+)"', match.group(3))
            found.extend((name, match.group(1), heading) for heading in [match.group(2)] + more)
    return found


def test_every_citation_names_a_page_and_one_of_its_headings():
    found = citations()
    assert len(found) > 40  # the pattern still sees the citations
    wrong = []
    for name, page, heading in found:
        headings = _headings(page)
        if headings is None or not any(h.startswith(heading) for h in headings):
            wrong.append("%s cites docs/%s, %r" % (name, page, heading))
    assert wrong == []


def test_a_citation_of_a_missing_heading_is_found(tmp_path):
    text = 'see docs/architecture.md, "No such heading" and docs/architecture.md, "One planner"'
    cited = [(m.group(1), m.group(2)) for m in CITATION.finditer(text)]
    assert cited == [("architecture.md", "No such heading"), ("architecture.md", "One planner")]
    assert not any(h.startswith("No such heading") for h in _headings("architecture.md"))


CODE_CITATION = re.compile(r"([\w/.-]+\.py)::(\w+)")


def _defined(path):
    """The names a Python file defines at any depth (functions, classes, assigned names)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, ast.Assign):
            found.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return found


def test_every_citation_of_a_repository_file_names_what_it_defines():
    """`_plan/transfer.py::kv_transfer_config` in a comment or a page: the file of this repository that path ends
    with defines that name (upstream citations, vllm/... of files the repository does not hold, are not checked)."""
    files = subprocess.run(["git", "-C", str(REPO), "ls-files"], capture_output=True, text=True,
                           check=True).stdout.split()
    # the stand-in images mirror upstream paths (vllm/entrypoints/...): a citation of those is vLLM's, not theirs
    python = [f for f in files if f.endswith(".py") and not f.startswith("tests/harness/images/")]
    wrong, checked = [], 0
    for name in files:
        if not name.endswith((".py", ".yml", ".md")) or name.startswith(("changelogs/", "tests/fixtures/")) \
                or name == "docs/benchmarks.md":  # benchmarks.md keeps the history of each pass as measured
            continue
        for match in CODE_CITATION.finditer((REPO / name).read_text(errors="replace")):
            cited, symbol = match.groups()
            held = [f for f in python if f == cited or f.endswith("/" + cited)]
            if not held:
                continue
            checked += 1
            if not any(symbol in _defined(REPO / f) for f in held):
                wrong.append("%s cites %s::%s" % (name, cited, symbol))
    assert checked > 50
    assert wrong == []
