"""Hugging Face transformers models by target (issue 55): tiny Llama, GPT-2 and Qwen2 models built
from a config or loaded from a folder the test saves itself (no hub), trained as they are under
the strategies that can hold them and certified by suite.verify; text as users hold it (a local
tokenizer and local files, padded batches scoring as unpadded); the trained model exported back
to a folder ``from_pretrained`` loads; a model whose step fails is refused at --dry-run."""
from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from suite import recipe as recipes
from suite.data import IGNORE
from suite.models import hf
from suite.models.task import Task
from suite.submit import cli as submit
from tests.parity import make_recipe, step_losses

pytestmark = pytest.mark.slow  # starts ranks or fake runs: not in the fast tier

ROOT = Path(__file__).resolve().parents[2]
LLAMA = {"target": "suite.models.hf:from_config", "model_type": "llama", "hidden_size": 16, "intermediate_size": 32,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
         "pad_token_id": 0, "task": "language"}
GPT2 = {"model_type": "gpt2", "n_embd": 16, "n_layer": 2, "n_head": 2, "n_positions": 64, "resid_pdrop": 0.0,
        "embd_pdrop": 0.0, "attn_pdrop": 0.0, "pad_token_id": 0}  # GPT-2 ties its input and output embeddings
TOKENS = {"name": "synthetic_tokens", "vocab": 24, "seq_len": 16, "n_train": 128, "n_val": 32}
FEW_STEPS = {"epochs": 1, "max_steps": 3, "batch_size": 8, "seed": 0, "log_every_steps": 1}
STEPS = 4


def build(model_type: str, vocab: int = 24, **config):
    kwargs = {k: v for k, v in {**(GPT2 if model_type == "gpt2" else LLAMA), **config}.items()
              if k not in ("target", "model_type", "task")}
    return hf.adapt(hf.from_config(SimpleNamespace(num_classes=vocab), model_type, **kwargs))


@pytest.fixture(scope="module")
def text(tmp_path_factory) -> dict:
    """A word-level tokenizer trained here and saved as save_pretrained writes it, documents of 3 to
    30 words as .jsonl (training) and .txt (validation): the data section that reads them."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    root = tmp_path_factory.mktemp("text")
    words = "the cat sat on a mat and the dog ran to its bed while birds sang".split()
    rng = random.Random(0)
    docs = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 30))) for _ in range(120)]
    (root / "train.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[:100]))
    (root / "val.txt").write_text("\n".join(docs[100:]) + "\n")
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(docs, trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]", "[EOS]"]))
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]",
                            eos_token="[EOS]").save_pretrained(root / "tok")
    return {"name": "text_files", "tokenizer": str(root / "tok"), "train": str(root / "train.jsonl"),
            "val": str(root / "val.txt"), "seq_len": 16, "pack": False}


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory) -> str:
    """A tiny GPT-2 saved by save_pretrained: what a user's local checkpoint folder holds."""
    folder = tmp_path_factory.mktemp("gpt2")
    torch.manual_seed(0)
    build("gpt2", vocab=18).save_pretrained(folder)
    return str(folder)


def _verify(tmp_path, raw: dict, strategies: str):
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw))
    return subprocess.run([sys.executable, "-m", "suite.verify", str(path), "--steps", str(STEPS), "--out",
                           str(tmp_path / "runs"), "--strategies", strategies], capture_output=True, text=True,
                          timeout=900, cwd=ROOT)


def _certified(tmp_path, proc, expected: set[str]) -> None:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    certs = [json.loads(p.read_text()) for p in sorted((tmp_path / "runs").glob("*/verify.json"))]
    # each strategy's run folder is named after its point, <name>-verify-<ddp | zero_stage3 | ...>-<time>-<id>,
    # where verify ran more than one (a sweep)
    points = [Path(c["runs"]["strategy"]).name.split("-verify-")[1].rsplit("-", 3)[0] for c in certs]
    got = {c["strategy"] if point.isdigit() else point for c, point in zip(certs, points)}
    assert got == expected, got
    assert all(c["verdict"] == "equivalent" for c in certs), [(c["strategy"], c["verdict_line"]) for c in certs]


