"""A parameter server in the style of Downpour SGD (Dean et al., 2012), over torch.distributed.rpc
(TensorPipe): rank 0 holds the parameters and the optimizer and applies every gradient pushed to
it; every rank, rank 0 included, is a worker that pulls the parameters, computes gradients on
its own shard and pushes them, without waiting for the others.

Staleness (``strategy.staleness: N``), counted in the server's version (the number of updates it
has applied):
- a worker pulls a fresh copy at least every N of its own steps (N=1: before every step), and
  right after the server refused one of its gradients;
- a gradient's staleness is the number of updates the server applied between the pull of the
  copy it was computed on and its arrival; the server applies it when that is at most
  N x world size (the most a worker keeping pace accumulates: its own N-1 earlier pushes from
  the copy plus about N from each other worker) and refuses it otherwise (a straggler's), and
  counts both.
Rank 0 also trains: a dedicated server would leave one of few ranks idle, would need a data
split the layout does not have (every rank reads its share), and with it world size 1 is exactly
the single baseline. Its own pulls and pushes are direct calls under the server's lock; RPC
serves the others. See docs/strategies.md ("Asynchronous training").
"""
from __future__ import annotations

import os
import threading
from typing import ClassVar, Literal

import torch
import torch.distributed as dist

from suite.common.errors import SuiteError
from suite.strategies import costs, scaling
from suite.strategies.base import ModuleEngine, StrategyOptions
from suite.strategies.engine import NoFullModelState
from torch.distributed import rpc
from suite.common.ports import free_port
from suite.record.metrics import optimizer_state_bytes, tensor_bytes

_SERVER_RANK = 0
_RPC_TIMEOUT_S = 60  # a push or pull to a server gone silent fails after this long
_server: "Server | None" = None  # this process's server (rank 0), where the RPC handlers find it


class Options(StrategyOptions):
    name: Literal["param_server"] = "param_server"
    staleness: int = 1  # a worker pulls at least every N of its steps; the server's bound is N x world
    warm_imports: ClassVar = ("torch.distributed.rpc",)
    refuses: ClassVar = (scaling.refused("its workers push unscaled gradients to a server that skips no step"),)
    no_parity: ClassVar = "param_server's workers push gradients computed on stale weights, asynchronously"
    overlap: ClassVar = costs.NOTHING_HIDDEN
    # Tried; outside a launched job its RPC start fails (no MASTER_ADDR), and the plan falls back
    # to the analytic rule with that error in its notes.
    cannot_fake: ClassVar = ("its workers reach the server through torch.distributed.rpc, which needs a real "
                             "agent and rendezvous (MASTER_ADDR): the fake process group carries no RPC")

    def check(self, layout, model) -> None:
        if self.staleness < 1:
            raise SuiteError(f"strategy.staleness={self.staleness} must be at least 1: a worker pulls fresh "
                             f"parameters at least every staleness of its own steps (1: before every step)")

    def held_fraction(self, total: dict, layout) -> dict:
        # Rank 0, the most loaded: the server's parameters and optimizer state and its worker's
        # replica with gradients. Other ranks hold the replica and gradients only.
        return {"parameters": 2 * total["parameters"], "gradients": total["gradients"],
                "optimizer_state": total["optimizer_state"]}

    def comm_rule(self, step: costs.StepSizes) -> costs.Comm:
        # Its RPC pushes and pulls are not modelled: counted as the data-parallel all-reduce of
        # the gradients (a push of G to the server and a pull of P back move as much).
        return costs.data_parallel_all_reduce(step)

    @classmethod
    def search_space(cls, world_size: int) -> list[dict]:
        return []  # staleness trades the updates' freshness for speed: the user's choice, not a cost's


