"""``python -m suite.export RUN_DIR [RUN_DIR ...] [--mode offline|online] [--force]``: write each
job's W&B run (one per job, its id the run id) from its run record, e.g. for runs recorded with
W&B disabled. Idempotent: a job that has its W&B run already is left alone (``--force`` writes it
again from the record, replacing the offline files). See suite/record/wandb_export.py.

``python -m suite.export RUN_DIR --model FILE.safetensors``: write the run's trained model (its
last complete checkpoint) as one safetensors file, whatever its strategy and world size, that
loads with ``load_state_dict(strict=True)`` into the plain model, with ``FILE.json`` beside it
(the recipe's model section, how to build the plain model, the data spec, the step).
``--hf DIR`` instead: a Hugging Face model as ``save_pretrained`` writes it (and the run's
tokenizer), which ``from_pretrained(DIR)`` loads. A completed run keeps its final weights
(``training.keep_final_weights``, on by default). The run's strategy is rebuilt at its own
world size on this machine (forked ranks) to gather the model."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from suite.common.errors import SuiteError
from suite.record import run_record
from suite.record.wandb_export import export_run

EPILOG = """--model: the run's ranks are started here (world size as trained, forked, gloo on CPU unless
the recipe's launch.device says otherwise), restore the latest checkpoint and gather the whole model
(DDP/single: the module; FSDP2/tensor: DTensors all-gathered; ZeRO-3: partitions gathered block by
block; pipeline: every stage's blocks). Load it with:
  model = suite.models.build(options, spec)    # or your target, e.g. torchvision.models.resnet18(num_classes=10)
  model.load_state_dict(safetensors.torch.load_file(FILE), strict=True)
fp64 runs export float64 tensors: build the model under torch.set_default_dtype(torch.float64)."""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m suite.export", description=__doc__.split("\n\n")[0],
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="run folders (holding recipe.yaml and metrics.jsonl)")
    p.add_argument("--mode", choices=["offline", "online"], default="offline")
    p.add_argument("--force", action="store_true",
                   help="write the W&B run again from the run record, also where one was written (live or exported)")
    p.add_argument("--model", metavar="FILE.safetensors", type=Path,
                   help="write the run's trained model (latest checkpoint) to this safetensors file, and its "
                        "config to FILE.json, instead of W&B runs; one run folder")
    p.add_argument("--hf", metavar="DIR", type=Path,
                   help="write the run's trained Hugging Face model (latest checkpoint) as save_pretrained does "
                        "(config.json, model.safetensors, and the run's tokenizer) to this folder; one run folder")
    args = p.parse_args(argv)
    if args.model is not None or args.hf is not None:
        if len(args.runs) != 1 or (args.model is not None and args.hf is not None):
            print("error: --model and --hf export one run, one of them at a time; give one run folder", file=sys.stderr)
            return 2
        try:
            return export_model(Path(args.runs[0]), args.hf if args.hf is not None else args.model,
                                hf_folder=args.hf is not None)
        except SuiteError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    failed = 0
    for folder in map(Path, args.runs):
        if not (folder / "recipe.yaml").is_file() or not (folder / "metrics.jsonl").is_file():
            print(f"error: {folder} is not a run folder with records (recipe.yaml and metrics.jsonl)", file=sys.stderr)
            return 2
        notice = export_run(folder, args.mode, args.force)
        if notice:
            print(notice, file=sys.stderr)
            failed += "failed" in notice
        if not notice or notice.startswith("W&B online is not available"):
            print(f"{folder}: W&B run {folder.name} written ({args.mode}) to {folder / 'wandb'}")
    return 1 if failed else 0


def export_model(folder: Path, out: Path, hf_folder: bool = False) -> int:
    if not (folder / "recipe.yaml").is_file():
        raise SuiteError(f"{folder} is not a run folder (no recipe.yaml)")
    saved = run_record.latest_checkpoint(folder)
    if saved is None:
        raise SuiteError(f"{folder} holds no complete checkpoint ({run_record.checkpoint_folder(folder)}/latest.json); "
                         f"train with training.keep_final_weights=true (the default) or training.checkpoint_every_steps "
                         f"set, or resume the run until it saves one")
    if not hf_folder and out.suffix != ".safetensors":
        raise SuiteError(f"--model {out}: name the file FILE.safetensors (its config is written to FILE.json)")
    from suite import recipe as recipes
    from suite.tasks import export as export_task

    recipe = recipes.load(folder / "recipe.yaml")[0]
    if type(recipe.strategy).owns_training:
        raise SuiteError(f"strategy {recipe.strategy.name} cannot export its model: it trains in its own loop "
                         f"(TensorFlow), without the torch engine the export rebuilds")
    if saved["world_size"] != recipe.world_size:
        raise SuiteError(f"the checkpoint in {run_record.checkpoint_folder(folder)} was saved at world size "
                         f"{saved['world_size']}, the recipe says {recipe.world_size}")
    done = export_task.start_ranks(recipe, folder.resolve(), out.resolve(), hf_folder=hf_folder)
    summary = run_record.read_json(run_record.summary_path(folder)) if run_record.summary_path(folder).exists() else {}
    ended = summary.get("steps")
    note = f" (the run went on to step {ended}: that step was not checkpointed)" if ended and ended != done["step"] else ""
    print(f"{folder}: model of step {done['step']} ({recipe.strategy.name}, world size {recipe.world_size}, "
          f"{done['tensors']} tensors) written to {done['model']}, its config to {done['config']}{note}")
    return 0


if __name__ == "__main__":
    from suite.common.exit import run_command

    run_command(main)
