"""The gateway's OpenAPI document (`GET /openapi.json`): the real request bodies and error shape.

The generation routes are served by the gateway's own ASGI shell, not by FastAPI, so this module
adds them to the document, describing their bodies from the same pydantic models that validate
them (`tandem.core.openai_api`), with `model` limited to the names
this gateway serves. Every error answer is OpenAI's `{"error": {...}}` object. With auth on, the
`/v1` operations declare the bearer key (`/health`, `/metrics`, `/openapi.json` stay open).
Schemathesis fuzzes the gateway from this document (tests/fuzz).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from tandem.core.openai_api import ChatCompletionRequest, CompletionRequest

REF = "#/components/schemas/{model}"

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["integer", "string", "null"]},
            },
        }
    },
}

_ERRORS = {
    "400": "Invalid JSON, or a parameter fails validation (`param` names it); an engine's 400 (e.g. "
    "the prompt exceeds the model's context length) is passed through.",
    "401": "Auth is on and the API key is missing or unknown (`code: invalid_api_key`).",
    "404": "`model` is not served here.",
    "413": "The request body is larger than the router accepts.",
    "429": "A rate limit (`code: rate_limit_exceeded`), or the router's queue is full or too slow for "
    "the request's objective; `Retry-After` says when to retry.",
    "503": "No engine could take the request.",
}

_GENERATION: dict[str, tuple[type[BaseModel], str]] = {
    "/v1/completions": (CompletionRequest, "Text completion (vLLM's /v1/completions)."),
    "/v1/chat/completions": (ChatCompletionRequest, "Chat completion (vLLM's /v1/chat/completions)."),
}


def _error_response(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": REF.format(model="Error")}}},
    }


def _request_schema(model: type[BaseModel], components: dict[str, Any], served: list[str]) -> None:
    schema = model.model_json_schema(ref_template=REF)
    components.update(schema.pop("$defs", {}))
    schema["properties"]["model"] = {"type": "string", "enum": served, "description": "The served model."}
    components[model.__name__] = schema


def _describe(schema: dict[str, Any], *, served: list[str], auth: bool) -> None:
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components["Error"] = ERROR_SCHEMA
    paths = schema["paths"]
    for path, (model, summary) in _GENERATION.items():
        _request_schema(model, components, served)
        operation = paths.setdefault(path, {}).setdefault(
            "post", {"operationId": path.strip("/").replace("/", "_")}
        )
        operation["summary"] = summary
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": REF.format(model=model.__name__)}}},
        }
        operation["responses"] = {
            "200": {
                "description": "The engine's answer: JSON, or server-sent events when `stream` is true.",
                "content": {
                    "application/json": {"schema": {"type": "object"}},
                    "text/event-stream": {"schema": {"type": "string"}},
                },
            },
            **{status: _error_response(text) for status, text in _ERRORS.items()},
        }
    models = paths["/v1/models"]["get"]
    models["responses"] = {
        "200": {
            "description": "The served model (OpenAI's list object).",
            "content": {"application/json": {"schema": {"type": "object"}}},
        },
        "401": _error_response(_ERRORS["401"]),
    }
    if auth:
        schema["components"]["securitySchemes"] = {
            "apiKey": {"type": "http", "scheme": "bearer", "description": "A key from the API key file."}
        }
        for path in (*_GENERATION, "/v1/models"):
            for operation in paths[path].values():
                operation["security"] = [{"apiKey": []}]


def openapi_builder(app: FastAPI, *, served: Collection[str], auth: bool) -> Callable[[], dict[str, Any]]:
    """`app.openapi`: builds the document once, then returns it."""

    def build() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                description="OpenAI-compatible gateway of one Tandem InferenceService.",
                routes=app.routes,
            )
            _describe(schema, served=sorted(served), auth=auth)
            app.openapi_schema = schema
        return app.openapi_schema

    return build
