"""Run llama.cpp's server test suite (tools/server/tests) against another server.

Only the harness is adapted, never a test body: a pytest plugin, loaded with ``-p``, replaces
``utils.ServerProcess.start`` (the command that starts llama-server, and its readiness check)
with one that starts SERVER on the test's port and waits until ``GET /health`` (or
``/v1/models``) answers 200, and ``ServerPreset.load_all`` (which pre-downloads llama.cpp's GGUF
test models) with nothing. From the test's settings the new start passes on only
``n_predict`` (as ``--max-tokens``), ``api_key`` (as ``--api-key``, mlxrt only),
``chat_template_file`` (the file's text as ``--chat-template``, read from llama.cpp's
``models/templates``, ``--templates``), a built-in template name (``chat_template``, as
``--chat-template NAME``, mlxrt only: mlxrt has llama-server's common names) and ``n_batch``
(llama-server's ``--batch-size``, the prompt tokens run per prefill step, as
``--prefill-step-size``, mlxrt only). A test that starts llama-server with ``--embeddings`` (the
``bert_bge_small`` presets of test_embedding.py) is served ``--embedding-model PATH`` instead
of ``--model`` when that is given (mlxrt only; default: the same model as every test). Tests whose
settings give the same command share one server process, started once (the suite's own
``DEBUG_EXTERNAL`` mode runs every test against one running server); a different command stops
it and starts the new one.

This script fetches nothing. Get the tests folder yourself (llama.cpp's
``tools/server/tests``) and a Python environment with its requirements.txt, then:

    python benchmarks/llama_server_tests.py TESTS_DIR --python /path/to/venv/bin/python \\
        --server mlxrt [--server-arg=--strict-model] [--model PATH] [--embedding-model PATH] \\
        [--templates DIR] [-k EXPR]
    python benchmarks/llama_server_tests.py TESTS_DIR --python ... --server mlx_lm --model PATH

It prints passed / failed / skipped per test file and in total (``--json`` for a record).
The default files are the OpenAI- and Anthropic-compatible ones (``DEFAULT_FILES``): the chat,
Responses, Anthropic Messages, completion and embedding files, and test_security.py (API keys as
OpenAI's client and Anthropic's ``x-api-key`` send them): the set whose counts come nearest
issue 30's figures (docs/benchmarks.md says how it was found).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

DEFAULT_FILES = ("test_chat_completion.py", "test_compat_oai_responses.py", "test_compat_anthropic.py",
                 "test_completion.py", "test_embedding.py", "test_security.py")

#: The pytest plugin written next to the run: it patches the suite's harness after utils imports.
PLUGIN = r'''
import json, os, subprocess, sys, time
import requests

#: The one server on the tests' port: (its command, its process). A test whose settings give the
#: same command reuses it (as the suite's own DEBUG_EXTERNAL mode reuses a running server).
running = {}


def stop_running():
    if running:
        args, process = running.pop("server")
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()


def pytest_configure(config):
    import utils

    command = json.loads(os.environ["LLAMA_TESTS_SERVER"])

    def start(self, timeout_seconds=180):
        # llama-server started with --embeddings (the bert_bge_small presets) serves an embedding model
        base = command["embedding_args"] if self.server_embeddings and command.get("embedding_args") else command["args"]
        args = [a.replace("{port}", str(self.server_port)) for a in base]
        if self.n_predict:
            args += ["--max-tokens", str(self.n_predict)]
        if self.api_key and command.get("mlxrt"):
            args += ["--api-key", self.api_key]
        if self.chat_template and command.get("mlxrt"):  # llama-server's built-in names: mlxrt has them too
            args += ["--chat-template", self.chat_template]
        if self.n_batch and command.get("mlxrt"):  # llama-server's --batch-size: prompt tokens per prefill step
            args += ["--prefill-step-size", str(self.n_batch)]
        if self.chat_template_file:  # a Jinja file of llama.cpp's models/templates: passed as its text
            path = os.path.join(os.environ["LLAMA_TESTS_TEMPLATES"], os.path.basename(self.chat_template_file))
            with open(path) as template:
                args += ["--chat-template", template.read()]
        self.process = None  # the suite's stop() then leaves the shared server alone
        if running and running["server"][0] == args and running["server"][1].poll() is None:
            return
        stop_running()
        with open(os.environ["LLAMA_TESTS_LOG"], "a") as log:
            log.write(f"\n### {os.environ.get('PYTEST_CURRENT_TEST', '')}\n$ {' '.join(args)}\n")
            log.flush()
            process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        running["server"] = (args, process)
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        deadline = time.time() + timeout_seconds
        while time.time() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"server exited {process.returncode}")
            for path in ("/health", "/v1/models"):
                try:
                    if requests.get(self.make_url(path), headers=headers, timeout=2).status_code == 200:
                        self.ready = True
                        return
                except requests.RequestException:
                    pass
            time.sleep(0.1)
        raise TimeoutError(f"server did not start within {timeout_seconds} seconds")

    utils.ServerProcess.start = start
    # A request the suite gives 600 s fails the same at REQUEST_TIMEOUT on a CPU-bound tiny server.
    method = utils.ServerProcess.make_request
    method.__defaults__ = tuple(int(os.environ["LLAMA_TESTS_REQUEST_TIMEOUT"]) if d == utils.DEFAULT_REQUEST_TIMEOUT
                                else d for d in method.__defaults__)
    utils.ServerPreset.load_all = staticmethod(lambda: None)


def pytest_unconfigure(config):
    stop_running()
'''


def server_command(kind: str, model: str | None, extra: list[str], embedding_model: str | None = None) -> dict:
    if kind == "mlxrt":
        mlxrt = shutil.which("mlxrt") or str(Path(sys.executable).with_name("mlxrt"))

        def serve(path: str | None) -> list[str]:
            return [mlxrt, "serve", *([path] if path else []), "--port", "{port}", *extra]

        return {"args": serve(model), "embedding_args": serve(embedding_model) if embedding_model else None,
                "mlxrt": True}
    if not model:
        raise SystemExit("--server mlx_lm needs --model PATH")
    if embedding_model:
        raise SystemExit("--embedding-model is for --server mlxrt (mlx_lm.server serves no embeddings)")
    return {"args": [sys.executable, "-m", "mlx_lm.server", "--model", model, "--port", "{port}", *extra],
            "mlxrt": False}


def counts(junit: Path) -> dict[str, dict[str, int]]:
    by_file: dict[str, dict[str, int]] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = case.get("classname", "").split(".")[-1] + ".py"
        row = by_file.setdefault(name, {"passed": 0, "failed": 0, "skipped": 0})
        if case.find("skipped") is not None:
            row["skipped"] += 1
        elif case.find("failure") is not None or case.find("error") is not None:
            row["failed"] += 1
        else:
            row["passed"] += 1
    return by_file


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tests", type=Path, help="llama.cpp's tools/server/tests folder (extracted)")
    parser.add_argument("--server", choices=["mlxrt", "mlx_lm"], default="mlxrt")
    parser.add_argument("--model", default=None, help="model to serve (mlxrt: default, the embedded SmolLM2)")
    parser.add_argument("--embedding-model", default=None,
                        help="model to serve where the test starts llama-server with --embeddings (the "
                             "bert_bge_small presets of test_embedding.py); default: --model, as every test")
    parser.add_argument("--server-arg", action="append", default=[], help="extra server flag (repeatable)")
    parser.add_argument("--python", default=sys.executable, help="the Python with the suite's requirements")
    parser.add_argument("--files", nargs="+", default=list(DEFAULT_FILES), help="test files under unit/")
    parser.add_argument("--deselect", action="append", default=[],
                        help="a test id (unit/FILE::NAME) not to run; reported as not run (repeatable)")
    parser.add_argument("--request-timeout", type=int, default=180,
                        help="seconds a non-streamed request may take (the suite's own: 600)")
    parser.add_argument("--templates", type=Path, default=None,
                        help="llama.cpp's models/templates folder (default: TESTS/../../../models/templates)")
    parser.add_argument("-k", dest="keyword", default=None, help="only tests matching this pytest -k expression")
    parser.add_argument("--log", type=Path, default=None, help="server output (default: a temp file)")
    parser.add_argument("--json", action="store_true", help="print the counts as JSON")
    opts = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="llama-server-tests-"))
    (work / "mlxrt_llama_harness.py").write_text(PLUGIN)
    log = opts.log or work / "server.log"
    junit = work / "junit.xml"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(work), str(opts.tests.resolve()), *filter(None, [os.environ.get("PYTHONPATH")])]), "LLAMA_TESTS_LOG": str(log),
           "LLAMA_TESTS_SERVER": json.dumps(server_command(opts.server, opts.model, opts.server_arg,
                                                             opts.embedding_model))}
    env.setdefault("PORT", "8080")
    env["LLAMA_TESTS_REQUEST_TIMEOUT"] = str(opts.request_timeout)
    env["LLAMA_TESTS_TEMPLATES"] = str((opts.templates or opts.tests / "../../../models/templates").resolve())
    subprocess.run([opts.python, "-m", "pytest", "-p", "mlxrt_llama_harness", "-q", "-p", "no:cacheprovider",
                    f"--junitxml={junit}", *(f"--deselect={d}" for d in opts.deselect),
                    *(["-k", opts.keyword] if opts.keyword else []),
                    *(f"unit/{f}" for f in opts.files)],
                   cwd=opts.tests, env=env)
    by_file = counts(junit)
    total = {k: sum(row[k] for row in by_file.values()) for k in ("passed", "failed", "skipped")}
    if opts.json:
        print(json.dumps({"server": opts.server, "args": opts.server_arg, "model": opts.model,
                          "embedding_model": opts.embedding_model, "files": by_file,
                          "total": total, "not_run": opts.deselect}, indent=1))
    else:
        for name, row in sorted(by_file.items()):
            print(f"{name:36} {row['passed']:4} passed {row['failed']:4} failed {row['skipped']:4} skipped")
        print(f"{'total':36} {total['passed']:4} passed {total['failed']:4} failed {total['skipped']:4} skipped")
        for test in opts.deselect:
            print(f"not run: {test}")
    print(f"server log: {log}", file=sys.stderr)


if __name__ == "__main__":
    main()
