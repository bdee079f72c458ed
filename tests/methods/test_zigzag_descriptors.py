"""Zigzag descriptors: kNN clique complexes, the folding into layers, Z_p / B_p on hand-made barcodes,
synthetic layer sequences, and hidden-state point clouds of agent-small (batched = one at a time)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from lmforge.common.errors import UserError
from lmforge.methods.zigzag.descriptors import (
    ZigzagDescriptors,
    average_inter_layer_persistence,
    betti_numbers,
    births_frequency,
    describe_bars,
    effective_persistence_image,
    inter_layer_persistence,
    knn_clique_complex,
    layer_point_clouds,
    normalize_cloud,
    persistence_counts,
    plot_descriptors,
    zigzag_descriptors,
    zigzag_layer_scores,
    zigzag_of_layers,
)
from lmforge.methods.zigzag.persistence import Bar

SQUARE = np.array([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])

# A hand-made barcode of a 4-layer zigzag (indices 0..6; layers at 0, 2, 4, 6), with its layer form
# (birth layer = ceil(b/2), last layer alive = floor(d/2)):
HAND_BARS = [
    Bar(1, 0, 6),  # A: layers 0..3
    Bar(1, 1, 4),  # B: born in K0∩K1 -> layer 1, last alive in K2 -> 1..2
    Bar(1, 2, 3),  # C: 1..1 (last alive in K1∩K2)
    Bar(1, 3, 3),  # only in K1∩K2: in no layer, dropped
    Bar(1, 4, 4),  # D: 2..2
    Bar(0, 0, 6),  # another dimension
    Bar(1, 5, 6),  # E: born in K2∩K3 -> 3..3
    Bar(1, 2, 5),  # F: 1..2 (last alive in K2∩K3)
]
HAND_PI = np.array(
    [
        [0, 0, 0, 1],  # A
        [0, 1, 2, 0],  # C; B, F
        [0, 0, 1, 0],  # D
        [0, 0, 0, 1],  # E
    ],
    dtype=float,
)


# ---------------------------------------------------------------- complexes


def test_knn_square_k2_is_the_four_cycle():
    cx = knn_clique_complex(SQUARE, k=2, max_dim=3)
    assert cx == [(0,), (1,), (2,), (3,), (0, 1), (0, 3), (1, 2), (2, 3)]  # no diagonal, no triangle


def test_knn_square_k3_is_the_full_tetrahedron_up_to_max_dim():
    full = knn_clique_complex(SQUARE, k=3, max_dim=3)
    assert len(full) == 4 + 6 + 4 + 1 and (0, 1, 2, 3) in full
    two = knn_clique_complex(SQUARE, k=3, max_dim=2)
    assert [s for s in full if len(s) <= 3] == two and len(two) == 14
    assert knn_clique_complex(SQUARE, k=3, max_dim=0) == [(0,), (1,), (2,), (3,)]


def test_knn_graph_is_symmetrised_by_union():
    # 0 and 1 are each other's nearest; 2 is far away, its nearest is 1, but 1's nearest is 0:
    # the edge 1-2 comes only from 2's list and must still be there.
    pts = np.array([[0.0], [1.0], [10.0]])
    assert knn_clique_complex(pts, k=1, max_dim=1) == [(0,), (1,), (2,), (0, 1), (1, 2)]


def test_knn_errors():
    with pytest.raises(UserError, match="k larger than the number of prompts"):
        knn_clique_complex(SQUARE, k=4, max_dim=2)
    with pytest.raises(UserError, match="positive integer"):
        knn_clique_complex(SQUARE, k=0, max_dim=2)
    with pytest.raises(UserError, match="2-D"):
        knn_clique_complex(np.zeros(4), k=1, max_dim=2)


# ---------------------------------------------------------------- folding and descriptors


def test_effective_persistence_image_hand_values():
    np.testing.assert_array_equal(effective_persistence_image(HAND_BARS, 4, 1), HAND_PI)
    pi0 = effective_persistence_image(HAND_BARS, 4, 0)
    assert pi0.sum() == 1 and pi0[0, 3] == 1


def test_folding_matches_the_four_term_formula():
    """PÎ(b/2, d/2) = PI(b,d) + PI(b-1,d) + PI(b,d-1) + PI(b-1,d-1) on the unfolded image with exclusive
    deaths (the official convention), keeping the bars whose folded birth and death differ."""
    n_layers = 4
    size = 2 * n_layers  # zigzag indices 0..6 plus exclusive death 7
    pi = np.zeros((size, size))
    for bar in HAND_BARS:
        if bar.dim == 1:
            pi[bar.birth, bar.death + 1] += 1
    ref = np.zeros((n_layers, n_layers))
    for lb in range(n_layers):
        for ld_excl in range(lb + 1, n_layers + 1):  # folded exclusive death, != folded birth
            b, d = 2 * lb, 2 * ld_excl
            total = sum(
                pi[i, j] for i in (b - 1, b) for j in (d - 1, d) if 0 <= i < size and 0 <= j < size
            )
            ref[lb, ld_excl - 1] = total
    np.testing.assert_array_equal(effective_persistence_image(HAND_BARS, n_layers, 1), ref)


def test_betti_is_the_number_of_bars_alive_at_the_layer():
    beta = betti_numbers(HAND_PI)
    direct = [sum(1 for b in HAND_BARS if b.dim == 1 and b.birth <= 2 * ell <= b.death) for ell in range(4)]
    np.testing.assert_array_equal(beta, direct)
    np.testing.assert_array_equal(beta, [1, 4, 4, 2])


def test_inter_layer_persistence_hand_values():
    psim = persistence_counts(HAND_PI)
    np.testing.assert_array_equal(psim, [[1, 1, 1, 1], [1, 4, 3, 1], [1, 3, 4, 1], [1, 1, 1, 2]])
    z = inter_layer_persistence(HAND_PI)
    np.testing.assert_allclose(
        z, [[1, 1, 1, 1], [0.25, 1, 0.75, 0.25], [0.25, 0.75, 1, 0.25], [0.5, 0.5, 0.5, 1]]
    )
    # pruning reading: mean over the first index = mean_j psim[l, j] / beta[j]
    zbar = average_inter_layer_persistence(z)
    np.testing.assert_allclose(zbar, [0.5, 0.8125, 0.8125, 0.625])
    np.testing.assert_allclose(zbar, (psim / betti_numbers(HAND_PI)[None, :]).mean(axis=1))
    # the notebooks' reading: mean over the second index
    np.testing.assert_allclose(average_inter_layer_persistence(z, over="second"), [1, 0.5625, 0.5625, 0.625])
    # alpha = 1: weights |l - l_i|, e.g. l = 0: (1*0.25 + 2*0.25 + 3*0.5) / (1 + 2 + 3)
    np.testing.assert_allclose(average_inter_layer_persistence(z, 1.0), [0.375, 0.6875, 0.8125, 0.625])


def test_inter_layer_persistence_of_an_empty_layer_is_zero():
    pi = np.zeros((3, 3))
    pi[0, 0] = 1  # one hole in layer 0 only; layers 1 and 2 have none
    z = inter_layer_persistence(pi)
    np.testing.assert_array_equal(z, [[1, 0, 0], [0, 0, 0], [0, 0, 0]])
    assert np.isfinite(average_inter_layer_persistence(z)).all()


def test_births_frequency_hand_values():
    np.testing.assert_allclose(births_frequency(HAND_PI), [1 / 6, 3 / 6, 1 / 6, 1 / 6])
    # alpha = 1 weighs each bar by its length in layers: A 4, B 2, C 1, F 2, D 1, E 1
    np.testing.assert_allclose(births_frequency(HAND_PI, 1.0), [4 / 11, 5 / 11, 1 / 11, 1 / 11])
    np.testing.assert_array_equal(births_frequency(np.zeros((3, 3))), [0, 0, 0])


def test_describe_bars_bundles_everything():
    d = describe_bars(HAND_BARS, 4, 1)
    assert isinstance(d, ZigzagDescriptors) and d.n_layers == 4 and d.p == 1
    assert Bar(1, 3, 3) not in d.bars and Bar(0, 0, 6) in d.bars
    np.testing.assert_array_equal(d.pi, HAND_PI)
    np.testing.assert_array_equal(d.betti, [1, 4, 4, 2])
    np.testing.assert_allclose(d.zbar, [0.5, 0.8125, 0.8125, 0.625])
    with pytest.raises(UserError, match="does not fit"):
        effective_persistence_image([Bar(1, 0, 7)], 4, 1)


# ---------------------------------------------------------------- synthetic layer sequences


def _circle_then_noise(seed: int = 0, n: int = 24) -> list[np.ndarray]:
    """12 layers: a jittered circle in layers 2..9, Gaussian noise in layers 0, 1, 10, 11."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) * 2 * np.pi / n
    circle = np.stack([np.cos(t), np.sin(t), np.zeros(n)], axis=1)
    return [
        circle + rng.normal(scale=0.01, size=circle.shape) if 2 <= ell <= 9 else rng.normal(size=(n, 3))
        for ell in range(12)
    ]


