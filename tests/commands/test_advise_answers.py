"""The advisor's answers a practitioner would take: the memory of a configuration is the plan's
for it (one code path), fits are decided on that figure, tensor parallelism stays within a node
unless asked, a model that fits one device is told so (with how many ranks its batch feeds and
--weak-scaling), the configurations left out come one line per reason with a count (every one
with --verbose), and a bad key=value is refused once, before the search."""
import csv
import re
import subprocess
import sys

import pytest

from suite.planner import hardware, search, table
from tests.commands.test_advise import _clean, _env

pytestmark = pytest.mark.slow  # starts ranks or fake runs: not in the fast tier

# A Llama of 4 blocks at sequence 256: its activations dwarf its weights, so checkpointing decides
# whether it fits (the analytic rule on the bare model never applied checkpointing).
LLAMA = {"name": "t", "model": {"name": "llama", "dim": 64, "layers": 4, "heads": 4, "kv_heads": 2},
         "data": {"name": "synthetic_tokens", "vocab": 64, "seq_len": 256, "n_train": 64, "n_val": 8},
         "strategy": {"name": "fsdp"}, "optimizer": {"name": "adamw", "lr": 0.001},
         "training": {"epochs": 1, "batch_size": 16, "seed": 0}, "launch": {"tasks_per_node": 2},
         "tracking": {"wandb": "disabled"}}
QUIET = {"progress": lambda _: None}


def _plans_peak(raw: dict, checkpointing) -> int:
    """What python -m suite.plan says for fsdp at 2 ranks (its own code path)."""
    raw = {**raw, "training": {**raw["training"], "activation_checkpointing": checkpointing}}
    (point,) = table.plan(raw, [("fsdp", {"name": "fsdp"})], [2], jobs=1, **QUIET)
    return point.profile.peak_bytes


def test_the_advisor_sizes_and_fits_a_configuration_as_the_plan_does():
    plain, selective, full = (_plans_peak(LLAMA, checkpointing) for checkpointing in (False, "selective", True))
    assert plain > selective > full  # the premise: how much is recomputed decides whether it fits
    h100, fsdp = hardware.preset("h100"), [("fsdp", {"name": "fsdp"})]
    for memory, checkpointing in ((selective, "selective"), (full, True)):
        (c,) = search.search(LLAMA, 1, 2, h100, memory, strategies=fsdp, **QUIET)
        assert not c.excluded, c.excluded
        # The cheapest try that fits by the plan's figure, not an accumulation the analytic rule asked for.
        assert (c.checkpointing, c.accumulation) == (checkpointing, 1)
        assert c.profile.peak_bytes == memory
        assert f"training.activation_checkpointing={str(checkpointing).lower()}" in c.overrides
    # A byte under the plan's figure: left out, or accumulating to fit under it.
    (c,) = search.search(LLAMA, 1, 2, h100, full - 1, strategies=fsdp, **QUIET)
    assert c.excluded or (c.accumulation > 1 and c.profile.peak_bytes < full)


def test_a_configuration_listed_as_fitting_fits():
    h100 = hardware.preset("h100")
    memory = _plans_peak(LLAMA, True)  # fsdp fully checkpointed: the other layouts must get under it too
    specs = [("fsdp", {"name": "fsdp"}), ("ddp", {"name": "ddp"}), ("tensor", {"name": "tensor", "dp": 1, "tp": 2})]
    for c in search.search(LLAMA, 1, 2, h100, memory, strategies=specs, **QUIET):
        assert c.excluded or c.profile.peak_bytes <= memory, (c.name, c.profile.peak_bytes, memory)


def test_tensor_parallelism_stays_within_a_node_unless_asked():
    raw = {**LLAMA, "model": {**LLAMA["model"], "heads": 4, "kv_heads": 4}}
    specs = [("tensor:dp=1:tp=4", {"name": "tensor", "dp": 1, "tp": 4}),
             ("tensor:dp=2:tp=2", {"name": "tensor", "dp": 2, "tp": 2})]
    h100 = hardware.preset("h100")
    spans, within = sorted(search.search(raw, 2, 2, h100, 2**40, strategies=specs, fake=False, **QUIET),
                           key=lambda c: c.label)
    assert spans.label == "tensor:dp=1:tp=4" and "would span nodes" in spans.excluded
    assert "--tensor-across-nodes" in spans.excluded
    assert within.label == "tensor:dp=2:tp=2" and not within.excluded, within.excluded
    asked = search.search(raw, 2, 2, h100, 2**40, strategies=specs[:1], fake=False, tensor_across_nodes=True, **QUIET)
    assert not asked[0].excluded, asked[0].excluded


