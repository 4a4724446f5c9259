"""Whatever a recipe or an override holds (wrong types, out-of-range numbers, unknown keys, odd
strings, YAML tags), loading, validating and the dry run's estimate either succeed or raise a
SuiteError of one line: never another exception."""
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from suite import recipe as recipes
from suite.common.errors import SuiteError
from suite.submit import preflight

QUICKSTART = Path("recipes/quickstart.yaml").read_text()
KEYS = ["name", "sweep", "model", "model.name", "model.hidden", "model.dim", "model.heads", "model.width",
        "model.base_channels", "model.vocab", "data", "data.name", "data.shape", "data.classes", "data.n_train",
        "data.vocab", "data.seq_len", "data.branching", "data.limit_train", "data.val_fraction", "data.root",
        "strategy", "strategy.name", "strategy.stages", "strategy.micro_batches", "strategy.schedule", "strategy.dp",
        "strategy.tp", "strategy.stage", "strategy.split_at", "strategy.replicate", "optimizer.name", "optimizer.lr",
        "optimizer.betas", "optimizer.momentum", "training.epochs", "training.batch_size", "training.seed",
        "training.precision", "training.grad_accumulation", "training.max_steps", "launch.tasks_per_node",
        "launch.nodes", "launch.executor", "launch.device", "launch.cpus_per_task", "launch.mem_gb",
        "launch.sbatch_extra", "tracking.wandb", "tracking.sample_interval_s", "sweep.training.seed",
        "sweep.strategy.name", "training", "launch", "optimizer.schedule", "optimizer.schedule.name",
        "optimizer.schedule.step_size_epochs", "optimizer.schedule.milestones_steps", "optimizer.schedule.min_lr",
        "data.augment", "data.augment.crop_padding", "data.normalize", "data.normalize.mean"]
NAMES = ["mlp", "cnn", "vgg11", "autoencoder", "transformer", "digits", "synthetic", "synthetic_tokens", "mnist",
         "ddp", "single", "pipeline", "tensor", "zero", "fsdp", "layer_split", "1f1b", "gpipe", "adam", "bf16", "fp16", "step", "cosine"]
# Counts kept small: a model with a million layers is valid, only slow to build even on the meta device.
INTS = st.integers(-3, 70) | st.sampled_from([0, -1, 2**31, 2**63, 2**64, 10**30])
SCALARS = (st.none() | st.booleans() | INTS | st.floats(allow_nan=True, allow_infinity=True)
           | st.sampled_from(NAMES) | st.text(max_size=20))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    st.sampled_from(["name", "hidden", "seed", "x", "1"]) | st.text(max_size=5), inner, max_size=3), max_leaves=8)
KEY = st.sampled_from(KEYS) | st.text(max_size=15)
TAGGED = st.sampled_from(["!!python/object/apply:os.system [echo hi]", "!!binary aGk=", "!!set {a, b}",
                          "!!timestamp 2024-01-01", "[1, 2", "{a: ", "&a [*a]", "!!float nan", "'unclosed",
                          "2024-01-01", "0x1F", "1e5", "~", "\t", "- a\n- b"])


def value_text(value) -> str:
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


OVERRIDE = st.one_of(st.tuples(KEY, VALUES.map(value_text)), st.tuples(KEY, TAGGED), st.tuples(KEY, st.text(max_size=20)))


def loads_or_says_one_line(path, overrides):
    try:
        for r in recipes.load(path, overrides):
            preflight.estimate(r)
    except SuiteError as e:
        message = str(e)
        assert message and "\n" not in message and "\r" not in message, repr(message)


@pytest.mark.slow
@settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(st.lists(OVERRIDE, max_size=4))
def test_any_override_loads_or_gives_one_line(overrides):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "r.yaml"
        path.write_text(QUICKSTART)
        loads_or_says_one_line(path, [f"{k}={v}" for k, v in overrides])


@pytest.mark.slow
@settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(st.dictionaries(KEY, VALUES, max_size=5), st.one_of(st.none(), TAGGED, st.binary(max_size=30)))
def test_any_recipe_file_loads_or_gives_one_line(changes, extra):
    raw = yaml.safe_load(QUICKSTART)
    for key, value in changes.items():
        try:
            recipes.set_path(raw, key, value) if key else None
        except SuiteError:
            pass
    text = yaml.safe_dump(raw, allow_unicode=True).encode()
    if isinstance(extra, str):
        text += f"extra: {extra}\n".encode()
    elif isinstance(extra, bytes):
        text = extra + text
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "r.yaml"
        path.write_bytes(text)
        loads_or_says_one_line(path, [])
