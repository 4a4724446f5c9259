"""Sentence-level sourcing of the studies (issue 59): the checks behind test_study_sources.py.

A descriptive field is split into sentences (``analysis.study.sentences``: clauses between ';' and
'.'). Each sentence either starts with a label of ours (``ours:``, ``assumption:``,
``interpretation:``, ``derived:`` with a formula) or is the source's: then it rests on rows of
docs/studies.md's reference table (its field's rows: a figure's ``source`` for ``what``, its
``why_source`` for ``why``; and any row it names in its own text), and every number in it is a
number of those rows. What this cannot see: whether an unlabelled sentence without numbers says
what its rows say; a reader still checks that.
"""
from __future__ import annotations

import re
from pathlib import Path

import yaml

from analysis.study import LABELS, sentences

# The documents' own titles (as they print them); each recipe's reference.source starts with its
# source's, in double quotes, and docs/studies.md's tables quote them.
TITLES = {
    "ENS": "Scalable Machine Learning: Distributed Training Methods for Large Models and Datasets",
    "ASU": "A Comparative Analysis of Distributed Training Strategies",
    "BRAC": "Distributed Machine Learning Utilizing Multi-node Hybrid Approach",
    "FM": "Comparative Study on Distributed Training Strategies",
}
ROW_TAG = re.compile(r"\b(?:%s)-[A-Za-z0-9.-]*[A-Za-z0-9]" % "|".join(TITLES))
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
QUOTED = re.compile(r'"([^"]+)"')


def _numbers(text: str) -> set[str]:
    return {n.replace(",", "").rstrip(".") for n in NUMBER.findall(ROW_TAG.sub(" ", text))}


def _row_text(row: dict) -> str:
    return " ".join(row[k] for k in ("published arm", "what", "value", "where in the source", "kind"))


def sentence_problems(text: str, rows: list, table: dict, where: str) -> list[str]:
    """What is wrong with each sentence of ``text`` (a field resting on ``rows``)."""
    problems = []
    for s in sentences(text):
        label = next((lab for lab in LABELS if s.lstrip("('\"").startswith(lab)), None)
        if label == "derived:" and "=" not in s:
            problems.append(f"{where}: derived without its formula: {s!r}")
        if label:
            continue
        named = ROW_TAG.findall(s)
        unknown = [r for r in named if r not in table]
        if unknown:
            problems.append(f"{where}: {unknown[0]} is not a row of the reference table: {s!r}")
        backing = [table[r] for r in [*rows, *named] if r in table]
        if not backing:
            problems.append(f"{where}: unsourced (no row, no label of ours): {s!r}")
            continue
        theirs = set().union(*(_numbers(_row_text(r)) for r in backing))
        stray = sorted(_numbers(s) - theirs)
        if stray:
            problems.append(f"{where}: {stray[0]} is in none of its rows ({', '.join(r['entry'] for r in backing)}): {s!r}")
    return problems


def _list(value) -> list:
    return [] if value is None else value if isinstance(value, list) else [value]


def prefix_of(reference: dict) -> str:
    prefixes = {str(f["source"]).split("-")[0] for f in reference["figures"]}
    assert len(prefixes) == 1, prefixes
    return prefixes.pop()


def recipe_problems(path: Path, table: dict) -> list[str]:
    """Every descriptive field of a study recipe, sentence by sentence, and its title."""
    ref = yaml.safe_load(Path(path).read_text())["reference"]
    prefix = prefix_of(ref)
    problems = []
    if not str(ref["source"]).startswith(f'"{TITLES[prefix]}"'):
        problems.append(f"{path}: reference.source must start with the document's own title, "
                        f'"{TITLES[prefix]}": {ref["source"]!r}')
    problems += sentence_problems(ref["hardware"], [], table, f"{path}: reference.hardware")
    for i, fig in enumerate(ref["figures"]):
        at = f"{path}: figure {i} ({fig['published']}, {fig['measure']})"
        problems += sentence_problems(fig["what"], _list(fig["source"]), table, f"{at}.what")
        if fig.get("hardware"):
            problems += sentence_problems(fig["hardware"], [], table, f"{at}.hardware")
        if fig.get("not_run"):
            problems += sentence_problems(fig["not_run"], [], table, f"{at}.not_run")
        problems += _why_problems(fig, table, at)
    for i, verdict in enumerate(ref.get("verdicts") or []):
        problems += _why_problems(verdict, table, f"{path}: verdict {i} ({verdict['published']})")
    return problems


def _why_problems(block: dict, table: dict, at: str) -> list[str]:
    why = block.get("why")
    if not why:
        return []
    problems = sentence_problems(why, _list(block.get("why_source")), table, f"{at}.why")
    ours = [s for s in sentences(why) if s.startswith(("assumption:", "interpretation:"))]
    if ours and block.get("assumption") is not True:
        problems.append(f"{at}.why holds our assumption or interpretation but is not labelled assumption: true")
    return problems


def _table_rows(text: str, heading: str) -> list[list[str]]:
    """The cells of the first table under ``heading``."""
    body = text.split(heading, 1)[1].split("\n#", 1)[0]
    return [[c.strip() for c in line.strip().strip("|").split(" | ")] for line in body.splitlines()
            if line.startswith("| ") and not line.startswith("|---")][1:]


def docs_problems(docs: Path, table: dict, recipes) -> list[str]:
    """docs/studies.md: the titles it quotes, and each setup difference sourced or labelled."""
    text = Path(docs).read_text()
    problems = []
    for cells in _table_rows(text, "### The sources"):
        title = QUOTED.search(cells[1])
        if cells[0] in TITLES and (not title or title.group(1) != TITLES[cells[0]]):
            problems.append(f"{docs}: the sources table's title for {cells[0]} is not the document's own: {cells[1]!r}")
    for path in recipes:
        prefix = prefix_of(yaml.safe_load(Path(path).read_text())["reference"])
        row = next((c for c in _table_rows(text, "## The published studies") if c[0] == f"`{Path(path).name}`"), None)
        if row is None or f'"{TITLES[prefix]}"' not in row[1]:
            problems.append(f"{docs}: the published studies table must quote {Path(path).name}'s title "
                            f'"{TITLES[prefix]}"')
    for cells in _table_rows(text, "### Where our setup differs from the source's"):
        at = f"{docs}: setup difference ({cells[0]}: {cells[1][:40]})"
        if not ROW_TAG.search(cells[1]):
            problems.append(f"{at}: the source's side names no row of the reference table")
        problems += sentence_problems(cells[1], [], table, f"{at}, source")
        problems += [p for p in sentence_problems(cells[3], [], table, f"{at}, why")]
    for entry, row in table.items():
        if not row["where in the source"] or row["where in the source"] == "–":
            problems.append(f"{docs}: row {entry} says not where in the source")
        if row["kind"] not in ("≈ chart", "printed", "stated") and not (row["kind"].startswith("derived:") and "=" in row["kind"]):
            problems.append(f"{docs}: row {entry}: kind {row['kind']!r} (≈ chart, printed, stated, or derived: formula)")
    return problems
