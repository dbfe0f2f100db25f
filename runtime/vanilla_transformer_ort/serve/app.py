"""The HTTP API: LibreTranslate's `/translate` and `/languages`, plus `/health`, `/ready` and `/metrics`.

Clients written for LibreTranslate (libretranslatepy, Weblate, translate-shell, browser extensions) work unmodified:
`POST /translate` takes JSON or form fields `q` (a string, or a list of strings), `source` (or "auto"), `target`,
`format` ("text" or "html"), `api_key`; it answers `{"translatedText": ...}` of the same shape as `q`. Every error is
`{"error": "one line"}` with LibreTranslate's status: 400 bad request, 403 API key, 413 too large, 429 queue full,
503 shutting down or overloaded. The OpenAPI schema at `/openapi.json` describes it all.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from typing import Any, Literal
from urllib.parse import parse_qsl

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__
from .files import FILE_PATHS, add_file_routes
from .frontend import FRONTEND_PATHS, add_frontend_routes
from .service import RequestError, TranslationService

access_logger = logging.getLogger("vanilla_transformer_ort.serve.access")
PAGE_AND_FILE_PATHS = FRONTEND_PATHS | FILE_PATHS  # metrics labels of the web page's routes (not /download_file/*)


def configure_access_log(stream=None, level: int = logging.INFO) -> None:
    """Write the access log as bare JSON lines on `stream` (default stderr): its own handler with no prefix, not the
    root logger's format, so that every line parses as JSON (`jq`, log shippers). Its lines are INFO: a `level`
    above that turns it off."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    access_logger.handlers[:] = [handler]
    access_logger.setLevel(max(level, logging.INFO))
    access_logger.propagate = False


# -- schema (documentation and validation of answers; requests are parsed by hand to accept JSON and forms alike) --


class TranslateRequest(BaseModel):
    """LibreTranslate's translate request, as JSON or as form fields."""

    model_config = ConfigDict(extra="allow")
    q: str | list[str] = Field(description="Text to translate, or a list of texts (batch).")
    source: str = Field(description="Source language code, or 'auto' when the served pairs make it unambiguous.")
    target: str = Field(description="Target language code.")
    format: Literal["text", "html"] = Field("text", description="'html' keeps tags and entities.")
    api_key: str | None = Field(None, description="Required when the server was started with --api_keys.")
    alternatives: int | None = Field(None, ge=0, description="Accepted; this server returns no alternatives.")


class DetectedLanguage(BaseModel):
    confidence: float
    language: str


class TranslateResponse(BaseModel):
    translatedText: str | list[str]  # noqa: N815 (LibreTranslate's field name)
    detectedLanguage: DetectedLanguage | list[DetectedLanguage] | None = None  # noqa: N815
    alternatives: list[str] | list[list[str]] | None = None


class Language(BaseModel):
    code: str
    name: str
    targets: list[str]


class ErrorResponse(BaseModel):
    error: str


class Health(BaseModel):
    status: str


def _errors(*statuses: int) -> dict[int, dict]:
    meaning = {
        400: "Invalid request: a missing or malformed field, an unknown pair, a text over the character limit.",
        403: "API key missing or not valid (only when the server was started with --api_keys).",
        413: "Request too large: more texts than --max_texts, or a body over --max_body_bytes.",
        429: "The queue is full (--max_queue): slow down and retry.",
        503: "Shutting down, still loading, or no answer within --request_timeout.",
    }
    return {status: {"model": ErrorResponse, "description": meaning[status]} for status in statuses}


def _request_body_schema(service: TranslationService) -> dict:
    """TranslateRequest's schema with what this server accepts: its languages, character and text limits."""
    settings = service.settings
    schema = TranslateRequest.model_json_schema()
    properties = schema["properties"]
    sources = sorted({spec.source for spec in service.specs})
    targets = sorted({spec.target for spec in service.specs})
    properties["source"] |= {"enum": [*sources, "auto"]}
    properties["target"] |= {"enum": targets}
    text = {"type": "string", "maxLength": settings.char_limit}
    properties["q"] = {
        "anyOf": [text, {"type": "array", "items": text, "maxItems": settings.max_texts}],
        "description": properties["q"]["description"],
    }
    form = json.loads(json.dumps(schema))
    return {
        "required": True,
        "content": {"application/json": {"schema": schema}, "application/x-www-form-urlencoded": {"schema": form}},
    }


# -- request parsing ----------------------------------------------------------------------------------------------