class Server:
    """The parameters, the optimizer and the version; every pull and push under one lock."""

    def __init__(self, module: torch.nn.Module, optimizer, bound: int):
        self.params = list(module.parameters())
        self.optimizer, self.bound = optimizer, bound
        self.lock = threading.Lock()
        self.version = 0  # updates applied
        self.accepted = self.refused = 0
        self.staleness_sum = self.staleness_max = 0

    def pull(self) -> tuple[int, list[torch.Tensor]]:
        """(version, host copies of the parameters): copied under the lock, so never half-updated;
        through host memory, so that RPC needs no device map."""
        with self.lock, torch.no_grad():
            return self.version, [p.detach().to("cpu", copy=True) for p in self.params]

    def pull_into(self, replica: list[torch.Tensor]) -> int:
        """The server's own worker: copy straight into its replica; the version copied."""
        with self.lock, torch.no_grad():
            for mine, p in zip(replica, self.params):
                mine.copy_(p)
            return self.version

    def push(self, grads: list[torch.Tensor], version: int, lr: float) -> bool:
        """Apply one worker's gradients with its step's lr if they are fresh enough; whether applied."""
        with self.lock:
            staleness = self.version - version
            if staleness > self.bound:
                self.refused += 1
                return False
            for p, g in zip(self.params, grads):
                p.grad = g.to(p.device)  # a remote worker's arrive in host memory
            for group in self.optimizer.param_groups:
                group["lr"] = lr if lr is not None else group["lr"]  # None: no schedule, the recipe's lr
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.version += 1
            self.accepted += 1
            self.staleness_sum += staleness
            self.staleness_max = max(self.staleness_max, staleness)
            return True

    def metrics(self) -> dict:
        return {"server_version": self.version, "gradients_accepted": self.accepted,
                "gradients_refused": self.refused, "staleness_bound": self.bound,
                "staleness_max": self.staleness_max,
                "staleness_mean": self.staleness_sum / self.accepted if self.accepted else None}


def _remote_pull():
    return _server.pull()


def _remote_push(grads, version, lr):
    return _server.push(grads, version, lr)


