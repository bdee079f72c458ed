"""Tests for the hand-written batched decode loop in lmforge.common.generation."""

from __future__ import annotations

import pytest
import torch

from lmforge.common.errors import UserError
from lmforge.common.generation import generate

from .conftest import FAMILIES, make_model, make_tokenizer

# Mixed lengths so that a batch needs left padding; 5 prompts with batch_size=3 gives a full and a
# partial batch.
PROMPTS = [
    "the cat",
    "a model predicts the next token from the tokens before it",
    "we",
    "numbers like 12, 345 and 6789 appear",
    "quantization maps weights",
]


def hf_greedy(model, tokenizer, prompt: str, max_new_tokens: int, eos=None) -> list[int]:
    """Reference: HF generate on one prompt, unpadded."""
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    kwargs = {} if eos is None else {"eos_token_id": eos}
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id
            if tokenizer.pad_token_id is not None
            else tokenizer.eos_token_id,
            **kwargs,
        )
    return out[0, ids.shape[1] :].tolist()


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_batched_matches_hf_unbatched(models, tokenizer, family):
    model = models[family]
    outs = generate(model, tokenizer, PROMPTS, max_new_tokens=12, batch_size=3)
    assert len(outs) == len(PROMPTS)
    for prompt, out in zip(PROMPTS, outs):
        ref = hf_greedy(model, tokenizer, prompt, 12)
        assert out.token_ids == ref, prompt
        assert out.prompt_tokens == len(tokenizer(prompt).input_ids)
        assert out.completion_tokens == len(out.token_ids) <= 12
        if out.finished_by == "length":
            assert out.completion_tokens == 12
            assert out.text == tokenizer.decode(ref, skip_special_tokens=True)


def test_greedy_sdpa_with_padding_matches_hf(tokenizer):
    model = make_model("llama", tokenizer, seed=7, attn="sdpa")
    outs = generate(model, tokenizer, PROMPTS, max_new_tokens=10, batch_size=5)
    for prompt, out in zip(PROMPTS, outs):
        assert out.token_ids == hf_greedy(model, tokenizer, prompt, 10)


def test_results_come_back_in_input_order(models, tokenizer):
    model = models["llama"]
    forward = generate(model, tokenizer, PROMPTS, max_new_tokens=6, batch_size=2)
    backward = generate(model, tokenizer, PROMPTS[::-1], max_new_tokens=6, batch_size=2)
    singles = [generate(model, tokenizer, [p], max_new_tokens=6)[0] for p in PROMPTS]
    assert [o.token_ids for o in forward] == [o.token_ids for o in singles]
    assert [o.token_ids for o in backward] == [o.token_ids for o in singles[::-1]]
    assert [o.prompt_tokens for o in forward] == [len(tokenizer(p).input_ids) for p in PROMPTS]


def test_max_new_tokens_respected(models, tokenizer):
    model = models["qwen2"]
    for n in (0, 1, 5):
        outs = generate(model, tokenizer, PROMPTS, max_new_tokens=n, batch_size=4)
        for out in outs:
            assert out.completion_tokens <= n
            if out.finished_by == "length":
                assert out.completion_tokens == n
    zero = generate(model, tokenizer, PROMPTS[:2], max_new_tokens=0)
    assert all(o.text == "" and o.completion_tokens == 0 and o.finished_by == "length" for o in zero)


def test_eos_stops_a_row_and_others_continue(tokenizer):
    model = make_model("llama", tokenizer, seed=3)
    free = generate(model, tokenizer, PROMPTS, max_new_tokens=12, batch_size=5)
    # Make the 4th greedy token of prompt 0 an EOS token (first occurrence).
    row = free[0].token_ids
    k = 3
    eos_tok = row[k]
    k = row.index(eos_tok)
    model.generation_config.eos_token_id = [eos_tok]
    outs = generate(model, tokenizer, PROMPTS, max_new_tokens=12, batch_size=5)
    assert outs[0].finished_by == "eos"
    assert outs[0].token_ids == row[: k + 1]
    assert outs[0].completion_tokens == k + 1
    assert outs[0].text == tokenizer.decode(row[:k], skip_special_tokens=True)
    # Every row (the finished one is dropped from the batch) still matches HF with the same EOS set.
    eos_set = [eos_tok, tokenizer.eos_token_id]
    for prompt, out in zip(PROMPTS, outs):
        ref = hf_greedy(model, tokenizer, prompt, 12, eos=eos_set)
        assert out.token_ids == ref
        assert out.finished_by == ("eos" if ref[-1] in eos_set else "length")


def test_stop_strings_truncate(models, tokenizer):
    model = models["mistral"]
    free = generate(model, tokenizer, PROMPTS, max_new_tokens=16, batch_size=5)
    full = free[1].text
    assert len(full) > 10
    stop = full[6:9]
    start = full.find(stop)
    outs = generate(
        model, tokenizer, PROMPTS, max_new_tokens=16, batch_size=5, stop=[stop, "never-seen-stop"]
    )
    assert outs[1].text == full[:start]
    assert outs[1].finished_by == "stop"
    assert outs[1].completion_tokens < free[1].completion_tokens
    assert outs[1].token_ids == free[1].token_ids[: outs[1].completion_tokens]
    for before, after in zip(free, outs):
        cut = before.text.find(stop)
        if cut == -1:
            assert after.text == before.text and after.finished_by == before.finished_by
        else:
            assert after.text == before.text[:cut] and after.finished_by == "stop"
            assert stop not in after.text