async def _read_body(request: Request, max_body_bytes: int) -> bytes:
    """The request's body; RequestError 413 as soon as it is over `max_body_bytes`."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
        raise RequestError(413, f"request body of {declared} bytes is over the limit of {max_body_bytes} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > max_body_bytes:
            raise RequestError(413, f"request body is over the limit of {max_body_bytes} bytes")
    return bytes(body)


async def _read_fields(request: Request, max_body_bytes: int) -> dict[str, Any]:
    """The request's fields from a JSON object or a form; RequestError for anything else."""
    body = await _read_body(request, max_body_bytes)
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "application/json" or content_type.endswith("+json"):
        try:
            fields = json.loads(bytes(body).decode("utf-8"))
        except UnicodeDecodeError:
            raise RequestError(400, "the request body is not valid UTF-8") from None
        except ValueError as error:
            raise RequestError(400, f"the request body is not valid JSON: {error}") from None
        if not isinstance(fields, dict):
            raise RequestError(400, "the JSON body must be an object with fields q, source and target")
        return fields
    if content_type == "application/x-www-form-urlencoded":
        try:
            pairs = parse_qsl(bytes(body).decode("utf-8"), keep_blank_values=True, encoding="utf-8", errors="strict")
        except UnicodeDecodeError:
            raise RequestError(400, "the request body is not valid UTF-8") from None
        return _form_fields(pairs)
    if content_type == "multipart/form-data":
        request._body = bytes(body)  # let Starlette parse the form from what was read
        try:
            form = await request.form()
        except Exception as error:  # python-multipart's errors have no common base
            raise RequestError(400, f"the form body cannot be parsed: {error}") from None
        return _form_fields((key, value) for key, value in form.multi_items() if isinstance(value, str))
    if not body:
        raise RequestError(400, "the request has no body: send q, source and target as JSON or form fields")
    raise RequestError(400, f"unsupported content type {content_type or '(none)'!r}: send application/json or a form")


def _form_fields(pairs) -> dict[str, Any]:
    """Form pairs -> fields; a field given more than once (`q=a&q=b`) is a list, as JSON's would be."""
    fields: dict[str, Any] = {}
    for key, value in pairs:
        if key in fields:
            fields[key] = [*fields[key], value] if isinstance(fields[key], list) else [fields[key], value]
        else:
            fields[key] = value
    return fields


def _validate(fields: dict[str, Any], settings) -> tuple[list[str], bool, str, str, str]:
    """(texts, whether q was one string, source, target, format) from the fields, by LibreTranslate's rules."""
    for name in ("q", "source", "target"):
        if fields.get(name) is None:
            raise RequestError(400, f"Invalid request: missing {name} parameter")
    q = fields["q"]
    if isinstance(q, str):
        texts, single = [q], True
    elif isinstance(q, list):
        texts, single = q, False
        for index, text in enumerate(texts):
            if not isinstance(text, str):
                raise RequestError(400, f"Invalid request: q[{index}] must be a string, got {type(text).__name__}")
    else:
        raise RequestError(400, f"Invalid request: q must be a string or a list of strings, got {type(q).__name__}")
    if len(texts) > settings.max_texts:
        raise RequestError(413, f"Invalid request: {len(texts)} texts; the limit is {settings.max_texts} a request")
    for index, text in enumerate(texts):
        if len(text) > settings.char_limit:
            where = "q" if single else f"q[{index}]"
            raise RequestError(
                400, f"Invalid request: {where} has {len(text)} characters; the limit is {settings.char_limit}"
            )
        if "\x00" in text:
            raise RequestError(400, "Invalid request: q holds a NUL character")
    source, target = fields["source"], fields["target"]
    for name, value in (("source", source), ("target", target)):
        if not isinstance(value, str) or not value:
            raise RequestError(400, f"Invalid request: {name} must be a language code")
    text_format = fields.get("format") or "text"
    if text_format not in ("text", "html"):
        raise RequestError(400, f"Invalid request: format must be 'text' or 'html', got {text_format!r:.40}")
    alternatives = fields.get("alternatives")
    if alternatives not in (None, ""):
        try:
            if int(alternatives) < 0:
                raise ValueError
        except (TypeError, ValueError):
            raise RequestError(400, "Invalid request: alternatives must be a non-negative integer") from None
    return texts, single, source, target, text_format


def _check_api_key(fields: dict[str, Any], keys: frozenset[str]) -> None:
    if not keys:
        return
    key = fields.get("api_key")
    if not key:
        raise RequestError(403, "Please provide an API key (field api_key)")
    if not isinstance(key, str) or key not in keys:
        raise RequestError(403, "Invalid API key")


