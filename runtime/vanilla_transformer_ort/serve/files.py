"""LibreTranslate's file translation: `POST /translate_file` (multipart `file`, `source`, `target`, `api_key`) answers
`{"translatedFileUrl": URL}`, and `GET /download_file/{token}.{name}` serves the translation under the upload's name.

Plain text and HTML take the /translate route's path (`TranslationService.translate`, a chunk of segments at a
time); gettext catalogs take `vt-translate-po`'s (`catalog.load_catalog`, `pretranslate`, `write_catalog`), its model
calls batched with everyone else's. An upload is read into memory. The only files written are in the server's own
temporary folder, under random names that no request chooses: a catalog while it is read, and each translation until
`download_expiry` seconds have passed. The folder goes on shutdown.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import tempfile
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse
from pydantic import BaseModel
from starlette.datastructures import Headers, UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from ..gettext.catalog import CatalogError, load_catalog, pretranslate, translatable_entries, write_catalog
from .service import RequestError, TranslationService

# Extension -> how the file is translated; LibreTranslate's `supportedFilesFormat` lists the keys.
SUPPORTED_FORMATS = {".txt": "text", ".html": "html", ".htm": "html", ".po": "po", ".pot": "po"}
MEDIA_TYPES = {
    "text": "text/plain; charset=utf-8",
    "html": "text/html; charset=utf-8",
    "po": "text/x-gettext-translation; charset=utf-8",
}
FILE_PATHS = frozenset({"/translate_file"})
# Room for the form's other fields and part headers beside the file itself.
FORM_OVERHEAD_BYTES = 64 * 1024
# Distinct segments a file queues at a time (never more than --max_queue).
FILE_CHUNK_SEGMENTS = 256
TOKEN = re.compile(r"[0-9a-f]{32}")
MAX_NAME_CHARS = 120


class TranslateFileResponse(BaseModel):
    translatedFileUrl: str  # noqa: N815 (LibreTranslate's field name)


def safe_name(filename: str) -> str:
    """The upload's base name with letters, digits, `.`, `-` and `_` only (anything else becomes `_`), no leading
    dot: it names the download, never a file on disk."""
    base = re.split(r"[/\\]", filename)[-1]
    cleaned = "".join(c if c.isalnum() or c in "._-" else "_" for c in base).lstrip(".")
    stem, dot, suffix = cleaned.rpartition(".")
    if dot and len(cleaned) > MAX_NAME_CHARS:
        return stem[: MAX_NAME_CHARS - len(suffix) - 1] + "." + suffix
    return cleaned[:MAX_NAME_CHARS]


@dataclass
class StoredFile:
    path: Path
    name: str
    media_type: str
    expires: float  # time.monotonic()


class DownloadStore:
    """Translated files in a temporary folder of the server's own, each under a random token, until it expires."""

    def __init__(self, expiry: float):
        self.expiry = expiry
        self.folder: Path | None = None
        self.files: dict[str, StoredFile] = {}

    def open(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="vt-serve-files-"))

    def close(self) -> None:
        self.files.clear()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def reserve(self) -> tuple[str, Path]:
        """A fresh token and the path its translation is written to."""
        if self.folder is None:
            raise RequestError(503, "the server is not started or shutting down; retry shortly")
        token = uuid.uuid4().hex
        return token, self.folder / token

    def add(self, token: str, path: Path, name: str, media_type: str) -> str:
        """Register a written translation; its download name, `{token}.{name}`."""
        self.files[token] = StoredFile(path, name, media_type, time.monotonic() + self.expiry)
        return f"{token}.{name}"

    def get(self, download_name: str) -> StoredFile:
        """The file of a download name; RequestError 400 for a name this server never hands out, 404 when unknown
        or expired. Only the registry's paths are opened: a name is looked up, never joined to a folder."""
        token, dot, name = download_name.partition(".")
        if not dot or not TOKEN.fullmatch(token) or not name or safe_name(name) != name:
            raise RequestError(400, "Invalid filename")
        stored = self.files.get(token)
        if stored is not None and stored.expires <= time.monotonic():
            self._remove(token)
            stored = None
        if stored is None or stored.name != name:
            raise RequestError(
                404, f"no such file: translations can be downloaded for {self.expiry:g} s; translate it again"
            )
        return stored

    def remove_expired(self) -> None:
        now = time.monotonic()
        for token in [token for token, stored in self.files.items() if stored.expires <= now]:
            self._remove(token)

    def _remove(self, token: str) -> None:
        stored = self.files.pop(token, None)
        if stored is not None:
            stored.path.unlink(missing_ok=True)


