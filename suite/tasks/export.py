"""What each rank runs for ``python -m suite.export RUN_DIR --model FILE.safetensors``: rebuild the
run's strategy at its own world size, restore the last complete checkpoint into it, gather the
whole model (``Engine.full_model_state``: the plain model's parameter names, on CPU) and, on
rank 0, check it against the plain model and write it as one safetensors file with its config
beside it (``FILE.json``: how to build the plain model and for which data).

``start_ranks`` forks the ranks on this machine (as a local pool does) with a free port; the
command calls it, the ranks call ``export_rank``.
"""
from __future__ import annotations

import dataclasses
import json
import multiprocessing as mp
import os
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from suite import strategies
from suite.common.errors import SuiteError
from suite.common.ports import free_port
from suite.models import hf, source
from suite.strategies import prepare
from suite.strategies.engine import NoFullModelState
from suite.train import checkpoint, dist as sdist
from suite.train.rank import make_setup


def export_rank(recipe, run_dir: Path, out: Path, hf_folder: bool = False) -> dict | None:
    """This rank's part of the export; rank 0 returns what it wrote ({"model", "config", "step",
    "tensors"}), the others None. ``hf_folder``: ``out`` is a folder for Hugging Face's
    ``save_pretrained`` (``write_hf``) instead of one safetensors file."""
    launch = recipe.launch
    ctx = sdist.init(launch.device, launch.devices_per_task, launch.cpus_per_task, launch.collective_timeout_s)
    try:
        if ctx.world_size != recipe.world_size:
            raise SuiteError(f"the run was trained at world size {recipe.world_size}, {ctx.world_size} ranks started")
        setup = make_setup(recipe, ctx)  # run_dir None: nothing of the run is rewritten
        with prepare.default_dtype(recipe.training.precision):
            engine = strategies.build(recipe.strategy, setup)
            try:
                loop = checkpoint.load(run_dir, ctx, engine)
                try:
                    state = engine.full_model_state()
                except NoFullModelState as e:
                    raise SuiteError(f"strategy {recipe.strategy.name} cannot export its model: {e}") from None
                if not ctx.is_main:
                    return None
                plain = setup.build_model()  # the plain model, as the user's code builds it
            finally:
                engine.close()
        _check_against(plain, state, recipe.strategy.name)
        if hf_folder:
            return write_hf(recipe, plain, state, out, loop["step"])
        out.parent.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in state.items()}, str(out),
                  metadata={"run": str(run_dir), "step": str(loop["step"]), "strategy": recipe.strategy.name})
        config = out.with_suffix(".json")
        config.write_text(json.dumps(model_config(recipe, run_dir, loop["step"], state), indent=2) + "\n")
        return {"model": str(out), "config": str(config), "step": loop["step"], "tensors": len(state)}
    finally:
        if ctx.world_size > 1 and dist.is_initialized():
            dist.barrier()  # rank 0 has written the file before any rank leaves
        sdist.close()


def write_hf(recipe, plain: torch.nn.Module, state: dict, out: Path, step: int) -> dict:
    """The trained model as ``save_pretrained`` writes it (config.json and model.safetensors), with
    the run's tokenizer beside it where the data has one (``data.tokenizer``): a folder that
    ``AutoModelForCausalLM.from_pretrained`` and ``AutoTokenizer.from_pretrained`` load."""
    model = getattr(plain, "hf_model", plain)  # a sequential layout shares the HF model's modules
    if not hf.is_hf(model):
        raise SuiteError(f"--hf writes a Hugging Face model, and {source(recipe.model)} builds "
                         f"{type(plain).__name__}; use --model FILE.safetensors")
    plain.load_state_dict(state, strict=True)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tokenizer = getattr(recipe.data, "tokenizer", None)
    if tokenizer:
        from suite.data.text_files import load_tokenizer  # late: only a text data set has a tokenizer

        load_tokenizer(tokenizer).save_pretrained(str(out))
    return {"model": str(out), "config": str(out / "config.json"), "step": step, "tensors": len(state)}


