"""Load benchmark of `vt-serve`: closed-loop clients against a fresh server for each of `--modes`, and open-loop
(Poisson) arrivals at fractions of its capacity; what each row measures: docs/serving.md#load-benchmark."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from benchmarks.common import machine_info, process_tree, read_tsv, save_results

# --modes: the name a row carries and the server's flags
MODES = {
    "batching": ("batching", ["--no_step_batching"]),
    "step": ("step-level", ["--step_batching"]),
    "off": ("batching off", ["--no_batching"]),
}
DEFAULT_TEXTS = Path(__file__).resolve().parents[2] / "shared" / "data" / "gettext-en-de" / "test.tsv"
# The settings that make two runs the same run: a run replaces the earlier one of its settings.
SETTINGS = ("model", "num_beams", "server_args", "modes", "clients", "open_loop", "capacity", "paragraphs", "seconds")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and its live descendants, threads included (Linux /proc)."""
    total = 0.0
    for member in process_tree(pid):
        try:
            fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # it ended meanwhile
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def start_server(model: str, port: int, extra: list[str]) -> subprocess.Popen:
    command = [sys.executable, "-m", "vanilla_transformer_ort.serve", model, "--port", str(port), "--log_level"]
    command += ["warning", *extra]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_ready(url: str, process: subprocess.Popen | None = None, timeout: float = 120) -> None:
    """Poll `url`/ready until it answers 200; raise if the server's `process` (if any) exits or `timeout` s pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"vt-serve exited with status {process.returncode}")
        try:
            if httpx.get(f"{url}/ready", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} not ready after {timeout} s")


async def drive(url: str, pair: tuple[str, str], texts: list[str], clients: int, seconds: float, seed: int) -> dict:
    """`clients` closed-loop clients for `seconds`: latencies of the answered requests and the failures."""
    rng = random.Random(seed)
    order = texts[:]
    rng.shuffle(order)
    latencies: list[float] = []
    failures = 0
    counter = iter(range(10**9))
    stop = time.monotonic() + seconds

    async def one_client():
        # A connection per client, as separate users have (a shared pool throttled the load generator).
        nonlocal failures
        async with httpx.AsyncClient(base_url=url, timeout=120, limits=httpx.Limits(max_connections=1)) as client:
            while time.monotonic() < stop:
                text = order[next(counter) % len(order)]
                started = time.perf_counter()
                try:
                    answer = await client.post("/translate", json={"q": text, "source": pair[0], "target": pair[1]})
                    ok = answer.status_code == 200
                except httpx.HTTPError:
                    ok = False
                if ok:
                    latencies.append(time.perf_counter() - started)
                else:
                    failures += 1

    started = time.perf_counter()
    await asyncio.gather(*(one_client() for _ in range(clients)))
    wall = time.perf_counter() - started
    return {
        "clients": clients,
        "answered": len(latencies),
        "failed": failures,
        "seconds": wall,
        "sentences_per_s": len(latencies) / wall,
        "p50_ms": 1000 * statistics.median(latencies) if latencies else None,
        "p99_ms": 1000 * percentile(latencies, 0.99) if latencies else None,
    }


def arrival_times(rate: float, seconds: float, seed: int) -> list[float]:
    """Offsets (seconds) of a Poisson stream of `rate` requests/s over `seconds`: exponential gaps."""
    rng = random.Random(seed)
    times, now = [], rng.expovariate(rate)
    while now < seconds:
        times.append(now)
        now += rng.expovariate(rate)
    return times


def with_paragraphs(texts: list[str], share: float, count: int, seed: int) -> list[tuple[str, bool]]:
    """`count` requests cycled from `texts`, a `share` of them paragraphs of 5-8 texts joined: (text, is_line)."""
    rng = random.Random(seed)
    requests = []
    for index in range(count):
        if rng.random() < share:
            requests.append((" ".join(rng.choice(texts) for _ in range(rng.randint(5, 8))), False))
        else:
            requests.append((texts[(index * 7919) % len(texts)], True))
    return requests


def percentile(values: list[float], q: float) -> float | None:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else None


async def post_once(host: str, port: int, path: str, payload: dict) -> int:
    """One POST on a connection of its own, written and read with asyncio streams; the status code. An open loop
    has thousands of requests in flight: one httpx pool of that many connections cost the load generator most of a
    core at 150 % of capacity, and its rows then measured the generator (as a shared pool did for closed loops)."""
    body = json.dumps(payload).encode()
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        status = int((await reader.readline()).split()[1])
        await reader.read()  # the rest of the answer, until the server closes
        return status
    finally:
        writer.close()


async def open_loop(url: str, pair: tuple[str, str], texts: list[str], rate: float, seconds: float, share: float,
                    seed: int) -> dict:  # fmt: skip
    """Poisson arrivals at `rate` requests/s for `seconds`; every request is sent at its time, answered or not."""
    times = arrival_times(rate, seconds, seed)
    requests = with_paragraphs(texts, share, len(times), seed)
    answered: list[tuple[float, bool]] = []  # (latency, is a one-line request)
    refused: list[float] = []
    errors = 0
    address = httpx.URL(url)

    async def one(offset: float, text: str, is_line: bool) -> None:
        nonlocal errors
        await asyncio.sleep(max(0.0, offset - (time.perf_counter() - start)))
        sent = time.perf_counter()
        payload = {"q": text, "source": pair[0], "target": pair[1]}
        try:
            status = await asyncio.wait_for(post_once(address.host, address.port, "/translate", payload), 120)
        except (OSError, ValueError, IndexError, asyncio.TimeoutError):
            errors += 1
            return
        latency = time.perf_counter() - sent
        if status == 200:
            answered.append((latency, is_line))
        elif status in (429, 503):
            refused.append(latency)
        else:
            errors += 1

    start = time.perf_counter()
    await asyncio.gather(*(one(t, text, line) for t, (text, line) in zip(times, requests, strict=True)))
    wall = time.perf_counter() - start
    latencies = [latency for latency, _ in answered]
    lines = [latency for latency, is_line in answered if is_line]
    ms = lambda value: None if value is None else 1000 * value  # noqa: E731
    return {
        "offered_per_s": len(times) / seconds,
        "achieved_per_s": len(answered) / wall,
        "answered": len(answered),
        "refused": len(refused),
        "errors": errors,
        "p50_ms": ms(percentile(latencies, 0.5)),
        "p99_ms": ms(percentile(latencies, 0.99)),
        "max_ms": ms(max(latencies, default=None)),
        "lines_p99_ms": ms(percentile(lines, 0.99)),
        "refused_p99_ms": ms(percentile(refused, 0.99)),
    }


def measured(process: subprocess.Popen, row) -> dict:
    """Run the coroutine `row` (one row of the table) and add the CPU cores the server and the load generator used."""
    before, generator_before = cpu_seconds(process.pid), time.process_time()
    started = time.perf_counter()
    result = asyncio.run(row)
    wall = time.perf_counter() - started
    return result | {"cpu_cores": (cpu_seconds(process.pid) - before) / wall,
                     "generator_cpu_cores": (time.process_time() - generator_before) / wall}  # fmt: skip


def run_mode(args, name: str, extra: list[str], texts: list[str], port: int) -> list[dict]:
    url = f"http://127.0.0.1:{port}"
    process = start_server(args.model, port, extra)
    try:
        wait_ready(url, process)
        languages = httpx.get(f"{url}/languages").json()
        source = next(language for language in languages if language["targets"])
        pair = (source["code"], source["targets"][0])
        asyncio.run(drive(url, pair, texts, 4, args.warmup, seed=0))  # warm-up: every session, allocator, cache
        rows = []
        for clients in args.clients:
            row = measured(process, drive(url, pair, texts, clients, args.seconds, seed=clients)) | {"mode": name}
            rows.append(row)
            single = rows[0]["p50_ms"] if rows[0]["clients"] == 1 else float("nan")
            print(f"{name:13s} {clients:4d} clients: {row['sentences_per_s']:7.1f} sentences/s, p50 "
                  f"{row['p50_ms']:7.1f} ms, p99 {row['p99_ms']:7.1f} ms ({row['p99_ms'] / single:.2f}x one at a "
                  f"time), failed {row['failed']}, CPU {row['cpu_cores']:.2f} cores (load generator "
                  f"{row['generator_cpu_cores']:.2f})", flush=True)  # fmt: skip
        if name != "batching off" and args.open_loop:
            capacity = args.capacity or rows[-1]["sentences_per_s"]  # else the largest --clients level
            for fraction in args.open_loop:
                rate = fraction * capacity
                row = measured(process, open_loop(url, pair, texts, rate, args.seconds, args.paragraphs, seed=1))
                rows.append(row | {"mode": f"open loop, {name}", "fraction": fraction, "paragraphs": args.paragraphs})
                ms = {key: f"{row[key] or 0:.0f} ms" for key in row if key.endswith("_ms")}
                print(f"{name}, open loop {fraction:4.0%} of {capacity:.0f}/s: offered {row['offered_per_s']:.1f}/s, "
                      f"achieved {row['achieved_per_s']:.1f}/s, p50 {ms['p50_ms']}, p99 {ms['p99_ms']}, max "
                      f"{ms['max_ms']}, one-line p99 {ms['lines_p99_ms']}, refused {row['refused']} (p99 "
                      f"{ms['refused_p99_ms']}), errors {row['errors']}, CPU {row['cpu_cores']:.2f} cores (load "
                      f"generator {row['generator_cpu_cores']:.2f})", flush=True)  # fmt: skip
        return rows
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:  # a server that does not drain in time must not outlive its rows
            for member in reversed(process_tree(process.pid)):
                with contextlib.suppress(OSError):
                    os.kill(member, signal.SIGKILL)
            process.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="export folder (or SRC-TGT=FOLDER) to serve")
    parser.add_argument("--texts", type=Path, default=DEFAULT_TEXTS, help="TSV with a header; column 1 is sent")
    parser.add_argument("--clients", type=int, nargs="*", default=[1, 8, 32, 128])
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds per level")
    parser.add_argument("--warmup", type=float, default=5.0, help="warm-up seconds per server")
    parser.add_argument("--num_beams", type=int, default=4)
    parser.add_argument("--server_args", default="", help="extra vt-serve flags, e.g. '--sessions 2 --threads 1' "
                        "(a single flag: --server_args=--no_batching)")  # fmt: skip
    parser.add_argument("--open_loop", type=float, nargs="*", default=[], help="Poisson rates: fractions of capacity")
    parser.add_argument("--capacity", type=float, help="requests/s the --open_loop fractions are of (else measured)")
    parser.add_argument("--paragraphs", type=float, default=0.0, help="share of open-loop requests: paragraphs")
    parser.add_argument(
        "--modes", nargs="+", default=["step", "batching", "off"], choices=list(MODES),
        help="servers to measure, one after the other: request-level batching, step-level (--step_batching), "
        "batching off (--no_batching)",
    )  # fmt: skip
    parser.add_argument("--port", type=int, default=5077)
    parser.add_argument(
        "--output", default="serve_load", help="results file: NAME (benchmarks/results/NAME.json) or a path"
    )
    args = parser.parse_args(argv)
    if args.open_loop and not (args.clients or args.capacity):
        parser.error("--open_loop needs a --clients level to measure capacity at, or --capacity")
    texts = read_tsv(args.texts)[0]
    common_flags = ["--num_beams", str(args.num_beams), *args.server_args.split()]
    rows = []
    for offset, mode in enumerate(args.modes):
        rows += run_mode(args, MODES[mode][0], [*common_flags, *MODES[mode][1]], texts, args.port + offset)
    save_results(args.output, "serve_load", argv, machine=machine_info(), settings={key: getattr(args, key) for key in
                 SETTINGS}, results={"rows": rows}, same_run=SETTINGS)  # fmt: skip


if __name__ == "__main__":
    main()
