"""From scrapes to the decider's observations: the collector's pure half.

Every second the collector scrapes each ready engine of a pool and the gateway (`Scrape`: the time,
one reading per engine URL and the queue depth per gateway URL, None where a scrape failed) and calls
`remember`, which keeps the scrapes of the last `keep_s` seconds. The gateway's queue
(`tandem_router_queue_depth`, summed over its replicas) holds requests the engines have not seen yet:
they wait there for decode capacity, then need a prefill. The observations are built from that history:

- **decode** (`decode_observation`): ready = engines scraped; mean `vllm:kv_cache_usage_perc` over them;
  Σ `vllm:num_requests_running` and the gateway's queued requests (the decider counts each queued
  request as one more running one; the running count is required only while something is queued).
- **prefill** (`prefill_observation`):
  - TTFT p90 from the `vllm:time_to_first_token_seconds` bucket deltas between the latest scrape and the
    oldest one still inside `ttft_window_s` (the panic window), summed over engines that have both;
    None when no request reached its first token in that window.
  - Queued prefill backlog in tokens = (Σ engines' waiting requests + gateway's queued and held requests,
    those held for a prefill engine with room included) × mean prompt length, the mean being
    Σ `vllm:prompt_tokens_total` / Σ TTFT count (lifetime). Example:
    12 waiting in engines and 8 in the gateway, 90 000 prompt tokens over 300 requests →
    (12 + 8) × 300 = 6000 tokens.
  - Per-replica prefill rate (capacity): Δ`vllm:prompt_tokens_total` / Δt per engine over its latest
    run of scrapes that *all* showed requests waiting, at least `BUSY_SPAN_S` long (an engine busy the
    whole time shows its capacity; one that was idle part of the span only its load); the rate used is
    the highest such one seen in `rate_memory_s`. Example: waiting at t = 1, 2, 3 and 6000 tokens
    between t = 1 and 3 → 3000 tokens/s. Before any engine was seen busy, the gateway's observed
    throughput (`tandem_router_endpoint_prefill_throughput_tokens_per_second`: mean prompt tokens over
    mean time to first token of its requests, overhead included, so on the safe side for an engine that
    batches) counts too: the highest over the pool's engines (each averaged over the gateway's replicas;
    `learned_tokens_per_s`); the decider divides by the higher of the two, both being lower bounds.
  - **Token velocity** (the leading signal): prompt tokens per second arriving, over the last
    `LEADING_WINDOW_S`: Δ`tandem_router_arrival_prompt_tokens_total` / Δt summed over the gateway's
    replicas; from gateways that do not export it, the engines' served rate plus the backlog's growth
    (Δ`vllm:prompt_tokens_total` / Δt + Δbacklog / Δt, at least 0). Example: the counter went 30 000 →
    84 000 in 2 s → 27 000 tokens/s.
- **decode** also carries the requests **on their way** to a decode engine's batch besides the
  gateway's queue: held for a prefill engine, open to one (`tandem_router_pool_in_flight_requests
  {pool="prefill"}`), and waiting in the decode engines (`vllm:num_requests_waiting`). Example: 3 held,
  5 in prefill, 1 waiting in a decode engine → 9.
- **decode** also carries the gateway's held requests (scale from zero: no decode engine yet), the
  arrival rate in requests per second, from the same counters, and the **service time**: the mean
  seconds a finished request ran in an engine, its time in the engine less its time waiting there
  (Δ`vllm:e2e_request_latency_seconds_sum` − Δ`vllm:request_queue_time_seconds_sum`, over
  Δ`vllm:e2e_request_latency_seconds_count`, summed over the engines across the kept scrapes; when
  nothing finished in them, the engines' lifetime totals). Example: 12 finished in the window, 30.0 s
  in the engines of which 6.0 s waiting → 2.0 s. With the arrival rate it gives Little's law's count of
  running requests (`tandem.autoscaler.decider.decode_leading`).
- **decode**, learned (`learn_service`, once per scrape, before `decode_observation`): how the service
  time grows with load (`tandem.autoscaler.service`). Between the last two scrapes, each engine that
  finished requests gives a point: their mean service time (Δ(e2e − queue) / Δcount) and the running
  count they saw, the `vllm:num_requests_running` gauge (linear between scrapes) averaged over that
  service time before the middle of the interval (a request finishing now ran at the load of the
  seconds before: at a step, the gauge of the last scrape alone paired the idle requests' time with the
  burst's count). Each round also adds, over the engines in both scrapes, the running request-seconds
  on the scraper's clock (the gauge's trapezoid), the service seconds reported for the requests that
  finished, and the running count at both ends, whose ratio converts the engines' seconds to the
  arrivals' (`service_s` and the curve are in those seconds). Example: 2 running, then 4, 1.0 s apart,
  3 finished reporting 1.5 s → 3.0 request-seconds; a point at 0.5 s, which saw the gauge's mean over
  [0, 0.5] s, 2.5 running.

Every Δt of a rate is the time between the two answers, as the scraper stamped them (`at`), not
between the rounds: on a loaded host a `/metrics` answer can come back hundreds of milliseconds after
the round began, and over a 2 s window that lag alone made one round's arrival rate 50% high and the
next one's as low.

Missing data is never guessed: a failed scrape or a missing metric on any ready engine makes the
observation invalid (`valid=False`, with the reason in `problem`), and the decider holds. The gateway's
queue only ever adds demand, so a gateway replica whose scrape failed adds nothing this round (logged by
the scraper) instead of invalidating the engines' signals: an overloaded gateway answers its `/metrics`
slowly, and holding then would freeze the autoscaler exactly when load is highest.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit

from tandem.autoscaler.decider import DecodeObservation, PrefillObservation
from tandem.autoscaler.readings import (
    EngineReading,
    GatewayReading,
    Histogram,
    histogram_delta,
    histogram_quantile,
    histogram_sum,
)
from tandem.autoscaler.service import (
    ClockSample,
    ServiceMemory,
    ServicePoint,
    clock_ratio,
    fit_service,
    remember_service,
)
from tandem.autoscaler.windows import Sample, peak, within

TTFT_QUANTILE = 0.9
#: A capacity is measured over at least this many seconds of an engine that had requests waiting at
#: every scrape (a shorter or interrupted run shows its load, not what it can do).
BUSY_SPAN_S = 2.0
#: Arrival rates are measured over this many seconds: a step shows within one round or two.
LEADING_WINDOW_S = 2.0


@dataclass(frozen=True, slots=True)
class Scrape:
    """One round over a pool at monotonic time `t`: engine URL → reading, gateway URL → its reading
    (None: the scrape failed; no gateway: nothing known to be queued or arriving)."""

    t: float
    readings: Mapping[str, EngineReading | None]
    gateways: Mapping[str, GatewayReading | None] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PoolHistory:
    """Recent scrapes of one pool (oldest first), measured prefill rates (tokens/s per replica) and
    what was learned of the decode service time."""

    scrapes: tuple[Scrape, ...] = ()
    rates: tuple[Sample, ...] = ()
    service: ServiceMemory = field(default_factory=ServiceMemory)


def remember(history: PoolHistory, scrape: Scrape, *, keep_s: float) -> PoolHistory:
    """`history` with `scrape` appended and scrapes older than `keep_s` before it dropped."""
    kept = tuple(s for s in history.scrapes if scrape.t - keep_s <= s.t < scrape.t)
    return replace(history, scrapes=(*kept, scrape))


def _elapsed(
    old: tuple[Scrape, EngineReading | GatewayReading], new: tuple[Scrape, EngineReading | GatewayReading]
) -> float:
    """Seconds between two readings of one source: between their answers when both carry the time they
    arrived, else between their rounds. Example: rounds at 10.0 and 11.0, answers at 10.05 and 11.45 →
    1.4 (the second counters were read late: over 1 s they would look 40% faster)."""
    (old_scrape, old_reading), (new_scrape, new_reading) = old, new
    if old_reading.at is not None and new_reading.at is not None:
        return new_reading.at - old_reading.at
    return new_scrape.t - old_scrape.t


def _problem(scrape: Scrape, needed: tuple[str, ...]) -> str | None:
    for url, reading in scrape.readings.items():
        if reading is None:
            return f"no metrics from {url}"
        missing = [name for name in needed if getattr(reading, name) is None]
        if missing:
            return f"{url} does not report {', '.join(missing)}"
    return None


def gateway_queued(scrape: Scrape) -> float:
    """Requests queued in the gateway (all its replicas) at this scrape; a failed scrape adds nothing."""
    return sum(g.queued for g in scrape.gateways.values() if g is not None)


def gateway_held(scrape: Scrape) -> float:
    """Requests the gateway holds (all replicas) because the decode pool has no engine."""
    return sum(g.held for g in scrape.gateways.values() if g is not None)


def gateway_waiting(scrape: Scrape) -> float:
    """Requests in the gateway that no engine has seen yet, each of which will need a prefill: queued,
    held for want of a decode engine, and held for a prefill engine with room (late binding)."""
    prefill_held = sum(g.prefill_held for g in scrape.gateways.values() if g is not None)
    return gateway_queued(scrape) + gateway_held(scrape) + prefill_held


def on_the_way(scrape: Scrape) -> float:
    """Requests bound for a decode engine's batch, besides the gateway's queue (module docstring): held
    for or open to a prefill engine, and waiting in the decode engines."""
    gateways = [g for g in scrape.gateways.values() if g is not None]
    waiting = sum(r.waiting or 0.0 for r in scrape.readings.values() if r is not None)
    return sum(g.prefill_held + g.prefill_in_flight for g in gateways) + waiting


def arrival_rates(history: PoolHistory, *, window_s: float) -> tuple[float, float] | None:
    """(requests/s, prompt tokens/s) arriving at the gateway over the last `window_s` (from the newest
    scrape at least that old, else the oldest), summed over its replicas; None when no replica exported
    its arrival counters in two scrapes. A counter
    that went down (a restarted replica) counts from 0. Example: tokens 30 000 → 84 000 and requests
    10 → 28 over 2 s → (9.0, 27 000.0)."""
    latest = history.scrapes[-1]
    requests = tokens = 0.0
    measured = False
    for url, new in latest.gateways.items():
        if new is None or new.arrivals is None or new.arrival_tokens is None:
            continue
        counted: list[tuple[Scrape, GatewayReading, float, float]] = []
        for scrape in history.scrapes[:-1]:
            old = scrape.gateways.get(url)
            if old is not None and old.arrivals is not None and old.arrival_tokens is not None:
                counted.append((scrape, old, old.arrivals, old.arrival_tokens))
        if not counted:
            continue
        # The newest scrape at least `window_s` back (else the oldest): a window of one round, as when
        # rounds drift a little late, would double the noise of the count.
        scrape, old, arrivals, arrival_tokens = next(
            (c for c in reversed(counted) if c[0].t <= latest.t - window_s), counted[0]
        )
        dt = _elapsed((scrape, old), (latest, new))
        if dt <= 0:
            continue
        restarted = new.arrivals < arrivals or new.arrival_tokens < arrival_tokens
        requests += (new.arrivals - (0.0 if restarted else arrivals)) / dt
        tokens += (new.arrival_tokens - (0.0 if restarted else arrival_tokens)) / dt
        measured = True
    return (requests, tokens) if measured else None


def learned_prefill_rate(scrape: Scrape) -> float | None:
    """The gateway's observed prefill throughput (tokens/s) for the pool's engines in `scrape`: the
    highest over the engines any gateway replica has observed (each engine's averaged over the
    replicas); None when none has. Each is a lower bound of what an engine can do (overhead included,
    one request after another), and the engines of a pool are alike: the highest bound is the closest
    (a new engine's first few slow answers pulled a mean to half the pool's rate). Example: engine a
    9 000 and 11 000 on two replicas, engine b 12 000 → 12 000."""
    per_engine: dict[str, list[float]] = {}
    for gateway in scrape.gateways.values():
        if gateway is None:
            continue
        for url in scrape.readings:
            rate = gateway.prefill_rates.get(urlsplit(url).netloc)
            if rate is not None and rate > 0:
                per_engine.setdefault(url, []).append(rate)
    if not per_engine:
        return None
    return max(sum(rates) / len(rates) for rates in per_engine.values())


def _running_seconds(reading: EngineReading) -> tuple[float, float] | None:
    if reading.e2e_sum is None or reading.finished is None:
        return None
    return reading.e2e_sum - (reading.queue_sum or 0.0), reading.finished


def service_time(history: PoolHistory) -> float | None:
    """Mean seconds a finished request ran in the pool's engines (module docstring): over the kept
    scrapes, else over the engines' lifetimes; None when no engine reports the histograms or none
    finished a request. A count that went down (a restarted engine) counts from 0."""
    latest = history.scrapes[-1]
    window_s = window_n = lifetime_s = lifetime_n = 0.0
    for url, new in latest.readings.items():
        now = _running_seconds(new) if new is not None else None
        if now is None:
            continue
        lifetime_s, lifetime_n = lifetime_s + now[0], lifetime_n + now[1]
        olds = (_running_seconds(r) for s in history.scrapes[:-1] if (r := s.readings.get(url)) is not None)
        old = next((o for o in olds if o is not None), None)
        start = (0.0, 0.0) if old is None or old[1] > now[1] else old
        window_s, window_n = window_s + now[0] - start[0], window_n + now[1] - start[1]
    seconds, finished = (window_s, window_n) if window_n > 0 else (lifetime_s, lifetime_n)
    return max(0.0, seconds / finished) if finished > 0 else None


def _mean_between(gauge: list[tuple[float, float]], *, start: float, end: float) -> float:
    """A gauge's (time, value) samples, linear between them, averaged over [start, end] clipped to
    them (the value at `end` when nothing is left). Example: 2 at t = 0, 4 at t = 1, over [0, 0.5] → 2.5."""

    def at(t: float) -> float:
        for (t0, v0), (t1, v1) in itertools.pairwise(gauge):
            if t0 <= t <= t1:
                return v0 + (v1 - v0) * (t - t0) / (t1 - t0) if t1 > t0 else v1
        return gauge[-1][1] if t >= gauge[-1][0] else gauge[0][1]

    start, end = max(start, gauge[0][0]), min(end, gauge[-1][0])
    if end <= start:
        return at(end)
    cuts = [start, *(t for t, _ in gauge if start < t < end), end]
    area = sum((at(a) + at(b)) / 2 * (b - a) for a, b in itertools.pairwise(cuts))
    return area / (end - start)


@dataclass(frozen=True, slots=True)
class _Interval:
    """One engine between the last two scrapes: the service counters' growth and the gauge's ends."""

    seconds: float
    reported_s: float
    finished: float
    running_start: float
    running_end: float


def _interval(history: PoolHistory, url: str) -> _Interval | None:
    prev, latest = history.scrapes[-2], history.scrapes[-1]
    old, new = prev.readings.get(url), latest.readings.get(url)
    if old is None or new is None or old.running is None or new.running is None:
        return None
    before, after = _running_seconds(old), _running_seconds(new)
    seconds = _elapsed((prev, old), (latest, new))
    if before is None or after is None or after[1] < before[1] or seconds <= 0:
        return None  # not reported, or a restarted engine
    return _Interval(seconds, after[0] - before[0], after[1] - before[1], old.running, new.running)


def learn_service(history: PoolHistory) -> PoolHistory:
    """`history` with what its last two scrapes teach of the decode service time (module docstring);
    call once per scrape. Per engine that finished requests between them: their mean reported time and
    the running count they saw, the gauge averaged over that time (on the scraper's clock, by the clock
    ratio learned so far) before the middle of the interval they finished in; and the round's clock
    sample over the engines in both scrapes."""
    if len(history.scrapes) < 2:
        return history
    latest = history.scrapes[-1]
    ratio = clock_ratio(history.service.clock) or 1.0
    middle = (history.scrapes[-2].t + latest.t) / 2
    points: list[ServicePoint] = []
    total = ClockSample(latest.t, 0.0, 0.0, 0.0)
    for url in latest.readings:
        step = _interval(history, url)
        if step is None:
            continue
        total = ClockSample(
            latest.t,
            total.running_s + (step.running_start + step.running_end) / 2 * step.seconds,
            total.reported_s + step.reported_s,
            total.finished + step.finished,
            total.running_start + step.running_start,
            total.running_end + step.running_end,
        )
        if step.finished > 0 and step.reported_s > 0:
            took = step.reported_s / step.finished
            gauge = [
                (s.t, r.running)
                for s in history.scrapes
                if (r := s.readings.get(url)) is not None and r.running is not None
            ]
            saw = _mean_between(gauge, start=middle - took * ratio, end=middle)
            points.append(ServicePoint(saw, took, step.finished))
    clock = total if total.running_s > 0 or total.finished > 0 else None
    memory = remember_service(history.service, points=points, clock=clock, now=latest.t)
    return replace(history, service=memory)


def decode_observation(history: PoolHistory) -> tuple[DecodeObservation, str | None]:
    """The decode pool now (module docstring); the second value says why it is invalid, if it is."""
    latest = history.scrapes[-1]
    queued = gateway_queued(latest)
    problem = _problem(latest, ("kv_usage", "running") if queued > 0 else ("kv_usage",))
    if problem is not None:
        return DecodeObservation(timestamp=latest.t, ready=len(latest.readings), valid=False), problem
    readings = [r for r in latest.readings.values() if r is not None]
    util = sum(r.kv_usage or 0.0 for r in readings) / len(readings) if readings else 0.0
    arrivals = arrival_rates(history, window_s=LEADING_WINDOW_S)
    ratio = clock_ratio(history.service.clock)
    scale = ratio if ratio is not None else 1.0  # engine seconds → the arrivals' seconds
    service = service_time(history)
    curve = fit_service(history.service.bins)
    observation = DecodeObservation(
        timestamp=latest.t,
        ready=len(readings),
        mean_kv_utilization=util,
        running_requests=sum(r.running or 0.0 for r in readings),
        gateway_queued=queued,
        gateway_held=gateway_held(latest),
        on_the_way=on_the_way(latest),
        arrivals_per_s=arrivals[0] if arrivals is not None else None,
        service_s=service * scale if service is not None else None,
        service_curve=curve.scaled(scale) if curve is not None else None,
        clock_ratio=ratio,
    )
    return observation, None


def _earliest(history: PoolHistory, url: str, *, since: float) -> tuple[float, EngineReading] | None:
    for scrape in history.scrapes[:-1]:
        reading = scrape.readings.get(url)
        if scrape.t >= since and reading is not None:
            return scrape.t, reading
    return None


def _window_deltas(history: PoolHistory, *, window_s: float) -> list[Histogram]:
    """Per engine: the TTFT histogram delta over the window."""
    latest = history.scrapes[-1]
    deltas: list[Histogram] = []
    for url, new in latest.readings.items():
        found = _earliest(history, url, since=latest.t - window_s)
        if new is None or found is None:
            continue
        _, old = found
        if new.ttft is not None and old.ttft is not None:
            deltas.append(histogram_delta(new.ttft, old.ttft))
    return deltas


def _busy_rate(history: PoolHistory, url: str, *, min_span_s: float) -> float | None:
    """Δ prompt tokens / Δt of one engine over its latest run of scrapes that all showed requests
    waiting (busy the whole time, so the rate is its capacity), if that run spans `min_span_s`."""
    latest = history.scrapes[-1].readings.get(url)
    if latest is None or not (latest.waiting or 0) > 0 or latest.prompt_tokens is None:
        return None
    end, start = history.scrapes[-1], None
    for scrape in reversed(history.scrapes[:-1]):
        reading = scrape.readings.get(url)
        if reading is None or not (reading.waiting or 0) > 0 or reading.prompt_tokens is None:
            break
        start = (scrape, reading)
    if start is None or end.t - start[0].t < min_span_s - 1e-9:
        return None
    gained = latest.prompt_tokens - (start[1].prompt_tokens or 0.0)
    elapsed = _elapsed(start, (end, latest))
    return gained / elapsed if gained >= 0 and elapsed > 0 else None


def _backlog_tokens(readings: list[EngineReading], *, queued: float) -> int:
    tokens = sum(r.prompt_tokens or 0.0 for r in readings)
    requests = sum(r.ttft.count if r.ttft is not None else 0.0 for r in readings)
    waiting = sum(r.waiting or 0.0 for r in readings) + queued
    return round(waiting * tokens / requests) if requests > 0 else 0


def _engine_velocity(history: PoolHistory, *, window_s: float, backlog: int) -> float | None:
    """Prompt tokens/s arriving as the engines see them: served (Δ prompt tokens) plus the backlog's
    growth, over the oldest scrape inside `window_s`; None without two scrapes of the same engines."""
    latest = history.scrapes[-1]
    for scrape in history.scrapes[:-1]:
        dt = latest.t - scrape.t
        if scrape.t < latest.t - window_s - 1e-9 or dt <= 0 or set(scrape.readings) != set(latest.readings):
            continue
        olds = [scrape.readings[url] for url in latest.readings]
        news = [latest.readings[url] for url in latest.readings]
        if any(r is None or r.prompt_tokens is None for r in (*olds, *news)):
            return None
        served = sum(
            max(0.0, (n.prompt_tokens or 0.0) - (o.prompt_tokens or 0.0))
            for o, n in zip(olds, news, strict=True)
            if o is not None and n is not None
        )
        before = _backlog_tokens([o for o in olds if o is not None], queued=gateway_waiting(scrape))
        return max(0.0, (served + backlog - before) / dt)
    return None


def prefill_observation(
    history: PoolHistory, *, ttft_window_s: float, rate_memory_s: float
) -> tuple[PrefillObservation, PoolHistory, str | None]:
    """The prefill pool now (module docstring), the history with the newly measured rates, and why the
    observation is invalid, if it is."""
    latest = history.scrapes[-1]
    problem = _problem(latest, ("waiting", "prompt_tokens", "ttft"))
    if problem is None:
        try:
            deltas = _window_deltas(history, window_s=ttft_window_s)
            pooled = histogram_sum(deltas)
        except ValueError as exc:
            problem = str(exc)
    if problem is not None:
        invalid = PrefillObservation(timestamp=latest.t, ready=len(latest.readings), valid=False)
        return invalid, history, problem
    measured = [
        r
        for r in (_busy_rate(history, url, min_span_s=BUSY_SPAN_S) for url in latest.readings)
        if r is not None
    ]
    rates = (*history.rates, Sample(latest.t, max(measured))) if measured else history.rates
    rates = within(rates, now=latest.t, window_s=rate_memory_s)
    readings = [r for r in latest.readings.values() if r is not None]
    queued = gateway_queued(latest)
    backlog = _backlog_tokens(readings, queued=gateway_waiting(latest))
    arrivals = arrival_rates(history, window_s=LEADING_WINDOW_S)
    velocity = (
        arrivals[1]
        if arrivals is not None
        else _engine_velocity(history, window_s=LEADING_WINDOW_S, backlog=backlog)
    )
    observation = PrefillObservation(
        timestamp=latest.t,
        ready=len(readings),
        ttft_p90_s=histogram_quantile(TTFT_QUANTILE, pooled) if pooled is not None else None,
        queued_prefill_tokens=backlog,
        prefill_tokens_per_s=peak(rates) or None,
        learned_tokens_per_s=learned_prefill_rate(latest),
        arrival_tokens_per_s=velocity,
        gateway_queued=queued,
    )
    return observation, replace(history, rates=rates), None
