"""S2H gradient alignment (align.py): flat gradients against autograd, the cosine, the first-order drop."""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call

from lmforge.methods.simple_to_hard import align as A
from lmforge.methods.simple_to_hard import mini, vlm
from lmforge.methods.simple_to_hard import train as T

TINY = vlm.VLMShape(vision_hidden=16, vision_layers=1, vision_heads=2, hidden=32, layers=1, heads=2, intermediate=64)


def _examples(ps, data_type, image):
    out = []
    for p in ps:
        conv = mini.conversation(p, data_type)["conversations"]
        out.append((conv[0]["value"], conv[1]["value"], mini.render_array(p) if image else None))
    return out


@pytest.fixture(scope="module")
def tok():
    return vlm.build_tokenizer()


@pytest.fixture(scope="module")
def batches(tok):
    train = _examples(mini.generate("SIMPLE", 4, 0), "text2answer", image=False)
    hard = _examples(mini.generate("HARD", 4, 0), "image2answer", image=True)
    return T.make_batch(tok, train, [0, 1, 2, 3]), T.make_batch(tok, hard, [0, 1, 2, 3])


def test_flat_grad_equals_backward_and_leaves_grads_alone(tok, batches):
    _, hard = batches
    model = vlm.build_model(tok, TINY, seed=0)
    model.train()
    assert all(p.grad is None for p in model.parameters())
    g = A.flat_grad(model, hard)
    assert all(p.grad is None for p in model.parameters())
    assert model.training  # mode restored

    model.eval()
    model(**hard).loss.backward()
    parts, n_none = [], 0
    for _, p in model.named_parameters():
        if p.grad is None:
            n_none += 1
            parts.append(torch.zeros(p.numel()))
        else:
            parts.append(p.grad.reshape(-1))
    ref = torch.cat(parts)
    assert n_none > 0  # the ViT's final LayerNorm and pooler feed nothing LLaVA uses
    assert g.shape == ref.shape == (sum(p.numel() for p in model.parameters()),)
    torch.testing.assert_close(g, ref, atol=1e-6, rtol=1e-5)
    assert ref.abs().max() > 1e-3

    # existing .grad fields survive a probe untouched
    before = {n: (p.grad.clone() if p.grad is not None else None) for n, p in model.named_parameters()}
    A.flat_grad(model, hard)
    for n, p in model.named_parameters():
        if before[n] is None:
            assert p.grad is None
        else:
            assert torch.equal(p.grad, before[n])


def test_cosine_of_a_gradient_with_itself_and_its_negative(tok, batches):
    model = vlm.build_model(tok, TINY, seed=0)
    g = A.flat_grad(model, batches[0])
    assert abs(A.cosine(g, g) - 1.0) < 1e-12
    assert abs(A.cosine(g, -g) + 1.0) < 1e-12
    assert abs(A.cosine(g, 3.0 * g) - 1.0) < 1e-12
    a, b = torch.tensor([1.0, 0.0, 0.0]), torch.tensor([1.0, 1.0, 0.0])
    assert A.cosine(a, b) == pytest.approx(2 ** -0.5, abs=1e-12)
    h = A.flat_grad(model, batches[1])
    assert A.alignment(model, batches[0], batches[1]) == pytest.approx(A.cosine(g, h), abs=1e-12)
    assert A.alignment(model, batches[0], h) == pytest.approx(A.cosine(g, h), abs=1e-12)


@torch.no_grad()
def _loss_at(model, params, batch):
    return float(functional_call(model, params, args=(), kwargs=batch).loss)


@pytest.mark.parametrize("eta", [3e-3, 1e-3])
def test_predicted_drop_matches_a_finite_difference(tok, batches, eta):
    model = vlm.build_model(tok, TINY, seed=0).eval()
    train, hard = batches
    g_train, g_hard = A.flat_grad(model, train), A.flat_grad(model, hard)
    params = {n: p.detach() for n, p in model.named_parameters()}
    stepped, off = {}, 0
    for n, p in params.items():  # one plain SGD step on the training batch
        stepped[n] = p - eta * g_train[off:off + p.numel()].view_as(p)
        off += p.numel()
    assert off == g_train.numel()
    actual = _loss_at(model, stepped, hard) - _loss_at(model, params, hard)
    predicted = A.predicted_drop(g_train, g_hard, eta)
    assert abs(predicted) > 1e-5  # a drop large enough to measure in float32
    assert actual == pytest.approx(-predicted, rel=0.05)
