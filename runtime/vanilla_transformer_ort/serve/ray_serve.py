"""Scale-out on Ray Serve: the same app as N replicas (bulk translation with Ray Data is `bulk_ray.py`).

Ray Serve runs `build_app` once per replica (each loads its own sessions and batches the requests Ray's proxy routes
to it, so the app's own cross-request batching applies inside every replica; Ray's `@serve.batch` is not used on
top). `vt-serve FOLDER --ray_replicas N` starts it on a local Ray instance, or on a running cluster with
`--ray_address auto`. Needs the `ray` extra: `pip install "./runtime[cpu,serve,ray]"` from a checkout.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence

from . import build_app
from .models import check_unique, parse_model_spec
from .settings import ServeSettings

logger = logging.getLogger(__name__)
DEPLOYMENT_NAME = "vt_translator"
APP_NAME = "vt_serve"


def deployment(models: Sequence[str], settings: ServeSettings, replicas: int, cpus_per_replica: float = 1.0):
    """A bound Ray Serve application: `replicas` copies of the app serving `models` (FOLDER or SRC-TGT=FOLDER)."""
    from ray import serve

    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    # Check the folders here, where the command runs, so a typo fails at once and not inside every replica; the
    # replicas get absolute paths (their working directory is Ray's).
    specs = [parse_model_spec(model) for model in models]
    check_unique(specs)
    resolved = [f"{spec.pair}={spec.folder.resolve()}" for spec in specs]
    # A replica is a Ray actor process already: its sessions run in its threads, and Ray places the replicas. A
    # translated file waits on the replica that made it, where Ray's proxy may not route its download: with more
    # than one replica, /translate_file is off (403, and the web page hides its file tab).
    settings = dataclasses.replace(
        settings, session_workers="thread", files_translation=settings.files_translation and replicas == 1
    )

    def builder():  # a plain function: Ray Serve calls it on each replica to build the ASGI app there
        return build_app(resolved, settings)

    ingress = serve.ingress(builder)()
    return serve.deployment(
        ingress,
        name=DEPLOYMENT_NAME,
        num_replicas=replicas,
        ray_actor_options={"num_cpus": cpus_per_replica},
        max_ongoing_requests=max(settings.max_queue, 1),
    ).bind()


def run_ray_serve(
    models: Sequence[str],
    settings: ServeSettings,
    *,
    replicas: int,
    host: str = "127.0.0.1",
    port: int = 8000,
    address: str | None = None,
    cpus_per_replica: float = 1.0,
    block: bool = True,
):
    """Start Ray (or join `address`), deploy the app with `replicas` replicas on `host:port`, and, with `block`,
    serve until interrupted. Returns the app's handle when not blocking."""
    import ray
    from ray import serve

    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": host, "port": port})
    app = deployment(models, settings, replicas, cpus_per_replica)
    handle = serve.run(app, name=APP_NAME, route_prefix="/")
    logger.info("Ray Serve: %d replica(s) on http://%s:%d", replicas, host, port)
    if not block:
        return handle
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        serve.shutdown()
    return None
