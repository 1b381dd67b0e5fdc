"""A frame's codec input row: the 16 codebooks' lookups in one joined table equal the lookup a table, to the bit."""

from __future__ import annotations

import torch

from services.model.loader import load_model
from tests.support.model_fixtures import reference_checkpoint


def _per_table(talker, codes: torch.Tensor) -> torch.Tensor:
    rows = [talker.codec_embedding(codes[:, 0])]
    rows += [table(codes[:, j + 1]) for j, table in enumerate(talker.codebook_embedding)]
    return torch.stack(rows, dim=1).sum(dim=1)


def _codes(talker, rows: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    first = torch.randint(0, talker.codec_embedding.num_embeddings, (rows, 1), generator=generator)
    rest = torch.randint(0, talker.codebook_embedding[0].num_embeddings, (rows, len(talker.codebook_embedding)),
                         generator=generator)
    return torch.cat((first, rest), dim=1)


@torch.inference_mode()
def test_the_joined_lookup_equals_a_lookup_a_table_and_follows_a_replaced_table():
    talker = load_model(reference_checkpoint("custom_voice").directory).talker
    codes = _codes(talker, 9, seed=1)
    before = talker.embed_codes(codes)
    assert torch.equal(before, _per_table(talker, codes))
    # A table replaced after the first lookup (a weight load assigns new tensors): the joined copy is rebuilt.
    talker.codebook_embedding[3].weight = torch.nn.Parameter(torch.randn_like(talker.codebook_embedding[3].weight),
                                                              requires_grad=False)
    again = talker.embed_codes(codes)
    assert torch.equal(again, _per_table(talker, codes))
    assert not torch.equal(again, before), "the replaced table must change the rows (else this checks nothing)"
