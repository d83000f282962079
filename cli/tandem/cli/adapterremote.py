"""Downloading an adapter's files from the Hugging Face Hub or S3 (`tandem adapters fetch`).

Each `download(source, directory)` fills an empty directory and returns the revision it got; every
failure is a `FetchError` with one line saying why (errors of httpx and botocore are translated here).

- The Hub: `GET {endpoint}/api/models/{repo}/revision/{revision}` names the commit (`sha`) and the
  files (`siblings[].rfilename`); each file is `GET {endpoint}/{repo}/resolve/{sha}/{file}` (redirects
  followed). `HF_ENDPOINT` (default https://huggingface.co) and `HF_TOKEN` (a Bearer token) come from
  the command's environment. The revision is the commit.
- S3: `ListObjectsV2` under `prefix/`, then `GetObject` of each key, with boto3's usual credentials
  (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, …) and `AWS_ENDPOINT_URL` for an
  S3-compatible store. The revision is a digest of the keys and ETags.

Only the files at the top of the repository or directly under the prefix are fetched (where vLLM
reads an adapter; a repository's `checkpoint-*/` folders and the like are left out). Bounded: at most
`MAX_FILES` files and `MAX_BYTES` bytes per adapter; file paths must stay inside the directory.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import quote

import httpx

from tandem.core.adapterfetch import FetchError, RemoteSource
from tandem.core.adapters import HfSource

#: Most files one adapter may have (a PEFT adapter has two to a dozen).
MAX_FILES = 256
#: Most bytes one adapter may have (a rank-64 adapter of a 70B model is about 1 GiB).
MAX_BYTES = 16 << 30
HF_DEFAULT_ENDPOINT = "https://huggingface.co"
_CHUNK = 1 << 20


def _safe_relative(name: str) -> PurePosixPath:
    path = PurePosixPath(name)
    if not name or path.is_absolute() or any(p in ("", ".", "..") for p in path.parts):
        raise FetchError(f"refusing the file path {name!r} (absolute or with '..')")
    return path


@dataclass(frozen=True)
class Remotes:
    """Where and as whom to download: the Hub's endpoint and token, S3's endpoint; `transport`
    replaces httpx's (tests); `s3_client` a ready boto3 client (tests, or None: built on use)."""

    hf_endpoint: str = HF_DEFAULT_ENDPOINT
    hf_token: str | None = None
    s3_endpoint: str | None = None
    timeout: float = 60.0
    transport: httpx.BaseTransport | None = None
    s3_client: Any = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Remotes:
        """As the pods run them: `HF_ENDPOINT` (else the Hub), `HF_TOKEN`, `AWS_ENDPOINT_URL` (boto3
        reads the rest of its credentials itself); an empty variable counts as unset."""
        return cls(
            hf_endpoint=environ.get("HF_ENDPOINT") or HF_DEFAULT_ENDPOINT,
            hf_token=environ.get("HF_TOKEN") or None,
            s3_endpoint=environ.get("AWS_ENDPOINT_URL") or None,
        )

    def download(self, source: RemoteSource, directory: Path) -> str:
        """Fill `directory` with the adapter of `source`; returns its revision."""
        if isinstance(source, HfSource):
            return self._hub(source, directory)
        return self._s3(source.bucket, source.prefix, directory)

    def _hub(self, source: HfSource, directory: Path) -> str:
        headers = {"Authorization": f"Bearer {self.hf_token}"} if self.hf_token else {}
        revision = quote(source.revision or "main", safe="")
        base = self.hf_endpoint.rstrip("/")
        with httpx.Client(
            headers=headers, timeout=self.timeout, follow_redirects=True, transport=self.transport
        ) as client:
            info = _hub_json(client, f"{base}/api/models/{source.repo}/revision/{revision}", source)
            sha = info.get("sha")
            siblings = info.get("siblings")
            if not isinstance(sha, str) or not isinstance(siblings, list):
                raise FetchError(f"hf://{source.repo}: the Hub's answer has no sha and siblings")
            listed = [s.get("rfilename") for s in siblings if isinstance(s, dict)]
            files = [name for name in listed if isinstance(name, str) and "/" not in name]
            if len(files) > MAX_FILES:
                raise FetchError(f"hf://{source.repo}: {len(files)} files, more than {MAX_FILES}")
            total = 0
            for name in files:
                url = f"{base}/{source.repo}/resolve/{sha}/{quote(name)}"
                total += _hub_file(client, url, directory / _safe_relative(name), budget=MAX_BYTES - total)
        return sha

    def _s3(self, bucket: str, prefix: str, directory: Path) -> str:
        from botocore.exceptions import BotoCoreError, ClientError  # type: ignore[import-untyped]

        where = f"s3://{bucket}/{prefix}"
        start = f"{prefix}/" if prefix else ""
        try:
            client = self.s3_client or _s3_client(self.s3_endpoint)
            keys: list[tuple[str, str, int]] = []
            listing = client.get_paginator("list_objects_v2")
            pages = listing.paginate(Bucket=bucket, Prefix=start, Delimiter="/")
            for page in pages:
                for item in page.get("Contents", []):
                    if not item["Key"].endswith("/"):
                        keys.append((item["Key"], str(item.get("ETag", "")), int(item.get("Size", 0))))
                if len(keys) > MAX_FILES:
                    raise FetchError(f"{where}: more than {MAX_FILES} objects")
            if not keys:
                raise FetchError(f"{where}: no objects under this prefix")
            if sum(size for _, _, size in keys) > MAX_BYTES:
                raise FetchError(f"{where}: more than {MAX_BYTES} bytes")
            for key, _, _ in keys:
                path = directory / _safe_relative(key[len(start) :])
                path.parent.mkdir(parents=True, exist_ok=True)
                client.download_file(bucket, key, str(path))
        except ClientError as exc:
            error = exc.response.get("Error", {})
            raise FetchError(f"{where}: {error.get('Code', 'error')}: {error.get('Message', exc)}") from None
        except BotoCoreError as exc:
            raise FetchError(f"{where}: {exc}") from None
        digest = hashlib.sha256("\n".join(f"{k} {e}" for k, e, _ in sorted(keys)).encode())
        return f"etags-{digest.hexdigest()[:16]}"


