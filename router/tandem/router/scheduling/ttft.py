"""Predicting time to first token (TTFT) per endpoint, and learning each endpoint's prefill speed online.

The model is the linear one of research/papers.md §3.7 (Mooncake's `c0 + c1·x`, Preble's fitted
prefill time): an engine works through the prompt tokens it was given at R_p tokens/s, after a fixed
per-request overhead c_p (scheduling, HTTP, the first decode step), so a request sent to p now sees

    TTFT̂_p = c_p + (Q_p + U_p) / R_p

- `Q_p`: uncached prompt tokens of the requests the router already sent to p that have not produced a
  first token yet (the router's own accounting; other routers' requests are not counted),
- `U_p = n − h_p`: this request's prompt tokens not cached on p (at least 1: an engine always computes
  the last prompt token),
- `R_p`, `c_p`: learned per endpoint (below); c_p is 0 until the data show one.

Worked example: 3,000 tokens queued on p, a 1,030-token prompt with 1,024 cached there, R = 10,000
tokens/s, c = 20 ms → TTFT̂ = 0.02 + (3,000 + 6) / 10,000 = 0.32 s; on an endpoint with nothing
queued or cached it is 0.02 + 1,030 / 10,000 = 0.123 s.

**Learning.** When a request's first token arrives after `t` seconds (the router sees the first byte
of a stream, or the whole answer of a one-token prefill), the work it waited for was
`W = Q_p(at dispatch) + U_p`. Each endpoint keeps exponentially weighted means (weight α =
`smoothing` on the newest sample) of W, t, W² and W·t, and fits the line t = c + W/R by least squares:

    1/R = cov(W, t) / var(W),   c = mean(t) − mean(W)/R

When that fit is unusable (fewer than 3 samples, W nearly constant, a slope ≤ 0, or c < 0) it falls
back to the line through the origin, `R = mean(W) / mean(t)`, c = 0: a token-weighted average rate.
Example, α = 0.2: (1,000 tokens, 0.12 s), (3,000, 0.32 s), (2,000, 0.22 s) lie on t = 0.02 + W/10,000,
so R = 10,000 tokens/s and c = 0.02 s; after only the first two the fallback gives R = mean(W)/mean(t)
= 1,400/0.16 = 8,750 tokens/s and c = 0 (the overhead, unseen, slows the apparent rate).

**Beyond the work it has seen.** A fit from requests of one size says little about the slope: at
idle every sample has W ≈ one prompt, and an engine that batches makes a request's time depend on work
that arrived after it too, so the line comes out flat with a large c. The line passes through the
samples' means (W̄, t̄); past W̄ the prediction is the larger of the line and the line through the origin
and that point (`W · t̄ / W̄`, the average rate, overhead included): the overhead grows with the work,
`c · max(1, W / W̄)`, instead of being paid once for a queue of any length. Example, measured
(simulated 7B engine at time scale 0.5, 3,030-token prompts one at a time): the fit was R = 48,541
tokens/s, c = 0.139 s, W̄ ≈ 3,100; with 18,180 tokens queued the line said 0.51 s, the rule says
0.374 + 0.139 × 18,180 / 3,100 = 1.19 s, and the request sent then took 1.24 s. Within W̄ the fit is
used as it is (a short prompt on an idle engine still costs c).

**Prior.** An endpoint not observed yet gets the mean R and c of the endpoints that were (new replicas
of a pool are the same hardware), or `prior_tokens_per_second` and no overhead when none was. No
profile of the model or GPU is needed; the prior only has to be right within a few requests.

Pure: plain numbers in and out; one `PrefillRates` per router, used from the event loop.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import NamedTuple

#: Rate assumed before anything was observed: a mid-size model on one GPU, order of magnitude only.
DEFAULT_PRIOR_TOKENS_PER_SECOND = 8192.0
DEFAULT_SMOOTHING = 0.2
#: Samples before the overhead is fitted; W must vary by at least this share of its mean.
MIN_FIT_SAMPLES = 3
MIN_RELATIVE_SPREAD = 0.05


def predict_ttft(
    *,
    queued_tokens: float,
    uncached_tokens: float,
    tokens_per_second: float,
    overhead_s: float = 0.0,
    seen_tokens: float = math.inf,
) -> float:
    """`overhead_s · max(1, W / seen_tokens) + W / tokens_per_second` seconds for the work
    `W = queued_tokens + uncached_tokens` (module docstring; `seen_tokens`: the mean work of the
    samples the model was fitted on); negative counts count as 0. Raises ValueError for a rate that is
    not positive."""
    if not tokens_per_second > 0:
        raise ValueError(f"tokens_per_second must be positive, got {tokens_per_second}")
    work = max(0.0, queued_tokens) + max(0.0, uncached_tokens)
    return ttft_seconds(Model(tokens_per_second, max(0.0, overhead_s), seen_tokens), work)


class Model(NamedTuple):
    """An endpoint's prefill model: `rate` tokens/s, `overhead` seconds, `seen` the mean work (tokens)
    of the samples it was fitted on (infinite for the prior)."""

    rate: float
    overhead: float
    seen: float


def ttft_seconds(model: Model, work: float, /) -> float:
    """Predicted seconds for `work` tokens ahead of and including a request's first token (module
    docstring: the overhead grows with the work past what the model has seen)."""
    overhead = model.overhead * work / model.seen if work > model.seen else model.overhead
    return overhead + work / model.rate


@dataclass(slots=True, kw_only=True)
class _Learned:
    """Exponentially weighted means of W (tokens), t (seconds), W², W·t."""

    w: float
    t: float
    ww: float
    wt: float
    observations: int = 1

    def fit(self) -> Model:
        """Rate, overhead and the mean work seen, as the module docstring says."""
        variance = self.ww - self.w * self.w
        covariance = self.wt - self.w * self.t
        if (
            self.observations >= MIN_FIT_SAMPLES
            and variance > (MIN_RELATIVE_SPREAD * self.w) ** 2
            and covariance > 0
        ):
            per_token = covariance / variance
            overhead = self.t - self.w * per_token
            if overhead >= 0:
                return Model(1.0 / per_token, overhead, self.w)
        return Model(self.w / self.t, 0.0, self.w)


class PrefillRates:
    """Learned prefill rate and overhead per endpoint URL (module docstring)."""

    def __init__(
        self,
        *,
        prior_tokens_per_second: float = DEFAULT_PRIOR_TOKENS_PER_SECOND,
        smoothing: float = DEFAULT_SMOOTHING,
    ) -> None:
        if not prior_tokens_per_second > 0:
            raise ValueError("prior_tokens_per_second must be positive")
        if not 0 < smoothing <= 1:
            raise ValueError("smoothing must be in (0, 1]")
        self._prior = prior_tokens_per_second
        self._alpha = smoothing
        self._learned: dict[str, _Learned] = {}
        self._fits: dict[str, Model] = {}
        self._mean: Model | None = None  # of the fits; None: to recompute

    def observe(self, url: str, *, tokens: float, seconds: float) -> bool:
        """Learn from `tokens` of prefill work done in `seconds`; ignored (False) unless both are
        positive (a fake clock that did not move, a request with nothing to prefill)."""
        if not (tokens > 0 and seconds > 0):
            return False
        learned = self._learned.get(url)
        if learned is None:
            self._learned[url] = _Learned(w=tokens, t=seconds, ww=tokens * tokens, wt=tokens * seconds)
        else:
            keep, alpha = 1.0 - self._alpha, self._alpha
            learned.w = keep * learned.w + alpha * tokens
            learned.t = keep * learned.t + alpha * seconds
            learned.ww = keep * learned.ww + alpha * tokens * tokens
            learned.wt = keep * learned.wt + alpha * tokens * seconds
            learned.observations += 1
        self._fits[url] = self._learned[url].fit()
        self._mean = None
        return True

    def rate(self, url: str) -> float:
        """Tokens/s for `url`: learned, else the mean learned rate, else the prior."""
        return self._model(url)[0]

    def overhead(self, url: str) -> float:
        """Fixed seconds per request for `url`: learned, else the mean learned one, else 0."""
        return self._model(url)[1]

    def predict(self, url: str, *, queued_tokens: float, uncached_tokens: float) -> float:
        """`predict_ttft` with `url`'s learned (or prior) model."""
        return ttft_seconds(self._model(url), max(0.0, queued_tokens) + max(0.0, uncached_tokens))

    def throughput(self, url: str) -> float | None:
        """Tokens/s of `url`'s requests as they came, overhead included: mean(W) / mean(t), the rate
        one request after another would sustain (the autoscaler's capacity before an engine was seen
        saturated); None until observed. Example: (1,000, 0.12 s), (3,000, 0.32 s) → 2,000 / 0.22."""
        learned = self._learned.get(url)
        return learned.w / learned.t if learned is not None else None

    def observations(self, url: str) -> int:
        learned = self._learned.get(url)
        return learned.observations if learned is not None else 0

    def known(self, urls: Iterable[str]) -> bool:
        """Whether every endpoint in `urls` has been observed at least once."""
        return all(url in self._learned for url in urls)

    def forget(self, keep: Collection[str]) -> None:
        """Drop what was learned about endpoints not in `keep`."""
        for url in [u for u in self._learned if u not in keep]:
            del self._learned[url]
            del self._fits[url]
            self._mean = None

    def model(self, url: str) -> Model:
        """`url`'s model: learned, else the mean of the learned ones, else the prior."""
        return self._model(url)

    def _model(self, url: str) -> Model:
        fit = self._fits.get(url)
        if fit is not None:
            return fit
        if not self._fits:
            return Model(self._prior, 0.0, math.inf)
        if self._mean is None:
            count = len(self._fits)
            fits = self._fits.values()
            self._mean = Model(
                sum(fit.rate for fit in fits) / count,
                sum(fit.overhead for fit in fits) / count,
                sum(fit.seen for fit in fits) / count,
            )
        return self._mean
