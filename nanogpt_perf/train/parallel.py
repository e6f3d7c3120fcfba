"""Data parallelism under torchrun, in one call for train.py: DDP (every rank holds the whole model,
the gradients all-reduced) or FSDP2 (each rank holds 1/world of every parameter, gradient and
optimizer state; each block's weights are gathered just before it runs and freed after), and
checkpoints of either as the full, plain state dicts that one process without torch.distributed
loads."""

import gc
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

# FSDP2 and torch.distributed.checkpoint take ~0.7 s to import (DTensor): imported where they are
# used, so that a run of one process never pays for them
if TYPE_CHECKING:
    from torch.distributed.fsdp import MixedPrecisionPolicy

from model import GPT
from nanogpt_perf.errors import UserError
from nanogpt_perf.optim import hyperparameters_kept
from nanogpt_perf.runtime import PTDTYPES, Runtime

PARALLELISMS = ("ddp", "fsdp")


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: str = "auto"  # the device setting, made this rank's own GPU under torchrun

    @property
    def distributed(self) -> bool:
        return self.world_size > 1 or dist.is_initialized()

    @property
    def master(self) -> bool:
        return self.rank == 0


# what torchrun sets in each process it starts: this process's rank, its rank on this machine, the
# number of ranks, and where they meet
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE")
TORCHRUN_VARIABLES = (*RANK_VARIABLES, "MASTER_ADDR", "MASTER_PORT")


def torchrun_problem(environ: Mapping[str, str]) -> str | None:
    """What is wrong with torchrun's variables when some were set by hand: all or none of them
    (MASTER_ADDR and MASTER_PORT alone are not a launch: some clusters set them for everyone),
    integers, and ranks in range."""
    present = [k for k in RANK_VARIABLES if k in environ]
    if not present:
        return None
    if missing := [k for k in TORCHRUN_VARIABLES if k not in environ]:
        return (
            f"{', '.join(present)} set but not {', '.join(missing)}: torchrun sets them all for "
            "each process it "
            "starts (torchrun --standalone --nproc_per_node=N train.py ...); for one process, "
            "unset " + ", ".join(present)
        )
    numbers = {}
    for key in (*RANK_VARIABLES, "MASTER_PORT"):
        try:
            numbers[key] = int(environ[key])
        except ValueError:
            return f"{key} must be an integer, not {environ[key]!r}"
    rank, local_rank, world_size, port = numbers.values()
    if world_size < 1:
        return f"WORLD_SIZE must be >= 1, not {world_size}"
    for key, value in (("RANK", rank), ("LOCAL_RANK", local_rank)):
        if not 0 <= value < world_size:
            return f"{key} must be in [0, WORLD_SIZE={world_size}), not {value}"
    if not 0 < port < 65536:
        return f"MASTER_PORT must be a port number in [1, 65535], not {port}"
    return None


def torchrun_rank(environ: Mapping[str, str]) -> int:
    """This process's rank (0 without torchrun), torchrun's variables checked: one error line when
    they are wrong."""
    if problem := torchrun_problem(environ):
        raise UserError(problem)
    return int(environ.get("RANK", 0))


def start_ranks(device: str, backend: str) -> Ranks:
    """Under torchrun (which sets RANK; torchrun_rank checked the variables): join the process
    group, each rank on its own GPU (cuda:LOCAL_RANK) where there are GPUs; backend 'auto' is nccl
    on CUDA, gloo elsewhere. One process: Ranks() with the device as set."""
    if "RANK" not in os.environ:
        return Ranks(device=device)
    rank, local_rank, world_size = (int(os.environ[k]) for k in RANK_VARIABLES)
    if device in ("auto", "cuda") and torch.cuda.is_available():
        if local_rank >= torch.cuda.device_count():
            raise UserError(
                f"LOCAL_RANK={local_rank}, but this machine has {torch.cuda.device_count()} CUDA "
                "devices"
            )
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(device)
    if backend == "auto":
        backend = "nccl" if device.startswith("cuda") else "gloo"
    # started by hand: it waits for every rank, 30 minutes at most
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        where = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        print(
            f"rank {rank}: waiting for all {world_size} ranks at {where} (RANK, WORLD_SIZE... set "
            "by hand)"
        )
    # torch.distributed.nn, imported before the group exists: its functions take group=group.WORLD
    # as a default argument, evaluated at import; imported after it (DDP and DTensor import it),
    # they would hold the group to the end and close() could not end it
    import torch.distributed.nn as distributed_nn  # noqa: F401

    try:
        dist.init_process_group(backend=backend)
    except (RuntimeError, ValueError) as e:  # the port taken, the address unknown
        raise UserError(
            f"torch.distributed did not start ({backend}, MASTER_ADDR/MASTER_PORT): "
            f"{str(e).splitlines()[0]}"
        ) from None
    return Ranks(rank, local_rank, world_size, device)