def _advise(tmp_path, *args, timeout=600):
    return subprocess.run([sys.executable, "-m", "suite.advise", "recipes/quickstart.yaml", "--hardware", "h100",
                           "--runs", str(tmp_path / "runs"), *args],
                          capture_output=True, text=True, timeout=timeout, env=_env(tmp_path))


@pytest.fixture(scope="module")
def mlp_at_1024(tmp_path_factory):
    """The README's 3-layer MLP (global batch 64) offered 128 nodes of 8: its advice, and the
    same with --verbose."""
    tmp_path = tmp_path_factory.mktemp("advise1024")
    short = _advise(tmp_path, "--nodes", "128", "--per-node", "8", "--out", str(tmp_path / "a"))
    full = _advise(tmp_path, "--nodes", "128", "--per-node", "8", "--out", str(tmp_path / "b"), "--verbose")
    return short, full, tmp_path


def test_a_model_that_fits_one_device_is_told_so_with_the_ranks_its_batch_feeds(mlp_at_1024):
    proc, _, tmp_path = mlp_at_1024
    _clean(proc)
    text = " ".join(proc.stdout.split())
    assert "The model fits one device" in text and "needs no model parallelism" in text
    assert "The global batch of 64 feeds at most 64 data-parallel ranks of the 1024 offered" in text
    assert "--nodes 8 --per-node 8" in text and "--weak-scaling" in text
    ranked = list(csv.DictReader(open(tmp_path / "a" / "advice.csv")))
    # Nothing a practitioner would not run: no tensor parallelism over nodes (tp 8 at most here).
    for r in ranked:
        tp = re.search(r"strategy.tp=(\d+)", r["overrides"])
        assert not tp or int(tp.group(1)) <= 8, r


def _named(left_out: str) -> int:
    return sum(len(re.match(r"- (.+?): \S", line).group(1).split(", ")) for line in left_out.splitlines()
               if line.startswith("- "))


def test_left_out_is_one_line_per_reason_with_a_count_and_every_one_with_verbose(mlp_at_1024):
    short, full, tmp_path = mlp_at_1024
    total = int(re.search(r"^## Left out \((\d+)\)", short.stdout, re.M).group(1))
    lines = [line for line in short.stdout.split("## Left out")[1].splitlines() if line.startswith("- ")]
    counts = [int(re.match(r"- (\d+) configurations? \(", line).group(1)) for line in lines]
    assert sum(counts) == total and len(lines) <= 12 < total, lines
    assert re.search(r"^- \d+ configurations \(.*\): training.batch_size=64 must divide into \d+ data-parallel ranks",
                     short.stdout, re.M)
    assert "--verbose (and advice.md) lists every configuration left out" in short.stdout
    verbose = full.stdout.split("## Left out")[1]
    assert _named(verbose) == total
    assert _named((tmp_path / "a" / "advice.md").read_text().split("## Left out")[1]) == total  # the record: all
    assert re.search(r"^- (.*, )?tensor:dp=16:tp=64(, .*)?: its tensor-parallel groups of 64 ranks would span nodes",
                     verbose, re.M)


def test_a_bad_override_is_refused_once_before_the_search(tmp_path):
    proc = _advise(tmp_path, "--nodes", "1", "--per-node", "2", "training.epochs=abc", "--out", str(tmp_path / "a"),
                   timeout=120)
    assert proc.returncode == 2, proc.stdout[-1000:] + proc.stderr[-2000:]
    assert proc.stderr.strip().count("\n") == 0 and "training.epochs" in proc.stderr, proc.stderr
    assert proc.stdout == "" and "sized" not in proc.stderr


def test_a_batch_too_small_for_the_ranks_offers_weak_scaling_whether_or_not_the_model_fits_one_device():
    from suite.advise import output

    raw = {"training": {"batch_size": 16}}
    say = lambda single, weak=False: " ".join(output.fewer_devices(single, raw, 1024, 8, weak))  # noqa: E731
    big = say(None)  # a model that needs several devices: no run on 16 ranks is suggested
    assert "feeds at most 16 data-parallel ranks of the 1024 offered" in big and "--weak-scaling" in big
    assert "fits one device" not in big and "--nodes" not in big
    assert say(None, weak=True) == "" and " ".join(output.fewer_devices(None, raw, 16, 8, False)) == ""
    assert output.fed_ranks(16, 1024, 8) == 16 and output.fed_ranks(64, 1024, 8) == 64
    assert output.fed_ranks(12, 1024, 8) == 4  # 12 ranks would not fill whole nodes of 8: 4 of one node
