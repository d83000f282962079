"""vLLM 0.32's LoRA surface on the simulator's HTTP API: `--lora-modules`, the runtime routes, the
filesystem resolver, `/v1/models`, generation under an adapter and the LoRA metrics.

Real: apps from `create_app` served by uvicorn on 127.0.0.1, called with httpx; adapter directories
with a PEFT `adapter_config.json` written to pytest's tmp_path. The LoRA environment variables are
passed to `create_app` as `environ` (nothing is patched). Nothing is faked; no timing is asserted.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tests.servers import run_uvicorn

from tandem.sim.app import create_app
from tandem.sim.settings import SimSettings

RUNTIME = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true"}


def write_adapter(root: Path, name: str, *, rank: int = 8, base: str = "tiny") -> Path:
    path = root / name
    path.mkdir(parents=True)
    config = {"r": rank, "lora_alpha": 16, "target_modules": ["q_proj"], "peft_type": "LORA"}
    (path / "adapter_config.json").write_text(json.dumps(config | {"base_model_name_or_path": base}))
    return path


def settings(**fields: object) -> SimSettings:
    return SimSettings.model_validate(
        {"profile": "tiny-cpu", "served_model_name": "qwen", "time_scale": 1000, "enable_lora": True} | fields
    )


@pytest.fixture
def adapters(tmp_path: Path) -> Path:
    write_adapter(tmp_path, "sql")
    write_adapter(tmp_path, "chat")
    write_adapter(tmp_path, "wide", rank=64)
    write_adapter(tmp_path, "other-base", base="someone-else")
    return tmp_path


@pytest.fixture
def http(adapters: Path) -> Iterator[httpx.Client]:
    env = RUNTIME | {
        "VLLM_LORA_RESOLVER_CACHE_DIR": str(adapters),
        "VLLM_PLUGINS": "lora_filesystem_resolver",
    }
    app = create_app(settings(max_loras=2, lora_modules=[f"sql={adapters / 'sql'}"]), environ=env)
    with run_uvicorn(app) as url, httpx.Client(base_url=url) as client:
        yield client


def complete(http: httpx.Client, model: str, prompt: str = "Tell me about adapters") -> httpx.Response:
    body = {"model": model, "prompt": prompt, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    return http.post("/v1/completions", json=body)


def test_models_lists_static_adapters_with_root_and_parent(http: httpx.Client, adapters: Path) -> None:
    data = http.get("/v1/models").json()["data"]
    assert [card["id"] for card in data] == ["qwen", "sql"]
    assert (data[1]["root"], data[1]["parent"], data[0]["parent"]) == (str(adapters / "sql"), "qwen", None)


def test_an_adapter_writes_its_own_text_every_time(http: httpx.Client) -> None:
    base, sql = complete(http, "qwen").json(), complete(http, "sql").json()
    assert sql["model"] == "sql"
    assert sql["choices"][0]["text"] != base["choices"][0]["text"]
    assert complete(http, "sql").json()["choices"][0]["text"] == sql["choices"][0]["text"]


def test_runtime_load_and_unload_answer_as_vllm(http: httpx.Client, adapters: Path) -> None:
    path = str(adapters / "chat")
    loaded = http.post("/v1/load_lora_adapter", json={"lora_name": "chat", "lora_path": path})
    assert (loaded.status_code, loaded.text) == (200, "Success: LoRA adapter 'chat' added successfully.")
    again = http.post("/v1/load_lora_adapter", json={"lora_name": "chat", "lora_path": path})
    assert again.status_code == 400
    assert again.json()["error"]["message"] == (
        "The lora adapter 'chat' has already been loaded. If you want to load the adapter in place, "
        "set 'load_inplace' to True."
    )
    inplace = {"lora_name": "chat", "lora_path": path, "load_inplace": True}
    assert http.post("/v1/load_lora_adapter", json=inplace).status_code == 200
    assert complete(http, "chat").status_code == 200
    gone = http.post("/v1/unload_lora_adapter", json={"lora_name": "chat"})
    assert (gone.status_code, gone.text) == (200, "Success: LoRA adapter 'chat' removed successfully.")
    missing = http.post("/v1/unload_lora_adapter", json={"lora_name": "chat"})
    assert missing.status_code == 404
    assert missing.json()["error"] == {
        "message": "The lora adapter 'chat' cannot be found.",
        "type": "NotFoundError",
        "param": None,
        "code": 404,
    }


@pytest.mark.parametrize(
    ("name", "path", "status", "message"),
    [
        ("x", "/nowhere/x", 404, "Loading lora x failed: No adapter found for /nowhere/x"),
        ("qwen", "/nowhere", 400, "The lora adapter 'qwen' conflicts with a served base model."),
        ("", "/p", 400, "Both 'lora_name' and 'lora_path' must be provided."),
    ],
)
def test_bad_loads_get_vllms_errors(
    http: httpx.Client, name: str, path: str, status: int, message: str
) -> None:
    reply = http.post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path})
    assert (reply.status_code, reply.json()["error"]["message"]) == (status, message)


def test_a_rank_above_max_lora_rank_is_refused(http: httpx.Client, adapters: Path) -> None:
    reply = http.post("/v1/load_lora_adapter", json={"lora_name": "w", "lora_path": str(adapters / "wide")})
    assert reply.status_code == 500
    assert reply.json()["error"]["message"] == (
        "Call to add_lora method failed: LoRA rank 64 is greater than max_lora_rank 16."
    )


def test_the_filesystem_resolver_loads_an_unknown_model_on_first_use(http: httpx.Client) -> None:
    assert complete(http, "chat").json()["model"] == "chat"
    assert "chat" in [card["id"] for card in http.get("/v1/models").json()["data"]]
    wrong_base = complete(http, "other-base")
    assert wrong_base.status_code == 404
    assert wrong_base.json()["error"]["message"] == "The model `other-base` does not exist."
    too_wide = complete(http, "wide")
    assert (too_wide.status_code, too_wide.json()["error"]["message"]) == (
        400,
        "LoRA adapter 'wide' was found but could not be loaded.",
    )
    assert complete(http, "../sql").status_code == 404


def disk_reads(http: httpx.Client) -> float:
    lines = [
        line for line in http.get("/metrics").text.splitlines() if line.startswith("tandem_sim_lora_loads")
    ]
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in lines if 'source="disk"' in line and "_total" in line
    )


def test_a_runtime_load_answers_after_the_engine_read_the_adapter(http: httpx.Client, adapters: Path) -> None:
    """vLLM answers `/v1/load_lora_adapter` once `add_lora` has run in its engine core: on an idle
    engine the read runs at once, in a step of its own, before the answer; so a request under the
    adapter right after reads nothing from disk. An in-place load reads it again, before its answer."""
    before = disk_reads(http)
    path = str(adapters / "chat")
    assert (
        http.post("/v1/load_lora_adapter", json={"lora_name": "chat", "lora_path": path}).status_code == 200
    )
    assert disk_reads(http) == before + 1
    assert complete(http, "chat").status_code == 200
    assert disk_reads(http) == before + 1
    inplace = {"lora_name": "chat", "lora_path": path, "load_inplace": True}
    assert http.post("/v1/load_lora_adapter", json=inplace).status_code == 200
    assert disk_reads(http) == before + 2


def test_lora_metrics_follow_vllm_0_32(http: httpx.Client) -> None:
    complete(http, "sql")
    text = http.get("/metrics").text
    info = [line for line in text.splitlines() if line.startswith("vllm:lora_requests_info{")]
    assert info, text
    assert all(
        line.startswith('vllm:lora_requests_info{max_lora="2",running_lora_adapters="') for line in info
    )
    # prometheus_client (vLLM's too) writes labels sorted; in 0.32 both lists name every adapter with
    # a waiting or running request
    assert any('running_lora_adapters="sql",waiting_lora_adapters="sql"}' in line for line in info)
    assert float(info[-1].rsplit(" ", 1)[1]) > 1e9  # a wall-clock timestamp
    loads = [line for line in text.splitlines() if line.startswith("tandem_sim_lora_loads_total{")]
    assert any('source="cpu"' in line and not line.endswith(" 0.0") for line in loads)


def test_without_the_environment_the_runtime_routes_do_not_exist(adapters: Path) -> None:
    with run_uvicorn(create_app(settings(), environ={})) as url, httpx.Client(base_url=url) as http:
        body = {"lora_name": "sql", "lora_path": str(adapters / "sql")}
        assert http.post("/v1/load_lora_adapter", json=body).status_code == 404
        assert complete(http, "sql").status_code == 404  # no resolver either


def test_without_enable_lora_there_is_no_lora_metric_and_loads_fail(adapters: Path) -> None:
    app = create_app(settings(enable_lora=False), environ=RUNTIME)
    with run_uvicorn(app) as url, httpx.Client(base_url=url) as http:
        assert "vllm:lora_requests_info" not in http.get("/metrics").text
        reply = http.post(
            "/v1/load_lora_adapter", json={"lora_name": "sql", "lora_path": str(adapters / "sql")}
        )
        assert reply.status_code == 500
        assert "LoRA is not enabled. Use --enable-lora to enable LoRA." in reply.json()["error"]["message"]


def test_a_static_adapter_that_does_not_load_stops_start_up(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="No adapter found for"):
        create_app(settings(lora_modules=[f"x={tmp_path / 'missing'}"]), environ={})


def test_lora_modules_accept_both_of_vllms_forms() -> None:
    spec = json.dumps({"name": "b", "path": "/b", "base_model_name": "qwen"})
    parsed = settings(lora_modules=["a=/a", spec]).lora_modules
    assert [(m.name, m.path, m.base_model_name) for m in parsed] == [("a", "/a", None), ("b", "/b", "qwen")]
    with pytest.raises(ValueError, match="Invalid JSON format for --lora-modules"):
        settings(lora_modules=["{oops"])
    with pytest.raises(ValueError, match=r"max_cpu_loras \(1\) must be >= max_loras \(2\)"):
        settings(max_loras=2, max_cpu_loras=1)
