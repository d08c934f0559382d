"""The robust summary of a configuration's repeats: median less a spread shrunk towards the
pooled noise, so that a configuration measured once does not outrank re-measured ones."""

from __future__ import annotations

import math

import pytest

from specdecode_tune.objective import (
    MIN_BAND_DOF,
    PRIOR_DOF,
    Robust,
    band_dof,
    cautious_band,
    moderated_sigma,
    noise_band,
)
from specdecode_tune.stats import MAD_K


def test_without_a_band_the_spread_is_the_repeats_own_mad() -> None:
    r = Robust.of([0.80, 0.82, 0.78])
    assert r.median == pytest.approx(0.80)
    assert r.sigma == pytest.approx(MAD_K * 0.02)
    assert Robust.of([0.8]).sigma == 0.0


def test_one_measurement_carries_the_pooled_spread() -> None:
    r = Robust.of([0.8], band=0.03)
    assert r.sigma == pytest.approx(0.015)
    assert r.score == pytest.approx(0.785)


def test_the_own_spread_counts_as_n_minus_1_degrees_of_freedom_against_the_prior() -> None:
    own = MAD_K * 0.015
    expected = math.sqrt((PRIOR_DOF * 0.015 ** 2 + 2 * own ** 2) / (PRIOR_DOF + 2))
    assert Robust.of([0.782, 0.797, 0.821], band=0.03).sigma == pytest.approx(
        moderated_sigma(own, 2, 0.015))
    assert moderated_sigma(own, 2, 0.015) == pytest.approx(expected)
    # Between the pooled spread and its own, nearer the pooled while the repeats are few.
    assert 0.015 < expected < own


def test_a_single_lucky_boot_no_longer_outranks_a_better_re_measured_config() -> None:
    # A search's README run on the simulator (stop 27): steps=4 at mem 0.92 measured three
    # times (median +0.797, one boot at +0.821), steps=5 three times close together (+0.779).
    wide, tight, single = [0.782, 0.797, 0.821], [0.782, 0.776, 0.779], [0.786]
    # Own MADs alone: the tight one ties the better median (a coin toss on three boots'
    # luck), and the single boot wins outright.
    assert abs(Robust.of(tight).score - Robust.of(wide).score) < 0.001
    assert Robust.of(single).score > Robust.of(wide).score
    # Shrunk towards the band the repeats measured (+-3%): the better median ranks first,
    # by more than a third of the band.
    band = 0.03
    assert Robust.of(wide, band).score - Robust.of(tight, band).score > band / 3
    ranked = sorted({"wide": wide, "tight": tight, "single": single}.items(),
                    key=lambda kv: -Robust.of(kv[1], band).score)
    assert [k for k, _ in ranked][0] == "wide"


def test_band_dof_counts_what_noise_band_uses() -> None:
    """One count of the band's residual degrees of freedom, for the searcher and the report:
    repeats less one per configuration measured twice or more; under 3 the default band."""
    assert MIN_BAND_DOF == 3
    assert band_dof([[0.5], [0.4, 0.42], [0.3, 0.31, 0.33]]) == 3
    assert noise_band([[0.5], [0.4, 0.42], [0.3, 0.31, 0.33]], 0.2) != 0.2
    assert band_dof([[0.5], [0.4, 0.42], [0.3, 0.31]]) == 0
    assert noise_band([[0.5], [0.4, 0.42], [0.3, 0.31]], 0.2) == 0.2
    assert band_dof(iter([[0.4, 0.42, 0.41, 0.45]])) == 3       # any iterable, read once


def test_the_cautious_band_is_the_measured_one_else_never_narrower_than_the_default() -> None:
    """What the searcher's final re-measurements are decided with (search/searcher.py)."""
    # No repeat: the default. Repeats that measure the band (3 residual dof): the band.
    assert cautious_band([[0.5], [0.4]], 0.025) == 0.025
    measured = [[0.5], [0.4, 0.42], [0.3, 0.31, 0.33]]
    assert cautious_band(measured, 0.025) == noise_band(measured, 0.025) != 0.025
    # Fewer repeats: close ones leave the default (never narrowed), a noisy server's first
    # repeat widens it: its spread moderated towards half the default, PRIOR_DOF against 1.
    assert cautious_band([[0.80, 0.80]], 0.025) == 0.025
    assert cautious_band([[0.80, 0.801], [0.7, 0.7]], 0.025) == 0.025
    wide = cautious_band([[1.00, 0.92]], 0.025)
    sd = math.sqrt(0.04 ** 2 * 2 / 1)                      # two residuals of 0.04, 1 dof
    assert wide == pytest.approx(
        2 * math.sqrt((PRIOR_DOF * 0.0125 ** 2 + 1 * sd ** 2) / (PRIOR_DOF + 1)))
    assert 0.025 < wide < 2 * sd
    assert cautious_band([[5.0, -5.0]], 0.025) == 0.5     # clamped as noise_band is
