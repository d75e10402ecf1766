"""Issue 31's edge probes, rerun: each starts `mlxrt serve` on a tiny random-weight checkpoint on
a free loopback port, attacks it the way the issue did (bounded counts, loopback only, every
socket closed at the end) and prints one markdown row per probe: requests tried, 5xx seen, the
server's RSS and threads before and after, and what was observed.

    python benchmarks/edge_probes.py                 # every probe
    python benchmarks/edge_probes.py --only cache,stall
    python benchmarks/edge_probes.py --stalled 1100  # the issue's count (needs ~1,200 open files)

Probes: cache (finding 1), count_tokens / embeddings (2, 10), stall (3), images (7),
template (8), log (9), config (19).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving import free_port
from slow_clients import wait_healthy

BIN = str(Path(sys.executable).with_name("mlxrt"))
HI = [{"role": "user", "content": "hi"}]
SPIN = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}{{ messages[0].content }}"


class Server:
    def __init__(self, model: Path, *args: str, log: Path | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        out = open(log, "w") if log else subprocess.DEVNULL
        self.proc = subprocess.Popen([BIN, "serve", str(model), "--port", str(self.port), *args],
                                     stdout=out, stderr=subprocess.STDOUT, cwd="/")
        wait_healthy(self.url, self.proc)

    def status(self) -> tuple[float, int]:
        """RSS (MB) and threads of the server process."""
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines())
        return int(fields["VmRSS"].split()[0]) / 1024, int(fields["Threads"])

    def stop(self) -> float:
        """SIGTERM; seconds until the process exited (killed after 30 s)."""
        started = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return time.monotonic() - started


class Probe:
    def __init__(self, server: Server) -> None:
        self.server, self.tried, self.errors = server, 0, 0
        self.before = server.status()

    def post(self, path: str, timeout: float = 60, **kw) -> httpx.Response:
        self.tried += 1
        resp = httpx.post(self.server.url + path, timeout=timeout, **kw)
        self.errors += resp.status_code >= 500
        return resp

    def row(self, name: str, seen: str) -> str:
        after = self.server.status()
        return (f"| {name} | {self.tried} | {self.errors} | {self.before[0]:.0f} → {after[0]:.0f} | "
                f"{self.before[1]} → {after[1]} | {seen} |")


def cache(ckpt: dict[str, Path]) -> str:
    guessers = ["key-two", "key-three", "key-four"]  # one per guess: a key's own earlier guesses do hit
    server = Server(ckpt["llama"], "--api-key", "key-one", *(a for k in guessers for a in ("--api-key", k)))
    try:
        probe = Probe(server)
        memo = ("Board memo: the merger with Zebrafalcon Corp closes on March 3rd, price 412 million. " * 40)

        def ask(key: str, system: str) -> tuple[int, str, float]:
            started = time.monotonic()
            resp = probe.post("/v1/chat/completions", headers={"authorization": f"Bearer {key}"},
                              json={"messages": [{"role": "system", "content": system}, *HI], "max_tokens": 1})
            took = time.monotonic() - started
            return resp.json()["usage"]["prompt_tokens_details"]["cached_tokens"], resp.headers["x-mlxrt-cache"], took

        ask("key-one", memo)
        own = ask("key-one", memo)
        guesses = [ask(k, g) for k, g in zip(guessers, (memo, memo.replace("412", "413"),
                                                         memo.replace("Zebrafalcon", "Quokka")), strict=True)]
        seen = (f"key one's repeat: cached {own[0]} ({own[2]:.2f} s); other keys' guesses (exact, price, company) "
                f"cached {[g[0] for g in guesses]} ({', '.join(f'{g[2]:.2f}' for g in guesses)} s), "
                f"header `{guesses[0][1]}`")
        return probe.row("1 prompt cache across keys", seen)
    finally:
        server.stop()


def health_latency(url: str, stop: threading.Event, out: list[float]) -> None:
    while not stop.is_set():
        started = time.monotonic()
        try:
            httpx.get(f"{url}/health", timeout=15)
        except httpx.HTTPError:
            pass
        out.append(time.monotonic() - started)
        time.sleep(0.1)


def long_text(ckpt: dict[str, Path]) -> list[str]:
    rows = []
    for name, model, path, body in (
        ("2 count_tokens, 31 MB", ckpt["llama"], "/v1/messages/count_tokens",
         {"model": "m", "messages": [{"role": "user", "content": "a " * (31 * 2**19)}]}),
        ("2 embeddings, 10 MB", ckpt["emb"], "/v1/embeddings", {"model": "m", "input": "a " * (5 * 2**20)}),
        ("10 embeddings, 10,000-deep array", ckpt["emb"], "/v1/embeddings", None),
    ):
        server = Server(model, "--model-fallback")
        try:
            probe = Probe(server)
            stop, health = threading.Event(), []
            watcher = threading.Thread(target=health_latency, args=(server.url, stop, health))
            watcher.start()
            started = time.monotonic()
            if body is None:
                raw = b'{"model": "m", "input": "hi", "extra": ' + b"[" * 10_000 + b"]" * 10_000 + b"}"
                resp = probe.post(path, content=raw, headers={"content-type": "application/json"})
            else:
                resp = probe.post(path, json=body)
            took = time.monotonic() - started
            time.sleep(0.5)
            stop.set()
            watcher.join()
            rows.append(probe.row(name, f"{resp.status_code} `{resp.json()['error'].get('code')}` in {took:.2f} s; "
                                        f"/health worst {max(health):.2f} s"))
        finally:
            server.stop()
    return rows


def stall(ckpt: dict[str, Path], count: int) -> str:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, count + 256)), hard))  # ours and the server's
    server = Server(ckpt["llama"], "--model-fallback", "--body-timeout", "5")
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            b"content-length: 200\r\n\r\n{")
    sockets: list[socket.socket] = []
    try:
        probe = Probe(server)
        for _ in range(count):
            try:
                s = socket.create_connection(("127.0.0.1", server.port), timeout=2)
                s.sendall(head)
                sockets.append(s)
            except OSError:
                break
        served = sum(httpx.get(f"{server.url}/health", timeout=5).status_code == 200 for _ in range(10))
        chat = probe.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 2}).status_code
        time.sleep(6.5)
        still_open = 0
        for s in sockets:
            s.settimeout(0.05)
            try:
                while s.recv(4096):
                    pass
            except TimeoutError:
                still_open += 1
            except OSError:
                pass
        return probe.row(f"3 stalled bodies ×{len(sockets)}", f"/health {served}/10 and chat {chat} while held; "
                                                               f"{still_open} still open 6.5 s later (--body-timeout 5)")
    finally:
        for s in sockets:
            s.close()
        server.stop()


def images(ckpt: dict[str, Path], concurrent: int) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8000, 5000), (20, 120, 200)).save(buf, format="PNG")  # 40 MP, ~60 KB
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    server = Server(ckpt["gemma4"], "--model-fallback", "--max-image-pixels", "50000000")
    try:
        probe = Probe(server)
        peak, done = [probe.before[0]], threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak.append(server.status()[0])
                time.sleep(0.05)

        sampler = threading.Thread(target=sample)
        sampler.start()
        statuses: list[int] = []
        body = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "?"}, {"type": "image_url", "image_url": {"url": url}}]}]}
        workers = [threading.Thread(target=lambda: statuses.append(probe.post("/v1/chat/completions", json=body,
                                                                              timeout=300).status_code))
                   for _ in range(concurrent)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        done.set()
        sampler.join()
        return probe.row(f"7 {concurrent} concurrent 40 MP PNGs", f"statuses {sorted(statuses)}; RSS peak {max(peak):.0f} MB")
    finally:
        server.stop()


def template(ckpt: dict[str, Path]) -> str:
    server = Server(ckpt["llama"], "--model-fallback", "--chat-template", SPIN, "--shutdown-grace", "1")
    probe = Probe(server)
    started = time.monotonic()
    try:
        resp = probe.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 2}, timeout=30)
        seen = f"{resp.status_code} after {time.monotonic() - started:.1f} s: {resp.json()['error']['message'][:70]}"
        probe.tried += 1
        try:
            httpx.post(f"{server.url}/v1/chat/completions", json={"messages": HI, "max_tokens": 2}, timeout=1)
        except httpx.TimeoutException:
            pass
        row = probe.row("8 template looping range(100000)²", seen)
    finally:
        exited = server.stop()
    return row[:-2] + f"; SIGTERM after a client left mid-render: exited in {exited:.1f} s |"


def log(ckpt: dict[str, Path], folder: Path) -> str:
    path = folder / "log.txt"
    server = Server(ckpt["llama"], "--model-fallback", log=path)
    probe = Probe(server)
    probe.tried += 1
    httpx.get(server.url + "/x%0aINFO%20mlxrt.access%20[req-1]:%20GET%20/forged%20200%0d%1b[31mred", timeout=5)
    row = probe.row("9 log injection", "")
    server.stop()
    text = path.read_text(errors="replace")
    forged = [ln for ln in text.splitlines() if "GET /forged" in ln and not ln.startswith("INFO mlxrt.access [req-")]
    return row[:-3] + f" forged lines {len(forged)}, raw ESC {text.count(chr(27))}, raw CR {text.count(chr(13))} |"


def config(ckpt: dict[str, Path], folder: Path) -> str:
    huge = folder / "huge"
    shutil.copytree(ckpt["llama"], huge)
    c = json.loads((huge / "config.json").read_text())
    (huge / "config.json").write_text(json.dumps({**c, "num_hidden_layers": 10_000}))
    server = Server(ckpt["llama"], "--no-strict-model")
    try:
        probe = Probe(server)
        started = time.monotonic()
        resp = probe.post("/v1/chat/completions", json={"model": str(huge), "messages": HI, "max_tokens": 1})
        took = time.monotonic() - started
        time.sleep(0.5)
        return probe.row("19 config.json of 10,000 layers", f"{resp.status_code} `{resp.json()['error']['code']}` "
                                                            f"in {took:.2f} s")
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="cache,text,stall,images,template,log,config")
    parser.add_argument("--stalled", type=int, default=1100)
    parser.add_argument("--images", type=int, default=8)
    args = parser.parse_args()
    from mlxrt.testing import write_tiny_checkpoint

    only = set(args.only.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        ckpt = {name: write_tiny_checkpoint(folder / name, kind)
                for name, kind in (("llama", "llama"), ("emb", "qwen3_embedding"), ("gemma4", "gemma4"))}
        print("| probe | requests | 5xx | RSS MB | threads | observed |\n|---|---|---|---|---|---|")
        for name, run in (("cache", lambda: [cache(ckpt)]), ("text", lambda: long_text(ckpt)),
                          ("stall", lambda: [stall(ckpt, args.stalled)]),
                          ("images", lambda: [images(ckpt, args.images)]), ("template", lambda: [template(ckpt)]),
                          ("log", lambda: [log(ckpt, folder)]), ("config", lambda: [config(ckpt, folder)])):
            if name in only:
                for row in run():
                    print(row, flush=True)


if __name__ == "__main__":
    main()
