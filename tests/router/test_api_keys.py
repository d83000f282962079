"""API keys as data: parsing the key file, constant-time look-up, reading the key from headers, and
reloading the file when it changes (as a Kubernetes Secret volume does: a symlink swapped).

Real: `parse_key_table`, `KeyTable`, `KeyAuth`, `KeyFile` on files in a temporary directory. Nothing
is faked; reloads are triggered with `KeyFile.check()` instead of waiting for the watcher's timer.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from pathlib import Path

import pytest

from tandem.router.errors import Unauthenticated
from tandem.router.identity.auth.gate import KeyAuth, presented_key
from tandem.router.identity.auth.keyfile import KeyFile
from tandem.router.identity.auth.keys import KeyTable, KeyTableError, parse_key_table

SECRET_A = "sk-team-a-4f9c2e7d1b8a6035"
SECRET_B = "sk-team-b-0d1e2f3a4b5c6d7e"


def sha256(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def test_keys_map_to_tenants_whether_stored_plain_or_as_sha256() -> None:
    table = parse_key_table(f"# key: tenant\n{SECRET_A}: team-a\n{sha256(SECRET_B)}: team-b\n")
    assert table.tenant_for(SECRET_A) == "team-a"
    assert table.tenant_for(SECRET_B) == "team-b"
    assert table.tenant_for(sha256(SECRET_B)) is None  # the hash itself is not a key
    assert table.tenant_for(SECRET_A[:-1]) is None
    assert table.tenant_for(SECRET_A + "x") is None
    assert table.tenants == {"team-a", "team-b"}


def test_the_table_keeps_digests_only_never_the_keys() -> None:
    table = parse_key_table(f"{SECRET_A}: team-a\n")
    assert SECRET_A.encode() not in repr(table).encode()
    assert all(len(stored) == 32 for stored, _ in table.entries)


def test_every_entry_is_compared_even_after_a_match(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bytes] = []

    def counting(a: bytes, b: bytes) -> bool:
        calls.append(b)
        return a == b

    monkeypatch.setattr(hmac, "compare_digest", counting)
    table = parse_key_table("\n".join(f"sk-key-{i:04d}: t{i}" for i in range(50)))
    assert table.tenant_for("sk-key-0000") == "t0"
    assert len(calls) == 50


def test_an_empty_file_is_an_empty_table() -> None:
    assert len(parse_key_table("")) == 0
    assert parse_key_table("# no keys yet\n").tenant_for("anything") is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- just\n- a list\n", "expected a mapping of key: tenant, got list"),
        ("a: b\nc: [unclosed\n", "not valid YAML (line 3)"),
        ("12345: team\n", "entry 1: a key must be a string of printable ASCII without spaces"),
        ("sk-x: ''\n", "entry 1: the tenant must be a non-empty string"),
        ("sk-x: 7\n", "entry 1: the tenant must be a non-empty string"),
        ("sk-x: a\nsha256:abc: b\n", "entry 2: a sha256: key needs 64 hexadecimal digits"),
        (f"{SECRET_A}: a\n{sha256(SECRET_A)}: b\n", "entry 2: the same key is listed twice"),
    ],
)
def test_an_invalid_file_is_refused_with_a_reason_that_never_quotes_a_key(text: str, message: str) -> None:
    with pytest.raises(KeyTableError, match="^" + re.escape(message)) as caught:
        parse_key_table(text)
    assert SECRET_A not in str(caught.value) and "sk-x" not in str(caught.value)


@pytest.mark.parametrize(
    ("headers", "key"),
    [
        ({"authorization": f"Bearer {SECRET_A}"}, SECRET_A),
        ({"authorization": f"bearer   {SECRET_A} "}, SECRET_A),
        ({"x-api-key": SECRET_A}, SECRET_A),
        ({"authorization": f"Bearer {SECRET_A}", "x-api-key": "other"}, SECRET_A),
        ({"authorization": "Basic dXNlcjpwYXNz", "x-api-key": SECRET_A}, SECRET_A),
        ({"authorization": "Bearer "}, None),
        ({}, None),
    ],
)
def test_the_key_comes_from_a_bearer_token_or_x_api_key(headers: dict[str, str], key: str | None) -> None:
    assert presented_key(headers) == key


def test_key_auth_names_the_tenant_or_refuses_with_401_and_counts_why() -> None:
    reasons: list[str] = []
    auth = KeyAuth(lambda: parse_key_table(f"{SECRET_A}: team-a\n"), on_failure=reasons.append)
    assert auth.tenant({"authorization": f"Bearer {SECRET_A}", "x-tenant-id": "someone-else"}) == "team-a"
    for headers in ({}, {"authorization": "Bearer sk-wrong"}):
        with pytest.raises(Unauthenticated) as caught:
            auth.tenant(headers)
        assert caught.value.status == 401 and "sk-wrong" not in caught.value.message
    assert reasons == ["missing", "invalid"]


def write_secret_volume(directory: Path, text: str, *, version: int) -> Path:
    """Lay out `text` the way the kubelet does for a Secret volume: `keys` → `..data/keys` and
    `..data` → a timestamped directory, swapped atomically on update."""
    target = directory / f"..2026_11_22_{version:02d}"
    target.mkdir()
    (target / "keys").write_text(text)
    link = directory / "..data_tmp"
    link.symlink_to(target.name)
    os.replace(link, directory / "..data")
    if not (directory / "keys").is_symlink():
        (directory / "keys").symlink_to("..data/keys")
    return directory / "keys"


def test_a_secret_update_in_place_is_picked_up_by_the_next_check(tmp_path: Path) -> None:
    path = write_secret_volume(tmp_path, f"{SECRET_A}: team-a\n", version=1)
    key_file = KeyFile(path)
    assert key_file.table.tenant_for(SECRET_A) == "team-a"
    assert key_file.check() is False  # nothing changed
    write_secret_volume(tmp_path, f"{SECRET_B}: team-b\n", version=2)
    assert key_file.check() is True
    assert key_file.table.tenant_for(SECRET_A) is None
    assert key_file.table.tenant_for(SECRET_B) == "team-b"
    assert key_file.reloads == {"ok": 1, "error": 0}


def test_a_bad_update_keeps_the_last_good_keys_until_a_good_one_arrives(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text(f"{SECRET_A}: team-a\n")
    key_file = KeyFile(path)
    path.write_text("- not a mapping\n")
    assert key_file.check() is False
    assert key_file.table.tenant_for(SECRET_A) == "team-a"
    path.unlink()
    assert key_file.check() is False
    path.write_text(f"{SECRET_A}: team-a2\n")
    assert key_file.check() is True
    assert key_file.table.tenant_for(SECRET_A) == "team-a2"
    assert key_file.reloads == {"ok": 1, "error": 2}


def test_a_missing_or_bad_file_at_start_is_an_error_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(KeyTableError, match=r"cannot read .*missing\.yaml"):
        KeyFile(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("sk-a: [x]\n")
    with pytest.raises(KeyTableError, match=re.escape("bad.yaml: entry 1: the tenant")):
        KeyFile(bad)


def test_an_empty_table_refuses_everyone() -> None:
    auth = KeyAuth(lambda: KeyTable(()))
    with pytest.raises(Unauthenticated):
        auth.tenant({"authorization": "Bearer anything"})
