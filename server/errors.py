"""Errors in OpenAI's shape: `ApiError` (raised by the server's own checks with its status, type,
param and code), `error_response` (the JSON body every error answer has), and the exception handlers
`create_app` registers (ERROR_HANDLERS), which turn the engine's, the grammar compiler's, pydantic's and
Starlette's errors into the same shape."""

from __future__ import annotations

from typing import Any, Awaitable, Callable

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .engine import InvalidRequest
from .protocol import ErrorBody, ErrorResponse
from .grammars import GrammarCompileFault
from .structured import StructuredOutputError


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        self.status, self.body = status, ErrorBody(message=message, type=type_, param=param, code=code)
        self.headers = headers


def error_response(status: int, body: ErrorBody, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(ErrorResponse(error=body).model_dump(), status_code=status, headers=headers)


async def api_error(_: Request, err: ApiError):
    return error_response(err.status, err.body, err.headers)


async def internal_error(_: Request, err: Exception):
    return error_response(500, ErrorBody(message=f"{type(err).__name__}: {err}", type="server_error"))


async def compile_fault(_: Request, err: Exception):
    return error_response(
        503, ErrorBody(message=str(err), type="server_error", code="grammar_compile_timeout"), {"Retry-After": "1"}
    )


async def invalid_request(_: Request, err: Exception):
    return error_response(400, ErrorBody(message=str(err), type="invalid_request_error"))


async def validation_error(_: Request, err: RequestValidationError):
    first = err.errors()[0] if err.errors() else {}
    if first.get("type") == "request_rule":  # request_rules.json's message, as the browser words it
        return error_response(400, ErrorBody(message=first["msg"], type="invalid_request_error", param=first["ctx"]["param"]))
    loc = ".".join(str(x) for x in first.get("loc", ())[1:])
    return error_response(
        400,
        ErrorBody(
            message=f"{loc or 'body'}: {first.get('msg', 'invalid request')}", type="invalid_request_error", param=loc or None
        ),
    )


async def http_error(_: Request, err: StarletteHTTPException):
    kind = "not_found_error" if err.status_code == 404 else "invalid_request_error"
    return error_response(err.status_code, ErrorBody(message=str(err.detail), type=kind))


# each handler takes the kind it is registered for (Starlette's handler type takes any Exception)
ERROR_HANDLERS: tuple[tuple[type[Exception], Callable[[Request, Any], Awaitable[JSONResponse]]], ...] = (
    (ApiError, api_error),
    (Exception, internal_error),
    (InvalidRequest, invalid_request),
    (StructuredOutputError, invalid_request),
    (GrammarCompileFault, compile_fault),
    (RequestValidationError, validation_error),
    (StarletteHTTPException, http_error),
)
