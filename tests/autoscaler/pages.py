"""What the autoscaler's table tests share: a histogram builder and a gateway `/metrics` page in the
exposition format Tandem's gateway serves."""

from __future__ import annotations

import math

from tandem.autoscaler.readings import Histogram

INF = math.inf


def hist(*counts: float, bounds: tuple[float, ...] = (0.1, 0.5, 1.0, INF)) -> Histogram:
    return Histogram(tuple(zip(bounds, counts, strict=True)))


ROUTER_PAGE = """\
# HELP tandem_router_queue_depth Requests waiting in the router's queue.
# TYPE tandem_router_queue_depth gauge
tandem_router_queue_depth{priority="0"} 3.0
tandem_router_queue_depth{priority="1"} 4.0
# HELP tandem_router_admitted_requests Requests holding decode capacity now.
# TYPE tandem_router_admitted_requests gauge
tandem_router_admitted_requests 16.0
"""