# ---- the model as it is ----------------------------------------------------------------------

def test_an_hf_model_returns_its_logits_and_names_its_own_blocks():
    from suite.strategies.tensor import published_plan

    model = build("llama")
    logits = model(torch.randint(1, 24, (2, 8)))
    assert isinstance(logits, torch.Tensor) and logits.shape == (2, 8, 24)
    assert [type(u).__name__ for u in hf.units(model)] == ["LlamaDecoderLayer"] * 2  # FSDP and checkpoint units
    plan = published_plan(model, 2)
    assert {type(s).__name__ for s in plan.values()} == {"ColwiseParallel", "RowwiseParallel"}
    assert "model.layers.1.mlp.down_proj" in plan and "lm_head" in plan
    tied = build("llama", tie_word_embeddings=True)  # its head is its embedding: both stay whole
    assert tied.lm_head.weight is tied.model.embed_tokens.weight and "lm_head" not in published_plan(tied, 2)
    gpt2 = build("gpt2")
    assert [type(u).__name__ for u in hf.units(gpt2)] == ["GPT2Block"] * 2
    assert hf.tensor_parallel_plan(gpt2) == {}  # GPT-2 publishes none


def test_a_tensor_parallel_plan_given_in_the_recipe_replaces_the_published_one():
    from suite.common.errors import SuiteError
    from suite.models import build as build_model
    from suite.strategies.tensor import published_plan

    given = {"model.layers.*.mlp.up_proj": "colwise", "model.layers.*.mlp.down_proj": "rowwise"}
    recipe = make_recipe({"name": "tensor"}, 2, model={**LLAMA, "tp_plan": given}, data=TOKENS, training=FEW_STEPS)
    plan = published_plan(build_model(recipe.model, recipe.data.spec()), 2)
    assert sorted(plan) == [f"model.layers.{i}.mlp.{p}" for i in (0, 1) for p in ("down_proj", "up_proj")]
    gpt2 = build("gpt2")
    gpt2.suite_tp_plan = {"transformer.h.*.mlp.c_fc": "colwise"}  # as model.tp_plan sets it
    with pytest.raises(SuiteError, match=r"transformer.h.0.mlp.c_fc is a Conv1D, and the suite splits Linear layers"):
        published_plan(gpt2, 2)


@pytest.mark.parametrize("model_type", ["llama", "gpt2"])
def test_padded_batches_give_the_loss_of_the_sequences_alone(model_type):
    torch.manual_seed(0)
    with torch.random.fork_rng():
        torch.set_default_dtype(torch.float64)
        try:
            model, task = build(model_type, vocab=20), Task("language", 20)
            seqs = [torch.randint(1, 20, (n,)) for n in (5, 9, 13)]
            x, y = torch.zeros(3, 12, dtype=torch.int64), torch.full((3, 12), IGNORE)
            for i, s in enumerate(seqs):  # padded on the right with pad_token_id 0, not scored there
                x[i, :len(s) - 1], y[i, :len(s) - 1] = s[:-1], s[1:]
            padded = task.loss(model(x), x, y)
            alone = torch.stack([task.loss(model(s[None, :-1]), None, s[None, 1:]) for s in seqs]).mean()
            scored_pads = task.loss(model(x), x, torch.where(y == IGNORE, 0, y))
        finally:
            torch.set_default_dtype(torch.float32)
    assert abs(padded.item() - alone.item()) < 1e-12
    assert abs(scored_pads.item() - alone.item()) > 1e-3  # were the padding scored, it would show


