"""Benchmark: lmforge's batched ``generate`` against one-prompt-at-a-time Hugging Face ``model.generate``.

A small random Llama (hidden 256, 4 layers, vocab 2048) and 16 prompts of varied lengths; both paths
decode greedily for 64 new tokens (EOS disabled, so every row runs to the length limit and both do
the same number of tokens). Each path runs 3 times in the same process, interleaved, after one
warm-up; the median wall time is reported, with tokens per second and the speed-up ratio.

    python benchmarks/engines.py [--out benchmarks/results/engines.json] [--quick]

``--quick`` uses 1 timed run and 16 new tokens (a smoke test, not a measurement).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from _timing import time_interleaved  # noqa: E402
from lmforge.common.generation import generate  # noqa: E402
from lmforge.common.io import atomic_write_json  # noqa: E402

WORDS = (
    "the model reads each token and predicts what comes next while the cache keeps keys and values "
    "so that every step costs one position instead of the whole prefix of the sequence so far"
).split()


def build_tokenizer(vocab_size: int):
    """A word-level tokenizer over ``WORDS`` padded out with filler tokens to ``vocab_size`` entries."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    words = list(dict.fromkeys(WORDS))
    filler = [f"w{i}" for i in range(vocab_size - len(specials) - len(words))]
    vocab = {t: i for i, t in enumerate(specials + words + filler)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece(prefix="##")  # joins tokens with spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )


def build_model(vocab_size: int, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def make_prompts(n: int) -> list[str]:
    prompts = []
    for i in range(n):
        length = 4 + (i * 7) % 45  # 4..48 words
        prompts.append(" ".join(WORDS[(i + j) % len(WORDS)] for j in range(length)))
    return prompts


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "engines.json"))
    parser.add_argument("--quick", action="store_true", help="1 run, 16 new tokens (smoke test)")
    args = parser.parse_args(argv)

    runs = 1 if args.quick else 3
    new_tokens = 16 if args.quick else 64
    vocab_size = 2048
    n_prompts = 16

    tokenizer = build_tokenizer(vocab_size)
    model = build_model(vocab_size, tokenizer)
    # Disable EOS so that both paths always decode exactly `new_tokens` tokens per prompt.
    model.generation_config.eos_token_id = None
    prompts = make_prompts(n_prompts)

    def ours():
        outs = generate(model, _NoEos(tokenizer), prompts, max_new_tokens=new_tokens, batch_size=16)
        assert all(o.completion_tokens == new_tokens for o in outs)
        return outs

    def hf_one_by_one():
        outs = []
        with torch.inference_mode():
            for p in prompts:
                ids = tokenizer(p, return_tensors="pt").input_ids
                out = model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=new_tokens,
                    min_new_tokens=new_tokens,
                    do_sample=False,
                    pad_token_id=tokenizer.pad_token_id,
                )
                assert out.shape[1] - ids.shape[1] == new_tokens
                outs.append(out[0, ids.shape[1] :].tolist())
        return outs

    # Same greedy tokens from both paths (a benchmark of two different computations means nothing).
    agree = [o.token_ids for o in ours()] == hf_one_by_one()

    times = time_interleaved({"ours": ours, "hf": hf_one_by_one}, runs)
    t_ours, t_hf = times["ours"], times["hf"]
    total_tokens = n_prompts * new_tokens
    med_ours = statistics.median(t_ours)
    med_hf = statistics.median(t_hf)
    result = {
        "benchmark": "batched generate vs one-prompt-at-a-time HF generate",
        "model": {
            "arch": "llama",
            "hidden_size": 256,
            "layers": 4,
            "vocab_size": vocab_size,
            "dtype": "float32",
        },
        "prompts": n_prompts,
        "prompt_tokens": [len(tokenizer(p).input_ids) for p in prompts],
        "max_new_tokens": new_tokens,
        "batch_size": 16,
        "runs": runs,
        "quick": args.quick,
        "same_tokens": agree,
        "ours_seconds": t_ours,
        "hf_seconds": t_hf,
        "ours_median_s": med_ours,
        "hf_median_s": med_hf,
        "ours_tokens_per_s": total_tokens / med_ours,
        "hf_tokens_per_s": total_tokens / med_hf,
        "speedup": med_hf / med_ours,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
    }
    print(
        f"ours (batch 16): {med_ours:.3f} s  {result['ours_tokens_per_s']:.0f} tok/s\n"
        f"HF one by one:   {med_hf:.3f} s  {result['hf_tokens_per_s']:.0f} tok/s\n"
        f"speed-up: {result['speedup']:.1f}x  (same tokens: {agree})"
    )
    atomic_write_json(args.out, result)
    print(f"wrote {args.out}")
    return result


class _NoEos:
    """A tokenizer view whose EOS id is hidden, so lmforge's generate never stops on EOS."""

    def __init__(self, tokenizer) -> None:
        self._tok = tokenizer

    eos_token_id = None

    def __getattr__(self, name):
        return getattr(self._tok, name)

    def __call__(self, *args, **kwargs):
        return self._tok(*args, **kwargs)


if __name__ == "__main__":
    main()
