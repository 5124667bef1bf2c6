"""The documents: README.md is a quick start of at most 8,000 characters that keeps the two set-up commands
(.ci/run calls the test command); docs/ holds at most 12 files, Markdown guides only (and images they link);
docs/PERFORMANCE.md has at most 300 lines; no document names a run by its ordinal or cites a file outside the
repository; and every relative link in README.md and docs/*.md reaches a file that exists, and a heading of it
where the link names one (#anchor). Needs neither torch nor the build."""
import pathlib
import re
import unicodedata

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCUMENTS = [README] + sorted((ROOT / "docs").glob("*.md"))
README_LIMIT = 8_000
DOCS_FILE_LIMIT = 12
PERFORMANCE_LINE_LIMIT = 300
IMAGE_SUFFIXES = {".png", ".svg", ".jpg"}

_UNITS = ["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth"]
_TEENS = ["tenth", "eleventh", "twelfth", "thirteenth", "fourteenth", "fifteenth", "sixteenth", "seventeenth",
          "eighteenth", "nineteenth"]
_TENS = {"twenty": "twentieth", "thirty": "thirtieth", "forty": "fortieth"}
# Run ordinals from "tenth" to "fortieth" ("twenty-eighth", "thirty-fifth", "twentieth", "twentyfirst"). "first"
# to "ninth" alone are ordinary English ("the first step") and are not matched; compounded they are.
RUN_ORDINAL = re.compile(r"\b(?:" + "|".join(
    _TEENS + list(_TENS.values()) + [f"{tens}-?{unit}" for tens in _TENS for unit in _UNITS]) + r")\b", re.IGNORECASE)
OUTSIDE_REFERENCE = re.compile(r"\.\./shared/|MEASURED\.md")

FENCE = re.compile(r"^\s*(```|~~~)")
# [text](target) and ![alt](target); the target ends at the first space or closing parenthesis.
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_CODE = re.compile(r"`[^`]*`")


def prose_lines(path: pathlib.Path):
    """(line number, line) of every line outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation other than '-' and '_' dropped, spaces to '-'."""
    text = heading.strip().lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading keeps its text
    kept = []
    for character in text:
        if character in "-_ " or unicodedata.category(character)[0] in "LN":
            kept.append(character)
    return "".join(kept).replace(" ", "-")


def anchors(path: pathlib.Path) -> set:
    seen: dict = {}
    result = set()
    for _, line in prose_lines(path):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    return result


def relative_links(path: pathlib.Path):
    """(line number, target) of every link that is not a URL, outside code."""
    for number, line in prose_lines(path):
        for match in LINK.finditer(INLINE_CODE.sub("", line)):
            target = match.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # http:, https:, mailto:
                continue
            yield number, target


def test_the_documents_exist():
    assert README.is_file()
    assert len(DOCUMENTS) > 1, "docs/*.md found nothing"


def test_readme_is_a_quick_start():
    text = README.read_text(encoding="utf-8")
    assert len(text) <= README_LIMIT, f"README.md has {len(text)} characters; the quick start takes at most {README_LIMIT}"


def test_readme_keeps_the_two_set_up_commands():
    text = README.read_text(encoding="utf-8")
    commands = [line for line in text.splitlines() if re.match(r"^\./scripts/\w+\.sh\b", line)]
    assert [line.split()[0] for line in commands] == ["./scripts/main.sh", "./scripts/test.sh"]
    run = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "./scripts/test.sh" in run


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_relative_links_resolve(document: pathlib.Path):
    broken = []
    for number, target in relative_links(document):
        file_part, _, anchor = target.partition("#")
        destination = (document.parent / file_part).resolve() if file_part else document
        where = f"{document.relative_to(ROOT)}:{number}: {target}"
        if not destination.exists():
            broken.append(f"{where} (no such file)")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append(f"{where} (no heading #{anchor} in {destination.relative_to(ROOT)})")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_slug_follows_github():
    assert slug("Warm start (CI)") == "warm-start-ci"
    assert slug("Sharing tuning between ranks: `cudnn_cache.distributed.sync()`") == \
        "sharing-tuning-between-ranks-cudnn_cachedistributedsync"
    assert slug("Many processes, one file") == "many-processes-one-file"


def docs_files():
    return sorted(path for path in (ROOT / "docs").rglob("*") if path.is_file())


def linked_images(documents) -> set:
    linked = set()
    for document in documents:
        for _, target in relative_links(document):
            destination = (document.parent / target.partition("#")[0]).resolve()
            if destination.suffix.lower() in IMAGE_SUFFIXES:
                linked.add(destination)
    return linked


def test_docs_holds_the_guides_only():
    files = docs_files()
    assert len(files) <= DOCS_FILE_LIMIT, f"docs/ has {len(files)} files; it holds at most {DOCS_FILE_LIMIT} guides"
    images = linked_images(DOCUMENTS)
    strays = [str(path.relative_to(ROOT)) for path in files
              if path.suffix != ".md" and path.resolve() not in images]
    assert not strays, ("docs/ holds guides (.md) and the images they link; results go to benchmarks/results/: "
                        + ", ".join(strays))


def test_performance_states_current_figures_only():
    lines = (ROOT / "docs" / "PERFORMANCE.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= PERFORMANCE_LINE_LIMIT, \
        f"docs/PERFORMANCE.md has {len(lines)} lines; the current figures take at most {PERFORMANCE_LINE_LIMIT}"


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_no_run_ordinals_or_outside_files(document: pathlib.Path):
    found = []
    for number, line in enumerate(document.read_text(encoding="utf-8").splitlines(), start=1):
        for pattern, what in ((RUN_ORDINAL, "a run ordinal"), (OUTSIDE_REFERENCE, "a file outside the repository")):
            match = pattern.search(line)
            if match:
                found.append(f"{document.relative_to(ROOT)}:{number}: {what}: {match.group(0)!r}")
    assert not found, "a document states what is, not which run found it:\n" + "\n".join(found)


def test_run_ordinal_pattern():
    for word in ["thirty-fifth", "twentieth", "Twenty-Eighth", "eleventh", "fortieth", "twentyfirst", "thirtieth"]:
        assert RUN_ORDINAL.search(f"the {word} run"), word
    for text in ["the first step", "the second gradient", "a third of it", "fifth", "ninth"]:
        assert not RUN_ORDINAL.search(text), text
    assert OUTSIDE_REFERENCE.search("see ../shared/context/MEASURED.md")