def test_the_models_own_loss_is_what_its_loss_with_labels_is(capsys, tmp_path):
    model = build("llama")
    x = torch.randint(1, 24, (2, 9))
    task = Task("language", 24)
    task.use_model_loss(*hf.loss_function(model))
    ours = task.loss(model(x[:, :-1]), None, x[:, 1:])
    theirs = type(model).forward(model, input_ids=x[:, :-1], labels=x[:, :-1], shift_labels=x[:, 1:].contiguous()).loss
    assert torch.allclose(ours, theirs) and task.loss_name.startswith("model: LlamaForCausalLM.loss_function")
    # the run record says which loss trained
    recipe = make_recipe({"name": "single"}, 1, model={**LLAMA, "loss": "model"}, data=TOKENS, training=FEW_STEPS)
    step_losses(recipe, tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["loss"].startswith("model: LlamaForCausalLM.loss_function (ForCausalLM"), summary["loss"]


# ---- refused before launch -------------------------------------------------------------------

def returns_a_dict(spec):
    """Like an HF model unadapted: an output object the task cannot score."""
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.head = torch.nn.Embedding(spec.num_classes, 8), torch.nn.Linear(8, spec.num_classes)

        def forward(self, x):
            return {"logits": self.head(self.embed(x))}

    return Net()


def users_llama(spec, dim=16, layers=2):
    """The issue's factory, in the user's own module."""
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(hidden_size=dim, intermediate_size=2 * dim, num_hidden_layers=layers,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=spec.num_classes))


def _dry_run(capsys, tmp_path, model: dict, strategy: dict, world: int = 2):
    raw = {"name": "hf", "model": model, "data": TOKENS, "strategy": strategy, "training": FEW_STEPS,
           "launch": {"tasks_per_node": world}, "tracking": {"wandb": "disabled"}}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw))
    code = submit.main([str(path), "--dry-run"])
    return code, capsys.readouterr().err.strip()


def test_a_model_whose_step_fails_is_refused_at_dry_run_in_one_line(capsys, tmp_path):
    code, err = _dry_run(capsys, tmp_path, {"target": "tests.models.test_hf:returns_a_dict", "task": "language"},
                         {"name": "ddp"})
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err == ("error: model.target=tests.models.test_hf:returns_a_dict fails a training step on a batch of "
                   "data.name=synthetic_tokens's shape (AttributeError: 'dict' object has no attribute 'dtype'); it "
                   "must return what model.task=language scores (docs/plugins.md): fix the model or model.task"), err
    code, err = _dry_run(capsys, tmp_path, {"target": "tests.models.test_hf:users_llama", "task": "language"},
                         {"name": "fsdp"})
    assert code == 0, err


@pytest.mark.parametrize("model, strategy, expected", [
    ({"target": "suite.models.hf:from_config", **GPT2, "task": "language"}, {"name": "tensor"},
     "error: strategy tensor has layouts for models mlp, transformer, llama and for models that publish a tensor-parallel "
     "plan; model.target=suite.models.hf:from_config publishes none: give one as model.tp_plan"),
    ({**LLAMA, "num_attention_heads": 2, "num_key_value_heads": 1, "hidden_size": 8}, {"name": "tensor"},
     "error: strategy.tp=2 must divide the model's num_key_value_heads=1"),
    (LLAMA, {"name": "pipeline", "stages": 2},
     "error: strategy pipeline cannot split model.target=suite.models.hf:from_config: LlamaForCausalLM hands its "
     "blocks the masks and position embeddings its own forward makes"),
])
def test_what_a_strategy_cannot_do_with_an_hf_model_is_one_line(capsys, tmp_path, model, strategy, expected):
    code, err = _dry_run(capsys, tmp_path, model, strategy)
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith(expected), err


# ---- certified under the strategies ----------------------------------------------------------

@pytest.mark.timeout(900)  # suite.verify: single and its noise floor in fp64 and fp32, then each strategy
def test_llama_from_config_on_padded_text_is_equivalent_under_every_strategy_that_holds_it(tmp_path, text):
    raw = {"name": "llama", "model": LLAMA, "data": text, "strategy": {"name": "ddp"},
           "optimizer": {"name": "adam", "lr": 0.01}, "training": {"epochs": 1, "batch_size": 8, "seed": 0},
           "launch": {"tasks_per_node": 2}, "tracking": {"wandb": "disabled"}}
    proc = _verify(tmp_path, raw, "ddp,fsdp,fsdp1,zero:stage=2,zero:stage=3,tensor")
    _certified(tmp_path, proc, {"ddp", "fsdp", "fsdp1", "zero_stage2", "zero_stage3", "tensor"})


