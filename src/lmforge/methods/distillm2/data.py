"""DistiLLM-2 data: teacher and student responses per prompt, stored as DPO pairs.

DistiLLM-2 (Ko et al., ICML 2025, arXiv 2503.07067), Sec. 3 and ``generate/generate_vllm.py`` of the
official code: for each prompt x sample y_t ~ p (teacher) and y_s ~ q (student) with T = 0.8, top-p =
0.95; store ``{"prompt": x, "chosen": y_t, "rejected": y_s}`` (the DPO format the official trainer, a
fork of TRL's DPOTrainer, reads). Student responses are regenerated before each epoch.

Generation uses lmforge's batched engine (:func:`lmforge.common.generation.generate`). The token ids
the engine produced are kept with the pair (``*_ids`` fields), so training sees exactly the sampled
tokens (decoding then re-tokenizing text need not give the same ids); a pair file without ids is
re-tokenized, appending EOS to each response.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmforge.common.errors import UserError
from lmforge.common.io import atomic_write_text, parse_json_lines, read_user_text



@dataclass
class Pair:
    """One DPO-format distillation pair.

    Attributes:
        prompt: prompt text.
        chosen: the teacher response y_t (text).
        rejected: the student response y_s (text).
        prompt_ids: prompt token ids (with the tokenizer's BOS).
        chosen_ids: response ids of y_t (ending with EOS when the teacher stopped).
        rejected_ids: response ids of y_s.
    """

    prompt: str
    chosen: str
    rejected: str
    prompt_ids: list[int]
    chosen_ids: list[int]
    rejected_ids: list[int]

    def to_json(self) -> dict[str, Any]:
        return {"prompt": self.prompt, "chosen": self.chosen, "rejected": self.rejected,
                "prompt_ids": self.prompt_ids, "chosen_ids": self.chosen_ids, "rejected_ids": self.rejected_ids}


def sample_responses(
    model: Any,
    tokenizer: Any,
    prompts: list[str],
    *,
    max_new_tokens: int,
    temperature: float = 0.8,
    top_p: float = 0.95,
    seed: int = 0,
    batch_size: int = 32,
) -> list[tuple[str, list[int]]]:
    """Sample one response per prompt with lmforge's batched engine: ``(text, token ids)``."""
    from lmforge.common.generation import generate

    was_training = model.training
    model.eval()
    outs = generate(model, tokenizer, prompts, max_new_tokens=max_new_tokens, do_sample=True,
                    temperature=temperature, top_p=top_p, seed=seed, batch_size=batch_size)
    if was_training:
        model.train()
    return [(o.text, list(o.token_ids)) for o in outs]


def build_pairs(
    tokenizer: Any,
    prompts: list[str],
    teacher: list[tuple[str, list[int]]],
    student: list[tuple[str, list[int]]],
) -> list[Pair]:
    """Zip prompts with teacher (chosen) and student (rejected) responses into :class:`Pair` s."""
    from lmforge.common.generation import encode_prompt

    if not len(prompts) == len(teacher) == len(student):
        raise ValueError("prompts, teacher and student responses differ in number")
    return [Pair(p, t[0], s[0], encode_prompt(tokenizer, p), list(t[1]), list(s[1]))
            for p, t, s in zip(prompts, teacher, student)]


def with_student(pairs: list[Pair], student: list[tuple[str, list[int]]]) -> list[Pair]:
    """The same prompts and teacher responses with new student responses (one epoch's regeneration)."""
    if len(pairs) != len(student):
        raise ValueError("pairs and student responses differ in number")
    return [Pair(p.prompt, p.chosen, s[0], p.prompt_ids, p.chosen_ids, list(s[1])) for p, s in zip(pairs, student)]


def write_pairs(path: str | Path, pairs: list[Pair]) -> Path:
    """Write pairs as JSON lines (``prompt``/``chosen``/``rejected`` plus the token ids)."""
    return atomic_write_text(path, "".join(json.dumps(p.to_json()) + "\n" for p in pairs))


def load_pairs(path: str | Path, tokenizer: Any) -> list[Pair]:
    """Read a DPO-format JSON-lines file; a line without prompt/chosen/rejected is a one-line UserError.

    Lines may carry ``prompt_ids``/``chosen_ids``/``rejected_ids`` (as :func:`write_pairs` writes);
    without them the text is tokenized: the prompt with the tokenizer's special tokens, each response
    without, followed by EOS.
    """
    from lmforge.common.generation import encode_prompt

    from lmforge.data.preferences import LINE_KEY, load_preferences  # the DPO-format field checks

    vocab = len(tokenizer)
    pairs = []
    for rec in load_preferences(path):
        lineno = rec[LINE_KEY]
        eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []

        def ids(key: str, text: str, prompt: bool = False) -> list[int]:
            if f"{key}_ids" in rec:
                val = rec[f"{key}_ids"]
                if not (isinstance(val, list) and all(isinstance(i, int) for i in val)):
                    raise UserError(f"{path}:{lineno}: field '{key}_ids' must be a list of integers")
                bad = [i for i in val if not 0 <= i < vocab]
                if bad:
                    raise UserError(f"{path}:{lineno}: field '{key}_ids' holds token id {bad[0]}, outside the "
                                    f"tokenizer's {vocab} ids")
                return val
            if prompt:
                return encode_prompt(tokenizer, text)
            return list(tokenizer(text, add_special_tokens=False)["input_ids"]) + eos

        pairs.append(Pair(rec["prompt"], rec["chosen"], rec["rejected"], ids("prompt", rec["prompt"], True),
                          ids("chosen", rec["chosen"]), ids("rejected", rec["rejected"])))
    return pairs


def load_prompts(path: str | Path) -> list[str]:
    """Prompts from ``.jsonl`` (a ``prompt`` field per line) or plain text (one prompt per non-blank line)."""
    raw = read_user_text(path, "prompts")
    prompts: list[str] = []
    if str(path).endswith(".jsonl"):
        for lineno, rec in parse_json_lines(path, raw):
            if not isinstance(rec, dict) or not isinstance(rec.get("prompt"), str):
                raise UserError(f"{path}:{lineno}: missing field 'prompt'")
            prompts.append(rec["prompt"])
    else:
        prompts = [line for line in raw.splitlines() if line.strip()]
    if not prompts:
        raise UserError(f"{path}: no prompts")
    return prompts
