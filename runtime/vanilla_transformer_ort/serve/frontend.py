"""LibreTranslate's web page and the endpoints it and other clients read: `GET /` (the page: plain HTML, JavaScript
and CSS shipped in `static/`, nothing fetched from elsewhere), `GET /frontend/settings` and `POST /detect`."""

from __future__ import annotations

from importlib.resources import files
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel

from .files import SUPPORTED_FORMATS
from .models import language_name
from .service import RequestError, TranslationService

FRONTEND_PATHS = frozenset({"/", "/frontend/settings", "/detect"})
STATIC_FILES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
# The page may load and call this server only; the browser enforces it.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


class LanguageRef(BaseModel):
    code: str
    name: str


class FrontendLanguages(BaseModel):
    source: LanguageRef
    target: LanguageRef


class FrontendSettings(BaseModel):
    """LibreTranslate's `/frontend/settings`, field for field."""

    charLimit: int  # noqa: N815 (LibreTranslate's field names)
    frontendTimeout: int  # noqa: N815
    apiKeys: bool  # noqa: N815
    keyRequired: bool  # noqa: N815
    suggestions: bool
    filesTranslation: bool  # noqa: N815
    supportedFilesFormat: list[str]  # noqa: N815
    language: FrontendLanguages


def frontend_settings(service: TranslationService) -> dict[str, Any]:
    """The page's settings: the character limit, the typing debounce, whether a key is needed, the file formats,
    and the first served pair as the page's default languages."""
    settings = service.settings
    first = service.specs[0]
    return {
        "charLimit": settings.char_limit,
        "frontendTimeout": settings.frontend_timeout,
        "apiKeys": bool(settings.api_keys),
        "keyRequired": bool(settings.api_keys),
        "suggestions": False,
        "filesTranslation": settings.files_translation,
        "supportedFilesFormat": list(SUPPORTED_FORMATS) if settings.files_translation else [],
        "language": {
            "source": {"code": first.source, "name": language_name(first.source)},
            "target": {"code": first.target, "name": language_name(first.target)},
        },
    }


def detect(service: TranslationService, fields: dict[str, Any]) -> list[dict[str, Any]]:
    """LibreTranslate's `/detect` answer: the served source languages, the only ones a request can name, in the
    order served. No language identification takes place; with several sources their confidence is shared."""
    q = fields.get("q")
    if q is None or q == "":
        raise RequestError(400, "Invalid request: missing q parameter")
    if not isinstance(q, str):
        raise RequestError(400, f"Invalid request: q must be a string, got {type(q).__name__}")
    if len(q) > service.settings.char_limit:
        raise RequestError(
            400, f"Invalid request: q has {len(q)} characters; the limit is {service.settings.char_limit}"
        )
    sources = list(dict.fromkeys(spec.source for spec in service.specs))
    return [{"confidence": round(100.0 / len(sources), 2), "language": code} for code in sources]


def static_file(name: str) -> Response:
    """One of the page's files from the package (a wheel or a checkout alike); 404 for any other name."""
    media_type = STATIC_FILES.get(name)
    if media_type is None:
        raise RequestError(404, "Not Found")
    content = files(__package__).joinpath("static", name).read_bytes()
    headers = {"Content-Security-Policy": CONTENT_SECURITY_POLICY, "X-Content-Type-Options": "nosniff"}
    return Response(content, media_type=media_type, headers=headers)


def add_frontend_routes(app: FastAPI, service: TranslationService) -> None:
    """The page, its files, `/frontend/settings` and `/detect` on `app`."""
    from .app import DetectedLanguage, ErrorResponse, _check_api_key, _read_fields  # app.py imports this module

    settings = service.settings

    @app.get("/", include_in_schema=False)
    async def page():
        return static_file("index.html")

    @app.get("/static/{name}", include_in_schema=False)
    async def static(name: str):
        return static_file(name)

    @app.get(
        "/frontend/settings",
        response_model=FrontendSettings,
        summary="The web page's settings (LibreTranslate's API)",
    )
    async def settings_route():
        return frontend_settings(service)

    detect_body = {
        "required": True,
        "content": {
            media_type: {
                "schema": {
                    "type": "object",
                    "required": ["q"],
                    "properties": {
                        "q": {"type": "string", "maxLength": settings.char_limit},
                        "api_key": {"type": "string"},
                    },
                }
            }
            for media_type in ("application/json", "application/x-www-form-urlencoded")
        },
    }

    @app.post(
        "/detect",
        response_model=list[DetectedLanguage],
        responses={
            400: {"model": ErrorResponse, "description": "q missing, not a string, or over --char_limit."},
            403: {"model": ErrorResponse, "description": "API key missing or not valid (--api_keys)."},
            413: {"model": ErrorResponse, "description": "A body over --max_body_bytes."},
        },
        openapi_extra={"requestBody": detect_body},
        summary="The served source language; no language identification (LibreTranslate's API)",
    )
    async def detect_route(request: Request):
        fields = await _read_fields(request, settings.max_body_bytes)
        _check_api_key(fields, settings.api_keys)
        return detect(service, fields)
