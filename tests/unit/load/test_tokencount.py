"""A ShareGPT sample counted again by a server's tokenize endpoint (llama-server's shape),
served here by a small HTTP server on 127.0.0.1."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from specdecode_tune.backends import get_backend
from specdecode_tune.config import WorkloadSpec
from specdecode_tune.config import sharegpt as sg
from specdecode_tune.load import make_prompts
from specdecode_tune.load.tokencount import server_lengths
from specdecode_tune.load.workload import iter_prompts


class Tokenize(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert self.path == "/tokenize" and body["add_special"] is True
        tokens = [1] + [0] * len(body["content"].split())    # BOS + one per word
        data = json.dumps({"tokens": tokens}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Tokenize)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_the_servers_counts_replace_the_samples_and_filter_again(
        server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path / "cache"))
    sg._sample.cache_clear()
    rows = [{"id": f"c{i}", "conversations": [
        {"from": "human", "value": " ".join(["word"] * (5 + i))},
        {"from": "gpt", "value": " ".join(["answer"] * (10 + 10 * i))}]} for i in range(10)]
    f = tmp_path / "d.json"
    f.write_text(json.dumps(rows))
    spec = WorkloadSpec(kind="sharegpt", path=str(f), max_total_len=60)
    sample = spec.sharegpt_sample()
    endpoint = get_backend("llamacpp").tokenize
    lengths = server_lengths(server, endpoint, sample)
    assert lengths is not None
    # c_i: 6 + i prompt tokens, 11 + 10 i reply tokens; total <= 60 keeps i <= 3
    assert lengths == {f"c{i}": (6 + i, 11 + 10 * i) for i in range(4)
                       if f"c{i}" in {p.id for p in sample.prompts}}
    assert lengths and set(lengths) <= {p.id for p in sample.prompts}
    gen = iter_prompts(spec, 0, lengths)
    sent = [next(gen) for _ in range(20)]
    assert {p.prompt_id for p in sent} == set(lengths)
    assert all((p.input_len, p.output_len) == lengths[p.prompt_id] for p in sent)
    # without the server's counts: the sample's own (4 characters a token)
    by_id = {p.id: p for p in sample.prompts}
    assert all(p.output_len == by_id[p.prompt_id].output_len for p in make_prompts(spec, 5))


def test_no_answer_leaves_the_samples_counts(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path / "cache"))
    sample = WorkloadSpec(kind="sharegpt", max_prompts=3).sharegpt_sample()
    assert server_lengths("http://127.0.0.1:9", get_backend("vllm").tokenize, sample,
                          timeout_s=2.0) is None
    assert getattr(get_backend("sim"), "tokenize", None) is None
