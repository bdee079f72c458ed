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


# --- a tiny linear model: closed forms and a naive per-example loop against torch.func ------------

class _Out:
    def __init__(self, loss):
        self.loss = loss


class _Linear(torch.nn.Module):
    """``y_hat = x W^T + b``; loss = mean over examples of 0.5 * |y_hat - y|^2."""

    def __init__(self, w, b):
        super().__init__()
        self.lin = torch.nn.Linear(w.shape[1], w.shape[0], dtype=torch.float64)
        with torch.no_grad():
            self.lin.weight.copy_(w)
            self.lin.bias.copy_(b)

    def forward(self, x, y):
        return _Out(0.5 * ((self.lin(x) - y) ** 2).sum(-1).mean())


def test_closed_form_by_hand_on_a_two_parameter_model():
    # w = 1, b = 0; residuals r = x: g = (mean r x, mean r)
    m = _Linear(torch.tensor([[1.0]], dtype=torch.float64), torch.tensor([0.0], dtype=torch.float64))
    a = {"x": torch.tensor([[1.0], [2.0]], dtype=torch.float64), "y": torch.zeros(2, 1, dtype=torch.float64)}
    b = {"x": torch.tensor([[1.0], [-1.0]], dtype=torch.float64), "y": torch.zeros(2, 1, dtype=torch.float64)}
    torch.testing.assert_close(A.flat_grad(m, a), torch.tensor([2.5, 1.5], dtype=torch.float64))
    torch.testing.assert_close(A.flat_grad(m, b), torch.tensor([1.0, 0.0], dtype=torch.float64))
    assert A.alignment(m, a, b) == pytest.approx(2.5 / 8.5 ** 0.5, abs=1e-12)  # (2.5*1 + 1.5*0) / (|.| |.|)
    assert A.alignment(m, a, b, measure="ratio") == pytest.approx(2.5 / 8.5, abs=1e-12)  # <a,b> / |a|^2
    assert A.alignment(m, b, a, measure="ratio") == pytest.approx(2.5 / 1.0, abs=1e-12)
    assert A.alignment(m, a, a) == pytest.approx(1.0, abs=1e-12)
    with pytest.raises(ValueError):
        A.alignment(m, a, b, measure="dot")


def _naive_grad(model, x, y):
    """Per-example autograd in a loop, averaged (the loss is a mean over examples)."""
    total = [torch.zeros_like(p) for p in model.parameters()]
    for i in range(len(x)):
        model.zero_grad(set_to_none=True)
        model(x[i:i + 1], y[i:i + 1]).loss.backward()
        for t, p in zip(total, model.parameters()):
            t += p.grad
    model.zero_grad(set_to_none=True)
    return torch.cat([t.reshape(-1) for t in total]) / len(x)


def test_linear_model_against_closed_form_and_a_naive_loop():
    gen = torch.Generator().manual_seed(0)
    w, b = torch.randn(3, 4, generator=gen, dtype=torch.float64), torch.randn(3, generator=gen, dtype=torch.float64)
    m = _Linear(w, b)
    xs = [torch.randn(n, 4, generator=gen, dtype=torch.float64) for n in (5, 7)]
    ys = [torch.randn(n, 3, generator=gen, dtype=torch.float64) for n in (5, 7)]
    grads = []
    for x, y in zip(xs, ys):
        g = A.flat_grad(m, {"x": x, "y": y})
        r = x @ w.T + b - y  # closed form: dL/dW = mean r x^T, dL/db = mean r
        closed = torch.cat([(r.T @ x / len(x)).reshape(-1), r.mean(0)])
        torch.testing.assert_close(g, closed, atol=1e-12, rtol=1e-12)
        torch.testing.assert_close(g, _naive_grad(m, x, y), atol=1e-12, rtol=1e-12)
        grads.append(closed)
    ga, gb = grads
    cos = float(ga @ gb / (ga.norm() * gb.norm()))
    assert abs(cos) > 0.05  # not a degenerate case
    bt = [{"x": x, "y": y} for x, y in zip(xs, ys)]
    assert A.alignment(m, bt[0], bt[1]) == pytest.approx(cos, abs=1e-12)
    assert A.alignment(m, bt[0], bt[1], measure="ratio") == pytest.approx(float(ga @ gb / (ga @ ga)), abs=1e-12)
    got = A.probe(m, bt[0], bt[1], lr=0.1)
    assert got == pytest.approx({"cos": cos, "drop": 0.1 * float(ga @ gb), "ratio": float(ga @ gb / (ga @ ga)),
                                 "g_train_norm": float(ga.norm()), "g_hard_norm": float(gb.norm())}, abs=1e-12)
    assert all(p.grad is None for p in m.parameters())


