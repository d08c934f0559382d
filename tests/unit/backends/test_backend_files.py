"""The pre-flight of a backend config: the local files its server would read, and its rules.

`backends.preflight` runs before a search starts anything (for a local cluster: the servers
run on this machine) and in `python -m specdecode_tune.trial`: a missing model, draft or
tokenizer is one ConfigError line, not a boot failure inside Ray. A Hugging Face hub id is
never refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from specdecode_tune import trial
from specdecode_tune.backends import preflight
from specdecode_tune.config import BackendConfig
from specdecode_tune.errors import ConfigError


def cfg(kind: str, **kw: object) -> BackendConfig:
    base: dict[str, object] = {"kind": kind, "model_path": "Qwen/Qwen3.5-122B",
                               "speculative_algorithm": "ngram" if kind != "sglang" else "EAGLE3"}
    base.update(kw)
    return BackendConfig(**base)  # type: ignore[arg-type]


def refused(c: BackendConfig) -> str:
    with pytest.raises(ConfigError) as info:
        preflight(c)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
@pytest.mark.parametrize("hub_id", ["Qwen/Qwen3.5-122B", "gpt2", "org/model-v1.5_x"])
def test_hub_ids_are_not_local_paths(kind: str, hub_id: str) -> None:
    preflight(cfg(kind, model_path=hub_id, draft_model_path=hub_id))


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
def test_a_missing_local_model_or_draft(kind: str, tmp_path: Path) -> None:
    msg = refused(cfg(kind, model_path=str(tmp_path / "none")))
    assert msg == (f"backend.model_path = {str(tmp_path / 'none')!r}: no such file or folder; "
                   f"allowed: a local model folder or file, or a Hugging Face hub id (org/name)")
    msg = refused(cfg(kind, model_path=str(tmp_path), draft_model_path="./no-draft"))
    assert msg.startswith("backend.draft_model_path = './no-draft': no such file or folder")
    # a draft without speculation is never read
    preflight(cfg(kind, model_path=str(tmp_path), draft_model_path="./no-draft",
                  speculative_algorithm=None))


def test_a_local_folder_model_and_tokenizer_pass(tmp_path: Path) -> None:
    preflight(cfg("sglang", model_path=str(tmp_path), flags={"tokenizer_path": str(tmp_path)}))
    preflight(cfg("vllm", model_path=str(tmp_path), flags={"tokenizer": str(tmp_path)}))


def test_missing_tokenizers() -> None:
    assert refused(cfg("sglang", flags={"tokenizer_path": "/no/tok"})).startswith(
        "backend.flags.tokenizer_path = '/no/tok': no such file or folder")
    assert refused(cfg("vllm", flags={"tokenizer": "../no/tok"})).startswith(
        "backend.flags.tokenizer = '../no/tok': no such file or folder")


def test_the_cache_variable_is_expanded_and_both_forms_are_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path))
    msg = refused(cfg("vllm", model_path="${SPECDECODE_CACHE}/models/hf"))
    assert msg.startswith(f"backend.model_path = '${{SPECDECODE_CACHE}}/models/hf' "
                          f"({tmp_path}/models/hf): no such file or folder"), msg
    (tmp_path / "models" / "hf").mkdir(parents=True)
    preflight(cfg("vllm", model_path="${SPECDECODE_CACHE}/models/hf"))


def test_llamacpp_model_is_always_a_local_gguf_file(tmp_path: Path) -> None:
    # llama-server --model takes a file: even a hub-id-like name is a (missing) local path
    assert refused(cfg("llamacpp", model_path="org/model.gguf")) == (
        "backend.model_path = 'org/model.gguf': no such file or folder; allowed: a GGUF model "
        "file (llama-server --model)")
    assert refused(cfg("llamacpp", model_path=str(tmp_path))).startswith(
        f"backend.model_path = {str(tmp_path)!r}: is a directory; allowed: a GGUF model file")
    model = tmp_path / "m.gguf"
    model.write_bytes(b"")
    preflight(cfg("llamacpp", model_path=str(model)))


def test_llamacpp_draft_and_file_flags(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"")
    assert refused(cfg("llamacpp", model_path=str(model), speculative_algorithm="draft",
                       draft_model_path="/no/draft.gguf")).startswith(
        "backend.draft_model_path = '/no/draft.gguf': no such file or folder; allowed: a GGUF "
        "model file (llama-server --spec-draft-model)")
    # n-gram speculation reads no draft
    preflight(cfg("llamacpp", model_path=str(model), draft_model_path="/no/draft.gguf"))
    assert refused(cfg("llamacpp", model_path=str(model),
                       flags={"chat_template_file": "/no/t.jinja"})).startswith(
        "backend.flags.chat_template_file = '/no/t.jinja': no such file or folder; allowed: a "
        "file (llama-server --chat-template-file)")


def test_llamacpp_rules_are_checked_even_with_a_binary() -> None:
    msg = refused(cfg("llamacpp", model_path="/no/m.gguf", binary="/opt/llama-server",
                      speculative_algorithm="lookahead"))
    assert msg.startswith("backend.speculative_algorithm = 'lookahead': llama.cpp takes one of")


def test_a_joined_cluster_s_files_are_not_checked_here() -> None:
    preflight(cfg("llamacpp", model_path="/on/the/workers.gguf"), local=False)
    with pytest.raises(ConfigError, match="lookahead"):
        preflight(cfg("llamacpp", speculative_algorithm="lookahead"), local=False)


def test_the_simulator_reads_no_model_but_its_profile(tmp_path: Path) -> None:
    preflight(cfg("sim", model_path="/no/such/model", draft_model_path="/no/draft"))
    bad = tmp_path / "bad.toml"
    bad.write_text("name = [unclosed")
    with pytest.raises(ConfigError, match=r"bad\.toml: not valid TOML"):
        preflight(cfg("sim", profile=str(bad)))


def test_the_trial_command_refuses_a_missing_model_before_booting(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    exp = tmp_path / "exp.toml"
    exp.write_text("\n".join([
        'name = "t"', "[backend]", 'kind = "llamacpp"', 'binary = "/bin/sh"',
        f'model_path = "{tmp_path}/none.gguf"', 'speculative_algorithm = "ngram"',
        "[space.speculative_num_steps]", 'type = "int"', "low = 1", "high = 4",
        "[measure]", "concurrency = [1]", ""]))
    before = sorted(tmp_path.rglob("*"))
    code = trial.main(["--experiment", str(exp), "--run-dir", str(tmp_path / "run")])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err == (f"error: backend.model_path = '{tmp_path}/none.gguf': no such file or "
                   f"folder; allowed: a GGUF model file (llama-server --model)\n")
    assert sorted(tmp_path.rglob("*")) == before
