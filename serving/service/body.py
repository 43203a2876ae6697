"""Bodies that handlers read themselves (orjson, numpy), documented in OpenAPI all the same.

FastAPI only documents a body it validates itself; the hot endpoints decode theirs with
:mod:`serving.service.decode`, so their operations point at the request model's schema through
``openapi_extra``, and :func:`request_components` adds those schemas to the document.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from pydantic import BaseModel

from balanceroute.serving.service.decode import parse_json

REF = "#/components/schemas/{model}"


def openapi_body(model: type[BaseModel] | str, *, required: bool = True) -> dict[str, Any]:
    """``openapi_extra`` for an operation whose JSON body is ``model`` (or the model named so)."""
    name = model if isinstance(model, str) else model.__name__
    return {
        "requestBody": {
            "required": required,
            "content": {"application/json": {"schema": {"$ref": REF.format(model=name)}}},
        }
    }


def request_components(models: tuple[type[BaseModel], ...]) -> dict[str, Any]:
    """Component schemas of ``models`` and everything they reference."""
    out: dict[str, Any] = {}
    for model in models:
        schema = model.model_json_schema(ref_template=REF, mode="validation")
        out.update(schema.pop("$defs", {}))
        out[model.__name__] = schema
    return out


async def json_body(request: Request) -> Any:
    """The request's JSON, decoded by orjson (422 on malformed or empty bodies)."""
    return parse_json(await request.body())