def test_ratio_is_the_hard_loss_drop_per_unit_training_loss_drop():
    gen = torch.Generator().manual_seed(1)
    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    m = _Linear(rand(2, 3), rand(2))
    tr, hd = {"x": rand(6, 3), "y": rand(6, 2)}, {"x": rand(6, 3), "y": rand(6, 2)}
    g = A.flat_grad(m, tr)
    eta = 1e-6
    with torch.no_grad():
        before = (float(m(**tr).loss), float(m(**hd).loss))
        m.lin.weight -= eta * g[:6].view(2, 3)
        m.lin.bias -= eta * g[6:]
        after = (float(m(**tr).loss), float(m(**hd).loss))
    measured = (before[1] - after[1]) / (before[0] - after[0])
    m2 = _Linear(m.lin.weight + eta * g[:6].view(2, 3), m.lin.bias + eta * g[6:])  # back at the start
    assert A.alignment(m2, tr, hd, measure="ratio") == pytest.approx(measured, rel=1e-4)


# --- the §5 loss decomposition on HARD images ------------------------------------------------------

def test_hard_image_losses_split_the_image_via_text_loss(tok):
    model = vlm.build_model(tok, TINY, seed=0)
    ps = mini.generate("HARD", 3, 0)
    conv, reason = A.conversion_split(tok, ps)
    full = T.make_batch(tok, _examples(ps, "image2answer+text", image=True), [0, 1, 2])
    torch.testing.assert_close(conv["input_ids"], full["input_ids"])
    enumerate_id, convert_id = tok.convert_tokens_to_ids("enumerate"), tok.convert_tokens_to_ids("convert")
    for k in range(3):
        lc, lr_, lf = conv["labels"][k], reason["labels"][k], full["labels"][k]
        c, r = (lc != -100).nonzero().view(-1), (lr_ != -100).nonzero().view(-1)
        assert int(lc[c[0]]) == convert_id and int(lr_[r[0]]) == enumerate_id
        assert int(c[-1]) + 1 == int(r[0])  # the two parts tile the response
        assert torch.equal(torch.where(lc != -100, lc, lr_), lf)
    losses = A.hard_image_losses(model, tok, ps)
    with torch.no_grad():
        model.eval()
        l_full = float(model(**full).loss)
        l_direct = float(model(**T.make_batch(tok, _examples(ps, "image2answer", image=True), [0, 1, 2])).loss)
    n_c = int((conv["labels"][:, 1:] != -100).sum())
    n_r = int((reason["labels"][:, 1:] != -100).sum())
    # the mean token loss of the whole response is the token-weighted mean of its two parts
    assert (n_c * losses["conversion"] + n_r * losses["reasoning"]) / (n_c + n_r) == pytest.approx(l_full, rel=1e-5)
    assert losses["direct"] == pytest.approx(l_direct, rel=1e-6)
    assert losses["conversion"] != pytest.approx(losses["reasoning"], rel=1e-3)


def test_run_arm_records_every_probe_statistic(tok):
    from lmforge.methods.simple_to_hard import experiment as E

    base = vlm.build_model(tok, TINY, seed=0)
    pools = E.make_pools(12, 12, seed=0)
    ev = {"hard-image": mini.generate("HARD", 1, 1)}
    probe = E.hard_probe_batch(tok, mini.generate("HARD", 2, 2))
    r = E.run_arm(base, tok, "align-mix+", 12, pools, ev, probe, seed=0, cfg=T.TrainConfig(batch_size=4),
                  probes_per_phase=1, probe_batch=4, loss_puzzles=mini.generate("HARD", 2, 3))
    assert len(r.alignment) == 2 and [a["phase"] for a in r.alignment] == [0, 1]
    for a in r.alignment:
        assert -1.0 <= a["cos"] <= 1.0 and a["g_train_norm"] > 0 and a["g_hard_norm"] > 0
        # ratio = cos |g_hard| / |g_train| and drop = lr <g_train, g_hard>: the record is one probe's
        assert a["ratio"] == pytest.approx(a["cos"] * a["g_hard_norm"] / a["g_train_norm"], rel=1e-6)
        assert a["drop"] == pytest.approx(3e-4 * a["cos"] * a["g_hard_norm"] * a["g_train_norm"], rel=1e-6)
        assert all(a[f"loss_{k}"] > 0 for k in ("conversion", "reasoning", "direct"))
    assert r.mean_alignment == pytest.approx(sum(a["cos"] for a in r.alignment) / 2)
