"""Bad input gets one clear line naming the key, the value and the fix, and exit code 2."""
import subprocess
import sys

import pytest

from suite.submit import cli as submit

QUICKSTART = "recipes/quickstart.yaml"


def run_cli(capsys, *args):
    code = submit.main([QUICKSTART, *args, "--dry-run"])
    err = capsys.readouterr().err.strip()
    return code, err


@pytest.mark.parametrize("args, expected", [
    (["training.epoch=3"], "unknown recipe key training.epoch; accepted here: batch_size, checkpoint_every_steps, epochs"),
    (["training.epochs=many"], "training.epochs='many'"),
    (["strategy.name=warp"], "strategy.name='warp' is not a known strategy; choose one of: single, ddp, allreduce"),
    (["strategy.name=single"], "strategy single runs on exactly 1 rank, but launch gives world size 2"),
    (["training.batch_size=63"], "training.batch_size=63 must divide into 2 data-parallel ranks"),
    (["data.name=mnist", "data.root=/nonexistent/place"], "data set mnist not found in /nonexistent/place/MNIST/raw"),
    (["model={name: vgg11}"], "model vgg11 needs images of at least 32x32"),
    (["model.hidden=[64, -]"], "model.hidden.1='-'"),
    (["launch.nodes=2"], "launch.executor=local runs on this machine only"),
])
def test_bad_input_is_one_line_and_exit_code_2(capsys, args, expected):
    code, err = run_cli(capsys, *args)
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert err.startswith("error: ") and expected in err, err


def test_unknown_strategy_key_names_the_accepted_ones(capsys):
    code, err = run_cli(capsys, "strategy.bucket_mb=10")
    assert code == 2 and "unknown recipe key strategy.bucket_mb; accepted here: bucket_cap_mb, name, static_graph" in err


def test_missing_recipe_file(capsys):
    assert submit.main(["recipes/nope.yaml"]) == 2
    assert "recipe recipes/nope.yaml does not exist" in capsys.readouterr().err


def test_command_line_shows_no_traceback():
    proc = subprocess.run([sys.executable, "-m", "suite.submit", QUICKSTART, "strategy.name=warp"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: strategy.name='warp' is not a known strategy; choose one of: single, ddp, allreduce"] or \
        "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
