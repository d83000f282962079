"""Where engines publish KV events and where the gateway connects (`tandem.core.kvevents`). Pure."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from tandem.core.kvevents import (
    KVEventsAddresses,
    cluster_addresses,
    cluster_binds,
    ipc_folder,
    local_addresses,
    sim_kv_events_args,
    vllm_kv_events_config,
)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://10.0.0.5:8000", ("tcp://10.0.0.5:5557", "tcp://10.0.0.5:5558")),
        ("http://engine-0.pool:8000/", ("tcp://engine-0.pool:5557", "tcp://engine-0.pool:5558")),
    ],
)
def test_in_a_cluster_the_gateway_connects_to_each_pods_fixed_ports(
    url: str, expected: tuple[str, str]
) -> None:
    assert cluster_addresses().for_engine(url) == expected
    assert cluster_binds() == ("tcp://*:5557", "tcp://*:5558")


def test_on_one_machine_each_engine_gets_sockets_named_after_its_http_port() -> None:
    addresses = local_addresses(Path("/run/demo"))
    assert addresses.for_engine("http://127.0.0.1:8101") == (
        "ipc:///run/demo/kv-events/8101.pub",
        "ipc:///run/demo/kv-events/8101.replay",
    )
    assert ipc_folder(addresses) == Path("/run/demo/kv-events")
    assert ipc_folder(cluster_addresses()) is None


def test_a_state_directory_too_long_for_a_socket_name_gets_a_stable_short_folder() -> None:
    deep = Path("/" + "/".join(["a-rather-long-directory-name"] * 5))
    first, again = local_addresses(deep), local_addresses(deep)
    events, _ = first.for_engine("http://127.0.0.1:65535")
    assert first == again and len(events.removeprefix("ipc://")) < 100
    assert "a-rather-long" not in events


def test_engines_get_vllms_config_and_the_simulators_flags() -> None:
    assert vllm_kv_events_config(endpoint="tcp://*:5557", replay=None) == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://*:5557",
        "topic": "",
    }
    assert sim_kv_events_args(endpoint="ipc:///x/1.pub", replay="ipc:///x/1.replay") == [
        "--kv-events-endpoint", "ipc:///x/1.pub", "--kv-events-replay-endpoint", "ipc:///x/1.replay",
    ]  # fmt: skip


def test_an_address_that_is_not_zmq_is_refused() -> None:
    with pytest.raises(ValidationError, match="events"):
        KVEventsAddresses(events="http://{host}:5557")
