"""Stage splitting rules. The schedules' training parity (every schedule, and pp x FSDP) is in
test_parity_matrix.py."""

import pytest

from scaletrain.config import resolve_model
from scaletrain.models import build_model
from scaletrain.parallel.pipeline import split_layers, split_stage, stage_ids


def test_split_layers_rule():
    assert split_layers(2, 2) == [range(0, 1), range(1, 2)]
    assert [len(r) for r in split_layers(32, 4)] == [7, 9, 9, 7]
    assert [len(r) for r in split_layers(4, 4)] == [0, 2, 2, 0]
    assert [len(r) for r in split_layers(5, 1)] == [5]
    for num_layers, num_stages in [(7, 3), (12, 8), (80, 16)]:
        parts = split_layers(num_layers, num_stages)
        assert [i for r in parts for i in r] == list(range(num_layers))
    with pytest.raises(ValueError, match="parallel.pp"):
        split_layers(2, 5)
    assert stage_ids(1, 4, 2) == [1, 5]


def test_split_stage_keeps_names_and_copies_tied_embeddings():
    model = build_model(resolve_model("tiny-llama"), device="meta")
    first, last = split_stage(model, 0, 2), split_stage(model, 1, 2)
    assert list(first.layers) == ["0"] and list(last.layers) == ["1"]
    assert first.output is None and first.norm is None and last.tok_embeddings is None
    names = {n for m in (first, last) for n, _ in m.named_parameters()}
    assert names == {n for n, _ in model.named_parameters()}
    # tied embeddings: the last stage gets its own head, the first keeps the embedding
    tied = build_model(resolve_model("tiny"), device="meta")
    first, last = split_stage(tied, 0, 2), split_stage(tied, 1, 2)
    assert first.output is None and first.tok_embeddings is not None
    assert last.output is not None and last.tok_embeddings is None
    assert last.output.weight.shape == tied.tok_embeddings.weight.shape
