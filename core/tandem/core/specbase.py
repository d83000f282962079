"""What every spec model shares (`tandem.core.spec`, `tandem.core.routerspec`, `tandem.core.adapterspec`,
`tandem.core.gateway`): the base model (camelCase on the wire, unknown fields refused, immutable), Secret
references, and the Kubernetes patterns for quantities and names."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

#: Kubernetes resource quantity, e.g. `32Gi`, `500m`, `1.5`.
QUANTITY_PATTERN = r"^[+]?[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|Pi|Ei|K|M|G|T|P|E)?$"
#: DNS-1123 label: names of Kubernetes objects derived from the service name.
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
Quantity = Annotated[str, Field(pattern=QUANTITY_PATTERN)]


class SpecModel(BaseModel):
    """Base of every spec model: camelCase on the wire, unknown fields rejected, immutable."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
    )


class SecretKeyRef(SpecModel):
    """One key of a Secret in the InferenceService's namespace."""

    name: str = Field(min_length=1, max_length=253, description="Secret name.")
    key: str = Field(min_length=1, max_length=253, description="Key inside the Secret.")
