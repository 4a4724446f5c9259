"""The per-rank torch files of a neutral checkpoint (suite.train.rank_files): what each rank
writes and how a reader's template is filled. Resuming across strategies and world sizes through
them (and through DCP for DTensor states) is tests/train/test_any_to_any_resume.py."""
import pytest
import torch

from suite.train import rank_files


def _state(scale=1.0):
    return {"model": {"a.weight": torch.full((2, 3), scale), "a.bias": torch.zeros(2)},
            "optimizer": {"a.weight": {"exp_avg": torch.ones(2, 3) * scale, "step": torch.tensor(3.0)}}}


def test_flat_keys_are_the_dotted_paths():
    assert sorted(rank_files.flat(_state())) == ["model.a.bias", "model.a.weight", "optimizer.a.weight.exp_avg",
                                                "optimizer.a.weight.step"]


def test_one_process_writes_everything_and_a_template_is_filled_in_its_own_dtype(tmp_path):
    is_whole, mine = rank_files.plan(_state(2.0))
    assert is_whole and len(mine) == 4
    rank_files.write(tmp_path / "model", 0, mine)
    assert rank_files.present(tmp_path / "model") and not rank_files.present(tmp_path)
    template = _state(0.0)
    template["model"]["a.weight"] = template["model"]["a.weight"].double()
    rank_files.fill(template, rank_files.read(tmp_path / "model"))
    assert template["model"]["a.weight"].dtype == torch.float64 and template["model"]["a.weight"].eq(2).all()
    assert template["optimizer"]["a.weight"]["exp_avg"].eq(2).all() and template["optimizer"]["a.weight"]["step"] == 3


def test_files_of_several_ranks_are_merged_and_a_missing_entry_is_named(tmp_path):
    entries = rank_files.flat(_state(5.0))
    stage0 = {k: v for k, v in entries.items() if k.startswith("model.")}
    rank_files.write(tmp_path, 0, stage0)
    rank_files.write(tmp_path, 1, {})  # a replica with nothing of its own writes no file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0.pt"]
    with pytest.raises(KeyError, match="optimizer.a.weight.exp_avg"):
        rank_files.fill(_state(), rank_files.read(tmp_path))
    rank_files.write(tmp_path, 1, {k: v for k, v in entries.items() if k not in stage0})
    template = _state()
    rank_files.fill(template, rank_files.read(tmp_path))
    assert template["optimizer"]["a.weight"]["exp_avg"].eq(5).all() and template["model"]["a.weight"].eq(5).all()
