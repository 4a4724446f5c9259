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


@pytest.mark.slow
@pytest.mark.parametrize("args, expected", [
    (["training.epoch=3"], "unknown recipe key training.epoch; accepted here: activation_checkpointing, balance, balance_shares, batch_size, checkpoint_every_steps, compile, epochs"),
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


@pytest.mark.slow
def test_unknown_strategy_key_names_the_accepted_ones(capsys):
    code, err = run_cli(capsys, "strategy.bucket_mb=10")
    assert code == 2 and "unknown recipe key strategy.bucket_mb; accepted here: bucket_cap_mb, name, static_graph" in err


@pytest.mark.slow
def test_missing_recipe_file(capsys):
    assert submit.main(["recipes/nope.yaml"]) == 2
    assert "recipe recipes/nope.yaml does not exist" in capsys.readouterr().err


@pytest.mark.slow
def test_command_line_shows_no_traceback():
    proc = subprocess.run([sys.executable, "-m", "suite.submit", QUICKSTART, "strategy.name=warp"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: strategy.name='warp' is not a known strategy; choose one of: single, ddp, allreduce"] or \
        "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


# ---- inputs a new user gets wrong: each is one line naming the key (or file), exit 2 ----------------

def assert_one_line(code, err, *named):
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert "Traceback" not in err and "internal error" not in err, err
    for word in named:
        assert word in err, err


@pytest.mark.slow
@pytest.mark.parametrize("args, named", [
    (["model.hidden=[1,2"], ["override model.hidden", "line 1, column 5"]),
    (["model.hidden=!!python/object/apply:os.system [echo hi]"], ["override model.hidden", "YAML tags"]),
    (["model.hidden=[-5]"], ["model.hidden.0=-5", "greater than 0"]),
    (["model.hidden=[0]"], ["model.hidden.0=0", "greater than 0"]),
    (["name=" + "a" * 300], ["name=", "file-name slug", "at most 100 characters"]),
    (["name=../x"], ["name='../x'", "letters, digits, '.', '_' and '-'"]),
    (["training.epochs=true"], ["training.epochs=True", "valid integer"]),
    (["training.batch_size=64.5"], ["training.batch_size=64.5"]),
    (["optimizer.lr=.inf"], ["optimizer.lr=inf", "finite"]),
    (["training.seed=2024-01-01"], ["training.seed", "date"]),
    (["model.name=cnn", "data.name=synthetic_tokens"], ["model.name=cnn", "data.name=synthetic_tokens"]),
    (["data.name=synthetic_tokens"], ["model.name=mlp needs float inputs", "data.name=synthetic_tokens"]),
    (["sweep.training.seed=7"], ["sweep.training.seed=7", "non-empty list"]),
])
def test_bad_override_is_one_line_naming_the_key(capsys, args, named):
    assert_one_line(*run_cli(capsys, *args), *named)


@pytest.mark.slow
def test_a_dotted_sweep_on_the_command_line_expands(capsys):
    assert submit.main([QUICKSTART, "sweep.training.seed=[0,1]", "--dry-run"]) == 0
    assert "2 job(s); nothing launched" in capsys.readouterr().out


def test_a_dotted_or_nested_sweep_gives_one_recipe_per_point(tmp_path):
    from suite import recipe as recipes
    from suite.recipe import text as recipe_text

    path = tmp_path / "r.yaml"
    path.write_text(open(QUICKSTART).read() + "sweep: {training: {seed: [0, 1]}, model.hidden: [[8], [8, 8]]}\n")
    points = recipes.load(path)
    assert [(p.training.seed, p.model.hidden) for p in points] == [(0, [8]), (0, [8, 8]), (1, [8]), (1, [8, 8])]
    assert all(recipe_text._SLUG.fullmatch(p.name) for p in points) and len({p.name for p in points}) == 4
    assert len(recipes.load(path, ["sweep.training.seed=[3,4,5]"])) == 6


@pytest.mark.slow
@pytest.mark.parametrize("content, named", [
    ("name: x\nmodel: {name: mlp}\n".encode("utf-16"), ["r.yaml", "not UTF-8", "save it as UTF-8"]),
    (b"name: caf\xe9\n", ["r.yaml", "not UTF-8", "byte 9"]),
    (b"name: x\nmodel: [1, 2\n", ["r.yaml", "not valid YAML at line 3, column 1"]),
    (b"name: !!python/object/apply:os.system [echo hi]\n", ["r.yaml", "YAML tags"]),
    (b"- a\n- b\n", ["r.yaml", "must be a mapping"]),
    (b"name: x\n1: 2\nmodel: {name: mlp}\n", ["key 1 must be text"]),
])
def test_bad_recipe_file_is_one_line_naming_the_file(capsys, tmp_path, content, named):
    path = tmp_path / "r.yaml"
    path.write_bytes(content)
    code = submit.main([str(path), "--dry-run"])
    assert_one_line(code, capsys.readouterr().err.strip(), *named)


@pytest.mark.slow
@pytest.mark.parametrize("content, named", [
    ("name: x\ntraining:\n  epochs: 2\n  batch_size: 32\n  epochs: 5\n", "key training.epochs is given twice, at lines 3 and 5"),
    ("name: x\nmodel: {name: mlp}\nname: y\n", "key name is given twice, at lines 1 and 3"),
    ("name: x\nsweep:\n  training.seed: [0, 1]\n  training.seed: [2]\n", "key sweep.training.seed is given twice, at lines 3 and 4"),
])
def test_a_key_given_twice_is_one_line_naming_it_and_both_lines(capsys, tmp_path, content, named):
    """PyYAML keeps the last of two equal keys silently: the recipe would train with a value its
    author may not see."""
    path = tmp_path / "r.yaml"
    path.write_text(content)
    code = submit.main([str(path), "--dry-run"])
    assert_one_line(code, capsys.readouterr().err.strip(), "r.yaml", named)


def test_a_merge_key_may_restate_what_it_merges(tmp_path):
    """YAML's merge key (<<) exists to be overridden beside it: that is no key given twice."""
    from suite.recipe import text as recipe_text

    raw = recipe_text.parse_yaml("base: &b {epochs: 1, seed: 0}\ntraining:\n  <<: *b\n  epochs: 3\n", "recipe")
    assert raw["training"] == {"epochs": 3, "seed": 0}


@pytest.mark.slow
def test_a_study_given_to_submit_names_suite_study(capsys):
    """A study recipe is a recipe plus arms, profiles, reference, ...: submit would report its first
    study key as an unknown recipe key; it names the command that runs studies instead."""
    path = "recipes/studies/fashion_mnist_dp.yaml"
    code = submit.main([path, "--dry-run"])
    assert_one_line(code, capsys.readouterr().err.strip(), f"{path} is a study", "repeats, arms",
                    f"python -m suite.study {path}")


@pytest.mark.slow
def test_a_recipe_path_that_is_a_directory_says_so(capsys):
    code = submit.main(["recipes", "--dry-run"])
    assert_one_line(code, capsys.readouterr().err.strip(), "recipe recipes is a directory")


@pytest.mark.slow
@pytest.mark.parametrize("out, named", [("file", "is a file, not a folder"), ("file/under", "Not a directory")])
def test_out_must_be_a_writable_folder(capsys, tmp_path, out, named):
    (tmp_path / "file").write_text("x")
    code = submit.main([QUICKSTART, "--out", str(tmp_path / out)])
    assert_one_line(code, capsys.readouterr().err.strip(), "--out", named)


@pytest.mark.slow
def test_out_unwritable(capsys, tmp_path):
    """Without write permission (as a normal user) or on a file system that refuses folders even to
    root (sysfs): one line, before anything launches."""
    import os

    if os.geteuid() == 0:
        folder, why = "/sys/scalesuite-runs", "Operation not permitted"
    else:
        folder, why = str(tmp_path / "ro" / "runs"), "Permission denied"
        (tmp_path / "ro").mkdir(mode=0o500)
    code = submit.main([QUICKSTART, "--out", folder])
    assert_one_line(code, capsys.readouterr().err.strip(), "--out", why)
