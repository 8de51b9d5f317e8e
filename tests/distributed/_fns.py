import torch
import torch.distributed as dist


def allreduce_rank():
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    return t.item()


def fail_on_rank1():
    if dist.get_rank() == 1:
        raise ValueError("boom on rank 1")
    dist.barrier()
    return 0


def environment_seen(name: str) -> tuple[str | None, str, int]:
    """What a rank sees of the launcher: an environment variable, its working directory, and
    its torch thread count."""
    import os

    return os.environ.get(name), os.getcwd(), torch.get_num_threads()