@pytest.mark.timeout(900)  # suite.verify: single and its noise floor in fp64 and fp32, then each strategy
def test_gpt2_from_a_local_folder_with_tied_embeddings_and_hf_checkpointing_is_equivalent(tmp_path, gpt2_folder):
    raw = {"name": "gpt2", "model": {"target": "suite.models.hf:from_pretrained", "path": gpt2_folder,
                                     "task": "language"},
           "data": {**TOKENS, "vocab": 18}, "strategy": {"name": "ddp"}, "optimizer": {"name": "adam", "lr": 0.01},
           "training": {"epochs": 1, "batch_size": 8, "seed": 0, "activation_checkpointing": True},
           "launch": {"tasks_per_node": 2}, "tracking": {"wandb": "disabled"}}
    proc = _verify(tmp_path, raw, "ddp,fsdp,zero:stage=2,zero:stage=3")
    _certified(tmp_path, proc, {"ddp", "fsdp", "zero_stage2", "zero_stage3"})


@pytest.mark.timeout(900)  # suite.verify: single and its noise floor in fp64 and fp32, then each strategy
def test_a_class_the_issue_does_not_name_qwen2_is_equivalent_under_fsdp_and_tensor(tmp_path):
    model = {**LLAMA, "model_type": "qwen2"}
    raw = {"name": "qwen2", "model": model, "data": TOKENS, "strategy": {"name": "fsdp"},
           "optimizer": {"name": "adam", "lr": 0.01}, "training": {"epochs": 1, "batch_size": 8, "seed": 0},
           "launch": {"tasks_per_node": 2}, "tracking": {"wandb": "disabled"}}
    proc = _verify(tmp_path, raw, "fsdp,tensor")
    _certified(tmp_path, proc, {"fsdp", "tensor"})


@pytest.mark.timeout(900)  # suite.verify: single and its noise floor, then the pipeline
def test_a_llama_laid_out_as_blocks_is_equivalent_under_a_pipeline(tmp_path):
    torch.manual_seed(0)
    plain = build("llama")
    torch.manual_seed(0)
    blocks = hf.from_config(SimpleNamespace(num_classes=24), "llama", sequential=True,
                            **{k: v for k, v in LLAMA.items() if k not in ("target", "model_type", "task")})
    x = torch.randint(1, 24, (2, 8))
    assert isinstance(blocks, torch.nn.Sequential) and len(blocks) == 4  # embedding, 2 decoder blocks, head
    assert torch.equal(blocks(x), plain(x))  # the same weights and function, cut into blocks
    raw = {"name": "blocks", "model": {**LLAMA, "sequential": True}, "data": TOKENS,
           "strategy": {"name": "pipeline", "stages": 2}, "optimizer": {"name": "adam", "lr": 0.01},
           "training": {"epochs": 1, "batch_size": 8, "seed": 0}, "launch": {"tasks_per_node": 2},
           "tracking": {"wandb": "disabled"}}
    _certified(tmp_path, _verify(tmp_path, raw, "pipeline"), {"pipeline"})


# ---- back to Hugging Face --------------------------------------------------------------------

LOAD = r"""
import json, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

torch.set_default_dtype(torch.float64)
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float64).eval()
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
x, y = torch.load(sys.argv[2])
with torch.no_grad():
    logits = model(input_ids=x, attention_mask=(x != model.config.pad_token_id).long()).logits
loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100, reduction="sum")
print(json.dumps({"val_loss": loss.item() / (y != -100).sum().item(), "vocab": len(tokenizer)}))
"""


@pytest.mark.parametrize("strategy, model", [({"name": "fsdp"}, LLAMA),
                                             ({"name": "pipeline", "stages": 2}, {**LLAMA, "sequential": True})],
                         ids=["fsdp", "pipeline-of-blocks"])
