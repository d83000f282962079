"""vLLM's runtime LoRA routes, `POST /v1/load_lora_adapter` and `POST /v1/unload_lora_adapter`.

The app includes them only when `VLLM_ALLOW_RUNTIME_LORA_UPDATING` is on (vLLM's `attach_router`
does nothing otherwise, so they are 404s). Bodies: `{"lora_name", "lora_path"[, "load_inplace"]}` and
`{"lora_name"[, "lora_int_id"]}` (the id is accepted and ignored, as vLLM 0.32 ignores it). Success
is 200 with vLLM's plain-text line; errors are vLLM's JSON error bodies (`lora.LoRAError`). A load
answers once the engine has read the adapter: vLLM 0.32's `OpenAIServingModels.load_lora_adapter`
awaits `engine_client.add_lora`, which its engine core runs between two steps; here the read is
charged to the engine's next step (a step of its own when the engine is idle) and the route waits
for that step to end (`EngineLoop.loads_settled`).
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.requests import Request

from tandem.sim.lora import LoRAError
from tandem.sim.middleware import log_fields
from tandem.sim.protocol import parse_json, validate
from tandem.sim.state import sim_state

router = APIRouter()


class LoadLoRAAdapterRequest(BaseModel):
    """vLLM's `LoadLoRAAdapterRequest`."""

    lora_name: str
    lora_path: str
    load_inplace: bool = False
    is_3d_lora_weight: bool = False


class UnloadLoRAAdapterRequest(BaseModel):
    """vLLM's `UnloadLoRAAdapterRequest`."""

    lora_name: str
    lora_int_id: int | None = None


@router.post("/v1/load_lora_adapter")
async def load_lora_adapter(request: Request) -> Response:
    sim = sim_state(request)
    body = validate(LoadLoRAAdapterRequest, parse_json(await request.body()))
    log_fields(request).update(lora_name=body.lora_name)
    loop = sim.running().loop
    try:
        text = sim.adapters.load(
            body.lora_name, body.lora_path, core=loop.core, load_inplace=body.load_inplace
        )
    except LoRAError as exc:
        return JSONResponse(exc.body(), status_code=exc.status)
    await loop.loads_settled()  # vLLM answers once its engine has run `add_lora` (module docstring)
    return Response(content=text, status_code=200)


@router.post("/v1/unload_lora_adapter")
async def unload_lora_adapter(request: Request) -> Response:
    sim = sim_state(request)
    body = validate(UnloadLoRAAdapterRequest, parse_json(await request.body()))
    log_fields(request).update(lora_name=body.lora_name)
    try:
        text = sim.adapters.unload(body.lora_name)
    except LoRAError as exc:
        return JSONResponse(exc.body(), status_code=exc.status)
    return Response(content=text, status_code=200)
