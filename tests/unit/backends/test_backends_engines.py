"""The llama.cpp, vLLM and SGLang backends: params -> argv, speculative config, environment,
and what the SGLang backend knows of SGLang's releases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdecode_tune import backends
from specdecode_tune.backends import (
    BACKENDS,
    get_backend,
    sglang,
    sglang_logs,
    sglang_python,
    sglang_releases,
)
from specdecode_tune.backends.llamacpp import spec_type
from specdecode_tune.backends.vllm import speculative_config
from specdecode_tune.config import BackendConfig
from specdecode_tune.config.reader import Table
from specdecode_tune.errors import ConfigError
from specdecode_tune.sim import releases as sim_releases
from specdecode_tune.sim.arguments import RADIX_SPEC_REFUSED, StartupError, normalize_params
from specdecode_tune.sim.profile import load_profile
from specdecode_tune.space import resolve


def llama_cfg(**kw: object) -> BackendConfig:
    base: dict[str, object] = {
        "kind": "llamacpp", "model_path": "/models/m.gguf", "speculative_algorithm": "ngram",
        "binary": "/opt/llama-server", "flags": {"ctx_size": 4096}}
    base.update(kw)
    return BackendConfig(**base)  # type: ignore[arg-type]


def vllm_cfg(**kw: object) -> BackendConfig:
    base: dict[str, object] = {
        "kind": "vllm", "model_path": "/models/hf", "speculative_algorithm": "ngram",
        "binary": "/venv/bin/python",
        "flags": {"prompt_lookup_max": 4, "prompt_lookup_min": 2, "max_model_len": 2048}}
    base.update(kw)
    return BackendConfig(**base)  # type: ignore[arg-type]


def argv(kind: str, cfg: BackendConfig, sampled: dict) -> list[str]:
    return get_backend(kind).argv(cfg, resolve(sampled, cfg.flags), "{port}")


def after(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_both_engines_are_registered() -> None:
    assert {"llamacpp", "vllm", "sglang", "sim"} <= set(BACKENDS)
    for kind in ("llamacpp", "vllm"):
        b = get_backend(kind)
        assert b.name == kind and b.health_path == "/health"


# ---------------------------------------------------------------------------------------------
# llama.cpp


def test_llamacpp_ngram_draft_length_goes_to_size_m_and_lookup_is_lowered_to_it() -> None:
    cfg = llama_cfg(flags={"spec_ngram_simple_size_n": 3, "parallel": 4})
    a = argv("llamacpp", cfg, {"speculative_num_steps": 8})
    assert a[:3] == ["/opt/llama-server", "--model", "/models/m.gguf"]
    assert after(a, "--spec-type") == "ngram-simple"
    assert after(a, "--spec-ngram-simple-size-m") == "8"
    assert after(a, "--spec-ngram-simple-size-n") == "3"
    assert a.count("--spec-ngram-simple-size-n") == 1        # the fixed flag is not repeated
    assert after(a, "--parallel") == "4" and "--metrics" in a
    assert a[-4:] == ["--host", "127.0.0.1", "--port", "{port}"]
    # a draft length below the lookup length would draft nothing: the lookup follows it down
    a = argv("llamacpp", cfg, {"speculative_num_steps": 2})
    assert after(a, "--spec-ngram-simple-size-n") == "2"
    # unset lookup length: llama.cpp's default 12, lowered to K
    a = argv("llamacpp", llama_cfg(), {"speculative_num_steps": 16})
    assert after(a, "--spec-ngram-simple-size-n") == "12"


def test_llamacpp_baseline_has_no_speculation_and_no_derived_params() -> None:
    a = argv("llamacpp", llama_cfg(), {"speculative_num_steps": 0})
    assert not any(x.startswith("--spec") for x in a)
    assert not any("speculative" in x for x in a)
    assert after(a, "--ctx-size") == "4096"


def test_llamacpp_max_running_requests_is_the_slot_count_and_mem_fraction_is_dropped() -> None:
    a = argv("llamacpp", llama_cfg(), {"speculative_num_steps": 4, "max_running_requests": 8,
                                       "mem_fraction_static": 0.8})
    assert after(a, "--parallel") == "8"
    assert not any("mem" in x for x in a)


def test_llamacpp_draft_model_and_other_ngram_types() -> None:
    cfg = llama_cfg(speculative_algorithm="draft", draft_model_path="/models/d.gguf")
    a = argv("llamacpp", cfg, {"speculative_num_steps": 5})
    assert after(a, "--spec-type") == "draft-simple"
    assert after(a, "--spec-draft-model") == "/models/d.gguf"
    assert after(a, "--spec-draft-n-max") == "5"
    a = argv("llamacpp", llama_cfg(speculative_algorithm="ngram-mod"),
             {"speculative_num_steps": 16})
    assert after(a, "--spec-ngram-mod-n-max") == "16"
    assert after(a, "--spec-ngram-mod-n-min") == "16"     # its default 48 lowered to K


@pytest.mark.parametrize("algo,words", [
    ("EAGLE3", "needs backend.draft_model_path"),
    ("medusa", "llama.cpp takes one of"),
])
def test_llamacpp_bad_algorithms_are_config_errors(algo: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        spec_type(llama_cfg(speculative_algorithm=algo))


def test_llamacpp_paths_expand_the_cache_variable(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path))
    cfg = llama_cfg(model_path="${SPECDECODE_CACHE}/models/m.gguf",
                    binary="${SPECDECODE_CACHE}/bin/llama-server")
    a = argv("llamacpp", cfg, {"speculative_num_steps": 0})
    assert a[0] == f"{tmp_path}/bin/llama-server"
    assert after(a, "--model") == f"{tmp_path}/models/m.gguf"
    # unset: the default cache folder
    monkeypatch.delenv("SPECDECODE_CACHE")
    a = argv("llamacpp", cfg, {"speculative_num_steps": 0})
    assert a[0] == str(Path.home() / ".cache/specdecode_tune/bin/llama-server")


def test_llamacpp_launch_command_is_a_shell_line_without_host_and_port() -> None:
    cmd = get_backend("llamacpp").launch_command(llama_cfg(),
                                                 resolve({"speculative_num_steps": 6}, {}))
    assert cmd.startswith("llama-server --model /models/m.gguf --spec-type ngram-simple "
                          "--spec-ngram-simple-size-m 6")
    assert "--port" not in cmd


# ---------------------------------------------------------------------------------------------
# vLLM


def test_vllm_module_form_with_speculative_config_json() -> None:
    a = argv("vllm", vllm_cfg(), {"speculative_num_steps": 5, "max_running_requests": 4,
                                  "mem_fraction_static": 0.85})
    assert a[:5] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server",
                     "--model", "/models/hf"]
    assert json.loads(after(a, "--speculative-config")) == {
        "method": "ngram", "num_speculative_tokens": 5,
        "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    assert after(a, "--max-num-seqs") == "4"
    assert after(a, "--gpu-memory-utilization") == "0.85"
    assert after(a, "--max-model-len") == "2048"
    # the lookup settings live in the JSON, never as flags; nor do the derived SGLang params
    assert not any(x.startswith(("--prompt-lookup", "--speculative-num", "--speculative-eagle"))
                   for x in a)


def test_vllm_backend_python_runs_the_module(monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path) -> None:
    """backend.python (the GPU route's engines/vllm/python wrapper): the module form through
    that Python, `${SPECDECODE_CACHE}` expanded; the program preflight checks is that Python."""
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path))
    cfg = vllm_cfg(binary=None, python="${SPECDECODE_CACHE}/engines/vllm/python")
    a = argv("vllm", cfg, {"speculative_num_steps": 2})
    assert a[:5] == [f"{tmp_path}/engines/vllm/python", "-m",
                     "vllm.entrypoints.openai.api_server", "--model", "/models/hf"]
    assert get_backend("vllm").program(cfg) == f"{tmp_path}/engines/vllm/python"
    # From an experiment's table too: vLLM takes backend.python as SGLang does.
    table = Table({"kind": "vllm", "model_path": "m", "python": "/x/engines/vllm/python"},
                  "backend", "x")
    assert BackendConfig.from_table(table).python == "/x/engines/vllm/python"


def test_vllm_serve_form_and_baseline() -> None:
    a = argv("vllm", vllm_cfg(binary="/usr/bin/vllm"), {"speculative_num_steps": 0})
    assert a[:3] == ["/usr/bin/vllm", "serve", "/models/hf"]
    assert "--speculative-config" not in a


def test_vllm_method_names_and_draft_model() -> None:
    cfg = vllm_cfg(speculative_algorithm="EAGLE3", draft_model_path="/models/eagle", flags={})
    conf = speculative_config(cfg, resolve({"speculative_num_steps": 3}, {}))
    assert conf == {"method": "eagle3", "num_speculative_tokens": 3, "model": "/models/eagle"}
    cfg = vllm_cfg(speculative_algorithm="NEXTN", flags={})
    assert speculative_config(cfg, resolve({"speculative_num_steps": 1}, {}))["method"] == "mtp"
    assert speculative_config(cfg, resolve({"speculative_num_steps": 0}, {})) is None


def test_vllm_cache_root_per_run_or_from_config(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path / "cache"))
    b = get_backend("vllm")
    assert b.env(vllm_cfg(env={"VLLM_CPU_KVCACHE_SPACE": "1"}), run_dir=str(tmp_path / "t1")) \
        == {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CACHE_ROOT": str(tmp_path / "t1/vllm-cache")}
    assert b.env(vllm_cfg())["VLLM_CACHE_ROOT"] == str(tmp_path / "cache/vllm-cache")
    cfg = vllm_cfg(env={"VLLM_CACHE_ROOT": "${SPECDECODE_CACHE}/vc"})
    assert b.env(cfg, run_dir="/x")["VLLM_CACHE_ROOT"] == str(tmp_path / "cache/vc")


def test_vllm_launch_command_is_vllm_serve() -> None:
    cmd = get_backend("vllm").launch_command(vllm_cfg(), resolve({"speculative_num_steps": 4},
                                                                 vllm_cfg().flags))
    assert cmd.startswith("vllm serve /models/hf --tensor-parallel-size 1 --speculative-config ")
    assert '"num_speculative_tokens":4' in cmd


@pytest.mark.parametrize("kind", sorted(BACKENDS))
def test_every_backend_keeps_the_contract(kind: str) -> None:
    b = get_backend(kind)
    algo = {"llamacpp": "ngram", "vllm": "ngram"}.get(kind, "EAGLE3")
    cfg = BackendConfig(kind=kind, model_path="/m", speculative_algorithm=algo,
                        env={"A": "1"})
    b.validate(cfg)
    params = resolve({"speculative_num_steps": 3}, {})
    a = b.argv(cfg, params, "{port}")
    assert "{port}" in a and all(isinstance(x, str) for x in a)
    assert b.env(cfg, run_dir="/tmp/run")["A"] == "1"
    assert isinstance(b.launch_command(cfg, params), str)
    assert isinstance(b.program(cfg), str) and b.program(cfg)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in b.request_headers.items())
    assert b.window_acceptance(None, None) == (None, ())


# ---------------------------------------------------------------------------------------------
# SGLang: the release the servers run


def sglang_cfg(**kw: object) -> BackendConfig:
    base: dict[str, object] = {"kind": "sglang", "model_path": "Qwen/Qwen3.5-122B-A10B",
                               "draft_model_path": "/models/eagle3", "tp_size": 2}
    base.update(kw)
    return BackendConfig(**base)  # type: ignore[arg-type]


def test_release_order() -> None:
    from specdecode_tune.backends import common
    key = common.version_key
    assert key("0.5.10.post1") < key("0.5.11") < key("0.5.13rc0") < key("0.5.13")
    assert key("0.5.9") < key("0.5.10") and key("0.5.13") <= key("0.5.13.post2")
    assert common.at_least("0.5.13", "0.5.13") and not common.at_least("0.5.12", "0.5.13")
    with pytest.raises(ValueError):
        key("latest")


def test_sglang_version_from_the_config_then_the_installed_package_then_the_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    b = get_backend("sglang")
    monkeypatch.setattr(sglang, "installed_version", lambda: None)
    assert b.engine_version(sglang_cfg())[0] == sglang_releases.DEFAULT_VERSION == "0.5.10.post1"
    monkeypatch.setattr(sglang, "installed_version", lambda: "0.5.14")
    assert b.engine_version(sglang_cfg()) == ("0.5.14", "the sglang installed here")
    assert b.engine_version(sglang_cfg(engine_version="0.5.12")) == (
        "0.5.12", "backend.engine_version")
    # The simulator imitates the default release, whatever is installed.
    assert get_backend("sim").engine_version(sglang_cfg(kind="sim"))[0] == "0.5.10.post1"


def test_sglang_schedule_command_only_where_the_release_reads_the_file() -> None:
    b = get_backend("sglang")
    params = resolve({"speculative_num_steps": 5}, {})
    cmd, why = b.schedule_command(sglang_cfg(engine_version="0.5.13"), params, "s.json")
    assert why == "" and cmd is not None
    assert "--speculative-adaptive --speculative-adaptive-config s.json" in cmd
    cmd, why = b.schedule_command(sglang_cfg(engine_version="0.5.10.post1"), params, "s.json")
    assert cmd is None and "has no --speculative-adaptive" in why and ">= 0.5.13" in why


@pytest.mark.parametrize(("kind", "value", "words"), [
    ("vllm", "0.5.13", "only allowed with backend.kind = 'sglang' or 'sim'"),
    ("sglang", "latest", "must be an SGLang release such as '0.5.10.post1'"),
])
def test_engine_version_is_checked(kind: str, value: str, words: str) -> None:
    table = Table({"kind": kind, "model_path": "m", "engine_version": value}, "backend", "x")
    with pytest.raises(ConfigError, match=words):
        BackendConfig.from_table(table)


def test_engine_version_is_read() -> None:
    table = Table({"kind": "sglang", "model_path": "m", "engine_version": "0.5.13"}, "backend",
                  "x")
    assert BackendConfig.from_table(table).engine_version == "0.5.13"


# ---------------------------------------------------------------------------------------------
# SGLang: a hybrid model's speculation with radix cache on


def hybrid_model(tmp_path: Path, arch: str = "Qwen3_5MoeForConditionalGeneration") -> str:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": [arch]}))
    return str(tmp_path)


def test_sglang_refuses_a_local_hybrid_models_speculation_with_radix_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sglang, "installed_version", lambda: None)
    b = get_backend("sglang")
    cfg = sglang_cfg(model_path=hybrid_model(tmp_path))
    with pytest.raises(ConfigError) as e:
        b.validate(cfg)
    msg = str(e.value)
    assert "\n" not in msg and "SGLang 0.5.10.post1" in msg
    assert sglang_releases.radix_spec_refusal("Qwen3_5MoeForConditionalGeneration") in msg
    assert "set disable_radix_cache = true in [backend.flags]" in msg
    # What makes it boot, or where it does not apply.
    b.validate(sglang_cfg(model_path=cfg.model_path, flags={"disable_radix_cache": True}))
    b.validate(sglang_cfg(model_path=cfg.model_path, speculative_algorithm=None))
    b.validate(sglang_cfg(model_path=cfg.model_path, engine_version="0.5.14"))
    (tmp_path / "llama").mkdir()
    b.validate(sglang_cfg(model_path=hybrid_model(tmp_path / "llama", "LlamaForCausalLM")))
    b.validate(sglang_cfg())     # a hub id: the server's own check decides
    # The simulator refuses at boot instead, as SGLang does (its profile names the model).
    get_backend("sim").validate(sglang_cfg(kind="sim", model_path=cfg.model_path))


def test_a_tree_narrower_than_deep_is_refused_for_the_releases_that_crash_on_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang 0.5.16 on captures its draft-extend graphs at the draft-token width and crashes
    at boot when the tree is narrower than deep (topk > 1, draft < steps + 1; seen on 0.5.17):
    the backend refuses such a command line without a boot, for those releases only, and the
    simulator does the same for the release it imitates."""
    monkeypatch.setattr(sglang, "installed_version", lambda: None)
    # (the simulator's default profile is a hybrid model: no radix cache, as SGLang wants)
    points = [{"speculative_num_steps": s, "speculative_eagle_topk": k,
               "speculative_num_draft_tokens": n, "disable_radix_cache": True} for s, k, n in
              ((8, 2, 8), (8, 4, 8), (8, 2, 9), (6, 2, 8), (3, 1, 4))]
    cases = (("0.5.17", [True, True, False, False, False]),
             ("0.5.16", [True, True, False, False, False]),
             ("0.5.14", [False] * 5), (None, [False] * 5))
    # (the simulator's CLI check is a process per argv: two releases are enough for it)
    for kind, versions in (("sglang", cases), ("sim", cases[::3])):
        for version, refused in versions:
            cfg = sglang_cfg(kind=kind, engine_version=version, model_path="m")
            got = backends.refusals(cfg, points)
            assert [g is not None for g in got] == refused, (kind, version, got)
            if refused[0]:
                assert got[0] is not None and "\n" not in got[0]
                assert got[0].startswith("backend: speculative_num_draft_tokens = 8 < "
                                         "speculative_num_steps + 1 = 9 at "
                                         "speculative_eagle_topk = 2: SGLang")
    assert sim_releases.SHORT_TREE_CRASH_SINCE == sglang_releases.SHORT_TREE_CRASH_SINCE


def test_the_simulator_copies_the_backends_hybrid_list_and_words() -> None:
    # The simulator is a separate program that imitates SGLang: it keeps its own copy.
    assert RADIX_SPEC_REFUSED == sglang_releases.RADIX_SPEC_REFUSED
    arch = "Qwen3_5MoeForConditionalGeneration"
    with pytest.raises(StartupError) as e:
        normalize_params(load_profile("seed-qwen35-122b"), {"speculative_algorithm": "EAGLE3"})
    assert e.value.message == "ValueError: " + sglang_releases.radix_spec_refusal(arch)


@pytest.mark.parametrize(("info", "running"), [
    # 0.5.10: the flag (48 after the speculative reset) and the scheduler's effective limit.
    ({"max_running_requests": 48, "internal_states": [
        {"max_running_requests": 48, "effective_max_running_requests_per_dp": 17}]}, 17),
    ({"max_running_requests": 64, "dp_size": 2, "internal_states": [
        {"max_running_requests": 64, "effective_max_running_requests_per_dp": 20}]}, 40),
    # No speculation, no flag: null flag, memory's figure.
    ({"max_running_requests": None, "internal_states": [
        {"max_running_requests": None, "effective_max_running_requests_per_dp": 2048}]}, 2048),
    # An SGLang without the effective figure: the flag, wherever it is.
    ({"max_running_requests": None, "internal_states": [{"max_running_requests": 26}]}, 26),
    ({"max_running_requests": 30}, 30),
])
def test_sglang_facts_read_the_effective_running_limit(monkeypatch: pytest.MonkeyPatch,
                                                       info: dict, running: int) -> None:
    monkeypatch.setattr(sglang, "get_json", lambda url, timeout_s, headers=None: info)
    facts = get_backend("sglang").read_facts("http://127.0.0.1:1")
    assert facts.max_running_requests == running and facts.gpu_ids == ()


def flagged_cfg(**kw: object) -> BackendConfig:
    base: dict[str, object] = {
        "kind": "sglang", "model_path": "/models/hf", "draft_model_path": "/models/draft",
        "flags": {"cuda_graph_max_bs": 64, "mamba_scheduler_strategy": "no_buffer",
                  "disable_radix_cache": True}}
    base.update(kw)
    return BackendConfig(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(("version", "graph", "mamba"), [
    ("0.5.10.post1", "--cuda-graph-max-bs", "--mamba-scheduler-strategy"),
    ("0.5.13", "--cuda-graph-max-bs", "--mamba-scheduler-strategy"),
    ("0.5.14", "--cuda-graph-max-bs-decode", "--mamba-radix-cache-strategy"),
    ("0.5.23", "--cuda-graph-max-bs-decode", "--mamba-radix-cache-strategy")])
def test_sglang_writes_the_flag_names_of_the_servers_release(
        version: str, graph: str, mamba: str) -> None:
    # From 0.5.20 the old --cuda-graph-max-bs is refused as ambiguous (docs/engines-sglang.md).
    cfg = flagged_cfg(engine_version=version)
    point = {"speculative_num_steps": 4, "speculative_eagle_topk": 1}
    for args in (argv("sglang", cfg, point),
                 get_backend("sglang").launch_command(cfg, resolve(point, cfg.flags)).split()):
        assert args[args.index(graph) + 1] == "64" and args[args.index(mamba) + 1] == "no_buffer"
        assert not {"--cuda-graph-max-bs", "--cuda-graph-max-bs-decode",
                    "--mamba-scheduler-strategy", "--mamba-radix-cache-strategy"} - {graph, mamba} \
            & set(args)


def test_the_simulator_takes_its_own_release_names_and_prints_the_servers() -> None:
    cfg = flagged_cfg(kind="sim", engine_version="0.5.14", flags={"cuda_graph_max_bs": 64})
    point = resolve({"speculative_num_steps": 4, "speculative_eagle_topk": 1}, cfg.flags)
    assert "--cuda-graph-max-bs" in get_backend("sim").argv(cfg, point, 0)
    assert "--cuda-graph-max-bs-decode" in get_backend("sim").launch_command(cfg, point).split()


def test_sglang_launches_with_backend_python() -> None:
    cfg = flagged_cfg(python="/opt/sglang/bin/python")
    assert argv("sglang", cfg, {})[:3] == ["/opt/sglang/bin/python", "-m", "sglang.launch_server"]
    assert get_backend("sglang").program(cfg) == "/opt/sglang/bin/python"


def test_sglang_check_cannot_tell_without_sglang_and_boots() -> None:
    # This Python has no sglang (the project does not depend on it): the check says nothing,
    # so the boot decides; a backend.binary hides the Python behind it.
    backend = get_backend("sglang")
    assert sglang_python.installed_version() is None
    cfg = flagged_cfg()
    assert backend.argcheck_python(cfg) is None
    assert backend.argcheck_python(flagged_cfg(binary="/opt/sglang-server")) is None
    assert backend.refusals(cfg, [backend.argv(cfg, {}, 0)]) == [None]


def test_the_argcheck_answers_without_sglang(tmp_path: Path) -> None:
    import subprocess
    import sys
    out = subprocess.run([sys.executable, sglang_python.ARGCHECK],
                         input='{"cases": [{"argv": []}]}',
                         capture_output=True, text=True, timeout=60, check=True)
    answer = json.loads(out.stdout.splitlines()[-1])
    assert answer["sglang"] is None and "cases" not in answer
    # sglang is missing here, and nothing else failed first: the script's own folder (the
    # backend's sglang.py) is not on its path (the contract tests hold that in the SGLang venv)
    assert answer["error"].startswith("PackageNotFoundError") or \
        answer["error"] == "ModuleNotFoundError: No module named 'sglang'", answer["error"]


def test_the_argcheck_leaves_its_folder_off_sys_path_before_it_imports_anything() -> None:
    """The folder holds the backend's sglang.py; any import before the strip may load it, or
    another of the backend's modules, instead of SGLang's or the standard library's (it did,
    when a module was named tokenize.py: `traceback` loads `tokenize` at import on Python 3.11).
    Held on the source, so on every Python."""
    import ast
    tree = ast.parse(Path(sglang_python.ARGCHECK).read_text())
    strip = next((i for i, node in enumerate(tree.body) if isinstance(node, ast.Assign)
                  and ast.unparse(node.targets[0]) == "sys.path[:]"), None)
    assert strip is not None, "no module-level `sys.path[:] = ...` in the argcheck"
    before = {alias.name for node in tree.body[:strip]
              if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}
    assert before <= {"annotations", "os", "sys"}, before


@pytest.mark.parametrize(("text", "words"), [
    ('python = "/x/python"\nkind = "llamacpp"',
     "only allowed with backend.kind = 'sglang' or 'vllm'"),
    ('python = "/x/python"\nbinary = "/x/server"', "exclude each other")])
def test_backend_python_is_checked(text: str, words: str) -> None:
    import tomllib
    data = {"kind": "sglang", "model_path": "m", **tomllib.loads(text)}
    with pytest.raises(ConfigError, match=words):
        BackendConfig.from_table(Table(data, "backend", "x"))


def test_sglang_memory_facts_from_its_boot_log() -> None:
    """SGLang's memory lines (the form the contract test renders from SGLang's own source),
    per rank: the room is the last capture's free memory over the free memory before the
    weights, the graphs' memory their "mem usage" summed, on the rank with the least room."""
    from specdecode_tune.records import GRAPH_MEMORY, MEMORY_ROOM
    log = "\n".join([
        "[2026-12-04 10:00:00 DP0 TP0] Load weight begin. avail mem=100.00 GB",
        "[2026-12-04 10:00:00 DP0 TP1] Load weight begin. avail mem=80.00 GB",
        "[2026-12-04 10:00:01 DP0 TP0] Load weight end. elapsed=1.00 s, type=X, "
        "avail mem=30.00 GB, mem usage=70.00 GB.",
        "[2026-12-04 10:00:09 DP0 TP0] Capture cuda graph end. Time elapsed: 8.00 s. "
        "mem usage=3.00 GB. avail mem=12.00 GB.",
        "[2026-12-04 10:00:09 DP0 TP1] Capture cuda graph end. Time elapsed: 8.00 s. "
        "mem usage=3.00 GB. avail mem=9.00 GB.",
        "[2026-12-04 10:00:12 DP0 TP0] Capture draft cuda graph end. Time elapsed: 2.00 s. "
        "mem usage=1.00 GB. avail mem=11.00 GB.",
        "[2026-12-04 10:00:12 DP0 TP1] Capture draft cuda graph end. Time elapsed: 2.00 s. "
        "mem usage=1.00 GB. avail mem=8.00 GB.",
    ])
    facts = sglang_logs.memory_facts(log)
    assert facts == {MEMORY_ROOM: 0.1, GRAPH_MEMORY: 0.05}      # TP1: 8 / 80, 4 / 80
    # The simulator's lines have no rank tag; a log without a capture says nothing.
    assert sglang_logs.memory_facts(
        "[t] INFO Load weight begin. avail mem=50.00 GB\n[t] INFO Capture cuda graph end. "
        "Time elapsed: 1.00 s. mem usage=1.00 GB. avail mem=5.00 GB.") == {
            MEMORY_ROOM: 0.1, GRAPH_MEMORY: 0.02}
    assert sglang_logs.memory_facts(log.splitlines()[0]) == {}
    for kind in ("vllm", "llamacpp"):
        assert get_backend(kind).memory_facts(log) == {}


@pytest.mark.parametrize("kind", sorted(BACKENDS))
def test_the_running_limit_is_the_servers_else_the_flag_it_was_given(kind: str) -> None:
    """What a closed loop over the limit queues behind: the booted server's own figure where
    it says one (SGLang's scheduler, llama.cpp's slots), else the engine's flag for
    max_running_requests (vLLM's --max-num-seqs: it reports none)."""
    from specdecode_tune.records import ServerFacts

    b = get_backend(kind)
    assert b.running_limit(ServerFacts(max_running_requests=12), {"max_running_requests": 8}) \
        == 12
    assert b.running_limit(ServerFacts(), {"max_running_requests": 8}) == 8
    assert b.running_limit(ServerFacts(), {}) is None


def test_the_simulators_known_crashes_are_those_of_the_release_it_imitates(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An sglang 0.5.17 in this Python does not make the simulator (imitating 0.5.10.post1
    unless told) refuse what its release boots; the SGLang backend reads that sglang."""
    monkeypatch.setattr(sglang, "installed_version", lambda: "0.5.17")
    point = {"speculative_num_steps": 8, "speculative_eagle_topk": 2,
             "speculative_num_draft_tokens": 8, "disable_radix_cache": True}
    assert backends.known_refusal(sglang_cfg(kind="sim", model_path="m"), point) is None
    assert backends.known_refusal(
        sglang_cfg(kind="sim", model_path="m", engine_version="0.5.17"), point) is not None
    assert backends.known_refusal(sglang_cfg(model_path="m"), point) is not None
