"""`tandem router`'s access flags: the API key file and its errors, `--log-prompts`, the body limit.

Real: config and key files on disk, click's in-process runner (the failing cases end before a server
starts), `settings_from_flags`. Nothing is faked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner
from tests.router.harness import router_config

from tandem.cli.main import cli
from tandem.cli.routerflags import FLAGS, settings_from_flags


def config_file(tmp_path: Path, **router: Any) -> Path:
    document = router_config(decode=["http://127.0.0.1:8101"], spec={"router": router}).model_dump(
        by_alias=True, mode="json", exclude_none=True
    )
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["router", *args])
    return result.exit_code, result.stderr


def test_a_missing_api_key_file_exits_2_naming_it(tmp_path: Path) -> None:
    code, err = run("--config", str(config_file(tmp_path)), "--api-keys-file", str(tmp_path / "nope.yaml"))
    assert code == 2
    assert (
        err == f"tandem: error: API keys: cannot read {tmp_path / 'nope.yaml'}: No such file or directory\n"
    )


def test_an_invalid_api_key_file_exits_2_without_quoting_keys(tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text("sk-secret-value: ''\n")
    code, err = run("--config", str(config_file(tmp_path)), "--api-keys-file", str(keys))
    assert code == 2
    assert err.startswith(f"tandem: error: API keys: {keys}: entry 1: the tenant must be")
    assert "sk-secret-value" not in err


def test_auth_enabled_in_the_spec_without_a_key_file_exits_2(tmp_path: Path) -> None:
    path = config_file(
        tmp_path, auth={"enabled": True, "apiKeysSecret": {"name": "keys", "key": "keys.yaml"}}
    )
    code, err = run("--config", str(path))
    assert code == 2
    assert err == (
        f"tandem: error: {path}: spec.router.auth.enabled is true but no API key file is configured "
        "(apiKeysFile in the config, or --api-keys-file)\n"
    )


def test_access_flags_reach_the_settings() -> None:
    values: dict[str, object] = {flag.dest: flag.default for flag in FLAGS}
    defaults = settings_from_flags(values).access
    assert (defaults.log_prompts, defaults.max_request_bytes) == (False, 4 * 1024 * 1024)
    values.update(log_prompts=True, max_request_bytes=4096, api_keys_reload_interval=0.5)
    access = settings_from_flags(values).access
    assert (access.log_prompts, access.max_request_bytes, access.api_keys_reload_seconds) == (True, 4096, 0.5)
