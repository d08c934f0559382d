"""The experiment's `[measure]` and `[objective]` tables: how a trial is measured, what "better" is.

`[measure]` lists the closed-loop concurrency levels (and optional open-loop request rates) and
the timing of each level. `[objective]` is read against those levels: a scalar objective weighs
the levels (keys are measured levels), a Pareto objective names per-level metrics
`NAME@LEVEL`, each maximised (latencies minimised), a goodput objective weighs the levels'
good requests per second (those that met every latency target: `ttft_ms`, `tpot_ms`,
`itl_ms` at `percentile`; load/slo.py) against the baseline's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import ConfigError
from .reader import Table

# The rounds a level keeps before the precision rule may stop it, unless the experiment says:
# on real servers one round's figure is not independent of the next, and fewer rounds stopped
# levels on chance agreement (benchmarks/stop_rule.py, load/rounds.py).
MIN_ROUNDS = 30

# "schedule": the search aims at the best config at every level (what a per-batch-size
# schedule can use), scored as "scalar" for Tune; it ends with the schedule's validation trial.
# "goodput": requests/s that met every latency target (load/slo.py).
OBJECTIVE_KINDS = ("scalar", "pareto", "goodput", "schedule")
PARETO_METRICS = ("output_tok_s", "requests_s", "ttft_p50", "tpot_p50", "itl_p50", "e2e_p50")


@dataclass(frozen=True)
class MeasureConfig:
    """How each concurrency level is measured (closed loop) or each request rate (open loop)."""

    concurrency: tuple[int, ...] = (1, 16, 32, 64)
    rates: tuple[float, ...] = ()                 # open-loop request rates, measured after
    warmup_s: float = 2.0                         # ramp-up per level, not counted
    duration_s: float = 10.0                      # measurement window per level
    warmup_requests: int = 2                      # sequential requests after boot, not counted
    request_timeout_s: float = 300.0
    max_requests: int | None = None               # optional cap per level
    # Windows that end when the level is known (load/rounds.py): each closed-loop level runs
    # whole rounds until the 95% interval of its tok/s (and acceptance) is within +-precision
    # of the figure, at least `min_rounds`, at most `max_duration_s` after the warm-up. None:
    # the fixed window `duration_s`. Open-loop rates always use `duration_s`.
    precision: float | None = None
    min_rounds: int = MIN_ROUNDS
    max_duration_s: float = 60.0

    @property
    def window_s(self) -> float:
        """A closed-loop level's window: fixed, or the cap of the round rule."""
        return self.max_duration_s if self.precision is not None else self.duration_s

    @classmethod
    def from_table(cls, t: Table) -> MeasureConfig:
        """Read and check `[measure]`."""
        conc = t.get("concurrency", list, [1, 16, 32, 64])
        if not conc or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 1
                               for c in conc):
            raise t.fail("concurrency", conc, "must be a non-empty list of integers >= 1")
        if len(set(conc)) != len(conc):
            raise t.fail("concurrency", conc, "must not repeat a level")
        rates = t.get("rates", list, [])
        if not all(isinstance(r, (int, float)) and not isinstance(r, bool) and r > 0
                   for r in rates):
            raise t.fail("rates", rates, "must be a list of request rates > 0")
        max_requests = t.get("max_requests", int, 0)
        if max_requests < 0:
            raise t.fail("max_requests", max_requests, "must be >= 0 (0 = no cap)")
        precision = t.get("precision", (int, float), None)
        if precision is not None and not 0 < precision < 0.5:
            raise t.fail("precision", precision, "a relative half-width at 95% in (0, 0.5), "
                                                 "e.g. 0.02 for +-2%")
        duration = t.positive("duration_s", (int, float), None)
        if precision is not None and duration is not None and not rates:
            raise t.fail("duration_s", duration, "give one: precision (each level measured "
                                                 "until known) or duration_s (a fixed window); "
                                                 "with precision, max_duration_s caps a level")
        for key in ("min_rounds", "max_duration_s"):
            if precision is None and key in t.data:
                raise t.fail(key, t.data[key], "only used with measure.precision")
        min_rounds = t.get("min_rounds", int, MIN_ROUNDS)
        if min_rounds < 2:
            raise t.fail("min_rounds", min_rounds, "must be >= 2 (an interval needs two "
                                                   "rounds)")
        cfg = cls(
            concurrency=tuple(conc),
            rates=tuple(float(r) for r in rates),
            warmup_s=float(t.positive("warmup_s", (int, float), 2.0, zero_ok=True)),
            duration_s=float(duration if duration is not None else 10.0),
            warmup_requests=t.positive("warmup_requests", int, 2, zero_ok=True),
            request_timeout_s=float(t.positive("request_timeout_s", (int, float), 300.0)),
            max_requests=max_requests or None,
            precision=None if precision is None else float(precision),
            min_rounds=min_rounds,
            max_duration_s=float(t.positive("max_duration_s", (int, float), 60.0)),
        )
        t.done()
        return cfg


