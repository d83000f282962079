"""The LoRA sections of an InferenceService's spec: `spec.engine.lora`, `spec.adapters`,
`spec.adapterCatalog`, `spec.adapterCache` (docs/operator.md, "LoRA adapters"; the rules on them are
`tandem.core.specrules`'s, the sources' parsing `tandem.core.adapters`')."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tandem.core.specbase import DNS_LABEL_PATTERN, SpecModel

#: Ranks vLLM accepts for `--max-lora-rank` (`vllm/config/lora.py`).
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
LoraRank = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]
#: An adapter's name: what clients send in `model`, and a directory name under the engines' adapter
#: directory (`/adapters/<name>`), so one path component: no `/`, not `.` or `..` (the first character
#: is a letter or digit), at most 128 characters.
ADAPTER_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


class LoraSpec(SpecModel):
    """LoRA on the engines (vLLM's `--enable-lora`): how many adapters a batch may mix and how large
    they may be. vLLM reserves GPU memory for `maxLoras` adapters of rank `maxRank`, so these are set
    explicitly; absent, the engines run without LoRA."""

    max_loras: int = Field(
        default=1, ge=1, le=1024, description="Adapters in one batch (vLLM --max-loras, default 1)."
    )
    max_rank: LoraRank = Field(
        default=16,
        description="Largest adapter rank the engines accept (vLLM --max-lora-rank); an adapter whose "
        "adapter_config.json says a larger `r` is refused.",
    )
    max_cpu_loras: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="Adapters kept in CPU memory (vLLM --max-cpu-loras, at least maxLoras); default "
        "maxLoras.",
    )


class AdapterSpec(SpecModel):
    """One LoRA adapter of the model, served under its own name (clients send it in `model`)."""

    name: str = Field(
        pattern=ADAPTER_NAME_PATTERN,
        description="The adapter's served name: one path component (letters, digits, `.`, `_`, `-`; "
        "starting with a letter or digit), at most 128 characters.",
    )
    source: str = Field(
        min_length=1,
        max_length=4096,
        description="Where the adapter's files are: `pvc://claim/path`, `hf://org/repo[@revision]`, "
        "`s3://bucket/prefix`, or a local directory for `tandem up` (relative to the file).",
    )


class AdapterCatalogSpec(SpecModel):
    """A directory of adapters: every subdirectory holding an `adapter_config.json` is an adapter
    named after the subdirectory."""

    source: str = Field(
        min_length=1,
        max_length=4096,
        description="`pvc://claim/path`, or a local directory for `tandem up` (relative to the file).",
    )


class AdapterCacheSpec(SpecModel):
    """Where the engines' adapter directory lives and how `hf://` and `s3://` adapters are fetched
    into it: a ReadWriteMany claim the pods of the service share (each adapter downloaded once for all
    of them) instead of an emptyDir per pod, and the credentials of the fetch."""

    pvc: str | None = Field(
        default=None,
        pattern=DNS_LABEL_PATTERN,
        max_length=63,
        description="PersistentVolumeClaim (RWX) holding the adapter directory, shared by the engine "
        "pods of this service only; default an emptyDir per pod.",
    )
    credentials_secret: str | None = Field(
        default=None,
        pattern=DNS_LABEL_PATTERN,
        max_length=63,
        description='Secret (labelled tandem.dev/usable: "true") whose keys HF_TOKEN, HF_ENDPOINT, '
        "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION and AWS_ENDPOINT_URL, "
        "where present, are the environment of the fetch of hf:// and s3:// adapters.",
    )
