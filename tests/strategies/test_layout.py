"""The parallel plan (suite.plan): one place for mesh degrees and the batch split. Its rank
coordinates agree with torch's DeviceMesh, and a bad degree or batch is one line naming the key."""
import subprocess
import sys
from types import SimpleNamespace

import pytest

from suite.strategies import layout as layouts
from suite.common.errors import SuiteError
from suite.strategies.layout import Axis
from tests.harness import run_ranks
from tests.parity import BASE, make_recipe


def _options(name, axes, chunks=1):
    return SimpleNamespace(name=name, mesh_axes=lambda: axes, pipeline_chunks=lambda: chunks)


def test_the_batch_splits_into_ranks_accumulation_steps_and_pipeline_chunks():
    opts = _options("p", [Axis("data", None, "strategy.dp", data=True), Axis("pipeline", 2, "strategy.stages")], 4)
    layout = layouts.build(opts, world_size=4, batch_size=64, accumulation_steps=2)
    assert (layout.dp_size, layout.rank_batch, layout.accumulation_batch, layout.chunk_batch) == (2, 32, 16, 4)


def test_ranks_that_differ_only_outside_the_data_axes_share_a_shard():
    pipeline = make_recipe({"name": "pipeline", "dp": 2, "stages": 2}, world_size=4).layout()  # data outer
    assert [pipeline.dp_rank(r) for r in range(4)] == [0, 0, 1, 1]
    assert pipeline.coordinates(3) == {"data": 1, "pipeline": 1}
    ds = make_recipe({"name": "ds_pipeline", "stages": 2, "micro_batches": 2}, world_size=4).layout()  # data inner
    assert [ds.dp_rank(r) for r in range(4)] == [0, 1, 0, 1]
    hybrid = make_recipe({"name": "fsdp", "replicate": 2}, world_size=4).layout()  # both axes read data
    assert [hybrid.dp_rank(r) for r in range(4)] == [0, 1, 2, 3]


def _mesh_ranks(layout):
    from suite.train import dist as sdist

    ctx = sdist.init("cpu")
    try:
        mesh = layout.device_mesh(ctx)
        return {name: mesh.get_local_rank(name) for name in layout.axes}, layout.coordinates(ctx.rank)
    finally:
        sdist.close()


@pytest.mark.slow
def test_coordinates_are_those_of_torchs_device_mesh():
    layout = make_recipe({"name": "tensor", "dp": 2}, world_size=4).layout()
    for from_mesh, from_plan in run_ranks(_mesh_ranks, 4, layout):
        assert from_mesh == from_plan


@pytest.mark.parametrize("strategy, world, training, fragment", [
    ({"name": "fsdp", "replicate": 3}, 4, {}, "strategy.replicate=3 x strategy.shard=? does not fit world size 4"),
    ({"name": "pipeline", "micro_batches": 3}, 2, {}, "strategy.micro_batches=3 must divide the batch of each "
                                                      "data-parallel rank (training.batch_size=32 / 1 = 32)"),
    ({"name": "ddp"}, 2, {"batch_size": 30, "grad_accumulation": 2},
     "training.batch_size=30 must divide into 2 data-parallel ranks x 2 accumulation steps; use a multiple of 4"),
])
def test_bad_degrees_and_batches_are_one_line_naming_the_key(strategy, world, training, fragment):
    with pytest.raises(SuiteError) as err:
        make_recipe(strategy, world_size=world, training={**BASE["training"], **training})
    assert fragment in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow
def test_the_plan_is_torch_free_at_import():
    code = "import sys, suite.plan; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
