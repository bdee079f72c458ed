"""The tiny VLM: a Hugging Face LLaVA (``LlavaForConditionalGeneration``) with a ViT tower.

No small VLM weights install from the registries, so lmforge trains one here. It is a stock
transformers LLaVA, so the checkpoint loads with ``LlavaForConditionalGeneration.from_pretrained``:

- vision tower: ``ViTModel`` with 8 x 8 px patches on a 48 x 48 image (one patch per table cell),
  2 layers of width 64; the LLaVA "default" feature strategy drops the CLS token (36 image tokens);
- projector: LLaVA's ``mlp2x_gelu`` (the official ``--mm_projector_type``), 64 -> 128 -> 128;
- language model: a 4-layer Llama of width 128 (the zoo's shape family) on a word-level vocabulary
  (:data:`lmforge.methods.simple_to_hard.mini.WORDS`, ``tokenizers``' ``WordLevel``);
- image tokens are an ``inputs_embeds`` prefix in the LLaVA style: the ``<image>`` placeholder is
  expanded to 36 image-token ids, whose embeddings LLaVA replaces by the projected patches
  (:func:`manual_inputs_embeds` rebuilds this by hand; the test checks they are equal).

Checked for reuse: transformers' LLaVA (used), ``tokenizers`` WordLevel (used); a new tokenizer is
needed because the task vocabulary (cell names, starred digits) is closed and tiny.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlavaConfig, LlavaForConditionalGeneration, PreTrainedTokenizerFast, ViTConfig

from lmforge.methods.simple_to_hard import mini

IMAGE = "<image>"
_CELLS = {mini.cell_name(r, c) for r in range(mini.N) for c in range(mini.N)}
N_IMAGE_TOKENS = mini.N * mini.N


@dataclass(frozen=True)
class VLMShape:
    vision_hidden: int = 64
    vision_layers: int = 2
    vision_heads: int = 4
    hidden: int = 128
    layers: int = 4
    heads: int = 4
    intermediate: int = 384
    max_positions: int = 320


def build_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {w: i for i, w in enumerate(mini.WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<pad>", padding_side="right", clean_up_tokenization_spaces=False)


def build_model(tok: PreTrainedTokenizerFast, shape: VLMShape = VLMShape(), seed: int = 0) -> LlavaForConditionalGeneration:
    vc = ViTConfig(image_size=mini.N * mini.CELL, patch_size=mini.CELL, num_channels=3, hidden_size=shape.vision_hidden,
                   num_hidden_layers=shape.vision_layers, num_attention_heads=shape.vision_heads,
                   intermediate_size=4 * shape.vision_hidden)
    tc = LlamaConfig(vocab_size=len(tok), hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                     num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.heads,
                     max_position_embeddings=shape.max_positions, pad_token_id=tok.pad_token_id,
                     bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, tie_word_embeddings=True)
    cfg = LlavaConfig(vision_config=vc, text_config=tc, image_token_index=tok.convert_tokens_to_ids(IMAGE),
                      vision_feature_layer=-1, vision_feature_select_strategy="default", projector_hidden_act="gelu",
                      image_seq_length=N_IMAGE_TOKENS, tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(cfg)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.bos_token_id = tok.bos_token_id
    return model


def pixels(arrays: list[np.ndarray]) -> torch.Tensor:
    """uint8 (H, W, 3) arrays -> the ViT's (B, 3, H, W) input in [-1, 1] (ViT's 0.5/0.5 normalisation)."""
    x = torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).float()
    return x / 127.5 - 1.0


def encode(tok: PreTrainedTokenizerFast, human: str, gpt: str | None, mask_cells: bool = False) -> tuple[list[int], list[int]]:
    """Token ids and labels (-100 on the prompt) of ``<s> human [gpt </s>]``, ``<image>`` expanded.

    ``mask_cells`` also takes the loss off cell names in the response (the dense reading drills of
    pretraining name random cells, which no model can predict)."""
    image_id = tok.convert_tokens_to_ids(IMAGE)
    ids = [tok.bos_token_id]
    for w in human.split():
        ids.extend([image_id] * N_IMAGE_TOKENS if w == IMAGE else [tok.convert_tokens_to_ids(w)])
    labels = [-100] * len(ids)
    if gpt is not None:
        words = gpt.split()
        ans = [tok.convert_tokens_to_ids(w) for w in words] + [tok.eos_token_id]
        ids += ans
        cells = _CELLS if mask_cells else set()
        labels += [-100 if w in cells else i for w, i in zip(words + [None], ans)]
    unk = [w for w in (human + " " + (gpt or "")).split() if w not in tok.get_vocab()]
    if unk:
        raise ValueError(f"words outside the VLM's vocabulary: {unk[:5]}")
    return ids, labels


def collate(encoded: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    width = max(len(i) for i, _ in encoded)
    ids = torch.full((len(encoded), width), pad_id, dtype=torch.long)
    labels = torch.full((len(encoded), width), -100, dtype=torch.long)
    mask = torch.zeros((len(encoded), width), dtype=torch.long)
    for k, (i, lab) in enumerate(encoded):
        ids[k, :len(i)] = torch.tensor(i)
        labels[k, :len(lab)] = torch.tensor(lab)
        mask[k, :len(i)] = 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def manual_inputs_embeds(model: LlavaForConditionalGeneration, input_ids: torch.Tensor,
                         pixel_values: torch.Tensor) -> torch.Tensor:
    """The LLaVA prefix built by hand: ViT patches (CLS dropped) -> projector, placed at the image tokens."""
    inner = model.model
    emb = inner.get_input_embeddings()(input_ids)
    # LLaVA takes the hidden states of ``vision_feature_layer`` (-1: the last block, before ViT's final
    # LayerNorm, which ``last_hidden_state`` applies) and drops CLS ("default" strategy)
    hs = inner.vision_tower(pixel_values=pixel_values, output_hidden_states=True).hidden_states
    feats = hs[model.config.vision_feature_layer][:, 1:]
    proj = inner.multi_modal_projector(feats)
    out = emb.clone()
    image_id = model.config.image_token_index
    for b in range(input_ids.shape[0]):
        pos = (input_ids[b] == image_id).nonzero().flatten()
        out[b, pos] = proj[b, :len(pos)]
    return out


def save(model: LlavaForConditionalGeneration, tok: PreTrainedTokenizerFast, out: Path, card: dict | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    if card is not None:
        (out / "vlm.json").write_text(json.dumps(card, indent=1))


def load(path: Path) -> tuple[LlavaForConditionalGeneration, PreTrainedTokenizerFast]:
    model = LlavaForConditionalGeneration.from_pretrained(path, dtype=torch.float32)
    tok = PreTrainedTokenizerFast.from_pretrained(path)
    model.eval()
    return model, tok


@torch.no_grad()
def generate(model: LlavaForConditionalGeneration, tok: PreTrainedTokenizerFast, prompts: list[str],
             images: list[np.ndarray | None], max_new_tokens: int = 200, batch_size: int = 64) -> list[str]:
    """Greedy responses (HF ``generate``, left padding) for prompts with or without an image."""
    out: list[str] = []
    was = model.training
    model.eval()
    for s in range(0, len(prompts), batch_size):
        chunk = list(range(s, min(s + batch_size, len(prompts))))
        enc = [encode(tok, prompts[i], None)[0] for i in chunk]
        width = max(len(e) for e in enc)
        ids = torch.full((len(enc), width), tok.pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for k, e in enumerate(enc):
            ids[k, width - len(e):] = torch.tensor(e)
            mask[k, width - len(e):] = 1
        imgs = [images[i] for i in chunk if images[i] is not None]
        kw = {"pixel_values": pixels(imgs)} if imgs else {}
        gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                             **kw)
        for k in range(len(enc)):
            toks = gen[k, width:].tolist()
            if tok.eos_token_id in toks:
                toks = toks[:toks.index(tok.eos_token_id)]
            out.append(" ".join(tok.convert_ids_to_tokens(toks)))
    model.train(was)
    return out
