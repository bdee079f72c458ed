"""SelfCite tier B: the whole loop on a tiny model trained here from scratch.

Loop (:func:`run_tier_b`): (1) toy documents (:func:`make_toy_docs`): 8 short sentences of a closed
vocabulary, 2-3 of them facts ``"{Key} {NN} {objects}."`` at non-adjacent places, the rest filler
``"The {adj} {noun} {verb}."``; a question naming one or two of the fact keys (quoted, so a key is the
same token in the question, the document and the answer); a gold response of 1-2 statements restating
facts, a fused statement restating two (gold = both sentences). Prompts are the official LongCite
instruction (:func:`~lmforge.methods.selfcite.format.build_prompt` on
:func:`~lmforge.methods.selfcite.format.split_sentences`, checked one to one). (2) SFT from scratch
(:func:`train_sft`): a 2-layer hidden-128 Llama (0.6M parameters, fp32) with the zoo's digit-splitting
BPE trained on the task texts, loss on the response and EOS only, AdamW with warm-up + cosine, fresh
documents every step, 30 % of the training citations noisy. (3) Best-of-N on the model's own reward
(:func:`make_pairs`): a sampled response per fresh document (official T 0.95 / top-p 0.7), every
citation reranked by :func:`~lmforge.methods.selfcite.bon.best_of_n` with the model as judge
(``RewardSettings(chat=False)``: the toy tokenizer has no chat template); chosen = BoN response,
rejected = the sample, equal pairs skipped as in the official ``make_preference_data.py``. (4) SimPO
(:func:`simpo_arm`, :func:`~lmforge.methods.selfcite.train.train_simpo`, LoRA, beta 10, gamma/beta 0.3)
from the same SFT weights on balanced pairs (:func:`~lmforge.methods.selfcite.balance.balance_rejected`
with the document's sentence count) and on raw pairs. (5) Greedy evaluation on held-out documents
(:func:`evaluate_responses`): citation F1 of :func:`~lmforge.methods.selfcite.metrics.score_dataset`
with statements matched to gold **by order** (the question fixes the statements and their order, and
order matching scores the citations even when the model miscopies a digit, where text matching would
leave the statement unmatched), cited sentences per statement, malformed and out-of-document counts,
and the share of responses whose statement texts equal the gold (content copied). The same numbers for
the BoN responses vs the original samples on the training documents. Conditions:
:data:`TIER_B_CONDITIONS`.

Design choices: the noisy citation replaces a cited sentence by a **neighbour** (i-1 or i+1), not a
uniformly random sentence: LongCite's noisy citations are mostly off by a chunk, and a neighbour is
always filler here (facts are never adjacent). Keys, objects and every word are single tokens (the BPE
saturates at ~610 tokens); digits are single tokens, and ``<C3>`` / ``[3-3]`` tokenize to the same
pieces everywhere (tested). The template head (the ~108 tokens before ``<C0>``) is shared by every
prompt, so SFT runs it once per batch and repeats its keys/values (:func:`shared_prefix_loss`; equal to
the plain loss, tested; 1.5x faster).

Result of the pilots (:data:`PILOT_RUNS`, seed 123): within the budget the tiny model learns the
format (every greedy answer parseable) and to copy the key from the question, but **not** to copy a
fact's number and object from the document (0-2 % of answers with the right content after up to 2000
steps / 5 min), and it cites a fact sentence at random (F1 0.42-0.49 against ~0.45 for a random fact).
Without content copying, log p(r|E) does not depend on E, so the self-reward carries no signal and
neither best-of-N nor SimPO has anything to teach: tier B does not work on this CPU budget with a
from-scratch model. What would be needed (untested): a longer SFT (minutes to tens of minutes), or a
pretrained copier.

Libraries checked: nothing packaged runs SelfCite's loop; the pieces are this package's
(format/reward/bon/balance/train/metrics) on transformers, PEFT and TRL (CPOTrainer).

NOTEs (deviations from the paper): the model is a 0.6M Llama trained here, not LongCite-8B; SimPO
updates LoRA adapters (r 16) where the official run is a full fine-tune; the SimPO lr is not the
official 3e-7 (:data:`SIMPO_LR`); N = 8 samples per citation (official 10) in :data:`FULL`; the
response samples are drawn for all documents in one batched call (:func:`sample_responses`) instead of
:func:`~lmforge.methods.selfcite.bon.sample_response` one prompt at a time (same settings); the fact
sentence has no verb (see ``_fact``).
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lmforge.common.errors import UserError
from lmforge.methods.selfcite.format import Sentence, build_prompt, render_statement, split_sentences
from lmforge.methods.selfcite.metrics import GoldStatement

# ---------------------------------------------------------------------------------------------- data

KEYS = ("Mira", "Tobo", "Kesa", "Lumo", "Rafi", "Nilo", "Dana", "Voss", "Pema", "Suri", "Galo", "Wren",
        "Ido", "Fenn", "Hale", "Juno", "Bex", "Cato", "Ruth", "Zane", "Oona", "Quin", "Yara", "Esme")
OBJECTS = ("lamps", "cups", "coins", "ropes", "maps", "bells", "kites", "drums", "boats", "hats")
_ADJ = ("old", "red", "small", "quiet", "tall", "wet", "cold", "green")
_NOUN = ("dog", "tree", "road", "wind", "river", "house", "cat", "bird", "cloud", "gate")
_VERB = ("sleeps", "waits", "stands", "moves", "rests", "sings")
_PREP = ("near", "by", "under", "behind", "past")
KINDS = ("single", "fused", "pair")
"""Question kinds: one key (one single statement); two keys in one fused statement (gold = both fact
sentences); two keys in two single statements."""


@dataclass(frozen=True)
class ToyDoc:
    """A document, its question and the gold statements.

    ``facts`` maps every key with a fact sentence in the document (asked or not) to that sentence's
    index; ``asked`` are the keys the question names, in the question's (and the response's) order.
    """

    context: str
    sentences: tuple[Sentence, ...]
    question: str
    gold: tuple[GoldStatement, ...]
    kind: str
    facts: dict[str, int]
    asked: tuple[str, ...]
    prompt: str

    @property
    def n_sentences(self) -> int:
        return len(self.sentences)

    def response(self, support: Sequence[Sequence[int]] | None = None) -> str:
        """The response with these cited sentence sets per statement (default: the gold ones)."""
        sets = [g.support for g in self.gold] if support is None else support
        return "\n".join(render_statement(g.text, spans_of(s)) for g, s in zip(self.gold, sets, strict=True))

    @property
    def gold_response(self) -> str:
        return self.response()


def spans_of(ids: Sequence[int]) -> list[tuple[int, int]]:
    """Sorted sentence ids as merged inclusive runs: ``{2, 3, 6}`` -> ``[(2, 3), (6, 6)]``."""
    out: list[tuple[int, int]] = []
    for i in sorted(set(ids)):
        if out and i == out[-1][1] + 1:
            out[-1] = (out[-1][0], i)
        else:
            out.append((i, i))
    return out


def _fact(key: str, number: int, obj: str) -> str:
    # NOTE: no verb between the key and the number: with "Mira keeps 41 lamps." the tiny model had not
    # learned to copy the number after 2000 SFT steps (5 min; the lookup needs the key two tokens
    # back); with the number right after the key a plain induction head copies it.
    return f"{key} {number} {obj}."


def _filler(rng: random.Random) -> str:
    return f"The {rng.choice(_ADJ)} {rng.choice(_NOUN)} {rng.choice(_VERB)}."


def _question(kind: str, asked: Sequence[str]) -> str:
    if kind == "single":
        return f'What does "{asked[0]}" keep?'
    if kind == "fused":
        return f'What do "{asked[0]}" and "{asked[1]}" keep?'
    return f'What does "{asked[0]}" keep, and what does "{asked[1]}" keep?'


def make_toy_docs(n: int, seed: int, *, n_sentences: int = 8, n_facts: tuple[int, ...] = (2, 3),
                  kinds: tuple[str, ...] = KINDS) -> list[ToyDoc]:
    """``n`` documents of ``n_sentences`` sentences, ``n_facts`` of them (drawn from the tuple) facts
    ``"{Key} keeps {NN} {objects}."`` about distinct keys at pairwise non-adjacent places, the rest
    filler ``"The {adj} {noun} {verb} {prep} the {adj} {noun}."`` (no key, no digit). The question names
    one or two of the fact keys (kind drawn from ``kinds``); unasked facts are distractors. Numbers are
    two digits (10-99), so a statement's number and object can only come from its fact sentence.

    Raises:
        UserError: bad sizes, or a document the sentence splitter does not give back one to one
            (a bug: the vocabulary is closed and was checked).
    """
    if n < 0:
        raise UserError(f"n must be >= 0, got {n}")
    if not kinds or any(k not in KINDS for k in kinds):
        raise UserError(f"kinds must be a non-empty subset of {KINDS}")
    if not n_facts or min(n_facts) < 2 or 2 * max(n_facts) - 1 > n_sentences or n_sentences > 10:
        raise UserError("need 2 <= n_facts, facts fitting non-adjacent in n_sentences, n_sentences <= 10")
    rng = random.Random(f"toy-docs:{seed}")
    docs = []
    for _ in range(n):
        k_facts = rng.choice(n_facts)
        while True:
            slots = sorted(rng.sample(range(n_sentences), k_facts))
            if all(b - a >= 2 for a, b in zip(slots, slots[1:])):
                break
        keys = rng.sample(KEYS, k_facts)
        facts = {}
        texts = []
        fact_text = {}
        for pos in range(n_sentences):
            if pos in slots:
                key = keys[slots.index(pos)]
                fact_text[key] = _fact(key, rng.randint(10, 99), rng.choice(OBJECTS))
                facts[key] = pos
                texts.append(fact_text[key])
            else:
                texts.append(_filler(rng))
        context = " ".join(texts)
        sentences = tuple(split_sentences(context))
        if [s.content.strip() for s in sentences] != texts:
            raise UserError("the sentence splitter did not give back the toy sentences one to one")
        kind = rng.choice(kinds)
        asked = tuple(rng.sample(keys, 1 if kind == "single" else 2))
        if kind == "fused":
            a, b = asked
            gold = (GoldStatement(f"{fact_text[a][:-1]} and {fact_text[b]}", frozenset({facts[a], facts[b]})),)
        else:
            gold = tuple(GoldStatement(fact_text[k], frozenset({facts[k]})) for k in asked)
        question = _question(kind, asked)
        docs.append(ToyDoc(context, sentences, question, gold, kind, facts, asked,
                           build_prompt(sentences, question)))
    return docs


def noisy_support(doc: ToyDoc, rng: random.Random, p_noise: float) -> tuple[list[list[int]], int, int]:
    """The gold support sets with each cited sentence, independently with probability ``p_noise``,
    replaced by a neighbour (i-1 or i+1 at random; the only one at the document's edges). Facts are
    never adjacent, so a neighbour is always a filler sentence.

    Returns:
        ``(support per statement, citations, noisy citations)``.
    """
    out, n, noisy = [], 0, 0
    for g in doc.gold:
        ids = []
        for i in sorted(g.support):
            n += 1
            if rng.random() < p_noise:
                noisy += 1
                options = [j for j in (i - 1, i + 1) if 0 <= j < doc.n_sentences]
                i = rng.choice(options)
            ids.append(i)
        out.append(ids)
    return out, n, noisy


# ----------------------------------------------------------------------------------- tokenizer, SFT

TOKENIZER_VOCAB = 1000
"""Upper bound for the BPE; the closed vocabulary saturates it at ~620 tokens (every word, key and
the tags' pieces are single tokens)."""


def toy_tokenizer(seed: int = 0, n_docs: int = 1500) -> Any:
    """The zoo's digit-splitting byte-level BPE (:func:`lmforge.models.tokenizer.train_tokenizer`)
    trained on the prompts and gold responses of ``n_docs`` documents (prompts and responses apart, so
    no merge spans the prompt/response boundary)."""
    from lmforge.models.tokenizer import train_tokenizer

    docs = make_toy_docs(n_docs, f"tokenizer:{seed}")  # type: ignore[arg-type]
    return train_tokenizer([d.prompt for d in docs] + [d.gold_response for d in docs], TOKENIZER_VOCAB)


@dataclass(frozen=True)
class SFTSettings:
    """The from-scratch SFT run (sizes from ``shared/papers/zoo-learnability.md``)."""

    hidden: int = 128
    layers: int = 2
    heads: int = 4
    steps: int = 1200
    batch: int = 16
    lr: float = 3e-3
    warmup: int = 50
    weight_decay: float = 0.01
    p_noise: float = 0.3
    min_lr_ratio: float = 0.1


def build_model(tok: Any, settings: SFTSettings, seed: int) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    s = settings
    config = LlamaConfig(vocab_size=len(tok), hidden_size=s.hidden, intermediate_size=4 * s.hidden,
                         num_hidden_layers=s.layers, num_attention_heads=s.heads, num_key_value_heads=s.heads,
                         max_position_embeddings=512, rope_theta=1e4, tie_word_embeddings=True,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def sft_batch(tok: Any, docs: Sequence[ToyDoc], rng: random.Random, p_noise: float
              ) -> tuple[dict[str, torch.Tensor], int, int]:
    """A collated batch of ``BOS prompt noisy-response EOS`` with the loss on the response and EOS;
    returns ``(batch, citations, noisy citations)``."""
    from lmforge.models.zoo import collate, encode_pair

    enc, n, noisy = [], 0, 0
    for d in docs:
        support, a, b = noisy_support(d, rng, p_noise)
        n, noisy = n + a, noisy + b
        enc.append(encode_pair(tok, d.prompt, d.response(support)))
    return collate(enc, tok.pad_token_id), n, noisy


def prompt_head(tok: Any) -> list[int]:
    """``BOS`` + the tokens of the template text before the first ``<C0>``: the prefix every toy prompt
    shares (checked per batch in :func:`shared_prefix_loss`)."""
    head = build_prompt([], "").split("[Document Start]\n")[0] + "[Document Start]\n"
    return [tok.bos_token_id, *tok(head, add_special_tokens=False).input_ids]


def shared_prefix_loss(model: Any, batch: dict[str, torch.Tensor], head: Sequence[int]) -> torch.Tensor:
    """The causal-LM loss of ``batch`` with the constant prompt head run once and its keys/values
    repeated over the batch (gradients flow through them). Equal to ``model(**batch).loss`` (the test
    checks it) whenever the head carries no labels; about 1.5x faster here, the head being half the
    sequence."""
    from transformers import DynamicCache

    ids = batch["input_ids"]
    p = len(head)
    if ids.shape[1] <= p or not bool((ids[:, :p] == torch.tensor(list(head))).all()) \
            or bool((batch["labels"][:, :p] != -100).any()):
        return model(**batch).loss
    b, t = ids.shape[0], ids.shape[1] - p
    cache = DynamicCache(config=model.config)
    model(input_ids=ids[:1, :p], past_key_values=cache, use_cache=True)
    cache.batch_repeat_interleave(b)
    pos = torch.arange(p, p + t).unsqueeze(0).expand(b, -1)
    return model(input_ids=ids[:, p:], attention_mask=batch["attention_mask"], position_ids=pos,
                 past_key_values=cache, labels=batch["labels"][:, p:]).loss


def train_sft(seed: int, settings: SFTSettings | None = None, *, tok: Any = None,
              progress: bool = False, callback: Any = None) -> tuple[Any, Any, dict[str, Any]]:
    """Train the tiny Llama from scratch on fresh documents with ``p_noise`` noisy citations.

    ``callback(step, model)``, if given, is called after every step (pilots use it to evaluate).

    Returns:
        ``(model, tokenizer, log)``; ``log`` has ``losses`` (every step), ``citations``/``noisy``
        (counts over all training responses) and ``seconds``.
    """
    from lmforge.methods.selective_dpo.core import lr_factor

    s = settings or SFTSettings()
    t0 = time.perf_counter()
    tok = tok if tok is not None else toy_tokenizer(seed)
    model = build_model(tok, s, seed)
    head = prompt_head(tok)
    opt = torch.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=s.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda k: max(s.min_lr_ratio, lr_factor(k, s.steps, s.warmup)) if k >= s.warmup
        else lr_factor(k, s.steps, s.warmup))
    rng = random.Random(f"sft-noise:{seed}")
    losses: list[float] = []
    n_cites = n_noisy = 0
    model.train()
    for step in range(s.steps):
        docs = make_toy_docs(s.batch, f"sft:{seed}:{step}")  # type: ignore[arg-type]
        batch, a, b = sft_batch(tok, docs, rng, s.p_noise)
        n_cites, n_noisy = n_cites + a, n_noisy + b
        loss = shared_prefix_loss(model, batch, head)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if progress and (step + 1) % 50 == 0:
            print(f"sft step {step + 1}/{s.steps} loss {sum(losses[-50:]) / 50:.4f} "
                  f"({time.perf_counter() - t0:.0f}s)", flush=True)
        if callback is not None:
            callback(step, model)
            model.train()
    model.eval()
    return model, tok, {"losses": losses, "citations": n_cites, "noisy": n_noisy,
                        "seconds": time.perf_counter() - t0}


# ------------------------------------------------------------------------------------------ scoring


def greedy_responses(model: Any, tok: Any, docs: Sequence[ToyDoc], *, max_new_tokens: int = 64,
                     batch_size: int = 32) -> list[str]:
    from lmforge.common.generation import generate

    outs = generate(model, tok, [d.prompt for d in docs], max_new_tokens=max_new_tokens, batch_size=batch_size)
    return [o.text.strip() for o in outs]


def evaluate_responses(docs: Sequence[ToyDoc], responses: Sequence[str]) -> dict[str, float]:
    """Citation F1 (statements matched to gold by order), cited sentences per statement, statement
    counts, malformed/out-of-document counts, and the share of responses whose statement texts equal
    the gold texts (content copied)."""
    from lmforge.methods.selfcite.format import postprocess
    from lmforge.methods.selfcite.metrics import normalise_text, score_dataset

    items, cited, n_stmt, malformed, ood, exact, parseable = [], 0, 0, 0, 0, 0, 0
    for d, r in zip(docs, responses, strict=True):
        p = postprocess(r, d.sentences)
        items.append((p, list(d.gold)))
        for st in p.statements:
            n_stmt += 1
            cited += len({i for c in st.citations or [] for i in range(c.start, c.end + 1)})
        malformed += p.malformed
        ood += p.out_of_document
        parseable += int(p.malformed == 0 and len(p.statements) > 0
                         and all(st.citations for st in p.statements))
        exact += int([normalise_text(s.text) for s in p.statements] == [normalise_text(g.text) for g in d.gold])
    scores = score_dataset(items, matcher="order")
    n = max(1, len(docs))
    return {"f1": scores["f1"], "recall": scores["recall"], "precision": scores["precision"],
            "cited_per_statement": cited / max(1, n_stmt), "statements_per_response": n_stmt / n,
            "malformed": malformed, "out_of_document": ood, "parseable_share": parseable / n,
            "content_exact_share": exact / n, "n": len(docs)}


# ------------------------------------------------------------------------- best-of-N, SimPO, tier B


def sample_responses(model: Any, tok: Any, docs: Sequence[ToyDoc], bon: Any, *, max_new_tokens: int = 64,
                     batch_size: int = 32) -> list[str]:
    """Step 1 of the official pipeline for many documents at once: one sampled response per prompt at
    the official response temperature / top-p (``bon.response_temperature``, ``bon.response_top_p``).
    :func:`~lmforge.methods.selfcite.bon.sample_response` does the same for one prompt; batching the
    documents is only faster."""
    from lmforge.common.generation import generate

    outs = generate(model, tok, [d.prompt for d in docs], max_new_tokens=max_new_tokens, do_sample=True,
                    temperature=bon.response_temperature, top_p=bon.response_top_p, seed=bon.seed,
                    batch_size=batch_size)
    return [o.text.strip() for o in outs]


def make_pairs(model: Any, tok: Any, docs: Sequence[ToyDoc], *, n: int, seed: int,
               max_new_tokens: int = 64) -> dict[str, Any]:
    """Sample a response per document, rerank its citations with best-of-N on the model's own reward,
    and build the preference pairs: chosen = the BoN response, rejected = the sample; pairs with
    chosen == rejected are skipped (official ``make_preference_data.py``). Two sets: ``unbalanced``
    (raw) and ``balanced`` (:func:`~lmforge.methods.selfcite.balance.balance_rejected` with the
    document's sentence count; a pair that balancing makes equal is skipped)."""
    from lmforge.methods.selfcite.balance import balance_rejected
    from lmforge.methods.selfcite.bon import BoNSettings, best_of_n
    from lmforge.methods.selfcite.reward import RewardSettings

    bon = BoNSettings(n=n, seed=seed, batch_size=32)
    reward = RewardSettings(chat=False, batch_size=32)
    originals = sample_responses(model, tok, docs, bon, max_new_tokens=max_new_tokens)
    chosen_all: list[str] = []
    unbalanced: list[dict[str, str]] = []
    balanced: list[dict[str, str]] = []
    cover = dict.fromkeys(("chosen", "rejected", "rejected_balanced"), 0)
    rng = random.Random(f"balance:{seed}")
    fakes = mismatched = 0
    for i, (d, orig) in enumerate(zip(docs, originals, strict=True)):
        res = best_of_n(model, tok, d.sentences, d.question, orig,
                        BoNSettings(n=n, seed=seed * 100_003 + i, batch_size=32), reward)
        chosen_all.append(res.response)
        if res.response == orig:
            continue
        unbalanced.append({"prompt": d.prompt, "chosen": res.response, "rejected": orig})
        bal = balance_rejected(orig, res.response, rng=rng, n_sentences=d.n_sentences)
        if not bal.coverages:
            mismatched += 1
        else:
            cover["chosen"] += bal.coverages["chosen_before_edit"]
            cover["rejected"] += bal.coverages["reject_before_edit"]
            cover["rejected_balanced"] += bal.coverages["reject_after_edit"]
            fakes += sum(len(f) for f in bal.fake_citations)
        if bal.rejected != bal.chosen:
            balanced.append({"prompt": d.prompt, "chosen": bal.chosen, "rejected": bal.rejected})
    return {"originals": originals, "bon": chosen_all, "unbalanced": unbalanced, "balanced": balanced,
            "coverage": cover, "fake_citations": fakes, "statement_count_mismatch": mismatched}


# NOTE: the official SimPO lr is 3e-7 for a full fine-tune of an 8B model; on this 0.6M model with
# LoRA it would not move the weights within the budget. The lr below is NOT tuned: no SFT pilot
# (seeds 100+, PILOT_RUNS) reached a model that copies facts, so no SimPO pilot could be informative;
# 2e-3 is the order of the SFT lr, a usual LoRA lr for a model this small.
SIMPO_LR = 2e-3
SIMPO_EPOCHS = 2.0
SIMPO_BATCH = 4


def simpo_settings(seed: int, *, lr: float = SIMPO_LR, epochs: float = SIMPO_EPOCHS,
                   batch: int = SIMPO_BATCH) -> Any:
    from lmforge.methods.selfcite.train import SimPOSettings

    # beta 10 and gamma/beta 0.3 as officially; LoRA r 16 / alpha 32 / dropout 0.05 (train.py's).
    return SimPOSettings(lr=lr, epochs=epochs, batch_size=batch, seed=seed, max_length=512,
                         max_prompt_length=384, gradient_checkpointing=False, logging_steps=1)


def simpo_arm(sft_model: Any, tok: Any, pairs: Sequence[dict[str, str]], settings: Any) -> tuple[Any, dict]:
    """A copy of the SFT model SimPO-trained with LoRA on ``pairs`` (adapters merged)."""
    import copy

    from lmforge.methods.selfcite.train import train_simpo

    if not pairs:
        return sft_model, {"losses": [], "reward_accuracies": [], "global_step": 0}
    res = train_simpo(copy.deepcopy(sft_model), tok, pairs, settings, merge=True)
    return res["model"], {k: res[k] for k in ("losses", "reward_accuracies", "reward_margins", "global_step")}


TIER_B_CONDITIONS = """Fixed before the verdict seed (0) was run:
(i)  greedy citation F1 on the held-out documents: SimPO-balanced - SFT >= 0.05;
(ii) inflation shown: mean cited sentences per statement (greedy, held-out) of SimPO-unbalanced
     > that of SimPO-balanced (a shown-or-not boolean; both numbers are reported).
Tier B holds when (i) holds; (ii) is reported beside it."""
F1_GAIN_MIN = 0.05


@dataclass(frozen=True)
class TierBSizes:
    sft: SFTSettings
    n_bon_docs: int
    bon_n: int
    n_eval: int
    simpo_epochs: float
    max_new_tokens: int = 64


# NOTE: N = 8 best-of-N samples (official 10) to fit the budget.
FULL = TierBSizes(sft=SFTSettings(), n_bon_docs=128, bon_n=8, n_eval=300, simpo_epochs=SIMPO_EPOCHS)
QUICK = TierBSizes(sft=SFTSettings(steps=250, batch=8, warmup=20), n_bon_docs=8, bon_n=4, n_eval=24,
                   simpo_epochs=1.0)

PILOT_RUNS = (
    # (seed, settings, what was seen); the greedy F1 is on 60-100 held-out documents.
    (123, "facts 'Mira keeps 41 lamps.', scratch 2x128, batch 16, lr 2e-3, 300 steps (93 s, CPU shared)",
     "format learned (parseable 1.0), content copied 0 %, F1 0.24; keys not even copied from the question"),
    (123, "same, lr 3e-3, 800 steps (169 s, CPU shared)", "content 0 %, F1 0.45 (cites a fact sentence at random)"),
    (123, "quoted keys in the question (one token per key everywhere), 800 steps (175 s)",
     "content 0 %, F1 0.29"),
    (123, "+ shared-prefix training, 2000 steps (295 s, CPU free)",
     "keys copied from the question by step ~600; numbers never; content 1.7 %, F1 0.42"),
    (123, "facts 'Mira 41 lamps.' (number right after the key), 1200 steps (~170 s)",
     "content 0 % up to step 1000, F1 0.47"),
    (123, "zoo reader-small (2x128, trained to find figures) fine-tuned, lr 2e-3, 400 steps",
     "content 0 %, prompts 360 tokens with the zoo tokenizer; dropped"),
)
"""The SFT pilots (seed 123, never the verdict seed). None reached a model that copies the facts, so the
best-of-N / SimPO stages were only run at the quick sizes (mechanism); see the module docstring."""


def run_tier_b(seed: int, *, quick: bool = False, progress: bool = False,
               sizes: TierBSizes | None = None) -> dict[str, Any]:
    """SFT from scratch on noisy citations, best-of-N on the model's own reward, SimPO on balanced and
    on raw pairs, and greedy evaluation on held-out documents (see :data:`TIER_B_CONDITIONS`)."""
    sz = sizes or (QUICK if quick else FULL)
    t: dict[str, float] = {}
    t0 = time.perf_counter()
    sft_model, tok, sft_log = train_sft(seed, sz.sft, progress=progress)
    t["sft"] = time.perf_counter() - t0

    t1 = time.perf_counter()
    train_docs = make_toy_docs(sz.n_bon_docs, f"bon:{seed}")  # type: ignore[arg-type]
    pairs = make_pairs(sft_model, tok, train_docs, n=sz.bon_n, seed=seed, max_new_tokens=sz.max_new_tokens)
    t["best_of_n"] = time.perf_counter() - t1

    arms: dict[str, Any] = {"sft": sft_model}
    logs: dict[str, Any] = {}
    for name in ("balanced", "unbalanced"):
        t2 = time.perf_counter()
        arms[name], logs[name] = simpo_arm(sft_model, tok, pairs[name],
                                           simpo_settings(seed, epochs=sz.simpo_epochs))
        t[f"simpo_{name}"] = time.perf_counter() - t2

    t3 = time.perf_counter()
    eval_docs = make_toy_docs(sz.n_eval, f"eval:{seed}")  # type: ignore[arg-type]
    evals, samples = {}, {}
    for name, m in arms.items():
        rs = greedy_responses(m, tok, eval_docs, max_new_tokens=sz.max_new_tokens)
        evals[name] = evaluate_responses(eval_docs, rs)
        samples[name] = rs[:3]
    bon_eval = {"original": evaluate_responses(train_docs, pairs["originals"]),
                "bon": evaluate_responses(train_docs, pairs["bon"])}
    t["eval"] = time.perf_counter() - t3
    t["total"] = time.perf_counter() - t0

    gain = evals["balanced"]["f1"] - evals["sft"]["f1"]
    inflation = evals["unbalanced"]["cited_per_statement"] > evals["balanced"]["cited_per_statement"]
    return {
        "seed": seed, "quick": quick, "conditions": TIER_B_CONDITIONS,
        "eval": evals, "bon_vs_original": bon_eval, "samples": samples,
        "pairs": {"balanced": len(pairs["balanced"]), "unbalanced": len(pairs["unbalanced"]),
                  "coverage": pairs["coverage"], "fake_citations": pairs["fake_citations"],
                  "statement_count_mismatch": pairs["statement_count_mismatch"]},
        "sft": {"final_loss": sum(sft_log["losses"][-20:]) / max(1, len(sft_log["losses"][-20:])),
                "noisy_share": sft_log["noisy"] / max(1, sft_log["citations"]), "steps": sz.sft.steps},
        "simpo": logs,
        "f1_gain_balanced": gain,
        "verdict": {"f1_gain >= 0.05": gain >= F1_GAIN_MIN, "inflation_shown": inflation},
        "seconds": t,
    }