# -- the app ------------------------------------------------------------------------------------------------------


def _error(status: int, message: str, retry_after: int | None = None) -> JSONResponse:
    headers = {"Retry-After": str(retry_after or 1)} if status in (429, 503) else None
    return JSONResponse({"error": message}, status_code=status, headers=headers)


class AccessLog:
    """ASGI middleware: one JSON line per HTTP request (UTC time, method, path, status, milliseconds, client) and the
    request counter and latency histogram."""

    def __init__(self, app, service: TranslationService):
        self.app = app
        self.service = service

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        status = {"code": 500}

        async def record_status(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, record_status)
        finally:
            seconds = time.perf_counter() - started
            path = scope.get("path", "")
            endpoint = path if path in KNOWN_PATHS or path in PAGE_AND_FILE_PATHS else "other"
            metrics = self.service.metrics
            metrics.requests.labels(endpoint, str(status["code"])).inc()
            metrics.latency.labels(endpoint).observe(seconds)
            client = scope.get("client")
            access_logger.info(
                json.dumps(
                    {
                        "time": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
                        "method": scope.get("method"),
                        "path": path,
                        "status": status["code"],
                        "ms": round(seconds * 1000, 2),
                        "client": f"{client[0]}:{client[1]}" if client else None,
                    }
                )
            )


KNOWN_PATHS = {"/translate", "/languages", "/health", "/ready", "/metrics", "/openapi.json"}


def create_app(service: TranslationService) -> FastAPI:
    """The FastAPI app of `service`; its lifespan loads the models and, on shutdown, finishes accepted work."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await service.start()
        try:
            yield
        finally:
            await service.close()

    app = FastAPI(
        title="vanilla-transformer translation server",
        description=__doc__,
        version=__version__,
        lifespan=lifespan,
        docs_url=None,  # FastAPI's pages load their scripts from a CDN: blank offline; /openapi.json stays
        redoc_url=None,
    )
    app.state.service = service
    settings = service.settings

    @app.exception_handler(RequestError)
    async def request_error(request: Request, error: RequestError):
        return _error(error.status, error.message, error.retry_after)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException):
        return _error(error.status_code, str(error.detail))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, error: RequestValidationError):
        return _error(400, f"Invalid request: {error.errors()[0].get('msg', 'bad field')}")

    @app.exception_handler(Exception)
    async def unexpected_error(request: Request, error: Exception):  # a fault of the server, never of the input
        return _error(500, f"internal error ({type(error).__name__}); the server's log has the details")

    @app.post(
        "/translate",
        response_model=TranslateResponse,
        response_model_exclude_none=True,
        responses=_errors(400, 403, 413, 429, 503),
        openapi_extra={"requestBody": _request_body_schema(service)},
        summary="Translate text (LibreTranslate's API)",
    )
    async def translate(request: Request):
        fields = await _read_fields(request, settings.max_body_bytes)
        _check_api_key(fields, settings.api_keys)
        texts, single, source, target, text_format = _validate(fields, settings)
        source, detected = service.resolve_pair(source, target)
        translations = await service.translate(texts, source, target, text_format)
        answer: dict[str, Any] = {"translatedText": translations[0] if single else translations}
        if detected:
            # "auto" resolves to the only source served for the target: no language identification takes place.
            language = {"confidence": 100.0, "language": source}
            answer["detectedLanguage"] = language if single else [language] * len(texts)
        if fields.get("alternatives") not in (None, "", 0, "0"):
            answer["alternatives"] = [] if single else [[] for _ in texts]
        return answer

    @app.get("/languages", response_model=list[Language], summary="Served languages (LibreTranslate's API)")
    async def languages():
        return service.languages()

    @app.get("/health", response_model=Health, summary="Liveness: the process answers")
    async def health():
        return {"status": "ok"}

    @app.get(
        "/ready",
        response_model=Health,
        responses=_errors(503),
        summary="Readiness: the models are loaded and the server is not shutting down",
    )
    async def ready():
        if service.draining:
            return _error(503, "shutting down")
        if not service.ready:
            return _error(503, "loading models")
        return {"status": "ready"}

    @app.get(
        "/metrics",
        summary="Prometheus metrics",
        response_class=Response,
        responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
    )
    async def metrics():
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        service.update_gauges()
        return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    add_frontend_routes(app, service)
    add_file_routes(app, service)
    app.add_middleware(AccessLog, service=service)
    return app
