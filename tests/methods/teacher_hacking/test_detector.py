"""The power-law fit recovers known parameters (and agrees with scipy's linregress in log-log space);
the deviation detector fires on a planted U-turn or plateau and not on clean or noisy power laws."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from lmforge.methods.teacher_hacking.detector import detect_deviation, detect_slope_collapse, fit_power_law
from lmforge.methods.teacher_hacking.train import eval_steps


@pytest.mark.parametrize(("a", "b"), [(5.0, 0.5), (20.0, 0.9), (0.3, 0.2)])
def test_fit_recovers_exact_power_law(a: float, b: float) -> None:
    t = np.geomspace(1, 1000, 25)
    fit = fit_power_law(t, a * t**-b)
    assert fit.a == pytest.approx(a, rel=1e-9) and fit.b == pytest.approx(b, rel=1e-9)
    assert fit.rms < 1e-9 and fit.n == 25


def test_fit_on_noisy_curve_matches_scipy_linregress() -> None:
    rng = np.random.default_rng(0)
    t = np.geomspace(2, 500, 40)
    y = 3.0 * t**-0.7 * np.exp(rng.normal(0, 0.02, t.size))
    fit = fit_power_law(t, y)
    ref = stats.linregress(np.log(t), np.log(y))
    assert fit.b == pytest.approx(-ref.slope, rel=1e-9)
    assert np.log(fit.a) == pytest.approx(ref.intercept, rel=1e-9)
    assert fit.b == pytest.approx(0.7, abs=0.03) and fit.a == pytest.approx(3.0, rel=0.1)


def test_detector_quiet_on_clean_and_noisy_power_laws() -> None:
    steps = np.array(eval_steps(600, 20))
    t = np.maximum(steps, 1)
    assert not detect_deviation(steps, 8.0 * t**-0.4).fired
    rng = np.random.default_rng(1)
    for _ in range(20):
        noisy = 8.0 * t**-0.4 * np.exp(rng.normal(0, 0.02, t.size))
        assert not detect_deviation(steps, noisy).fired


def test_detector_fires_on_planted_u_turn() -> None:
    steps = np.array(eval_steps(600, 20))
    t = np.maximum(steps, 1).astype(float)
    clean = 8.0 * t**-0.4
    turn = 250
    u = np.where(t <= turn, clean, 8.0 * turn**-0.4 * (t / turn) ** 0.3)  # falls, then rises again
    det = detect_deviation(steps, u)
    assert det.fired and det.first_step is not None and det.first_step > turn
    assert det.fit.b == pytest.approx(0.4, rel=1e-6)  # the fit window ends before the turn


def test_detector_fires_on_a_plateau_but_not_on_faster_convergence() -> None:
    steps = np.array(eval_steps(1000, 24))
    t = np.maximum(steps, 1).astype(float)
    plateau = 8.0 * np.minimum(t, 400.0) ** -0.4  # stops improving at step 400
    assert detect_deviation(steps, plateau).fired
    faster = np.where(t <= 300, 8.0 * t**-0.4, 8.0 * 300**-0.4 * (t / 300) ** -1.5)
    assert not detect_deviation(steps, faster).fired


def test_detector_rejects_bad_inputs() -> None:
    with pytest.raises(ValueError):
        fit_power_law([1, 2, 3], [1.0, -1.0, 0.5])
    with pytest.raises(ValueError):
        detect_deviation([0, 1, 2], [3.0, 2.0, 1.0])  # too few points in the window
    with pytest.raises(ValueError):
        detect_deviation([1, 2, 3, 4], [1.0, 1.0, 1.0, 1.0], fit_start=0.5, fit_end=0.4)


def test_slope_collapse_on_synthetic_curves() -> None:
    steps = np.array(eval_steps(700, 16, 14))
    t = np.maximum(steps, 1).astype(float)
    clean = detect_slope_collapse(steps, 8.0 * t**-0.4)
    assert not clean.fired and clean.b_early == pytest.approx(0.4) and clean.b_late == pytest.approx(0.4)
    turn = 300
    u = np.where(t <= turn, 8.0 * t**-0.4, 8.0 * turn**-0.4 * (t / turn) ** 0.2)
    det = detect_slope_collapse(steps, u)
    assert det.fired and det.b_late == pytest.approx(-0.2)  # the late window lies after the turn
    assert detect_slope_collapse(steps, 8.0 * np.minimum(t, 350.0) ** -0.4).fired  # a plateau
    faster = np.where(t <= 300, 8.0 * t**-0.4, 8.0 * 300**-0.4 * (t / 300) ** -1.0)
    assert not detect_slope_collapse(steps, faster).fired
    rng = np.random.default_rng(3)
    for _ in range(10):
        assert not detect_slope_collapse(steps, 8.0 * t**-0.4 * np.exp(rng.normal(0, 0.02, t.size))).fired
    with pytest.raises(ValueError):
        detect_slope_collapse([0, 1, 2, 3], [4.0, 3.0, 2.0, 1.0])
