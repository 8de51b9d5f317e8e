"""8-bit AdamW sharded by FSDP2 (ZeRO-3) and ZeRO-1, Adafactor by ZeRO-1, on real gloo ranks:
the states are sharded as the parameters are (DTensors under FSDP2), saved by DCP, and a run
stopped and resumed gives exactly the losses of the run straight through. (torch's Adafactor
cannot step DTensors: FSDP2 is refused for it, `option_problems`.)"""

import pytest

from scaletrain.parallel.launch import spawn

from ._trainer_fns import straight_and_resumed

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


@pytest.mark.parametrize(("optim", "zero"), [("adamw8bit", 3), ("adamw8bit", 1), ("adafactor", 1)])
def test_sharded_optimizer_resumes_bitwise(tmp_path, optim, zero):
    if optim == "adamw8bit":
        pytest.importorskip("torchao")
    extra = [f"--optim.name={optim}", "--parallel.dp=2", f"--parallel.zero={zero}"]
    for straight, resumed in spawn(straight_and_resumed, 2, tmp_path, extra, 2):
        assert resumed == straight  # exact: the checkpoint holds the whole optimizer state
        assert straight[-1] < straight[0]
