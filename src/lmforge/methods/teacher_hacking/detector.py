"""Oracle-free detection of teacher hacking: deviation of the proxy curve from polynomial convergence.

Tiapkin et al., "On Teacher Hacking in Language Model Distillation" (ICML 2025, arXiv 2502.02671):
"we can detect it by observing when the optimization process deviates from polynomial convergence
laws". A healthy proxy curve (the student-teacher distance over training steps) follows a power law
``proxy(t) ≈ a·t^(-b)``, a straight line on log-log axes; under teacher hacking the proxy curve bends
away from that line. The detector only reads the proxy curve (never the oracle).

NOTE (unverified detail): the paper shows the deviation on log-log plots; the exact fitting window
and decision threshold could not be read from the paper's text here (no official code is public).
Our rule, fixed before running any experiment: fit ``log proxy = log a - b·log t`` by least squares
on the steps in ``(fit_start·T, fit_end·T]`` (defaults: the first third of training after the first
5%), extrapolate, and flag hacking when some later point lies above the extrapolated line by more
than ``tol`` in log space (``tol = max(min_tol, sigma_mult·σ)``, σ the fit's RMS residual). Only upward
deviations count: converging faster than the power law is not hacking. The excess is averaged over
``persist`` consecutive evaluations (added after our first full run, where one noisy evaluation of an
online run crossed the line; see the reproduction's notes). scipy's ``linregress`` would
give the same line; the fit is a two-parameter least squares solved by numpy here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PowerLawFit:
    """``y ≈ a·t^(-b)`` fitted in log-log space.

    Attributes:
        a: prefactor.
        b: exponent (positive for a falling curve).
        rms: RMS residual of ``log y`` on the fitted points.
        n: number of fitted points.
    """

    a: float
    b: float
    rms: float
    n: int

    def predict(self, t: np.ndarray | list[float]) -> np.ndarray:
        """The power law at steps ``t``."""
        return self.a * np.asarray(t, dtype=float) ** (-self.b)


def fit_power_law(t: np.ndarray | list[float], y: np.ndarray | list[float]) -> PowerLawFit:
    """Least-squares fit of ``log y = log a - b·log t`` (all ``t`` and ``y`` must be positive)."""
    t_arr, y_arr = np.asarray(t, dtype=float), np.asarray(y, dtype=float)
    if t_arr.shape != y_arr.shape or t_arr.size < 2:
        raise ValueError("need at least two (t, y) points of equal count")
    if (t_arr <= 0).any() or (y_arr <= 0).any():
        raise ValueError("a power-law fit needs positive steps and positive values")
    x, z = np.log(t_arr), np.log(y_arr)
    design = np.stack([np.ones_like(x), -x], axis=1)
    (log_a, b), *_ = np.linalg.lstsq(design, z, rcond=None)
    resid = z - design @ np.array([log_a, b])
    return PowerLawFit(a=float(np.exp(log_a)), b=float(b), rms=float(np.sqrt(np.mean(resid**2))), n=int(t_arr.size))


@dataclass(frozen=True)
class Detection:
    """The detector's verdict on one proxy curve.

    Attributes:
        fired: True when the later proxy curve lies above the extrapolated power law by more than ``tol``.
        fit: the power law fitted to the early window.
        max_excess: largest ``persist``-point moving average of ``log proxy - log fit`` over the later
            points (log space).
        tol: the threshold used.
        first_step: first later step over the threshold (None if none).
        fit_window: the (exclusive, inclusive] step range of the fit.
    """

    fired: bool
    fit: PowerLawFit
    max_excess: float
    tol: float
    first_step: int | None
    fit_window: tuple[float, float]


def detect_deviation(steps: list[int] | np.ndarray, proxy: list[float] | np.ndarray, fit_start: float = 0.05,
                     fit_end: float = 1 / 3, min_tol: float = 0.1, sigma_mult: float = 3.0,
                     persist: int = 3) -> Detection:
    """Flag teacher hacking from the proxy curve alone (see the module docstring for the rule).

    Args:
        steps: training steps of the proxy measurements (step 0 is ignored: log 0 is undefined).
        proxy: proxy metric (student-teacher distance, positive) at those steps.
        fit_start: fit window starts after ``fit_start·T`` (skips the pre-asymptotic first steps).
        fit_end: fit window ends at ``fit_end·T``; points after it are tested.
        min_tol: smallest threshold on the log-space excess (0.1 ≈ 10.5% above the line).
        sigma_mult: threshold in units of the fit's RMS residual, when that is larger.
        persist: the excess is averaged over this many consecutive later points (a moving average)
            before the comparison, so one noisy evaluation cannot fire the detector; 1 = no averaging.

    Returns:
        The :class:`Detection`.
    """
    s, y = np.asarray(steps, dtype=float), np.asarray(proxy, dtype=float)
    if s.shape != y.shape:
        raise ValueError("steps and proxy differ in length")
    if not 0 <= fit_start < fit_end < 1:
        raise ValueError("need 0 <= fit_start < fit_end < 1")
    horizon = float(s.max())
    lo, hi = fit_start * horizon, fit_end * horizon
    in_fit = (s > lo) & (s <= hi) & (s > 0)
    later = s > hi
    if in_fit.sum() < 3 or later.sum() < 1:
        raise ValueError(f"need >= 3 points in the fit window ({lo:g}, {hi:g}] and >= 1 after it")
    fit = fit_power_law(s[in_fit], y[in_fit])
    excess = np.log(y[later]) - np.log(fit.predict(s[later]))
    w = max(1, min(persist, excess.size))
    smoothed = np.convolve(excess, np.ones(w) / w, mode="valid")  # smoothed[i] averages excess[i:i+w]
    tol = max(min_tol, sigma_mult * fit.rms)
    over = np.nonzero(smoothed > tol)[0]
    first = int(s[later][over[0] + w - 1]) if over.size else None  # the step where the run of points ends
    return Detection(fired=bool(over.size), fit=fit, max_excess=float(smoothed.max()), tol=float(tol), first_step=first,
                     fit_window=(lo, hi))


@dataclass(frozen=True)
class SlopeCollapse:
    """A second reading of "deviation from polynomial convergence": the late exponent against the early one.

    Attributes:
        fired: True when ``b_late < ratio·b_early`` (the curve has stopped converging polynomially).
        b_early: power-law exponent fitted on the early window.
        b_late: power-law exponent fitted on the late window (near 0 or negative: a plateau or a rise).
        ratio: the threshold ratio used.
    """

    fired: bool
    b_early: float
    b_late: float
    ratio: float


def detect_slope_collapse(steps: list[int] | np.ndarray, proxy: list[float] | np.ndarray, fit_start: float = 0.05,
                          fit_end: float = 1 / 3, late_start: float = 2 / 3, ratio: float = 0.25) -> SlopeCollapse:
    """Flag hacking when the proxy's local power-law exponent late in training collapses.

    NOTE: a post-hoc variant, added after the reproduction's seeds were seen (the extrapolation rule of
    :func:`detect_deviation` also fired on some online runs whose convergence merely slowed). It fits
    ``log proxy = log a - b·log t`` separately on the early window ``(fit_start·T, fit_end·T]`` and the
    late window ``[late_start·T, T]`` and fires when ``b_late < ratio·b_early`` with ``b_early > 0``.
    Like :func:`detect_deviation` it reads the proxy curve only.
    """
    s, y = np.asarray(steps, dtype=float), np.asarray(proxy, dtype=float)
    if s.shape != y.shape:
        raise ValueError("steps and proxy differ in length")
    if not 0 <= fit_start < fit_end <= late_start < 1:
        raise ValueError("need 0 <= fit_start < fit_end <= late_start < 1")
    horizon = float(s.max())
    early = (s > fit_start * horizon) & (s <= fit_end * horizon) & (s > 0)
    late = s >= late_start * horizon
    if early.sum() < 3 or late.sum() < 3:
        raise ValueError("need >= 3 points in each of the early and late windows")
    b_early = fit_power_law(s[early], y[early]).b
    b_late = fit_power_law(s[late], y[late]).b
    return SlopeCollapse(fired=bool(b_early > 0 and b_late < ratio * b_early), b_early=b_early, b_late=b_late,
                         ratio=ratio)