def test_persistent_circle_gives_the_largest_average_persistence():
    d = zigzag_descriptors(_circle_then_noise(), k=2, p=1)
    assert d.pi[2, 9] == 1  # one H1 bar from layer 2 to layer 9
    assert Bar(1, 4, 18) in d.bars
    stretch, rest = d.zbar[2:10], np.concatenate([d.zbar[:2], d.zbar[10:]])
    assert stretch.min() > rest.max()
    np.testing.assert_allclose(stretch, 8 / 12)  # each circle layer: 1 for the 8 circle layers, 0 else
    np.testing.assert_allclose(zigzag_layer_scores(_circle_then_noise(), k=2), d.zbar)


@pytest.mark.parametrize("seed", [0, 1])
def test_identity_blocks_get_the_highest_score(seed):
    """A random walk of clouds where layers 5, 6, 7 are equal (two identity blocks): every hole of
    layer 5 lives through 7, so r is highest there, as in the paper's pruning."""
    rng = np.random.default_rng(seed)
    clouds = [rng.normal(size=(60, 4))]
    for ell in range(1, 12):
        clouds.append(clouds[-1] if ell in (6, 7) else clouds[-1] + 0.35 * rng.normal(size=(60, 4)))
    r = zigzag_layer_scores(clouds, k=4, p=1)
    np.testing.assert_allclose(r[5:8], r[5])
    assert r[5] > np.delete(r, [5, 6, 7]).max()


