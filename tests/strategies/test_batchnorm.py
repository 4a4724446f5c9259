"""Synced batch norm (suite.strategies.batchnorm) on 2 CPU ranks computes what one batch norm
computes on the whole batch: outputs, input and parameter gradients, running statistics; and
the facts it exists for: torch 2.14's own SyncBatchNorm does not run on CPU.

Compared in float64, where rounding order cannot decide the outcome: the synced layer sums in
its own order (native per-rank reductions, then across ranks), which in float32 may round
differently from native batch norm's kernel, and differently again on a CPU with other vector
kernels. In float64 those differences are ~1e-15; a wrong formula is off by 1e-2 or more."""
import pytest
import torch
import torch.distributed as dist
from torch import nn

from suite.strategies.layout import build as build_layout
from suite.strategies import STRATEGIES, batchnorm
from suite.strategies.context import DistContext
from tests.harness import run_ranks

pytestmark = pytest.mark.parity  # every test here: rerun under each CPU kernel set

WORLD = 2
# One layer's float64 outputs and gradients: a few float64 roundings apart (sums in another order),
# relative for the parameter gradients, which sum 100-odd terms to values of ~20.
CLOSE = {"atol": 1e-12, "rtol": 1e-12}


def _layer(kind, **kwargs):
    torch.manual_seed(0)
    layer = kind(4, **kwargs).double()
    with torch.no_grad():  # not the defaults 1 and 0: gradients through weight and bias matter
        if layer.weight is not None:
            layer.weight.uniform_(0.5, 1.5)
        if layer.bias is not None:
            layer.bias.uniform_(-0.5, 0.5)
    return layer


def _whole_and_halves(kind, shape, **kwargs):
    """(per-rank results, results on the whole batch): output, input gradient, parameter
    gradients and running statistics after two training steps, then an eval output."""
    g = torch.Generator().manual_seed(1)
    x = 3 + 2 * torch.randn(shape, generator=g, dtype=torch.float64)  # mean far from 0: cancellation would show
    probe = torch.randn(shape, generator=g, dtype=torch.float64)  # a loss that weights every output differently

    def run(layer, x, probe):
        x = x.clone().requires_grad_()
        for _ in range(2):
            out = layer(x)
        (out * probe).sum().backward()
        grads = {n: p.grad for n, p in layer.named_parameters()}
        layer.eval()
        return {"out": out.detach(), "x_grad": x.grad, **grads, "eval": layer(x).detach(),
                **{n: b.clone() for n, b in layer.named_buffers()}}

    whole = run(_layer(kind, **kwargs), x, probe)

    def rank_part():
        dist.init_process_group("gloo")
        try:
            rank = dist.get_rank()
            layer = batchnorm.sync(_layer(kind, **kwargs), dist.group.WORLD, torch.device("cpu"))
            # numpy: torch would share the tensors' memory with the parent, gone with the process
            return {k: v.numpy() for k, v in run(layer, x.chunk(WORLD)[rank], probe.chunk(WORLD)[rank]).items()}
        finally:
            dist.destroy_process_group()

    ranks = [{k: torch.from_numpy(v) for k, v in got.items()} for got in run_ranks(rank_part, WORLD)]
    return ranks, whole


@pytest.mark.slow
@pytest.mark.parametrize("kind, shape, kwargs", [
    (nn.BatchNorm2d, (8, 4, 5, 5), {}),
    (nn.BatchNorm1d, (8, 4), {}),
    (nn.BatchNorm1d, (8, 4, 3), {"momentum": None}),  # cumulative running average
    (nn.BatchNorm3d, (4, 4, 2, 3, 3), {"affine": False}),
])
def test_synced_batchnorm_on_2_ranks_computes_what_one_batchnorm_computes_on_the_whole_batch(kind, shape, kwargs):
    ranks, whole = _whole_and_halves(kind, shape, **kwargs)
    for rank, got in enumerate(ranks):
        for key in ("out", "x_grad", "eval"):
            torch.testing.assert_close(got[key], whole[key].chunk(WORLD)[rank], **CLOSE)
        for key in ("running_mean", "running_var", "num_batches_tracked"):
            torch.testing.assert_close(got[key], whole[key], **CLOSE)
    for key in ("weight", "bias"):
        if key in whole:  # each rank holds its samples' share; DDP adds them up (and divides by 2 in both)
            torch.testing.assert_close(ranks[0][key] + ranks[1][key], whole[key], **CLOSE)


