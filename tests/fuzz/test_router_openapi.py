"""Fuzzing the gateway from its own OpenAPI document: no generated request gets a 5xx.

Real: a simulated engine (`tandem.sim`, a 128-token context, time scale 10^5 so generations are instant)
and the router in front of it, each a uvicorn server on 127.0.0.1; schemathesis reads the router's
`/openapi.json` and generates request bodies for every operation, both ones that fit the schema
(positive: they reach the engine) and ones that break it (negative: wrong types, missing fields,
junk). Every answer must be below 500; error answers must be OpenAI's `{"error": {...}}` object.
A bounded number of examples per operation keeps the run under a minute; the seed is fixed, so a
failure reproduces (`TANDEM_FUZZ_EXAMPLES` raises the count for a longer run).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import httpx
import hypothesis
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.core.result import Ok
from schemathesis.generation import GenerationMode
from schemathesis.generation.case import Case
from tests.servers import run_uvicorn

from tandem.core.routerconfig import RouterConfig
from tandem.router.app import create_app as router_app
from tandem.router.settings import AccessSettings, CollectorSettings, RouterSettings
from tandem.sim.app import create_app as sim_app
from tandem.sim.settings import SimSettings

MODEL = "qwen"
MODEL_NAME = "Qwen/Qwen2.5-7B-Instruct"
EXAMPLES = int(os.environ.get("TANDEM_FUZZ_EXAMPLES", "30"))


@pytest.fixture(scope="module")
def router_url() -> Iterator[str]:
    sim = SimSettings(model=MODEL_NAME, served_model_name=MODEL, max_model_len=128, time_scale=100_000)
    with run_uvicorn(sim_app(sim)) as engine:
        config = RouterConfig.model_validate(
            {
                "service": "fuzz",
                "spec": {
                    "model": {"name": MODEL_NAME, "servedName": MODEL},
                    "engine": {"kind": "sim"},
                    "disaggregation": {"mode": "off"},
                },
                "discovery": {"kind": "static", "decode": [engine]},
            }
        )
        router_settings = RouterSettings(
            collector=CollectorSettings(enabled=False),
            access=AccessSettings(max_request_bytes=256 * 1024),
        )
        with run_uvicorn(router_app(config, settings=router_settings)) as url:
            yield url


def check(case: Case[Any], url: str, session: requests.Session) -> int:
    """Send `case`; fails on a 5xx or an error answer not in OpenAI's shape. Returns the status."""
    response = case.call(base_url=url, session=session, timeout=30)
    assert response.status_code < 500, (
        f"{case.method} {case.path} -> {response.status_code}\nbody sent: {json.dumps(case.body)[:2000]}\n"
        f"answer: {response.text[:2000]}"
    )
    if response.status_code >= 400:
        error = response.json()["error"]
        assert isinstance(error["message"], str) and isinstance(error["type"], str)
    return response.status_code


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_generated_request_gets_a_server_error(router_url: str, mode: GenerationMode) -> None:
    schema = schemathesis.openapi.from_url(f"{router_url}/openapi.json")
    session = requests.Session()
    labels = []
    statuses: list[int] = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), f"the router's OpenAPI document is invalid: {result}"
        operation = result.ok()
        if operation.method.upper() != "POST" and mode is GenerationMode.NEGATIVE:
            continue  # a GET without parameters has nothing to break
        labels.append(operation.label)

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
            phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
        )
        @given(case=operation.as_strategy(generation_mode=mode))
        def fuzz(case: Case[Any]) -> None:
            statuses.append(check(case, router_url, session))

        fuzz()
    assert {"POST /v1/completions", "POST /v1/chat/completions"} <= set(labels)
    # The fuzzer got past validation to the engine (positive) and was turned away (negative).
    assert (200 in statuses) if mode is GenerationMode.POSITIVE else (400 in statuses)


@pytest.fixture(scope="module")
def http(router_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=router_url, trust_env=False, verify=False, timeout=30) as client:
        yield client


@given(body=st.binary(max_size=512))
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None)
def test_arbitrary_bytes_are_a_4xx_not_a_crash(http: httpx.Client, body: bytes) -> None:
    for path in ("/v1/completions", "/v1/chat/completions"):
        response = http.post(path, content=body, headers={"content-type": "application/json"})
        assert 400 <= response.status_code < 500, (body, response.text)
        assert "error" in response.json()