def test_zigzag_of_layers_checks_its_input():
    with pytest.raises(UserError, match="same prompts"):
        zigzag_of_layers([SQUARE, SQUARE[:3]], k=1, p=1)
    with pytest.raises(UserError, match="k larger"):
        zigzag_of_layers([SQUARE, SQUARE], k=4, p=1)
    with pytest.raises(UserError, match="no point clouds"):
        zigzag_of_layers([], k=1, p=1)


def test_plot_descriptors_writes_four_pngs(tmp_path):
    paths = plot_descriptors(describe_bars(HAND_BARS, 4, 1), tmp_path / "plots")
    assert len(paths) == 4
    for path in paths:
        assert path.parent == tmp_path / "plots" and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------- point clouds


def test_normalize_cloud():
    x = np.array([[3.0, 4.0], [0.0, 0.0]])
    np.testing.assert_allclose(normalize_cloud(x, "l2")[0], [0.6, 0.8])
    np.testing.assert_allclose(normalize_cloud(x, "rms")[0], np.array([3.0, 4.0]) / np.sqrt(12.5), rtol=1e-6)
    assert np.isfinite(normalize_cloud(x, "rms")).all() and normalize_cloud(x).dtype == np.float32
    np.testing.assert_allclose(normalize_cloud(x, "layer")[0], [-1.0, 1.0], rtol=1e-5)
    with pytest.raises(UserError, match="unknown normalisation"):
        normalize_cloud(x, "zscore")


