import pytest
import torch

from scaletrain.parallel.launch import spawn

from ._cp_fns import STEPS, cp_train_models, train_lm

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
# RoPE positions (tiny-llama, GQA) and learned positions (tiny, GPT-2 style)
PRESETS = ["tiny-llama", "tiny"]


def test_cp2_training_matches_single_process():
    refs = [train_lm(p) for p in PRESETS]
    per_rank = spawn(cp_train_models, 2, PRESETS)
    for i, preset in enumerate(PRESETS):
        for got in (per_rank[0][i], per_rank[1][i]):
            assert got["losses"] == pytest.approx(refs[i]["losses"], abs=1e-5), preset
            for step in range(STEPS):
                for n, g in refs[i]["grads"][step].items():
                    torch.testing.assert_close(got["grads"][step][n], g, atol=1e-5, rtol=1e-5,
                                               msg=f"{preset} {n} step {step}")