def _s3_client(endpoint: str | None) -> Any:
    import boto3  # type: ignore[import-untyped]

    return boto3.client("s3", endpoint_url=endpoint or None)


def _hub_json(client: httpx.Client, url: str, source: HfSource) -> dict[str, Any]:
    where = f"hf://{source.repo}" + (f"@{source.revision}" if source.revision else "")
    try:
        response = client.get(url)
    except httpx.HTTPError as exc:
        raise FetchError(f"{where}: cannot reach the Hub: {exc}") from None
    _raise_for(response, where)
    try:
        data = response.json()
    except ValueError:
        raise FetchError(f"{where}: the Hub's answer is not JSON") from None
    if not isinstance(data, dict):
        raise FetchError(f"{where}: the Hub's answer is not a JSON object")
    return data


def _raise_for(response: httpx.Response, where: str) -> None:
    if response.status_code in (401, 403):
        raise FetchError(f"{where}: access denied (HTTP {response.status_code}); set HF_TOKEN")
    if response.status_code == 404:
        raise FetchError(f"{where}: not found (HTTP 404): no such repository, revision or file")
    if response.status_code >= 400:
        raise FetchError(f"{where}: HTTP {response.status_code} from the Hub")


def _hub_file(client: httpx.Client, url: str, path: Path, *, budget: int) -> int:
    """Stream one file to `path`; returns its size. Raises `FetchError` past `budget` bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    size = 0
    try:
        with client.stream("GET", url) as response, path.open("wb") as out:
            _raise_for(response, url)
            for chunk in response.iter_bytes(_CHUNK):
                size += len(chunk)
                if size > budget:
                    raise FetchError(f"{url}: the adapter is larger than {MAX_BYTES} bytes")
                out.write(chunk)
    except httpx.HTTPError as exc:
        raise FetchError(f"{url}: {exc}") from None
    return size
