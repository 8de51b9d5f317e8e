"""Optional Weights & Biases logging, beside metrics.jsonl and TensorBoard (rank 0 only).

`wandb` is an optional extra (pip install 'scaletrain[wandb]'), imported only when
`monitor.wandb` is on. WANDB_MODE=offline writes the run under run_dir/wandb with no network
(`wandb sync` uploads it later). A requeued job resumes the same W&B run: its id is kept in
run_dir/wandb_id.txt.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

__all__ = ["WandbTracker"]


class WandbTracker:
    def __init__(self, run_dir: Path, *, project: str, config: dict[str, Any]):
        import wandb  # the optional extra; config validation checked it is installed

        run_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir = run_dir
        id_file = run_dir / "wandb_id.txt"
        if not id_file.exists():
            id_file.write_text(uuid.uuid4().hex[:12])
        self._run = wandb.init(
            project=project,
            name=run_dir.name,
            id=id_file.read_text(),
            resume="allow",
            dir=str(run_dir),
            config=config,
        )

    def log(self, record: dict[str, Any]) -> None:
        # scalars only: per-rank lists (straggler timings) stay in metrics.jsonl
        scalars = {k: v for k, v in record.items() if k != "step" and isinstance(v, int | float)}
        self._run.log(scalars, step=int(record["step"]))

    def finish(self, *, plan: dict[str, Any], ledger: str) -> None:
        """Attach the plan and the memory ledger (as files and summary fields), then close."""
        attachments = {"plan.json": json.dumps(plan, indent=1), "memory_ledger.txt": ledger}
        for name, text in attachments.items():
            path = self.run_dir / name
            path.write_text(text)
            self._run.save(str(path), base_path=str(self.run_dir), policy="now")
        self._run.summary["memory_ledger"] = ledger
        self._run.summary["plan"] = plan
        self._run.finish()