def test_plain_batchnorm_on_half_batches_differs():
    """The comparison above can fail: without syncing, each half is normalised on its own."""
    x = 3 + 2 * torch.randn(8, 4, 5, 5, dtype=torch.float64)
    whole, half = _layer(nn.BatchNorm2d)(x), _layer(nn.BatchNorm2d)(x[:4])
    assert (whole[:4] - half).abs().max() > 0.01


def test_syncing_keeps_the_layers_their_parameters_and_state_dict_keys():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Sequential(nn.BatchNorm1d(4)))
    before = {k: v for k, v in model.state_dict().items()}
    params = list(model.parameters())
    synced = batchnorm.sync(model, None, torch.device("cpu"))
    assert synced is model and list(synced.parameters()) == params
    assert list(synced.state_dict()) == list(before)
    assert batchnorm.is_synced(model[1]) and batchnorm.is_synced(model[2][0]) and not batchnorm.is_synced(model[0])


@pytest.mark.slow
def test_torch_syncbatchnorm_does_not_run_on_cpu():
    """Why the suite has its own: if this starts failing, torch's may now do (re-check, docs/strategies.md)."""
    def rank_part():
        dist.init_process_group("gloo")
        try:
            errors = []
            for attempt in (lambda: nn.SyncBatchNorm(4)(torch.randn(4, 4, 2, 2)),
                            lambda: nn.parallel.DistributedDataParallel(nn.SyncBatchNorm(4))):
                try:
                    attempt()
                except ValueError as e:
                    errors.append(str(e))
            return errors
        finally:
            dist.destroy_process_group()

    errors = run_ranks(rank_part, WORLD)[0]
    assert len(errors) == 2
    assert "expected input tensor to be on GPU" in errors[0]
    assert "SyncBatchNorm layers only work with GPU modules" in errors[1]


@pytest.mark.parametrize("strategy, world, groups", [
    ({"name": "ddp"}, 2, [[0, 1]]),
    ({"name": "fsdp", "replicate": 2}, 4, [[0, 1, 2, 3]]),  # replicas and shards all read their own samples
    ({"name": "pipeline", "stages": 2, "dp": 2}, 4, [[0, 2], [1, 3]]),  # same stage, other samples
    ({"name": "ds_pipeline", "stages": 2}, 4, [[0, 1], [2, 3]]),
    ({"name": "tensor", "tp": 2, "dp": 2}, 4, [[0, 2], [1, 3]]),
])
def test_batchnorm_syncs_over_the_ranks_that_hold_the_same_part_of_the_model(strategy, world, groups):
    options = STRATEGIES[strategy["name"]].Options(**strategy)
    assert build_layout(options, world_size=world, batch_size=64).dp_groups() == groups


def test_one_data_parallel_rank_leaves_batchnorm_alone():
    from suite.strategies.engine import Setup

    layout = build_layout(STRATEGIES["layer_split"].Options(), world_size=1, batch_size=8, devices_per_task=2)
    ctx = DistContext(0, 1, 0, 1, torch.device("cpu"), "gloo", (torch.device("cpu"),) * 2)
    setup = Setup(ctx=ctx, build_model=None, make_optimizer=None, task=None, layout=layout, sync_batchnorm=True)
    model = setup.prepare(nn.Sequential(nn.BatchNorm1d(4)))
    assert setup.batchnorm_group() is None and not batchnorm.is_synced(model[0])


