"""A study's published figures beside ours: the ``reference:`` block of a study recipe
(``python -m suite.study``) checked, and turned into the "published vs ours" table.

Each published figure names the arm as the source labels it (``published``), the arm of ours it
is set beside (``ours``; none when this suite does not run that arm yet, with ``not_run`` saying
why; ``not_run`` beside ``ours`` says ours is an analogue of a program the suite does not run),
what it measures (``measure``, one of MEASURES), its number and unit, and how to compare:

- ``absolute``: our number beside theirs, in their unit. Only where the setups match: when our
  runs trained on another data set than the figure (its ``data``, else ``reference.data``), the row says so.
- ``ratio``: where hardware differs, each side against its own baseline (the figure's
  ``baseline``, else ``reference.baseline``, for theirs; the arm's baseline arm for ours, see
  ``baselines``): speed-up = baseline time / arm time (or arm throughput / baseline throughput);
  memory, utilisation, accuracy and loss as arm / baseline.

Every row ends with which way ours differs, and the recipe's ``why`` where it gives one ("differs
because"). Every claim is traceable: ``source`` names the row of the reference table in
``docs/studies.md`` that the value and ``what`` rest on; a ``why`` names its rows (``why_source``)
or is labelled ``assumption: true`` (our reasoning, not the source's), and the row shows which.
``reference.verdicts`` (the source's improves / same / worse per model) and the study's
``thresholds`` (epochs to given accuracies) are tabled by ``analysis.study_tables``. Torch-free.
"""
from __future__ import annotations

import re
from pathlib import Path

import yaml

from analysis import study_tables, tables
from suite.common.errors import SuiteError

# unit families: unit -> size in the family's base unit
TIME = {"s": 1.0, "ms": 1e-3, "min": 60.0, "h": 3600.0}
BYTES = {"B": 1.0, "kB": 1e3, "MB": 1e6, "GB": 1e9, "KiB": 2.0**10, "MiB": 2.0**20, "GiB": 2.0**30}
FRACTION = {"fraction": 1.0, "%": 0.01}
PERCENT = {"%": 1.0, "fraction": 100.0}
RATE = {"samples/s": 1.0}
LOSS = {"nats": 1.0}


def _final(key):
    return lambda run: run.summary.get("final", {}).get(key)


# measure: (what ours is, unit family, ratio name, ours from one run)
MEASURES = {
    "train_time_s": ("training time, all epochs (rank 0, evaluation excluded)", TIME, "speed-up",
                     lambda run: run.summary.get("train_time_s")),
    "epoch_time_s": ("mean training time per epoch", TIME, "speed-up",
                     lambda run: tables.mean(run.summary.get("epoch_time_s") or [])),
    "samples_per_s": ("training throughput, global", RATE, "speed-up",
                      lambda run: run.summary.get("samples_per_s")),
    "final_train_loss": ("train loss, last epoch", LOSS, "loss ratio", _final("train_loss")),
    "final_val_loss": ("validation loss after training", LOSS, "loss ratio", _final("val_loss")),
    "final_train_accuracy": ("train accuracy, last epoch", FRACTION, "accuracy ratio", _final("train_accuracy")),
    "final_val_accuracy": ("validation accuracy after training", FRACTION, "accuracy ratio",
                           _final("val_accuracy")),
    "eval_time_total_s": ("validation time, all epochs summed", TIME, "speed-up",
                          lambda run: sum(run.summary.get("eval_time_s") or []) or None),
    "peak_memory_bytes": ("peak memory of the busiest rank", BYTES, "memory ratio",
                          lambda run: max((r.get("peak_memory_bytes") or 0) for r in run.summary["ranks"]) or None),
    "utilisation_percent": ("mean device utilisation", PERCENT, "utilisation ratio",
                            lambda run: tables.utilisation(run)[0]),
}
COMPARE = ("absolute", "ratio")
FIGURE_KEYS = {"published": True, "ours": False, "measure": True, "value": True, "unit": True, "what": True,
               "compare": True, "why": False, "not_run": False, "hardware": False, "baseline": False,
               "data": False, "source": True, "why_source": False, "assumption": False}
REFERENCE_KEYS = {"source": True, "hardware": True, "data": True, "baseline": False, "figures": True,
                  "verdicts": False}
ENTRY = re.compile(r"^[A-Z]+-[A-Za-z0-9.-]+$")  # a row of docs/studies.md's reference table, e.g. ASU-T1-naive
SAME_WITHIN = 0.05  # "about the same" when ours is within 5 % of theirs


