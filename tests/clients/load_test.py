"""Load test: 32 concurrent streaming clients x 20 requests each against `redline serve`.

Asserts zero errors, that every stream ends with [DONE] and its usage, and that the
server's resident memory after the run is flat against a warmed-up baseline. Reports
p50/p99 time to first token. Env: REDLINE_URL, REDLINE_KEY, REDLINE_PID.
"""

import asyncio
import json
import os
import statistics
import sys
import time

import httpx

URL = os.environ["REDLINE_URL"]
KEY = os.environ["REDLINE_KEY"]
PID = int(os.environ["REDLINE_PID"])
CLIENTS = int(os.environ.get("LOAD_CLIENTS", 32))
REQUESTS = int(os.environ.get("LOAD_REQUESTS", 20))
MAX_TOKENS = 16


def rss_kib():
    with open(f"/proc/{PID}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def one(client, i, j):
    body = {"messages": [{"role": "user", "content": f"Story {i}-{j} about a dog."}], "max_tokens": MAX_TOKENS,
            "stream": True, "stream_options": {"include_usage": True}, "temperature": 0.8}
    t0 = time.perf_counter()
    ttft = None
    usage = None
    done = False
    async with client.stream("POST", URL + "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {await r.aread()}")
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise RuntimeError(chunk["error"])
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content") and ttft is None:
                ttft = time.perf_counter() - t0
            if chunk.get("usage"):
                usage = chunk["usage"]
    if not done or usage is None or usage["completion_tokens"] < 1:
        raise RuntimeError(f"stream ended early: done={done} usage={usage}")
    return ttft if ttft is not None else time.perf_counter() - t0, usage["completion_tokens"]


async def client_loop(client, i, results, errors):
    for j in range(REQUESTS):
        try:
            results.append(await one(client, i, j))
        except Exception as e:  # noqa: BLE001 - every failure counts
            errors.append(f"client {i} request {j}: {e!r}")


async def round_of(n_clients, n_requests):
    global REQUESTS
    REQUESTS = n_requests
    results, errors = [], []
    limits = httpx.Limits(max_connections=n_clients + 4)
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {KEY}"}, timeout=300, limits=limits) as client:
        await asyncio.gather(*(client_loop(client, i, results, errors) for i in range(n_clients)))
    return results, errors


def main():
    total_requests = REQUESTS
    # Warm up: every slot allocates its cache, allocator pools fill.
    _, errors = asyncio.run(round_of(CLIENTS, 2))
    if errors:
        sys.exit("warm-up errors:\n" + "\n".join(errors[:10]))
    base = rss_kib()
    t0 = time.perf_counter()
    results, errors = asyncio.run(round_of(CLIENTS, total_requests))
    wall = time.perf_counter() - t0
    time.sleep(0.5)
    after = rss_kib()
    ttfts = sorted(r[0] for r in results)
    tokens = sum(r[1] for r in results)
    p50 = statistics.median(ttfts)
    p99 = ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))]
    print(f"load: {CLIENTS} clients x {total_requests} streaming requests = {len(results)} ok, {len(errors)} errors, "
          f"{wall:.1f}s, {tokens / wall:.0f} generated tok/s")
    print(f"load: time to first token p50 {p50 * 1e3:.0f} ms, p99 {p99 * 1e3:.0f} ms")
    print(f"load: server RSS {base / 1024:.1f} MiB after warm-up, {after / 1024:.1f} MiB after the run")
    if errors:
        sys.exit("errors:\n" + "\n".join(errors[:20]))
    if len(results) != CLIENTS * total_requests:
        sys.exit(f"expected {CLIENTS * total_requests} results, got {len(results)}")
    # Flat: no growth beyond noise (allocator slack), not proportional to requests served.
    if after > base * 1.10 + 16 * 1024:
        sys.exit(f"server memory grew from {base} KiB to {after} KiB")
    metrics = httpx.get(URL + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    for line in metrics.splitlines():
        if line.startswith(("redline_queue_depth ", "redline_slots_busy ")) and float(line.split()[1]) != 0:
            sys.exit(f"server not idle after the run: {line}")
    print("load: passed")


if __name__ == "__main__":
    main()
