"""The CUDA branches of the per-rank code, run on CPU with the CUDA calls faked where faking says
something: the process group bound to the rank's GPU (device_id, as torchtitan makes it), NCCL's
settings in the record, background checkpoints staged in pinned host memory through DCP's stager
instead of a clone in GPU memory, and this rank's CUDA RNG state in its checkpoint."""
import torch
import torch.distributed as dist

from suite.train import checkpoint, dist as sdist
from tests.harness import run_ranks


def test_a_cuda_rank_binds_its_process_group_to_its_gpu(monkeypatch):
    calls = {}
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")
    monkeypatch.delenv("SCALESUITE_RENDEZVOUS", raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.setdefault("set_device", device))
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: calls.update(backend=backend, **kw))
    monkeypatch.setattr(sdist, "choose_network", lambda interface=None: None)
    ctx = sdist.init(device="cuda")
    assert ctx.device == torch.device("cuda", 1) and calls["set_device"] == torch.device("cuda", 1)
    assert calls["backend"] == "nccl" and calls["device_id"] == torch.device("cuda", 1)


def test_a_cpu_rank_leaves_device_id_out(monkeypatch):
    calls = {}
    for key, value in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                           MASTER_PORT="1").items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: calls.update(backend=backend, **kw))
    sdist.init(device="cpu")
    assert calls["backend"] == "gloo" and "device_id" not in calls


def test_nccl_s_version_and_settings_are_recorded(monkeypatch):
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 27, 3))
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "ib0")
    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    settings = sdist.nccl_settings("nccl")
    assert settings["version"] == "2.27.3"
    assert {"NCCL_SOCKET_IFNAME": "ib0", "NCCL_DEBUG": "WARN"}.items() <= settings["env"].items()
    assert all(k.startswith("NCCL_") for k in settings["env"])
    assert sdist.nccl_settings("gloo") == {}


class RecordingStager:
    made = []

    def __init__(self, options):
        self.options, self.staged = options, []
        RecordingStager.made.append(self)

    def stage(self, state):
        self.staged.append(state)
        return {"staged": True}


def test_a_cuda_save_stages_in_pinned_host_memory_through_dcp_once_per_process(monkeypatch):
    import torch.distributed.checkpoint.staging as staging

    monkeypatch.setattr(staging, "DefaultStager", RecordingStager)
    monkeypatch.setattr(checkpoint, "_cuda_stager", None)
    RecordingStager.made.clear()
    state = {"model": {"w": torch.ones(2)}}
    assert checkpoint.stage(state, torch.device("cuda", 0)) == {"staged": True}
    checkpoint.stage(state, torch.device("cuda", 0))
    (stager,) = RecordingStager.made  # one stager: its pinned buffers serve every save
    o = stager.options
    assert o.use_pinned_memory and o.use_non_blocking_copy and not o.use_async_staging and not o.use_shared_memory
    assert len(stager.staged) == 2
    copied = checkpoint.stage(state, torch.device("cpu"))  # CPU: a clone, no stager
    assert len(stager.staged) == 2 and torch.equal(copied["model"]["w"], state["model"]["w"])


def test_an_older_torch_stages_through_dcp_s_blocking_stager_with_pinned_cached_buffers(monkeypatch):
    import torch.distributed.checkpoint.staging as staging

    monkeypatch.delattr(staging, "DefaultStager")
    monkeypatch.setattr(checkpoint, "_cuda_stager", None)
    stager = checkpoint._stager()
    assert isinstance(stager, staging.BlockingAsyncStager) and stager.cache_staged_state_dict


def _stage_a_sharded_state():
    """DCP's stager as the CUDA path uses it, with the CPU's options: a DTensor stays sharded, the
    copy does not move when training changes the originals, and the next save reuses its buffers."""
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    dist.init_process_group("gloo")
    try:
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        w = distribute_tensor(torch.arange(8.0).reshape(4, 2), mesh, [Shard(0)])
        state = {"model": {"w": w}, "optimizer": {"w": {"step": torch.tensor(3.0), "lr": 0.1}}}
        stager = DefaultStager(StagingOptions(use_pinned_memory=False, use_shared_memory=False,
                                              use_async_staging=False, use_non_blocking_copy=False))
        staged = stager.stage(state)
        before = staged["model"]["w"].to_local().clone()
        w.to_local().add_(100.0)  # training goes on
        kept = torch.equal(staged["model"]["w"].to_local(), before)
        again = stager.stage(state)
        return (isinstance(staged["model"]["w"], DTensor), staged["model"]["w"].placements == (Shard(0),), kept,
                again["model"]["w"].to_local().data_ptr() == staged["model"]["w"].to_local().data_ptr(),
                staged["optimizer"]["w"]["lr"])
    finally:
        dist.destroy_process_group()


def test_dcp_s_stager_serves_a_sharded_neutral_state():
    for is_dtensor, sharded, kept, reused, lr in run_ranks(_stage_a_sharded_state, 2):
        assert is_dtensor and sharded and kept and reused and lr == 0.1


def test_this_rank_s_cuda_rng_state_is_saved_and_restored(monkeypatch):
    device_state = {"now": torch.tensor([1, 2, 3], dtype=torch.uint8)}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": device_state["now"].clone())
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device="cuda": device_state.update(now=state))
    saved = checkpoint._rng_state()
    assert torch.equal(saved["cuda"], torch.tensor([1, 2, 3], dtype=torch.uint8))
    device_state["now"] = torch.tensor([9, 9, 9], dtype=torch.uint8)  # the generator moved on
    checkpoint._set_rng_state(saved)
    assert torch.equal(device_state["now"], torch.tensor([1, 2, 3], dtype=torch.uint8))