@pytest.mark.slow
@pytest.mark.parametrize("model", ["resnet18", "mobilenet_v2"])
def test_synced_batchnorm_on_one_rank_computes_what_torchs_computes_in_a_whole_model(model):
    """Outputs and every parameter gradient of a whole network, synced over a group of one
    against native batch norm, in float64: equal to rounding (1e-10 of each tensor's scale), where an error in
    the backward formula moves the first convolution's gradient by far more."""
    import copy

    from suite.data import DataSpec
    from suite.models import MODELS, build

    options = {"resnet18": {"width": 0.125}, "mobilenet_v2": {"width": 0.25, "dropout": 0.0}}[model]
    torch.manual_seed(1)
    native = build(MODELS[model][0](**options), DataSpec("synthetic", (3, 32, 32), 10)).double()
    x, y = torch.randn(8, 3, 32, 32, dtype=torch.float64), torch.randint(0, 10, (8,))

    def rank_part():
        dist.init_process_group("gloo")
        try:
            synced = batchnorm.sync(copy.deepcopy(native), dist.group.WORLD, torch.device("cpu"))
            results = []
            for net in (native, synced):
                out = net(x)
                torch.nn.functional.cross_entropy(out, y).backward()
                results.append([out.detach()] + [p.grad for p in net.parameters()])
            # relative to the tensor's scale, at least 1: convolutions' biases before batch norm have
            # gradients that are 0 but for rounding (~1e-17), which no relative error can judge
            return [((a - b).abs().max() / b.abs().max().clamp(min=1)).item() for a, b in zip(*results)]
        finally:
            dist.destroy_process_group()

    relative = run_ranks(rank_part, 1)[0]
    assert len(relative) > 40 and max(relative) < 1e-10, max(relative)


@pytest.mark.slow
def test_synced_batchnorm_layer_computes_what_torchs_computes_for_every_plane_size():
    """Feature planes of every size (2x2 ... 14x14: MNIST-sized maps; 32x32), on one rank, float64."""
    def rank_part():
        dist.init_process_group("gloo")
        try:
            worst = {}
            for side in (1, 2, 3, 4, 7, 14, 32):
                x = 3 + 2 * torch.randn(6, 4, side, side, dtype=torch.float64)
                probe = torch.randn_like(x)
                results = []
                for synced in (False, True):
                    layer = _layer(nn.BatchNorm2d)
                    if synced:
                        batchnorm.sync(layer, dist.group.WORLD, torch.device("cpu"))
                    leaf = x.clone().requires_grad_()
                    out = layer(leaf)
                    (out * probe).sum().backward()
                    results.append([out.detach(), leaf.grad, layer.weight.grad, layer.bias.grad,
                                    layer.running_mean, layer.running_var])
                worst[side] = max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(*results))
            return worst
        finally:
            dist.destroy_process_group()

    worst = run_ranks(rank_part, 1)[0]
    assert all(w < 1e-12 for w in worst.values()), worst


@pytest.mark.slow
def test_a_wrong_backward_formula_is_caught_by_the_float64_comparison(monkeypatch):
    """The comparisons above can fail: drop the dy * x_hat term's all-reduce (each rank then uses
    its own samples' sum) and the 2-rank input gradients part from the whole batch's."""
    real = dist.all_reduce

    def local_only(tensor, *args, **kwargs):  # the backward's one all-reduce: skipped
        return None

    monkeypatch.setattr(dist, "all_reduce", local_only)
    try:
        ranks, whole = _whole_and_halves(nn.BatchNorm2d, (8, 4, 5, 5))
    finally:
        monkeypatch.setattr(dist, "all_reduce", real)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(ranks[0]["x_grad"], whole["x_grad"].chunk(WORLD)[0], **CLOSE)


@pytest.mark.slow
def test_synced_batchnorm_runs_under_bf16_autocast_with_float32_statistics():
    """bf16 autocast hands batch norm bf16 inputs: the synced layer keeps float32 statistics, as
    native batch norm does (its first native version mixed bf16 and float32 and failed here)."""
    import copy

    def rank_part():
        dist.init_process_group("gloo")
        try:
            torch.manual_seed(0)
            native = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
            synced = batchnorm.sync(copy.deepcopy(native), dist.group.WORLD, torch.device("cpu"))
            x = 3 + 2 * torch.randn(4, 3, 8, 8)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                outs = [net(x) for net in (native, synced)]
            outs[1].float().sum().backward()
            return (outs[1].dtype == torch.bfloat16, synced[1].running_var.dtype == torch.float32,
                    (outs[0].float() - outs[1].float()).abs().max().item(),
                    (native[1].running_var - synced[1].running_var).abs().max().item())
        finally:
            dist.destroy_process_group()

    bf16_out, float_stats, out_diff, var_diff = run_ranks(rank_part, 1)[0]
    assert bf16_out and float_stats
    assert out_diff <= 2 ** -6 and var_diff <= 1e-5  # a bf16 ulp at |out| < 4; statistics in float32
