"""Where each declared adapter is loaded before its first request, when the pool can hold them all.

An adapter's first request on an engine waits for a disk read (about 70 ms for a rank-8 adapter in
the simulator's time model; a network volume takes longer), and so does every request in that
engine's step. With hundreds of adapters, each one's first request pays it: on docs/benchmarks.md
§8's workload that is 19% of the requests even when every engine's CPU tier could hold every
adapter. When the engines' CPU tiers (`maxCpuLoras`) have room for all the declared adapters, the
gateway loads each of them onto one engine of each pool (prefill and decode: a disaggregated request
runs on both; `warm_plan` plans one pool) ahead of its requests (`AdapterWarmer` in
`tandem.router.upstream.adaptercopy`), and the placement then finds it held there.

The plan (pure):

    room  = maxCpuLoras − maxLoras per engine       (the rest stays free for hot adapters' copies
                                                      and loads placed by requests)
    plan  = {} when the declared adapters outnumber room × engines (they do not all fit: they load
            on first use, as without warming)
          = else each adapter held nowhere goes to the first engine of its rendezvous order
            (`scorers.home_ranks`) with fewer than `room` declared adapters held or planned

So every gateway replica and worker plans the same homes, an engine joining or leaving moves only
the adapters it ranks first, and an adapter already held (by this gateway's record) is not loaded
again. Example, room 2, engines a and b, adapters x, y and z, x held on b: y and z each go to the
first engine of their order holding fewer than 2, so b takes at most one of them.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from tandem.router.scheduling.scorers import home_ranks


def warm_room(*, max_cpu_loras: int, max_loras: int) -> int:
    """Declared adapters an engine is given ahead of their requests: its CPU tier less its GPU
    slots (module docstring); 0 (no warming) at vLLM's default, `maxCpuLoras` = `maxLoras`.

    >>> warm_room(max_cpu_loras=64, max_loras=4), warm_room(max_cpu_loras=4, max_loras=4)
    (60, 0)"""
    return max(0, max_cpu_loras - max_loras)


def warm_plan(
    names: Sequence[str], urls: Sequence[str], held: Mapping[str, Collection[str]], *, room: int
) -> dict[str, list[str]]:
    """Engine URL → the declared adapters to load there, in `names`' order (module docstring);
    `held`: what each engine holds now. Empty when nothing needs loading or `names` do not fit.

    >>> plan = warm_plan(["x", "y", "z"], ["a", "b"], {"b": ["x"]}, room=2)
    >>> sorted(n for adapters in plan.values() for n in adapters), sum(map(len, plan.values()))
    (['y', 'z'], 2)
    >>> warm_plan(["x", "y", "z"], ["a"], {}, room=2)
    {}"""
    if room < 1 or not urls or len(names) > room * len(urls):
        return {}
    declared = set(names)
    where: dict[str, str] = {}
    for url in urls:
        for name in held.get(url, ()):
            if name in declared:
                where.setdefault(name, url)
    used = dict.fromkeys(urls, 0)
    for url in where.values():
        used[url] += 1
    plan: dict[str, list[str]] = {}
    for name in names:
        if name in where:
            continue
        ranks = home_ranks(name, urls)
        for url in sorted(urls, key=ranks.__getitem__):
            if used[url] < room:
                used[url] += 1
                plan.setdefault(url, []).append(name)
                break
    return plan