async def read_upload(request: Request, max_file_bytes: int) -> tuple[dict[str, str], UploadFile | None]:
    """The form's text fields and its `file` (None when absent), parsed in memory; RequestError for a body that is
    not a multipart form, or a file over `max_file_bytes`."""
    from .app import _read_body  # the /translate route's size-capped reading (app.py imports this module)

    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "multipart/form-data":
        raise RequestError(400, "Invalid request: send the file as multipart/form-data (fields file, source, target)")
    too_large = RequestError(413, f"the file is over the limit of {max_file_bytes} bytes (--max_file_bytes)")
    try:
        body = await _read_body(request, max_file_bytes + FORM_OVERHEAD_BYTES)
    except RequestError as error:
        raise too_large if error.status == 413 else error from None

    async def stream():
        yield body

    parser = MultiPartParser(Headers(raw=request.headers.raw), stream(), max_files=1, max_fields=16)
    parser.spool_max_size = len(body) + 1  # the upload stays in memory, out of the system's temporary folder
    try:
        form = await parser.parse()
    except MultiPartException as error:
        raise RequestError(400, f"Invalid request: the form cannot be parsed: {error.message}") from None
    fields = {key: value for key, value in form.multi_items() if isinstance(value, str)}
    upload = form.get("file")
    if isinstance(upload, UploadFile) and upload.size is not None and upload.size > max_file_bytes:
        raise too_large
    return fields, upload if isinstance(upload, UploadFile) else None


