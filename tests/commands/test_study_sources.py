"""Every claim of a study recipe is traceable: each published number is in docs/studies.md's
reference table under the row the figure names (same value, same unit), every `what` rests on a
row, every `why` names its rows or is labelled our assumption, and the claims no source makes
(listed in issues 29 and 59) stay out. Sentence by sentence (tests/commands/study_sourcing.py):
every sentence of a recipe's descriptive fields and of docs/studies.md's setup-difference table
is the source's (resting on named rows, its numbers theirs) or labelled ours, and every title is
the document's own."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from analysis.study import sentences
from suite.study import __main__ as study
from tests.commands import study_sourcing as sourcing

STUDIES = sorted(Path("recipes/studies").glob("*.yaml"))
DOCS = Path("docs/studies.md")
COLUMNS = ["entry", "published arm", "what", "value", "unit", "where in the source", "kind"]


def reference_table(docs: Path = DOCS) -> dict[str, dict]:
    """entry -> its row, from the table under '### Reference table'."""
    text = docs.read_text().split("### Reference table", 1)[1]
    rows = {}
    for line in text.splitlines()[1:]:
        if line.startswith("#"):
            break
        if not line.startswith("| ") or line.startswith("| entry") or line.startswith("|---"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        assert len(cells) == len(COLUMNS), line
        row = dict(zip(COLUMNS, cells))
        assert row["entry"] not in rows, f"entry {row['entry']} twice"
        rows[row["entry"]] = row
    return rows


def _figures(path: Path) -> list[dict]:
    return yaml.safe_load(path.read_text())["reference"]["figures"]


def _ids(value) -> list[str]:
    return value if isinstance(value, list) else [value]


def test_the_reference_table_is_read():
    table = reference_table()
    assert len(table) > 70 and {"FM-S1-test-loss", "ASU-D-naive-epoch", "ENS-V", "BRAC-hw"} <= set(table)


def test_derived_rows_say_derived_with_the_formula():
    table = reference_table()
    derived = [r for r in table.values() if r["kind"].startswith("derived")]
    assert {r["entry"] for r in derived} == {"ASU-D-naive-epoch", "ASU-D-dp-epoch", "ASU-D-gpipe-epoch"}
    for row in derived:  # the formula, and it gives the value
        numerator, rate, result = re.search(r"derived: ([\d,]+)(?: images)? / (\d+)(?: samples/s)? = ([\d.]+) s",
                                            row["kind"]).groups()
        assert "assumption: 50,000 images per epoch" in row["kind"], row  # the data set is not stated
        quotient = int(numerator.replace(",", "")) / int(rate)
        assert abs(quotient - float(result)) < 0.01 and round(quotient, 1) == float(row["value"])


@pytest.mark.parametrize("path", STUDIES, ids=str)
def test_every_published_number_is_in_the_reference_table(path):
    table = reference_table()
    for i, fig in enumerate(_figures(path)):
        entries = _ids(fig["source"])
        assert len(entries) == 1, f"{path} figure {i}: one row holds its number"
        row = table.get(entries[0])
        assert row is not None, f"{path} figure {i}: source {entries[0]} is not a row of {DOCS}"
        assert float(row["value"]) == pytest.approx(fig["value"]), (path, i, row)
        assert row["unit"] == fig["unit"], (path, i, row)


@pytest.mark.parametrize("path", STUDIES, ids=str)
def test_every_what_and_why_is_sourced_or_labelled_ours(path):
    table = reference_table()
    raw = yaml.safe_load(path.read_text())
    for i, fig in enumerate(raw["reference"]["figures"]):
        assert fig.get("what") and fig.get("source"), (path, i)
        if fig.get("why"):
            assert (fig.get("why_source") is not None or fig.get("assumption") is True
                    or all(s.startswith("ours:") for s in sentences(fig["why"]))), (path, i, fig["why"])
        for entry in _ids(fig.get("why_source") or []):
            assert entry in table, f"{path} figure {i}: why_source {entry} is not a row of {DOCS}"
    for i, verdict in enumerate(raw["reference"].get("verdicts") or []):
        assert verdict["source"] in table, (path, i)
        if verdict.get("why"):
            assert verdict.get("why_source") is not None or verdict.get("assumption") is True, (path, i)
        for entry in _ids(verdict.get("why_source") or []):
            assert entry in table, f"{path} verdict {i}: why_source {entry} is not a row of {DOCS}"


UNSOURCED = ["NVLink", "PCIe", "recomputes activations", "thesis", "1x P100 or 2x T4", "half teacher forcing",
             "within 0.02", "the usual setup of this model", "ran Keras fit on its shard", "GloVe",
             "mirrored over GPU:0", "both sides shard validation", "validation inside the timed region",
             "training time, 10 epochs", "not in our mlp"]


@pytest.mark.parametrize("path", STUDIES, ids=str)
def test_claims_no_source_makes_are_gone(path):
    text = path.read_text()
    for phrase in UNSOURCED:
        assert phrase not in text, f"{path}: {phrase!r}"


@pytest.mark.parametrize("edit, message", [
    (lambda f: f.pop("source"), "reference.figures.0.source is required (the row of docs/studies.md"),
    (lambda f: f.update(source="somewhere"), "reference.figures.0.source='somewhere' must name a row"),
    (lambda f: (f.pop("why_source"), f.pop("assumption")), "reference.figures.0.why needs why_source (the reference-table rows it rests "
                                    "on) or assumption: true"),
    (lambda f: f.update(assumption="yes"), "reference.figures.0.assumption='yes' must be true or false"),
    (lambda f: f.pop("why"), "reference.figures.0: why_source and assumption label a why; give the why or drop them"),
])
def test_an_unsourced_figure_is_refused_in_one_line(tmp_path, capsys, edit, message):
    raw = yaml.safe_load(Path("recipes/studies/fashion_mnist_dp.yaml").read_text())
    edit(raw["reference"]["figures"][0])
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert study.main([str(path), "--dry-run", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


@pytest.mark.parametrize("path", STUDIES, ids=str)
def test_every_sentence_of_a_recipe_is_sourced_or_labelled_ours_and_its_title_the_documents(path):
    assert sourcing.recipe_problems(path, reference_table()) == []


def test_every_sentence_and_title_of_the_docs_is_sourced_or_labelled_ours():
    assert sourcing.docs_problems(DOCS, reference_table(), STUDIES) == []


@pytest.mark.parametrize("where, plant, found", [
    ("why", lambda f: f.update(why=f["why"] + "; their GPUs ran at 1.9 GHz"), "1.9 is in none of its rows"),
    ("what", lambda f: f.update(what=f["what"] + ", 10 epochs"), "10 is in none of its rows"),
    ("not_run", lambda f: f.update(not_run="the program was lost"), "unsourced (no row, no label of ours)"),
    ("why", lambda f: f.update(why=f["why"] + "; their data came from ENS-nowhere"), "ENS-nowhere is not a row"),
])
def test_a_planted_unsourced_sentence_fails(tmp_path, where, plant, found):
    raw = yaml.safe_load(Path("recipes/studies/fashion_mnist_dp.yaml").read_text())
    plant(raw["reference"]["figures"][0])
    path = tmp_path / "planted.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    problems = sourcing.recipe_problems(path, reference_table())
    assert len(problems) == 1 and found in problems[0] and f".{where}" in problems[0], problems


def test_a_planted_unsourced_setup_difference_in_the_docs_fails(tmp_path):
    text = DOCS.read_text()
    row = "| MobileNetV2 | train or test accuracy not stated (BRAC-setup) | test accuracy | ours: a choice |"
    assert row in text
    docs = tmp_path / "studies.md"
    docs.write_text(text.replace(row, row + "\n| MobileNetV2 | 8 GB per node | 1 core | the nodes were small |"))
    problems = sourcing.docs_problems(docs, reference_table(docs), STUDIES)
    assert any("names no row" in p for p in problems) and any("the nodes were small" in p for p in problems), problems


WRONG_TITLE = '"Fashion-MNIST training without MPI, with MPI, with MirroredStrategy and with a custom data-parallel loop"'


def test_a_planted_wrong_title_fails(tmp_path):
    raw = yaml.safe_load(Path("recipes/studies/fashion_mnist_dp.yaml").read_text())
    raw["reference"]["source"] = f"{WRONG_TITLE} (TensorFlow report)"
    path = tmp_path / "planted.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    problems = sourcing.recipe_problems(path, reference_table())
    assert len(problems) == 1 and "must start with the document's own title" in problems[0], problems
    text = DOCS.read_text()  # and in the docs' table of sources
    docs = tmp_path / "studies.md"
    docs.write_text(text.replace(f'| FM | "{sourcing.TITLES["FM"]}"', f"| FM | {WRONG_TITLE}"))
    problems = sourcing.docs_problems(docs, reference_table(docs), STUDIES)
    assert len(problems) == 1 and "title for FM is not the document's own" in problems[0], problems
