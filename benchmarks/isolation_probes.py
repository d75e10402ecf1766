"""Loopback probes of issue 31's data-side findings against real ``mlxrt serve`` processes: the
server's own origins (16), the state-changing GET (17), a second server on a memory folder
(13), adapter listing, remounts and ownership (15), IPv6 forms of private addresses (14), the
memory per API key and ``store: false`` (5), the response store's per-key cap (11).

Each line prints what was seen and what a closed finding shows; the last line counts the
requests sent and the 5xx among them. Tiny random checkpoints; nothing leaves loopback.

    python benchmarks/isolation_probes.py
"""

from __future__ import annotations

import hashlib
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving import free_port, start_server

MLXRT = str(Path(sys.executable).with_name("mlxrt"))
codes: list[int] = []


def call(method: str, url: str, **kw: Any) -> httpx.Response:
    resp = httpx.request(method, url, timeout=120, **kw)
    codes.append(resp.status_code)
    return resp


def show(finding: str, seen: Any, want: Any) -> None:
    print(f"{finding}: {seen} (closed: {want})")


def keyless(model: Path, roots: Path, tmp: Path) -> None:
    port, memory = free_port(), tmp / "memory"
    server = start_server([MLXRT, "serve", str(model), "--memory-dir", str(memory), "--adapter-dir", str(roots)],
                          port)
    url = f"http://127.0.0.1:{port}"
    try:
        own = [call("DELETE", f"{url}/v1/adapters/x", headers={"origin": f"http://{name}:{port}"}).status_code
               for name in ("localhost", "[::1]", "127.0.0.1")]
        show("16 DELETE with Origin localhost, [::1], 127.0.0.1 on the served port", own, [404, 404, 404])
        other = [call("DELETE", f"{url}/v1/adapters/x", headers={"origin": origin}).status_code
                 for origin in ("http://evil.test", f"http://localhost:{port + 1}")]
        show("16 DELETE with another Origin", other, [403, 403])
        show("17 GET /v1/memory/synthesize, no Origin or Sec-Fetch-Site",
             call("GET", f"{url}/v1/memory/synthesize").status_code, 403)
        show("17 runs started by it", call("GET", f"{url}/v1/memory/status").json()["counts"]["runs"], 0)
        show("17 POST /v1/memory/synthesize?dry=1", call("POST", f"{url}/v1/memory/synthesize?dry=1",
                                                         json={}).status_code, 200)
        started = time.monotonic()
        try:
            second = subprocess.run([MLXRT, "serve", str(model), "--port", str(free_port()), "--memory-dir",
                                     str(memory)], capture_output=True, text=True, timeout=40)
            seen: Any = (second.returncode, round(time.monotonic() - started, 1),
                         second.stderr.strip().splitlines()[-1][:100])
        except subprocess.TimeoutExpired:
            seen = "still running after 40 s"
        show("13 a second server on the memory folder", seen, "exit 2 before loading, 'in use by another'")
        show("15 /v1/adapters/available (a symlink 'link' leads out of the root)",
             [r["id"] for r in call("GET", f"{url}/v1/adapters/available").json()["adapters"]], ["a"])
        call("POST", f"{url}/v1/adapters", json={"id": "a", "path": str(roots / "a")})
        show("15 the same folder under a new id", call("POST", f"{url}/v1/adapters", json={
            "id": "a2", "path": str(roots / "a")}).status_code, 400)
        modes = [oct(p.stat().st_mode & 0o777) for p in (memory, memory / "memory.sqlite3", memory / "vault")]
        show("5 modes of the folder, memory.sqlite3, vault", modes, ["0o700", "0o600", "0o700"])
    finally:
        server.terminate()
        server.wait(30)