def _keys(block: dict, allowed: dict, where: str, need: dict | None = None) -> None:
    if not isinstance(block, dict):
        raise SuiteError(f"{where} must be a mapping with keys {', '.join(allowed)}")
    for key in block:
        if key not in allowed:
            raise SuiteError(f"unknown key {where}.{key}; accepted here: {', '.join(allowed)}")
    for key, required in allowed.items():
        if required and block.get(key) in (None, ""):
            raise SuiteError(f"{where}.{key} is required ({(need or _NEED)[key]})")


_NEED = {"source": "the title of the paper or report the figures come from",
         "hardware": "what the figures were measured on, or 'not stated'",
         "data": "the data set the figures were measured on, e.g. fashion_mnist",
         "figures": "a list of published figures",
         "published": "the arm as the source labels it", "measure": f"one of {', '.join(MEASURES)}",
         "value": "the published number", "unit": "the published number's unit, e.g. s",
         "what": "what the number measures, in the source's words", "compare": "absolute or ratio"}
_NEED_FIGURE = {**_NEED, "source": "the row of docs/studies.md's reference table the value and `what` rest on, "
                                   "e.g. ASU-T1-naive-rate"}


def entries(value, at: str) -> list[str]:
    """A ``source`` / ``why_source``: one reference-table entry or a list of them, each checked."""
    items = value if isinstance(value, list) else [value]
    for item in items:
        if not isinstance(item, str) or not ENTRY.match(item):
            raise SuiteError(f"{at}={item!r} must name a row of docs/studies.md's reference table, e.g. ASU-T1-naive-rate "
                             f"(letters, a dash, then letters, digits, '.' or '-')")
    return items


# A descriptive field's sentences (clauses between ';' and '.'): each is the source's (resting on
# the reference-table rows its field or its own parentheses name) or starts with a label of ours.
OURS = "ours:"
LABELS = (OURS, "assumption:", "interpretation:", "derived:")
_SENTENCE_END = re.compile(r";\s+|\.\s+(?=[A-Z\"'(])|\.$")


def sentences(text: str) -> list[str]:
    """``text`` split into its sentences, stripped; a label starts a sentence."""
    return [s.strip() for s in _SENTENCE_END.split(text.strip()) if s.strip()]


def check_sourcing(fig: dict, at: str) -> None:
    """The value and ``what`` rest on ``source``; a ``why`` rests on ``why_source`` or is labelled
    ``assumption: true`` (ours, not the source's), so a reader can tell the two apart."""
    entries(fig["source"], f"{at}.source")
    if fig.get("why_source") is not None:
        entries(fig["why_source"], f"{at}.why_source")
    if fig.get("assumption") not in (None, True, False):
        raise SuiteError(f"{at}.assumption={fig['assumption']!r} must be true or false")
    if fig.get("why") and fig.get("why_source") is None and not fig.get("assumption") and \
            not all(s.startswith(OURS) for s in sentences(fig["why"])):
        raise SuiteError(f"{at}.why needs why_source (the reference-table rows it rests on) or assumption: true "
                         f"(it is our reasoning, not the source's)")
    if not fig.get("why") and (fig.get("why_source") is not None or fig.get("assumption")):
        raise SuiteError(f"{at}: why_source and assumption label a why; give the why or drop them")


ARM_KEYS = ("baseline", "profiles")  # an arm's own keys beside its key.path overrides


def baselines(arms: dict, default=None) -> dict:
    """arm -> the arm its ratios divide by and its plots are drawn with: the arm's own ``baseline``;
    else itself when another arm names it as baseline; else the study's ``baseline`` (default).
    A baseline arm is its own baseline (no chains), so the arms fall into groups, one per baseline."""
    named = {arm: (spec or {}).get("baseline") for arm, spec in arms.items()}
    for arm, base in named.items():
        if base is not None and base not in arms:
            raise SuiteError(f"arms.{arm}.baseline={base!r} must name one of the arms: {', '.join(arms)}")
    out = {}
    for arm, base in named.items():
        out[arm] = base or (arm if arm in named.values() else default)
        if out[arm] is None:
            raise SuiteError(f"arms.{arm}: give its baseline (the arm its ratios divide by), or a study-level "
                             f"baseline for every arm that names none")
    for arm, base in out.items():
        if out[base] != base:
            raise SuiteError(f"arms.{arm}.baseline={base!r}, but {base} divides by {out[base]} itself; name "
                             f"{out[base]} (a baseline arm is its own baseline)")
    return out