def test_seeded_sampling_reproducible_and_seed_dependent(models, tokenizer):
    model = models["gpt2"]
    kw = dict(max_new_tokens=12, do_sample=True, temperature=1.0, top_k=50, top_p=0.95, batch_size=3)
    a = generate(model, tokenizer, PROMPTS, seed=1, **kw)
    b = generate(model, tokenizer, PROMPTS, seed=1, **kw)
    c = generate(model, tokenizer, PROMPTS, seed=2, **kw)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert [o.token_ids for o in a] != [o.token_ids for o in c]
    # top_k=1 sampling can only pick the argmax.
    greedy = generate(model, tokenizer, PROMPTS, max_new_tokens=8)
    k1 = generate(model, tokenizer, PROMPTS, max_new_tokens=8, do_sample=True, top_k=1, seed=5)
    assert [o.token_ids for o in k1] == [o.token_ids for o in greedy]


def test_tokenizer_without_pad_falls_back_to_eos():
    tok = make_tokenizer(with_pad=False)
    assert tok.pad_token_id is None
    model = make_model("qwen2", tok, seed=11)
    side = tok.padding_side
    outs = generate(model, tok, PROMPTS, max_new_tokens=8, batch_size=5)
    assert tok.padding_side == side
    assert tok.pad_token_id is None
    for prompt, out in zip(PROMPTS, outs):
        assert out.token_ids == hf_greedy(model, tok, prompt, 8)


def test_bad_arguments_are_user_errors(models, tokenizer):
    model = models["llama"]
    with pytest.raises(UserError):
        generate(model, tokenizer, PROMPTS, do_sample=True, temperature=0.0)
    with pytest.raises(UserError):
        generate(model, tokenizer, PROMPTS, do_sample=True, top_p=0.0)
    with pytest.raises(UserError):  # learned positions: nothing past n_positions=256
        generate(models["gpt2"], tokenizer, PROMPTS[:1], max_new_tokens=1000)
    with pytest.raises(UserError):
        generate(model, tokenizer, "a single string")
    assert generate(model, tokenizer, []) == []


def test_rotary_model_may_run_past_max_positions(models, tokenizer, caplog):
    with caplog.at_level("WARNING", logger="lmforge.common.generation"):
        outs = generate(models["llama"], tokenizer, ["the cat"], max_new_tokens=260)
    assert outs[0].completion_tokens <= 260
    assert "exceeds the model's 256 positions" in caplog.text


def test_run_in_batches_sorts_by_length_and_restores_order():
    from lmforge.common.batching import run_in_batches

    seen: list[list[int]] = []

    def fn(batch):
        seen.append(batch)
        return [f"item{i}" for i in batch]

    lengths = [3, 9, 1, 7, 5]
    assert run_in_batches(lengths, 2, fn) == [f"item{i}" for i in range(5)]
    assert seen == [[1, 3], [4, 0], [2]]  # longest first, two at a time


def test_prompt_that_starts_with_bos_text_gets_no_second_bos(small):
    """A rendered chat template begins with the BOS text; encoding must not add another BOS."""
    from lmforge.common.generation import encode_prompt

    _, tok = small
    plain = encode_prompt(tok, "Task: email Anna.")
    assert plain[0] == tok.bos_token_id and plain[1] != tok.bos_token_id
    rendered = encode_prompt(tok, tok.bos_token + "Task: email Anna.")
    assert rendered == plain


def test_prompt_ids_give_the_same_tokens_as_text_prompts(models, tokenizer):
    model = models["llama"]
    ids = [tokenizer(p).input_ids for p in PROMPTS]
    by_text = generate(model, tokenizer, PROMPTS, max_new_tokens=8, batch_size=3)
    by_ids = generate(model, tokenizer, prompt_ids=ids, max_new_tokens=8, batch_size=3)
    assert [o.token_ids for o in by_ids] == [o.token_ids for o in by_text]
    assert [o.prompt_tokens for o in by_ids] == [len(i) for i in ids]
    with pytest.raises(UserError, match="exactly one"):
        generate(model, tokenizer, PROMPTS, prompt_ids=ids)


def test_position_hook_sees_every_fed_token_position_once_per_row(models, tokenizer):
    """Rebuild, from the hook's calls alone, which positions each row was fed: every prompt position
    once in the prefill (padding marked -1), then one new position per decode step until the row
    stops -- checked against the rows' prompt lengths and completion lengths."""
    model = models["llama"]
    seen: dict[int, list[int]] = {}
    calls = []

    def hook(rows, positions):
        assert positions.shape[0] == len(rows) and positions.dtype == torch.long
        calls.append(positions.shape[1])
        for r, pos in zip(rows, positions.tolist()):
            seen.setdefault(r, []).extend(p for p in pos if p >= 0)

    outs = generate(model, tokenizer, PROMPTS, max_new_tokens=7, batch_size=3, stop=["e"], position_hook=hook)
    for r, out in enumerate(outs):
        n_prompt = len(tokenizer(PROMPTS[r]).input_ids)
        # the last generated token is never fed back (the loop ends after choosing it)
        assert seen[r] == list(range(n_prompt + out.completion_tokens - 1)), PROMPTS[r]
    # padding is reported as -1 in the prefill of a mixed-length batch
    assert calls[0] == max(len(tokenizer(p).input_ids) for p in PROMPTS)