def embedded_ipv4() -> None:
    from mlxrt.errors import InvalidRequest
    from mlxrt.loading.images import ImageLimits, ImageRef, load_image

    forms = ("64:ff9b::7f00:1", "2002:7f00:1::", "::7f00:1", "::ffff:127.0.0.1", "::ffff:0:7f00:1", "64:ff9b:1::a00:1")
    refused = 0
    for host in forms:
        try:
            load_image(ImageRef(where="probe", url=f"http://[{host}]:9/x.png"), ImageLimits(fetch_timeout=2))
        except InvalidRequest as exc:
            refused += "private or loopback" in exc.message
    show(f"14 image URLs at IPv6 forms of private IPv4 addresses refused (of {len(forms)})", refused, len(forms))


def keyed(model: Path, roots: Path, tmp: Path) -> None:
    port, memory = free_port(), tmp / "keyed"
    server = start_server([MLXRT, "serve", str(model), "--memory-dir", str(memory), "--adapter-dir", str(roots),
                           "--api-key", "key-a", "--api-key", "key-b", "--response-store-bytes", "1"], port)
    url = f"http://127.0.0.1:{port}"
    a, b = ({"Authorization": f"Bearer {k}"} for k in ("key-a", "key-b"))

    def chat(headers: dict[str, str], text: str) -> None:
        call("POST", f"{url}/v1/chat/completions", headers=headers, json={
            "model": "default", "max_tokens": 3, "messages": [{"role": "user", "content": text}]})

    def respond(headers: dict[str, str], text: str, **kw: Any) -> httpx.Response:
        return call("POST", f"{url}/v1/responses", headers=headers,
                    json={"model": "default", "input": text, "max_output_tokens": 3, **kw})

    try:
        chat(a, "Zebra Falcon's merger closes on March 3rd")
        chat(b, "Grace Hopper wrote a compiler")
        respond(b, "Secret Person must never be remembered", store=False)
        time.sleep(1)
        turns = tuple(call("GET", f"{url}/v1/memory/status", headers=h).json()["counts"]["turns"] for h in (a, b))
        show("5 turns in key A's and key B's memory (B's store: false not kept)", turns, (1, 1))
        part = memory / "callers" / hashlib.sha256(b"key-b").hexdigest()[:32] / "memory.sqlite3"
        rows = str(sqlite3.connect(part if part.exists() else memory / "memory.sqlite3")
                   .execute("SELECT messages FROM turns").fetchall())
        show("5 key B's store holds A's 'Zebra' / its own store: false 'Secret'", ("Zebra" in rows, "Secret" in rows),
             (False, False))
        kept = respond(a, "keep this").json()["id"]
        for i in range(20):
            respond(b, f"flood {i}")
        show("11 key A's stored response after 20 of key B's (cap 1 byte)",
             call("GET", f"{url}/v1/responses/{kept}", headers=a).status_code, 200)
        call("POST", f"{url}/v1/adapters", headers=a, json={"id": "mine", "path": str(roots / "a")})

        def complete(headers: dict[str, str]) -> int:
            return call("POST", f"{url}/v1/completions", headers=headers, json={
                "model": "default", "prompt": "hi", "max_tokens": 2, "adapter": "mine"}).status_code

        seen = (complete(b), [x["id"] for x in call("GET", f"{url}/v1/adapters", headers=b).json()["adapters"]],
                call("DELETE", f"{url}/v1/adapters/mine", headers=b).status_code)
        show("15 key B uses / lists / unmounts key A's adapter", seen, (400, [], 404))
        show("15 key A still uses it", complete(a), 200)
    finally:
        server.terminate()
        server.wait(30)


def main() -> None:
    from mlxrt.testing import write_random_adapter, write_tiny_checkpoint

    tmp = Path(tempfile.mkdtemp())
    model = write_tiny_checkpoint(tmp / "qwen3", "qwen3")
    roots = tmp / "adapters"
    write_random_adapter(roots / "a", model, seed=1, rank=2)
    (roots / "link").symlink_to(write_random_adapter(tmp / "outside" / "evil", model, seed=2, rank=2))
    keyless(model, roots, tmp)
    embedded_ipv4()
    keyed(model, roots, tmp)
    print(f"requests {len(codes)}, 5xx {sum(c >= 500 for c in codes)}")


if __name__ == "__main__":
    main()