@dataclass(frozen=True)
class ObjectiveConfig:
    """Scalar: weighted mean of log-speedup over the no-spec baseline across levels.
    Pareto: several per-level metrics, each maximised (latencies minimised)."""

    kind: str = "scalar"
    weights: dict[int, float] = field(default_factory=dict)   # concurrency -> weight
    metrics: tuple[str, ...] = ()                               # pareto: "output_tok_s@1", ...
    # goodput: latency targets in milliseconds (None: not checked), the ITL percentile
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    itl_ms: float | None = None
    percentile: float = 90.0

    @classmethod
    def from_table(cls, t: Table, measure: MeasureConfig) -> ObjectiveConfig:
        """Read and check `[objective]` against the measured levels."""
        kind = t.choice("kind", OBJECTIVE_KINDS, "scalar")
        weights = _weights(t.sub("weights"), measure)
        if weights and sum(weights.values()) <= 0:
            raise ConfigError(f"{t.where}: objective.weights sum to 0: at least one must be > 0")
        metrics = t.get("metrics", list, [])
        for m in metrics:
            name, _, level = str(m).partition("@")
            if name not in PARETO_METRICS or not level.isdigit() or \
                    int(level) not in measure.concurrency:
                raise t.fail("metrics", m, f"each metric is NAME@LEVEL with NAME in "
                                           f"{', '.join(PARETO_METRICS)} and LEVEL a measured "
                                           f"concurrency")
        if kind == "pareto" and len(metrics) < 2:
            raise t.fail("metrics", metrics, "a pareto objective needs at least two metrics")
        if kind != "pareto" and metrics:
            raise t.fail("metrics", metrics, "only used with objective.kind = 'pareto'")
        targets: dict[str, float | None] = {}
        for key in ("ttft_ms", "tpot_ms", "itl_ms"):
            v = t.get(key, (int, float), None)
            if v is not None and kind != "goodput":
                raise t.fail(key, v, "only used with objective.kind = 'goodput'")
            if v is not None and not v > 0:
                raise t.fail(key, v, "a latency target in milliseconds, > 0")
            targets[key] = None if v is None else float(v)
        pct = t.get("percentile", (int, float), 90.0)
        if not 0 < pct <= 100:
            raise t.fail("percentile", pct, "a percentile in (0, 100]")
        if kind == "goodput" and all(v is None for v in targets.values()):
            raise ConfigError(f"{t.where}: objective.kind = 'goodput' needs at least one "
                              f"target: ttft_ms, tpot_ms or itl_ms")
        t.done()
        return cls(kind=kind, weights=weights, metrics=tuple(metrics), percentile=float(pct),
                   **targets)


def _weights(wt: Table, measure: MeasureConfig) -> dict[int, float]:
    """`[objective.weights]`: a weight >= 0 per measured level, keyed by the level."""
    weights: dict[int, float] = {}
    for k in list(wt.data):
        w = wt.get(k, (int, float))
        try:
            c = int(k)
        except ValueError:
            raise wt.fail(k, w, "weights are keyed by a concurrency level, e.g. \"16\" = 1.0") \
                from None
        if c not in measure.concurrency:
            raise wt.fail(k, w, f"{c} is not a measured level (measure.concurrency = "
                                f"{list(measure.concurrency)})")
        if w < 0:
            raise wt.fail(k, w, "must be >= 0")
        weights[c] = float(w)
    wt.done()
    return weights