def test_a_completed_run_exports_a_folder_from_pretrained_loads_with_its_val_loss(tmp_path, text, strategy, model):
    from suite.export.__main__ import main as export_main

    recipe = make_recipe(strategy, 2, model=model, data=text, training=FEW_STEPS)
    assert recipe.training.keep_final_weights and not recipe.training.checkpoint_every_steps
    run = tmp_path / "run"
    step_losses(recipe, run)
    (run / "recipe.yaml").write_text(recipes.dump(recipe))
    assert export_main([str(run), "--hf", str(tmp_path / "hf")]) == 0
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in (tmp_path / "hf").iterdir()}
    _, val = recipe.data.load()
    torch.save(val.tensors, tmp_path / "val.pt")
    done = subprocess.run([sys.executable, "-c", LOAD, str(tmp_path / "hf"), str(tmp_path / "val.pt")],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    summary = json.loads((run / "summary.json").read_text())
    assert loaded["val_loss"] == pytest.approx(summary["final"]["val_loss"], rel=1e-12, abs=0)
    assert loaded["vocab"] == recipe.data.spec().num_classes


def test_a_run_told_not_to_keep_its_weights_keeps_none(tmp_path, capsys):
    from suite.export.__main__ import main as export_main

    recipe = make_recipe({"name": "single"}, 1, model=LLAMA, data=TOKENS,
                         training={**FEW_STEPS, "keep_final_weights": False})
    step_losses(recipe, tmp_path / "run")
    (tmp_path / "run" / "recipe.yaml").write_text(recipes.dump(recipe))
    capsys.readouterr()
    assert export_main([str(tmp_path / "run"), "--hf", str(tmp_path / "hf")]) == 2
    assert "holds no complete checkpoint" in capsys.readouterr().err


# ---- text files --------------------------------------------------------------------------------

def test_documents_are_packed_into_next_token_samples_and_the_last_is_padded():
    from suite.data.text_files import samples

    inputs, targets = samples([[5, 6, 7], [8, 9]], seq_len=3, pad=0, eos=2, pack=True)
    # the stream 5 6 7 2 8 9 2 in windows of 4 that overlap by one: inputs 5 6 7 | 2 8 9, then 2 alone is no sample
    assert inputs.tolist() == [[5, 6, 7], [2, 8, 9]] and targets.tolist() == [[6, 7, 2], [8, 9, 2]]
    inputs, targets = samples([[5, 6, 7], [8, 9]], seq_len=3, pad=0, eos=None, pack=False)
    assert inputs.tolist() == [[5, 6, 0], [8, 0, 0]] and targets.tolist() == [[6, 7, IGNORE], [9, IGNORE, IGNORE]]


@pytest.mark.parametrize("change, expected", [
    ({"train": "NOWHERE/*.jsonl"}, "error: data.train='NOWHERE/*.jsonl' names no file; give a .jsonl, .txt or .parquet"),
    ({"tokenizer": "NOWHERE"}, "error: data.tokenizer='NOWHERE' holds no tokenizer.json or tokenizer_config.json"),
    ({"field": "body"}, "has no text under 'body'; set data.field to the key that holds the text"),
])
def test_text_files_that_cannot_be_read_are_one_line_at_dry_run(capsys, tmp_path, text, change, expected):
    raw = {"name": "text", "model": LLAMA, "data": {**text, **change}, "strategy": {"name": "single"},
           "training": FEW_STEPS, "tracking": {"wandb": "disabled"}}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw))
    code = submit.main([str(path), "--dry-run"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and expected in err, err


# ---- planned -----------------------------------------------------------------------------------

def test_the_planners_tensor_rule_for_an_hf_model_counts_what_the_real_code_sends():
    """The analytic rule each run's prediction uses, held to the fake run of the real DTensor code:
    the all-reduces of the plan Llama publishes, and the gather of its head's output."""
    from suite.planner import analytic, fake_run
    from tests.planner.test_planner import _profiles, _raw

    raw = _raw({k: v for k, v in LLAMA.items() if k != "pad_token_id"}, TOKENS, 16)
    fake = _profiles(raw, "tensor", [2])[("tensor", 2)]
    assert fake.source == "fake" and fake.comm_calls == {"all_reduce": 15, "all_gather": 1}
    rule = analytic.profile(fake_run.at_world(recipes.validate({**raw, "strategy": {"name": "tensor"}}), 2), 2, "test")
    assert rule.comm_calls == fake.comm_calls and rule.comm_bytes == fake.comm_bytes