def check_reference(reference: dict, arms, where: str = "reference") -> dict:
    """Refuse a malformed ``reference:`` block with one line naming the key; returns it."""
    _keys(reference, REFERENCE_KEYS, where)
    figures = reference["figures"]
    if not isinstance(figures, list) or not figures:
        raise SuiteError(f"{where}.figures must be a non-empty list of published figures")
    for i, fig in enumerate(figures):
        at = f"{where}.figures.{i}"
        _keys(fig, FIGURE_KEYS, at, _NEED_FIGURE)
        check_sourcing(fig, at)
        if fig["measure"] not in MEASURES:
            raise SuiteError(f"{at}.measure={fig['measure']!r} is not known; choose one of {', '.join(MEASURES)}")
        units = MEASURES[fig["measure"]][1]
        if fig["unit"] not in units:
            raise SuiteError(f"{at}.unit={fig['unit']!r} does not fit measure {fig['measure']}; use one of "
                             f"{', '.join(units)}")
        if isinstance(fig["value"], bool) or not isinstance(fig["value"], (int, float)):
            raise SuiteError(f"{at}.value={fig['value']!r} must be a number")
        if fig["compare"] == "ratio" and fig["value"] <= 0:
            raise SuiteError(f"{at}.value={fig['value']!r}: a ratio needs a positive number")
        if fig["compare"] not in COMPARE:
            raise SuiteError(f"{at}.compare={fig['compare']!r}: use absolute or ratio")
        if fig.get("ours") is None and not fig.get("not_run"):
            raise SuiteError(f"{at}: give ours (the arm set beside it: {', '.join(arms)}) or not_run "
                             f"(why this suite does not run it yet)")
        if fig.get("ours") is not None and fig["ours"] not in arms:
            raise SuiteError(f"{at}.ours={fig['ours']!r} is not an arm of the study; arms: {', '.join(arms)}")
        if fig["compare"] == "ratio" and _published_baseline(reference, fig) is None:
            raise SuiteError(f"{at}.compare=ratio needs a baseline (the figure's or reference.baseline) and a "
                             f"figure of that published arm with measure {fig['measure']}")
    if reference.get("verdicts") is not None:
        study_tables.check_verdicts(reference["verdicts"], arms, f"{where}.verdicts")
        for i, row in enumerate(reference["verdicts"]):
            entries(row["source"], f"{where}.verdicts.{i}.source")
    return reference


def load(path) -> dict:
    """A study folder's ``study.yaml`` (written by ``python -m suite.study``), its reference checked."""
    try:
        study = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise SuiteError(f"--study {path}: cannot read it ({str(e).splitlines()[0]}); give the study.yaml "
                         f"that python -m suite.study wrote in the study's folder") from None
    missing = [k for k in ("name", "profile", "repeats", "baseline", "arms", "reference")
               if not isinstance(study, dict) or k not in study]
    if missing:
        raise SuiteError(f"--study {path} lacks {', '.join(missing)}; give the study.yaml that python -m "
                         f"suite.study wrote")
    check_reference(study["reference"], study["arms"], f"{path}: reference")
    baselines(study["arms"], study["baseline"])
    if study.get("thresholds") is not None:
        study_tables.check_thresholds(study["thresholds"], f"{path}: thresholds")
    return study


def _published_baseline(reference: dict, fig: dict):
    base = fig.get("baseline") or reference.get("baseline")
    return next((f for f in reference["figures"] if f["published"] == base and f["measure"] == fig["measure"]),
                None) if base else None


def _ratio(measure: str, arm, baseline):
    """speed-up (base / arm) for times, arm / base for everything else."""
    if arm is None or baseline is None or arm == 0 or baseline == 0:
        return None
    return baseline / arm if MEASURES[measure][1] is TIME else arm / baseline


def _ours(runs, arm: str, measure: str) -> list[float]:
    values = [MEASURES[measure][3](r) for r in runs if r.arm == arm]
    return [v for v in values if v is not None]


def _in_unit(value_base: float, measure: str, unit: str) -> float:
    return value_base / MEASURES[measure][1][unit]


def _num(v) -> str:
    return f"{v:.4g}"


def _which_way(ours: float, theirs: float, what: str) -> str:
    """e.g. 'our speed-up is lower (0.42x theirs)'."""
    if theirs == 0:
        return "the published value is 0"
    rel = ours / theirs
    if abs(rel - 1) <= SAME_WITHIN:
        return f"{what} about the same ({rel:.2f}x theirs, within {SAME_WITHIN:.0%})"
    return f"{what} {'higher' if rel > 1 else 'lower'} ({rel:.2f}x theirs)"


def comparison_rows(study: dict, runs) -> list[dict]:
    """One row per published figure: theirs, ours (mean over repeats, min-max), and which way."""
    return [_row(fig, study, runs) for fig in study["reference"]["figures"]]


