"""The server's settings: limits, batching and sessions, each a `vt-serve` flag of the same name."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path


def usable_cores() -> int:
    """Cores this process may run on (the affinity mask where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


SESSION_WORKERS = ("process", "thread")  # where each session runs: a process of its own, or a thread of the server's


@dataclass
class ServeSettings:
    """What `create_app` needs besides the models.

    Limits answer LibreTranslate's statuses: a text over `char_limit` characters is a 400, more than `max_texts`
    texts or a body over `max_body_bytes` a 413, a full queue (`max_queue` segments waiting) a 429, a request not
    answered within `request_timeout` seconds a 503. Admission control: a request is a 503 at once, with a
    Retry-After, when the work queued before it would take more than `max_queue_seconds` to start at the service
    rate the server measures from its recent batches; what it accepts then starts within that bound. `sessions`
    onnxruntime sessions per model run batches side by side (default: 2 where there are 2 cores or more), each on
    `threads` intra-op threads (default: the usable cores shared out among the sessions): one batch's Python search
    steps overlap the other's kernels.
    `session_workers` "process" (the default) runs each session in a process of its own, so that no session's search
    step waits for another's, or for the event loop, on one interpreter lock (both choices measured in
    docs/experiments/serving-runs.md). "thread" keeps the sessions in
    this process: an fp32 folder's embedding table and onnxruntime's arena are then shared, for less memory.

    The web page at `/` waits `frontend_timeout` milliseconds after the last keystroke before it translates.
    `files_translation` turns on `POST /translate_file`: an upload over `max_file_bytes` bytes is a 413, and a
    translated file can be downloaded for `download_expiry` seconds, then it is deleted (all of them on shutdown).
    """

    char_limit: int = 5000
    max_texts: int = 1000
    max_body_bytes: int = 2 * 1024 * 1024
    max_queue: int = 4096
    request_timeout: float = 30.0
    max_queue_seconds: float = 10.0
    max_batch_tokens: int = 4096
    max_batch_size: int = 64
    step_batch_size: int = 16
    max_wait_ms: float = 5.0
    batching: bool = True
    step_batching: bool | None = None  # None: step-level wherever the folder and provider allow it
    sessions: int | None = None
    threads: int | None = None
    num_beams: int | None = None
    max_new_tokens: int | None = None
    provider: str = "cpu"
    protect_placeholders: bool = True
    session_workers: str = "process"
    api_keys: frozenset[str] = field(default_factory=frozenset)
    frontend_timeout: int = 500
    files_translation: bool = True
    max_file_bytes: int = 1024 * 1024
    download_expiry: float = 1800.0

    def __post_init__(self) -> None:
        positive = (
            "char_limit", "max_texts", "max_body_bytes", "max_queue", "max_batch_tokens", "max_batch_size",
            "step_batch_size", "max_file_bytes",
        )  # fmt: skip
        if self.sessions is None:
            self.sessions = min(2, usable_cores())
        for name in (*positive, "sessions"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.request_timeout <= 0:
            raise ValueError(f"request_timeout must be > 0 seconds, got {self.request_timeout}")
        if self.max_queue_seconds <= 0:
            raise ValueError(f"max_queue_seconds must be > 0 seconds, got {self.max_queue_seconds}")
        if self.download_expiry <= 0:
            raise ValueError(f"download_expiry must be > 0 seconds, got {self.download_expiry}")
        if self.frontend_timeout < 0:
            raise ValueError(f"frontend_timeout must be >= 0 milliseconds, got {self.frontend_timeout}")
        if self.max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must be >= 0, got {self.max_wait_ms}")
        if self.session_workers not in SESSION_WORKERS:
            raise ValueError(
                f"session_workers must be one of {', '.join(SESSION_WORKERS)}, got {self.session_workers!r}"
            )
        if self.step_batching and not self.batching:
            raise ValueError("step_batching batches requests together; it cannot be combined with batching=False")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if self.num_beams is not None and self.num_beams < 1:
            raise ValueError(f"num_beams must be >= 1, got {self.num_beams}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    @property
    def threads_per_session(self) -> int:
        return self.threads or max(1, usable_cores() // self.sessions)


def read_api_keys(path: str | os.PathLike) -> frozenset[str]:
    """One key a line; blank lines and lines starting with # are skipped. ValueError for a missing or empty file."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"API key file {path} does not exist")
    keys = {line.strip() for line in path.read_text(encoding="utf-8").splitlines()}
    keys = frozenset(key for key in keys if key and not key.startswith("#"))
    if not keys:
        raise ValueError(f"API key file {path} holds no key (one key a line)")
    return keys
