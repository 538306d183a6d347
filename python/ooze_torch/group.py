"""The worker group: one process, or N ranks under torch.distributed (gloo on CPU, NCCL on CUDA) with
the model sharded by FSDP2. Rank 0 speaks the protocol and launches the other ranks itself
(torchrun-style environment, rendezvous on 127.0.0.1); every rank runs every request on its share of
the batch's sequences. A rank that dies takes the group down (rank 0 exits; the others have rank 0's
death as their parent-death signal), so the supervisor sees one crashed worker.
"""
from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import torch
import torch.distributed as dist


class Group:
    """Rank, world size and device of this process, and the collectives the trainer uses."""

    def __init__(self, rank: int, world: int, device: torch.device):
        self.rank, self.world, self.device = rank, world, device
        self.mesh = None

    @property
    def distributed(self) -> bool:
        return self.world > 1

    def share(self, n: int) -> list[int]:
        """The indices of n sequences this rank trains on (round robin)."""
        return list(range(self.rank, n, self.world))

    def sum(self, values: list[float]) -> list[float]:
        if not self.distributed:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.tolist()

    def extreme(self, value: float, op: str) -> float:
        if not self.distributed:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN if op == "min" else dist.ReduceOp.MAX)
        return float(t.item())

    def all_reduce_(self, t: torch.Tensor) -> None:
        if self.distributed:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)

    def broadcast(self, obj):
        """Rank 0's obj on every rank."""
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]


def pick_device(name: str, local_rank: int) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("device 'cuda' was asked for, but torch sees no CUDA device (torch.cuda.is_available() is False: "
                               "a CPU build of torch, or no GPU); use device: cpu or install torch's CUDA build")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    if name != "cpu":
        raise RuntimeError(f"device must be auto, cpu or cuda, got {name!r}")
    return torch.device("cpu")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In a launched rank: SIGKILL when rank 0 (the parent) dies (Linux prctl PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except OSError:
        pass


def launch(argv: list[str], world: int, device: str) -> Group:
    """Starts ranks 1..world-1 as children of this process (rank 0), joins the process group, and
    returns rank 0's Group. In a child (RANK set) joins as that rank instead."""
    if "RANK" not in os.environ:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE=str(world))
        children = []
        for r in range(1, world):
            env = {**os.environ, "RANK": str(r), "LOCAL_RANK": str(r)}
            # stdin and stdout are rank 0's protocol stream: the other ranks get neither
            children.append(subprocess.Popen([sys.executable, "-m", "ooze_torch", *argv], env=env, stdin=subprocess.DEVNULL,
                                             stdout=sys.stderr.fileno(), preexec_fn=_die_with_parent))
        os.environ.update(RANK="0", LOCAL_RANK="0")
        threading.Thread(target=_watch, args=(children,), daemon=True).start()
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
    dev = pick_device(device, local)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    dist.init_process_group(backend=backend, rank=rank, world_size=world, device_id=dev if dev.type == "cuda" else None)
    g = Group(rank, world, dev)
    from torch.distributed.device_mesh import init_device_mesh

    g.mesh = init_device_mesh(dev.type, (world,))
    return g


STOPPING = threading.Event()
"""Set by rank 0 when it tells the group to stop: ranks exiting then are expected."""


def _watch(children: list[subprocess.Popen]) -> None:
    """Rank 0: when any other rank exits, the whole worker exits (its supervisor restarts it)."""
    while True:
        for i, c in enumerate(children):
            code = c.poll()
            if code is not None and not STOPPING.is_set():
                how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
                print(f"torch trainer worker: rank {i + 1} (pid {c.pid}) {how}; the worker group stops", file=sys.stderr, flush=True)
                for o in children:
                    if o.poll() is None:
                        o.kill()
                os._exit(3)
        time.sleep(0.2)