def _row(fig: dict, study: dict, runs) -> dict:
    reference, measure, unit = study["reference"], fig["measure"], fig["unit"]
    shown_arm = fig.get("ours") or "none"
    if fig.get("ours") and fig.get("not_run"):  # ours is an analogue of what the source ran
        shown_arm += f" (the published program is not run by this suite yet: {fig['not_run']})"
    row = {"published_arm": fig["published"], "ours_arm": shown_arm,
           "measure": f"{fig['what']} (ours: {MEASURES[measure][0]})",
           "source": ", ".join(entries(fig["source"], "source")),
           "hardware": fig.get("hardware") or reference["hardware"],
           "published": f"{_num(fig['value'])} {unit}", "ours": "", "compare": fig["compare"],
           "published_compared": "", "ours_compared": "", "differs": "", "because": because(fig)}
    theirs = fig["value"]
    our_base = baselines(study.get("arms", {}), study.get("baseline")).get(fig.get("ours"), study.get("baseline"))
    if fig["compare"] == "ratio":
        base_fig, units = _published_baseline(reference, fig), MEASURES[measure][1]
        theirs = _ratio(measure, fig["value"] * units[unit], base_fig["value"] * units[base_fig["unit"]])
        row["compare"] = f"ratio: {MEASURES[measure][2]} vs {base_fig['published']} / ours vs {our_base}"
        row["published_compared"] = f"{theirs:.3g}x" if theirs is not None else ""
    if fig.get("ours") is None:
        return {**row, "differs": f"not run by this suite yet: {fig['not_run']}"}
    values = [_in_unit(v, measure, unit) for v in _ours(runs, fig["ours"], measure)]
    if not values:
        return {**row, "differs": f"no completed run of arm {fig['ours']} measured {measure}"}
    ours = sum(values) / len(values)
    row["ours"] = f"{_num(ours)} {unit}" + (f" (mean of {len(values)}, min-max {_num(min(values))}-"
                                             f"{_num(max(values))})" if len(values) > 1 else "")
    if fig["compare"] == "absolute":
        data = {r.summary.get("data") for r in runs if r.arm == fig["ours"]}
        theirs_data = fig.get("data") or reference["data"]
        if data != {theirs_data}:
            return {**row, "differs": f"not comparable: ours trained on {', '.join(sorted(map(str, data)))}, the "
                                      f"published figure on {theirs_data} (profile {study.get('profile')})"}
        return {**row, "published_compared": row["published"], "ours_compared": f"{_num(ours)} {unit}",
                "differs": _which_way(ours, theirs, "ours is")}
    base_values = _ours(runs, our_base, measure)
    if not base_values:
        return {**row, "differs": f"no completed run of the baseline arm {our_base}"}
    ours_ratio = _ratio(measure, ours, _in_unit(tables.mean(base_values), measure, unit))
    return {**row, "ours_compared": f"{ours_ratio:.3g}x",
            "differs": _which_way(ours_ratio, theirs, f"our {MEASURES[measure][2]} is")}


def because(fig: dict) -> str:
    """The figure's ``why``, labelled: the reference-table rows it rests on, or ours (an assumption)."""
    if not fig.get("why"):
        return ""
    labels = []
    if fig.get("why_source") is not None:
        labels.append("source: " + ", ".join(entries(fig["why_source"], "why_source")))
    if fig.get("assumption"):
        labels.append("our assumption")
    if not labels:  # every sentence labelled ours: (check_sourcing)
        labels.append("ours")
    return f"{fig['why']} [{'; '.join(labels)}]"


COLUMNS = {"published_arm": "published arm", "ours_arm": "our arm", "measure": "measures",
           "source": "source (docs/studies.md)", "hardware": "published on", "published": "published",
           "ours": "ours", "compare": "compared as", "published_compared": "published (compared)",
           "ours_compared": "ours (compared)", "differs": "which way ours differs", "because": "differs because"}


def header(study: dict) -> str:
    """One paragraph naming the study, its source, profile and repeats (plain text)."""
    ref = study["reference"]
    bases = sorted(set(baselines(study["arms"], study["baseline"]).values()))
    return (f"Study {study['name']} (profile {study['profile']}, {study['repeats']} repeat(s) per arm, baseline "
            f"arm{'s' if len(bases) > 1 else ''} {', '.join(bases)}). Published figures from: {ref['source']}. Published on: {ref['hardware']}; "
            f"data: {ref['data']}. Ours: mean over repeats; min-max across repeats in brackets.")


def plot_groups(study: dict, runs) -> dict:
    """Plot name -> its runs: in a study, one plot per baseline arm with the arms dividing by it
    (so a study of several models draws each model apart, whatever its arms' batch sizes); runs of
    no arm of the study by their experiment."""
    base = baselines(study["arms"], study["baseline"])
    groups: dict = {}
    for r in runs:
        groups.setdefault(base.get(r.arm) or r.experiment, []).append(r)
    return groups