def mean_over_ranks(value: torch.Tensor) -> float:
    """The mean of value over every rank (each rank the same answer); value itself in one
    process."""
    if dist.is_initialized():
        value = value.clone()
        dist.all_reduce(value)  # a sum: gloo has no average
        return value.item() / dist.get_world_size()
    return value.item()


def wrap_model(
    model: GPT, parallelism: str, runtime: Runtime, compile: bool, compile_mode: str
) -> nn.Module:
    """The GPT as train.py runs it, moved to the device: compiled when asked and, when
    torch.distributed is initialised, wrapped in DDP or sharded with FSDP2 (one process: no
    wrapper). Build the optimizer from unwrap(result) afterwards: FSDP replaces every parameter by
    its shard."""
    if parallelism == "fsdp" and dist.is_initialized():
        return shard(model, runtime, compile, compile_mode)
    model.to(runtime.device)
    if compile:
        model = torch.compile(model, mode=compile_mode)
    if dist.is_initialized():
        model = DDP(
            model, device_ids=[runtime.device.index] if runtime.device_type == "cuda" else None
        )
    return model


def mixed_precision(runtime: Runtime) -> "MixedPrecisionPolicy":
    """Compute in the run's reduced dtype (weights gathered in it), with fp32 gradient reduction and
    fp32 shards for the optimizer; fp32 runs: no casts at all."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if not runtime.autocast:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=PTDTYPES[runtime.dtype], reduce_dtype=torch.float32)


def shard(model: GPT, runtime: Runtime, compile: bool, compile_mode: str) -> nn.Module:
    """FSDP2 in place: each block a unit of its own (gathered for its forward and backward only),
    then the root for the rest (the embeddings, tied to lm_head, and ln_f). fully_shard moves each
    unit to the device as it shards it, so the whole model is never on one device. With compile,
    each block is compiled in place before it is sharded (FSDP2's recipe, which composes with the
    model's activation checkpointing around each block), and the state dict keeps its plain
    names."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(runtime.device_type, (dist.get_world_size(),))
    policy = mixed_precision(runtime)
    for block in model.transformer.h:
        if compile:
            block.compile(mode=compile_mode)
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def close() -> None:
    """Leave torch.distributed, every rank together, and end the process group while the interpreter
    is whole.

    Gloo runs each collective on a thread of its own, which wakes the caller, then lets go of the
    work, and so of the tensors it was given: when Python has let go of them already, that thread
    frees their Python objects, which takes the GIL. A thread that takes the GIL once the
    interpreter is finalizing is ended there (pthread_exit), the unwinding meets a C++ destructor
    and the process aborts ('terminate called without an active exception'). The barrier's work
    holds every work before it until its thread lets go of it, a moment after the barrier returns.
    Only the group's destructor waits for its threads (it joins them, the GIL released), and it runs
    only once nothing holds the group: the caller releases the DDP or FSDP model, its optimizer and
    training step first; close() drops what torch.distributed and DTensor keep."""
    dist.barrier()  # no rank tears its group down while its peer still works with it
    dist.destroy_process_group()
    forget_dtensor_caches()
    gc.collect()  # the wrappers' reference cycles: the group's destructor runs here


def forget_dtensor_caches() -> None:
    """Empty DTensor's caches of sharding decisions (when DTensor was used): each holds a device
    mesh, and so FSDP2's process group, to the interpreter's end. They are private to torch and
    change with its versions: each is looked up and skipped where this torch has none
    (tests/test_train.py counts the gloo threads left at the end)."""
    if "torch.distributed.tensor" not in sys.modules:
        return
    try:
        from torch.distributed.tensor import _redistribute, debug
        from torch.distributed.tensor._collective_utils import MeshTopoInfo
    except ImportError:
        return
    caches = (
        (debug, "_clear_sharding_prop_cache"),  # the sharding propagator's, in Python and in C++
        (_redistribute, "clear_redistribute_planner_cache"),
        (getattr(_redistribute, "_gen_transform_infos", None), "cache_clear"),
        (getattr(MeshTopoInfo, "build_from_mesh", None), "cache_clear"),
    )
    for owner, name in caches:
        if clear := getattr(owner, name, None):
            clear()


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The plain model under DDP and torch.compile wrappers, whose state dict has no
    _orig_mod./module. prefixes."""
    model = getattr(model, "module", model)  # DistributedDataParallel
    return getattr(model, "_orig_mod", model)  # torch.compile


def is_fsdp(model: nn.Module) -> bool:
    if not dist.is_initialized():
        return False
    from torch.distributed.fsdp import FSDPModule

    return isinstance(unwrap(model), FSDPModule)


def full_state(
    model: nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(model state, optimizer state) as one process's model.state_dict() and optimizer.state_dict()
    hold them, for a plain model, DDP or FSDP alike. Under FSDP every rank must call it (it
    gathers); only rank 0 gets the state."""
    if not is_fsdp(model):
        return unwrap(model).state_dict(), optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    # gathered shard by shard to rank 0's CPU
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state = get_model_state_dict(model, options=full)
    optimizer_state = get_optimizer_state_dict(model, optimizer, options=full)
    if dist.get_rank() != 0:
        return {}, {}
    return retie(model, model_state), by_id(optimizer_state, param_names(model, optimizer))


def retie(model: nn.Module, state: dict[str, Any]) -> dict[str, Any]:
    """The names of one shared parameter (the embedding tied to lm_head), which the gathering copied
    apart, pointed at one tensor again, as in model.state_dict(): saved once, not twice."""
    first: dict[torch.Tensor, str] = {}
    for name, tensor in unwrap(model).state_dict(keep_vars=True).items():
        state[name] = state[first.setdefault(tensor, name)]
    return state


def load_full_state(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    model_state: dict[str, Any] | None,
    optimizer_state: dict[str, Any],
) -> None:
    """Load what full_state saved (or a checkpoint of a single process or of DDP) into a plain
    model, DDP or FSDP; under FSDP every rank calls it with the whole state and keeps its own shard.
    model_state None: the weights are already in the model (loaded before it was wrapped). The
    optimizer keeps the hyperparameters it was built with (this run's settings), and takes the
    state's moments and steps."""
    if not is_fsdp(model):
        if model_state is not None:
            unwrap(model).load_state_dict(model_state)
        with hyperparameters_kept(optimizer):
            optimizer.load_state_dict(optimizer_state)
        return
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True)
    if model_state is not None:
        set_model_state_dict(model, model_state, options=options)
    by_name_state = by_name(optimizer_state, param_names(model, optimizer))
    with hyperparameters_kept(optimizer):
        set_optimizer_state_dict(model, optimizer, by_name_state, options=options)


def param_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The name of each of the optimizer's parameters, in the order that numbers them in
    optimizer.state_dict() (the tied embedding by its first name, as torch.distributed.checkpoint
    names it)."""
    names = {p: name for name, p in unwrap(model).named_parameters()}
    return [names[p] for group in optimizer.param_groups for p in group["params"]]


def by_id(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """torch.distributed.checkpoint's optimizer state (keyed by parameter name) in
    optimizer.state_dict()'s layout (keyed by number), so that a checkpoint is the same whatever the
    parallelism that saved it."""
    ids = {name: i for i, name in enumerate(names)}
    groups = [
        {**group, "params": [ids[n] for n in group["params"]]} for group in state["param_groups"]
    ]
    return {"state": {ids[n]: s for n, s in state["state"].items()}, "param_groups": groups}


def by_name(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """The inverse of by_id."""
    groups = [
        {**group, "params": [names[i] for i in group["params"]]} for group in state["param_groups"]
    ]
    return {"state": {names[i]: s for i, s in state["state"].items()}, "param_groups": groups}
