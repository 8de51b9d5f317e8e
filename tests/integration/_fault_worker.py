"""A torchrun worker that dies once (rank 1, right after the step-4 checkpoint) to test restarts.

Run as `torchrun --max-restarts 1 ... _fault_worker.py MARKER --section.key=value ...`. The first
attempt crashes without cleanup; torchrun restarts every worker and `checkpoint.resume=auto`
continues from the last good checkpoint.
"""

import os
import sys
import time
from pathlib import Path

import scaletrain.trainer.checkpointing as checkpointing
from scaletrain.config import load_config
from scaletrain.trainer import train

marker = Path(sys.argv[1])
real_save = checkpointing.save


def save_then_die(run, step, wall_s):
    path = real_save(run, step, wall_s)
    if step == 4 and run.env.rank == 1 and not marker.exists():
        marker.write_text("crashed once")
        os._exit(17)  # a hard kill: no cleanup, no exception handling
    return path


checkpointing.save = save_then_die
if int(os.environ["TORCHELASTIC_RESTART_COUNT"]) > 0 and int(os.environ["RANK"]) == 1:
    # the restarted rank 1 joins late: its peer meets the killed attempt's store keys first (the
    # interleaving that made restarts fail before each attempt got its own key namespace)
    time.sleep(2)
result = train(load_config(None, sys.argv[2:]))
if result.run_dir and int(os.environ["RANK"]) == 0:
    (result.run_dir / "losses.txt").write_text("\n".join(map(repr, result.losses)))
    (result.run_dir / "attempt.txt").write_text(os.environ["TORCHELASTIC_RESTART_COUNT"])
