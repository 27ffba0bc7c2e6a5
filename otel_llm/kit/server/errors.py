"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}`` with a 4xx/5xx status.

A client's mistake is answered here, before the engine sees the request, so it never becomes a
request span at all, let alone one with an error status.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException

INVALID_REQUEST = "invalid_request_error"
NOT_FOUND = "not_found_error"
SERVER_ERROR = "server_error"


class ApiError(Exception):
    """An answer other than 200, raised anywhere in a handler."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = INVALID_REQUEST,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def parse_json(raw: bytes) -> Any:
    """The request body as JSON, or a 400 that says where it broke."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise ApiError(400, "request body is nested too deeply", code="invalid_json") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer past Python's digit limit
        raise ApiError(400, f"request body is not valid JSON: {exc}", code="invalid_json") from None


def from_validation(exc: ValidationError | RequestValidationError, data: Any = None) -> ApiError:
    """The first problem pydantic found, with the dotted path of the field in ``data`` as ``param``."""
    first = exc.errors()[0]
    kind = first.get("type", "")
    param = ".".join(_field_path(data, [p for p in first.get("loc", ()) if p != "body"], kind)) or None
    code = "missing_required_parameter" if kind == "missing" else "invalid_value"
    message = first.get("msg", "invalid request")
    if kind == "value_error":  # pydantic prefixes a validator's own message with "Value error, "
        message = message.removeprefix("Value error, ")
    return ApiError(400, f"{param}: {message}" if param else message, param=param, code=code)


def _field_path(data: Any, loc: list[Any], kind: str) -> list[str]:
    """``loc`` without pydantic's union-member tags (``prompt.str``): the steps that exist in ``data``."""
    path: list[str] = []
    node = data
    for i, part in enumerate(loc):
        in_dict = isinstance(node, dict) and part in node
        if in_dict or (isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)):
            node = node[part]
        elif not (kind == "missing" and i == len(loc) - 1) and data is not None:
            continue  # a tag naming which type of a union was tried, not a field
        path.append(str(part))
    return path


def install(app: FastAPI) -> None:
    """Route every framework-level error (unknown path, wrong method, ...) through the OpenAI shape."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return from_validation(exc).response()

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        kind = (
            NOT_FOUND
            if exc.status_code == 404
            else INVALID_REQUEST
            if exc.status_code < 500
            else SERVER_ERROR
        )
        return ApiError(exc.status_code, str(exc.detail), type=kind).response()
