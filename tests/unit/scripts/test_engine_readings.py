"""scripts/device/engine_readings.py is engine-neutral: which paths it reads of a live server
come from the backend (`raw_paths`, `load_path`, its API), not from SGLang's names in the
script. (The probe itself runs against a live server: tests/engine or the GPU route.)"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

from specdecode_tune.backends import BACKENDS

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "scripts" / "device" / "engine_readings.py"


def _readings():
    spec = importlib.util.spec_from_file_location("engine_readings", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["engine_readings"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("kind", sorted(BACKENDS))
def test_every_backend_names_what_the_probe_reads(kind: str) -> None:
    backend = BACKENDS[kind]
    assert backend.raw_paths and all(name and path.startswith("/")
                                     for name, path in backend.raw_paths)
    assert len({name for name, _ in backend.raw_paths}) == len(backend.raw_paths)
    assert backend.load_path.startswith("/")


def test_vllm_reads_its_own_paths_and_polls_its_gauges() -> None:
    er = _readings()
    vllm = BACKENDS["vllm"]
    assert dict(vllm.raw_paths)["v1_models.json"] == "/v1/models"
    assert vllm.load_path == "/metrics"
    keep = er.load_lines(vllm)
    assert keep("vllm:num_requests_running{engine=\"0\"} 3.0")
    assert keep("vllm:num_requests_waiting 0.0")
    assert not keep("vllm:num_requests_waiting_by_reason{reason=\"capacity\"} 0.0")
    assert not keep("vllm:spec_decode_num_drafts_total 7.0")
    assert not keep("# HELP vllm:num_requests_running Number of requests")
    # SGLang's /v1/loads answer is kept whole (0.5.11+; /get_load is its deprecated shim).
    assert er.load_lines(BACKENDS["sglang"]) is None
    assert BACKENDS["sglang"].load_path == "/v1/loads?include=core"


def test_the_script_names_no_engine_path_of_its_own() -> None:
    """No SGLang endpoint as a string in the code (the docstring may describe them)."""
    tree = ast.parse(SCRIPT.read_text())
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)}
    strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
               and isinstance(n.value, str) and id(n) not in docs]
    for path in ("/server_info", "/get_load", "/generate", "/v1/loads", "/model_info",
                 "/health_generate", "sglang:"):
        assert not any(path in s for s in strings), path
