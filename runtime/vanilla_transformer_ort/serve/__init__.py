"""`vt-serve`: a translation server that speaks LibreTranslate's HTTP API, with batching across requests.

Needs the `serve` extra (FastAPI, uvicorn, prometheus-client): `pip install "./runtime[cpu,serve]"`.
"""

from .models import ModelSpec, parse_model_spec
from .settings import ServeSettings

__all__ = ["ModelSpec", "ServeSettings", "build_app", "parse_model_spec"]


def build_app(models: list[str], settings: ServeSettings | None = None):
    """The FastAPI app serving `models` (each `FOLDER` or `SRC-TGT=FOLDER`), e.g. for `uvicorn --factory`."""
    from .app import create_app
    from .models import check_unique
    from .service import TranslationService

    specs = [parse_model_spec(model) for model in models]
    check_unique(specs)
    return create_app(TranslationService(specs, settings or ServeSettings()))
