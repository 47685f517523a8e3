"""eagleviz/models/hot_vocab.py: ranking, restricting an EAGLE-3 head to its hot tokens (same logits on the
kept rows, right id map), the engine stays lossless with it, and loading explains what it cannot do."""

import json

import pytest
import torch

from eagleviz.config import SamplingConfig, TreeConfig
from eagleviz.decoding.engine import Engine
from eagleviz.errors import UserFacingError
from eagleviz.models.draft import DraftConfig, DraftHead, random_head, save_head
from eagleviz.models.hot_vocab import (HOT_TOKENS_FILE, draft_target_ids, rank_tokens, read_ranking, restrict,
                                       write_ranking)
from eagleviz.decoding.load import _hot_vocabulary
from tiny import tiny_target

USED = [0, 2, 3, 5, 8, 13, 21, 30]  # the target ids of an 8-token draft vocabulary


def eagle3_head(target, seed: int = 0) -> DraftHead:
    torch.manual_seed(seed)
    head = DraftHead(DraftConfig.for_target(target, "eagle3", draft_vocab_size=len(USED)))
    with torch.no_grad():
        for name, p in head.named_parameters():
            p.copy_(torch.ones_like(p) if name.endswith("norm.weight") else torch.randn(p.shape) * 0.5)
        used = torch.tensor(USED)
        head.d2t.copy_(used - torch.arange(len(USED)))
        head.t2d.zero_()
        head.t2d[used] = True
    return head.eval()


def test_rank_tokens_orders_candidates_by_count_then_id():
    counts = torch.tensor([5, 0, 9, 5, 1, 7])
    assert rank_tokens(counts, torch.tensor([3, 0, 2, 4])) == [2, 0, 3, 4]


def test_restricted_head_keeps_the_hot_rows_and_their_ids():
    target = tiny_target()
    head = eagle3_head(target)
    ranking = [30, 1, 5, 0, 8, 2]  # 1 is not in the draft vocabulary: skipped
    small = restrict(head, ranking, 3)
    assert small.config.draft_vocab_size == 3 and head.config.draft_vocab_size == len(USED)
    assert draft_target_ids(small).tolist() == [0, 5, 30]  # rows keep their order
    assert small.t2d.nonzero().flatten().tolist() == [0, 5, 30]
    h = torch.randn(4, target.hidden_size)
    full = head.logits(h, target.unembed)
    rows = [USED.index(t) for t in (0, 5, 30)]
    torch.testing.assert_close(small.logits(h, target.unembed), full[:, rows])
    assert restrict(head, ranking, 100).config.draft_vocab_size == 5  # draft ids the ranking misses are dropped
    assert restrict(head, USED, 100) is head  # the whole ranked vocabulary: nothing to change


def test_restrict_refuses_eagle1_and_empty_sizes():
    target = tiny_target()
    with pytest.raises(ValueError, match="EAGLE-3"):
        restrict(random_head(target, "eagle1"), [1, 2], 1)
    with pytest.raises(ValueError, match="at least 1"):
        restrict(eagle3_head(target), USED, 0)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_hot_vocabulary_keeps_decoding_lossless(temperature):
    target = tiny_target(scale=3.0)
    engine = Engine(target, restrict(eagle3_head(target, seed=2), [21, 3, 8], 2), "hot")
    sampling = SamplingConfig(temperature=temperature, max_new_tokens=24, seed=5)
    spec = engine.generate("hello there", TreeConfig.create(3, 2, 6), sampling, chat=False)
    plain = engine.generate("hello there", None, sampling, chat=False)
    if temperature == 0:
        assert spec.token_ids == plain.token_ids
    drafted = {n.token for c in spec.cycles for n in c.nodes if n.source != "lookup"}
    assert drafted <= {3, 21}  # the head only ever drafts hot tokens (lookup copies the context)


def test_ranking_file_round_trip_and_bad_files(tmp_path):
    write_ranking(tmp_path, [5, 3, 1], "test", 9)
    assert read_ranking(tmp_path) == [5, 3, 1]
    (tmp_path / HOT_TOKENS_FILE).write_text(json.dumps({"ids": ["a"]}))
    with pytest.raises(ValueError, match="list of token ids"):
        read_ranking(tmp_path)
    assert read_ranking(tmp_path / "nowhere") is None


def test_loading_uses_the_ranking_by_default_and_explains_refusals(tmp_path):
    target = tiny_target()
    head = eagle3_head(target)
    save_head(head, tmp_path, dtype=torch.float32)
    assert _hot_vocabulary(head, "h", tmp_path, None) == (head, "h")  # no ranking: the whole vocabulary
    with pytest.raises(UserFacingError, match="hot-tokens --head"):
        _hot_vocabulary(head, "h", tmp_path, 4)
    write_ranking(tmp_path, rank_tokens(torch.arange(32), torch.tensor(USED)), "test", 1)
    small, name = _hot_vocabulary(head, "h", tmp_path, 4)
    assert draft_target_ids(small).tolist() == [8, 13, 21, 30] and name == "h (4 of 8 draft tokens)"
    assert _hot_vocabulary(head, "h", tmp_path, 0) == (head, "h")
    with pytest.raises(UserFacingError, match="EAGLE-1"):
        _hot_vocabulary(random_head(target, "eagle1"), "e1", tmp_path, 4)
    with pytest.raises(UserFacingError, match="0 .*or positive"):
        _hot_vocabulary(head, "h", tmp_path, -1)