def _check_against(plain: torch.nn.Module, state: dict, strategy: str) -> None:
    """The gathered state must be exactly the plain model's: the same names, shapes and dtypes'
    kinds; anything else would fail the user's load_state_dict(strict=True), so it is refused here."""
    want = plain.state_dict()
    missing, extra = sorted(set(want) - set(state)), sorted(set(state) - set(want))
    if missing or extra:
        raise SuiteError(f"strategy {strategy} cannot export its model: its gathered state does not name the plain "
                         f"model's tensors (missing {missing[:3]}, unexpected {extra[:3]})")
    for name, value in want.items():
        if tuple(state[name].shape) != tuple(value.shape):
            raise SuiteError(f"strategy {strategy} cannot export its model: {name} is gathered with shape "
                             f"{tuple(state[name].shape)}, the plain model's is {tuple(value.shape)}")


def model_config(recipe, run_dir: Path, step: int, state: dict) -> dict:
    """How to build the plain model the file loads into, and the data it was trained for."""
    model = recipe.model.model_dump(mode="json")
    target = getattr(recipe.model, "target", None)
    dtypes = sorted({str(v.dtype).removeprefix("torch.") for v in state.values() if v.is_floating_point()})
    build = ({"target": target, "kwargs": recipe.model.factory_kwargs(), "pythonpath": recipe.model.pythonpath,
              "called_with_spec": recipe.model.calls_with_spec()} if target else
             {"name": recipe.model.name, "options": {k: v for k, v in model.items() if k != "name"}})
    return {"format": "scalesuite model export 1", "run": str(run_dir), "step": step,
            "strategy": recipe.strategy.name, "world_size": recipe.world_size,
            "precision": recipe.training.precision, "dtypes": dtypes,
            "model": model, "build": build, "data": dataclasses.asdict(recipe.data.spec()),
            "task": getattr(recipe.model, "task", None)}


def start_ranks(recipe, run_dir: Path, out: Path, timeout_s: float = 600, hf_folder: bool = False) -> dict:
    """Fork the run's world size of ranks here (a free port; one thread each), run ``export_rank``
    in each; rank 0's result, or SuiteError with the first rank's error."""
    fork = mp.get_context("fork")
    port, world = free_port(), recipe.world_size
    pipes, procs = [], []
    for rank in range(world):
        parent, child = fork.Pipe(duplex=False)
        env = dict(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        proc = fork.Process(target=_rank_main, args=(env, child, recipe, run_dir, out, hf_folder), daemon=True)
        proc.start()
        child.close()
        pipes.append(parent)
        procs.append(proc)
    results, errors, pending = [None] * world, [], set(range(world))
    deadline = time.monotonic() + timeout_s
    try:
        while pending and not errors:
            if time.monotonic() > deadline:
                errors.append(f"ranks {sorted(pending)} gave no answer within {timeout_s:.0f} s")
            for rank in sorted(pending):
                if pipes[rank].poll(0.05):
                    try:
                        status, value = pipes[rank].recv()
                    except EOFError:  # the process ended without a word
                        procs[rank].join(5)
                        status, value = "error", f"rank {rank} died (exit code {procs[rank].exitcode})"
                    pending.discard(rank)
                    if status == "ok":
                        results[rank] = value
                    else:
                        errors.append(value)
                        break
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
            proc.join(5)
    if errors:
        raise SuiteError(errors[0])
    return results[0]


def _rank_main(env: dict, conn, recipe, run_dir: Path, out: Path, hf_folder: bool) -> None:
    os.environ.update(env)
    torch.set_num_threads(1)
    try:
        conn.send(("ok", export_rank(recipe, run_dir, out, hf_folder)))
    except SuiteError as e:
        conn.send(("error", str(e)))
    except BaseException as e:  # noqa: BLE001 - the command says it in one line, the trace goes to stderr
        traceback.print_exc()
        conn.send(("error", f"rank {env['RANK']}: {type(e).__name__}: {e}"))
    finally:
        conn.close()