PROMPTS = [
    "the cat sat on the mat",
    "a much longer prompt about the weather and the sea and the hills far away from the town",
    "hello",
    "numbers one two three four five",
    "the model reads each token",
]


def _reference_points(model, tok, prompt, pooling, max_length=None):
    ids = tok(prompt, add_special_tokens=False)["input_ids"][:max_length]
    with torch.inference_mode():
        states = model(input_ids=torch.tensor([ids]), output_hidden_states=True, use_cache=False).hidden_states
    return [(h[0, -1] if pooling == "last" else h[0].mean(0)).float().numpy() for h in states]


def _stack(ref, j):
    return np.stack([r[j] for r in ref])


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_layer_point_clouds_batched_equals_one_at_a_time(small, pooling):
    model, tok = small
    ref = [_reference_points(model, tok, p, pooling) for p in PROMPTS]
    clouds = layer_point_clouds(model, tok, PROMPTS, pooling=pooling, batch_size=3)  # padded batches
    assert len(clouds) == model.config.num_hidden_layers + 1
    for j, cloud in enumerate(clouds):
        assert cloud.shape == (len(PROMPTS), model.config.hidden_size) and cloud.dtype == np.float32
        np.testing.assert_allclose(cloud, normalize_cloud(_stack(ref, j)), atol=1e-5, rtol=0)
    # raw states reach |x| ~ 30 (RMS ~ 10) in agent-small's last layers, where float32 summation order
    # (padded batch vs one prompt) moves entries by ~1e-5: the tolerance is 1e-5 of the layer's RMS
    raw = layer_point_clouds(model, tok, PROMPTS, pooling=pooling, batch_size=2, normalize="none")
    for j, cloud in enumerate(raw):
        expected = _stack(ref, j)
        np.testing.assert_allclose(cloud, expected, atol=1e-5 * np.sqrt(np.mean(expected**2)), rtol=0)


def test_layer_point_clouds_max_length_and_errors(small):
    model, tok = small
    clouds = layer_point_clouds(model, tok, PROMPTS, pooling="mean", max_length=3)
    ref = [_reference_points(model, tok, p, "mean", max_length=3) for p in PROMPTS]
    for j, cloud in enumerate(clouds):
        np.testing.assert_allclose(cloud, normalize_cloud(_stack(ref, j)), atol=1e-5, rtol=0)
    with pytest.raises(UserError, match="pooling"):
        layer_point_clouds(model, tok, PROMPTS, pooling="first")
    with pytest.raises(UserError, match="non-empty list"):
        layer_point_clouds(model, tok, [])
    with pytest.raises(UserError, match="no tokens"):
        layer_point_clouds(model, tok, ["hello", ""])


class _NoHiddenStates(torch.nn.Module):
    def forward(self, input_ids, attention_mask=None, **kwargs):
        return SimpleNamespace(logits=torch.zeros(*input_ids.shape, 3))


class _NoKwargs(torch.nn.Module):
    def forward(self, input_ids, attention_mask=None):
        return SimpleNamespace(logits=torch.zeros(*input_ids.shape, 3))


@pytest.mark.parametrize("cls", [_NoHiddenStates, _NoKwargs])
def test_model_without_hidden_states_is_a_user_error(small, cls):
    _, tok = small
    with pytest.raises(UserError) as err:
        layer_point_clouds(cls(), tok, ["hello"])
    assert "hidden states" in str(err.value) or "output_hidden_states" in str(err.value)
    assert "\n" not in str(err.value)
