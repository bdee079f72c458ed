"""The zoo's fast tokenizer, trained here with Hugging Face ``tokenizers``.

Byte-level BPE (GPT-2 style, so any text round-trips) with one twist measured to matter for tiny
models: digits are split into single-digit tokens before BPE, so a number is copied digit by digit
instead of through arbitrary multi-digit merges (byte-level BPE without this left key-value
retrieval at 0% here, see ``shared/papers/zoo-learnability.md``). A leading space stays attached to
the first digit (``" 4821"`` -> ``Ġ4 8 2 1``): with a lone ``Ġ`` token between a key and its
value, a 2-layer probe stayed at chance on retrieval for 600 steps; with the space attached it
learned steadily. Checked: ``tokenizers``'s ``ByteLevelBPETokenizer`` has no digit option, so the
pipeline is assembled from its components.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

BOS, EOS, PAD = "<s>", "</s>", "<pad>"


def train_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE with single-digit pre-splitting; deterministic for the same texts."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r" ?\d"), behavior="isolated"),
         pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, bos_id)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, padding_side="right",
        clean_up_tokenization_spaces=False,
    )