class ParamServerEngine(ModuleEngine):
    """A worker (on rank 0 also the server): a replica trained on a copy at most N steps old."""

    def __init__(self, setup, module, staleness: int, server: Server | None, rpc_started: bool):
        self.setup, self.module = setup, module
        self.scaling = scaling.LossScaling(setup.precision, setup.ctx.device)  # disabled: fp16 is refused
        self.dp_rank, self.dp_size = setup.layout.dp_rank(setup.ctx.rank), setup.layout.dp_size
        self.server, self.staleness, self.rpc_started = server, staleness, rpc_started
        self.lr_group = {"lr": None}  # the loop's lr for this step; it travels with the push
        self._version, self._since_pull, self._must_pull = 0, 0, True
        self.pulls = self.refused = 0
        self._gradient_bytes, self._evaluating = 0, False

    # ---- pulls and pushes: direct on rank 0, RPC elsewhere ---------------------------------
    def _pull(self) -> None:
        replica = self.parameters()
        if self.server is not None:
            self._version = self.server.pull_into(replica)
        else:

            self._version, fresh = rpc.rpc_sync(_server_name(), _remote_pull, timeout=_RPC_TIMEOUT_S)
            with torch.no_grad():
                for mine, p in zip(replica, fresh):
                    mine.copy_(p)
        self._since_pull, self._must_pull = 0, False
        self.pulls += 1

    def _push(self) -> bool:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.parameters()]
        lr = self.lr_group["lr"]
        if self.server is not None:
            return self.server.push(grads, self._version, lr)

        grads = [g.cpu() for g in grads]  # through host memory: RPC needs no device map
        return rpc.rpc_sync(_server_name(), _remote_push, args=(grads, self._version, lr), timeout=_RPC_TIMEOUT_S)

    # ---- the loop's interface ---------------------------------------------------------------
    def train_step(self, inputs, targets):
        self._evaluating = False
        if self._must_pull or self._since_pull >= self.staleness:
            self._pull()
        sums = self.accumulate_gradients(inputs, targets)
        self.note_gradient_bytes()
        grad_norm = self.clip_gradients()  # each push is one update: clipped by its own norm
        if not self._push():
            self.refused += 1
            self._must_pull = True  # too stale: take the current parameters before the next step
        self._since_pull += 1
        self.module.zero_grad(set_to_none=True)
        return sums.result(len(inputs), grad_norm)

    def eval_step(self, inputs, targets):
        if not self._evaluating:  # the server's parameters, not a stale copy, once per evaluation
            self._pull()  # every push has arrived: the loop's reduction before evaluation waits for all
            self._evaluating = self._must_pull = True  # training then pulls afresh
        return super().eval_step(inputs, targets)

    def optimizer_groups(self) -> list[dict]:
        return [self.lr_group]

    def held_bytes(self) -> dict:
        held = {"parameters": tensor_bytes(self.parameters()), "gradients": self._gradient_bytes,
                "optimizer_state": 0}
        if self.server is not None:
            held["parameters"] += tensor_bytes(self.server.params)
            held["optimizer_state"] = optimizer_state_bytes(self.server.optimizer)
        return held

    def extra_metrics(self) -> dict:
        mine = {"pulls": self.pulls, "pushes_refused": self.refused}
        return {**mine, **(self.server.metrics() if self.server is not None else {})}

    def full_model_state(self) -> dict:
        raise NoFullModelState("the trained parameters are the server's (rank 0's), not a worker's replica, "
                               "and exporting them is not implemented")

    def state_dict(self) -> dict:
        state = {"replica": self.module.state_dict()}  # buffers (batch norm statistics) are the worker's
        if self.server is not None:
            with self.server.lock:
                state["server"] = {"params": [p.detach().clone() for p in self.server.params],
                                   "optimizer": self.server.optimizer.state_dict(),
                                   "version": self.server.version}
        return state

    def load_state_dict(self, state: dict) -> None:
        self.module.load_state_dict(state["replica"])
        if self.server is not None:
            saved = state["server"]
            with self.server.lock, torch.no_grad():
                for p, v in zip(self.server.params, saved["params"]):
                    p.copy_(v)
                self.server.optimizer.load_state_dict(saved["optimizer"])
                self.server.version = saved["version"]
        self._must_pull = True

    def abort(self) -> None:
        self._shutdown(graceful=False)

    def close(self) -> None:
        self._shutdown(graceful=True)

    def _shutdown(self, graceful: bool) -> None:
        global _server
        if self.rpc_started:

            self.rpc_started = False
            # Graceful waits until every rank has reached here (outstanding pushes answered);
            # after a failure peers may be gone, so the agent just stops.
            rpc.shutdown(graceful=graceful, timeout=_RPC_TIMEOUT_S)
        _server = None


def _server_name() -> str:
    return f"rank{_SERVER_RANK}"


def _start_rpc(ctx) -> None:
    """Join the RPC group beside the process group: its own port, chosen by rank 0 and sent to all."""


    box = [free_port() if ctx.is_main else None]
    dist.broadcast_object_list(box, src=0)
    options = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://{os.environ['MASTER_ADDR']}:{box[0]}",
                                              rpc_timeout=_RPC_TIMEOUT_S)
    rpc.init_rpc(f"rank{ctx.rank}", rank=ctx.rank, world_size=ctx.world_size, rpc_backend_options=options)


def build(opts: Options, setup) -> ParamServerEngine:
    global _server
    ctx = setup.ctx
    server = None
    if ctx.rank == _SERVER_RANK:
        master = setup.build_model().to(ctx.device)  # never run forward: no prepare
        server = Server(master, setup.make_optimizer(master.parameters()), opts.staleness * ctx.world_size)
        _server = server  # before the RPC group exists: no push can arrive earlier
    replica = setup.prepare(setup.build_model().to(ctx.device))
    rpc_started = ctx.world_size > 1
    if rpc_started:
        _start_rpc(ctx)
    return ParamServerEngine(setup, replica, opts.staleness, server, rpc_started)