def decode_utf8(data: bytes, name: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RequestError(
            400, f"Invalid request: {name} is not UTF-8 text (byte {error.start}); convert it to UTF-8"
        ) from None


def add_file_routes(app: FastAPI, service: TranslationService) -> None:
    """`POST /translate_file` and `GET /download_file/{name}` on `app`; the download folder lives as long as the
    app's lifespan, and a sweep deletes expired translations."""
    from .app import ErrorResponse, _check_api_key  # the /translate route's schema and key check

    settings = service.settings
    store = DownloadStore(settings.download_expiry)
    app.state.downloads = store
    served_lifespan = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        async with served_lifespan(app) as state:
            store.open()
            sweep = asyncio.create_task(_sweep(store, min(60.0, settings.download_expiry)))
            try:
                yield state
            finally:
                sweep.cancel()
                store.close()

    app.router.lifespan_context = lifespan
    errors = {
        400: "Invalid request: a missing field, an unknown pair, a file type not served, not UTF-8, a catalog that "
        "does not parse.",
        403: "API key missing or not valid, or file translation turned off (--no_files_translation).",
        413: "The file is over --max_file_bytes.",
        429: "The queue is full (--max_queue): slow down and retry.",
        503: "Shutting down, still loading, or no answer within --request_timeout.",
    }
    file_body = {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file", "source", "target"],
                    "properties": {
                        "file": {"type": "string", "format": "binary", "description": ", ".join(SUPPORTED_FORMATS)},
                        "source": {"type": "string"},
                        "target": {"type": "string"},
                        "api_key": {"type": "string"},
                    },
                }
            }
        },
    }

    @app.post(
        "/translate_file",
        response_model=TranslateFileResponse,
        responses={status: {"model": ErrorResponse, "description": text} for status, text in errors.items()},
        openapi_extra={"requestBody": file_body},
        summary="Translate a file: .txt, .html, gettext .po/.pot (LibreTranslate's API)",
    )
    async def translate_file(request: Request):
        if not settings.files_translation:
            raise RequestError(403, "Files translation is disabled on this server")
        fields, upload = await read_upload(request, settings.max_file_bytes)
        _check_api_key(fields, settings.api_keys)
        if upload is None:
            raise RequestError(400, "Invalid request: missing file parameter")
        for name in ("source", "target"):
            if not fields.get(name):
                raise RequestError(400, f"Invalid request: missing {name} parameter")
        name = safe_name(upload.filename or "")
        suffix = Path(name).suffix.lower()
        kind = SUPPORTED_FORMATS.get(suffix)
        if kind is None or not Path(name).stem:
            raise RequestError(
                400,
                f"Invalid request: file format {suffix or '(no extension)'} is not supported; send one of "
                f"{', '.join(SUPPORTED_FORMATS)}",
            )
        text = decode_utf8(await upload.read(), name)
        source, _ = service.resolve_pair(fields["source"], fields["target"])
        target = fields["target"]
        token, path = store.reserve()
        try:
            if kind == "po":
                await translate_catalog(service, text, name, source, target, path)
                name = Path(name).with_suffix(".po").name  # a filled template is a catalog
            else:
                path.write_text(await translate_document(service, text, kind, source, target), encoding="utf-8")
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        download = store.add(token, path, name, MEDIA_TYPES[kind])
        return {"translatedFileUrl": f"{request.base_url}download_file/{quote(download)}"}

    @app.get(
        "/download_file/{name:path}",
        response_class=FileResponse,
        responses={
            200: {
                "content": {
                    media_type.split(";")[0]: {"schema": {"type": "string"}} for media_type in MEDIA_TYPES.values()
                }
            },
            400: {"model": ErrorResponse, "description": "A name this server never hands out (a path, say)."},
            404: {"model": ErrorResponse, "description": "No such file, or it expired (--download_expiry)."},
        },
        summary="Download a translated file (LibreTranslate's API)",
    )
    async def download_file(name: str):
        stored = store.get(name)
        return FileResponse(stored.path, media_type=stored.media_type, filename=stored.name)


async def _sweep(store: DownloadStore, interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        store.remove_expired()


async def translate_document(
    service: TranslationService, text: str, text_format: str, source: str, target: str
) -> str:
    """A text or HTML file's translation, through the /translate route's path a chunk of segments at a time; a
    byte-order mark is kept, out of the model's sight."""
    bom = "\ufeff" if text.startswith("\ufeff") else ""
    chunk = min(FILE_CHUNK_SEGMENTS, service.settings.max_queue)
    (translation,) = await service.translate([text[len(bom) :]], source, target, text_format, chunk_size=chunk)
    return bom + translation


async def translate_catalog(
    service: TranslationService, text: str, name: str, source: str, target: str, output: Path
) -> None:
    """A gettext catalog filled as `vt-translate-po` fills it (placeholders kept, every plural form written, the
    machine's entries marked fuzzy) and written to `output`; RequestError 400 for a catalog it refuses."""
    upload = output.with_name(output.name + ".upload.po")  # load_catalog reads a path: the upload waits beside it
    upload.write_text(text, encoding="utf-8")
    try:
        catalog = load_catalog(upload)
    except CatalogError as error:
        raise RequestError(400, f"Invalid request: {str(error).replace(str(upload), name)}") from None
    finally:
        upload.unlink(missing_ok=True)
    if not translatable_entries(catalog):
        raise RequestError(400, f"Invalid request: {name}: the catalog has no messages")

    def fill(translate_batch):
        return pretranslate(catalog, name, translate_batch, target, batch_size=service.settings.max_batch_size)

    try:
        await service.run_with_translator(source, target, fill)
    except CatalogError as error:
        raise RequestError(400, f"Invalid request: {error}") from None
    write_catalog(catalog, output)
