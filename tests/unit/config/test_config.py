"""Experiment loading: the shipped experiments load, and bad input gives one precise line."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from specdecode_tune.config import ConfigError, load_experiment
from tests.conftest import REPO

GOOD = textwrap.dedent("""
    name = "t"
    [backend]
    kind = "sim"
    tp_size = 2
    profile = "seed-qwen35-122b"
    [backend.flags]
    mem_fraction_static = 0.85
    [space.speculative_num_steps]
    type = "int"
    low = 1
    high = 10
    [space.speculative_eagle_topk]
    type = "categorical"
    choices = [1, 2]
    [space.speculative_num_draft_tokens]
    type = "int"
    low = 2
    high = 16
    [measure]
    concurrency = [1, 16]
    duration_s = 5
    [objective]
    weights = { "1" = 1.0, "16" = 2.0 }
    [search]
    max_trials = 8
    enqueue = [{ speculative_num_steps = 4, speculative_eagle_topk = 1 }]
""")


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "exp.toml"
    p.write_text(text)
    return p


def test_good_experiment_loads(tmp_path: Path) -> None:
    exp = load_experiment(write(tmp_path, GOOD))
    assert exp.backend.kind == "sim" and exp.backend.tp_size == 2
    assert [p.name for p in exp.space] == ["speculative_num_steps", "speculative_eagle_topk",
                                           "speculative_num_draft_tokens"]
    assert exp.measure.concurrency == (1, 16)
    assert exp.level_weights() == {1: 1.0, 16: 2.0}
    assert exp.search.enqueue == ({"speculative_num_steps": 4, "speculative_eagle_topk": 1},)


@pytest.mark.parametrize("path", sorted((REPO / "experiments").glob("*.toml")),
                         ids=lambda p: p.name)
def test_shipped_experiments_load(path: Path) -> None:
    exp = load_experiment(path)
    assert exp.name and exp.space


BAD = [
    # (replace this, with this, expected words in the error)
    ('kind = "sim"', 'kind = "tgi"', ["backend.kind", "'tgi'", "sim, sglang, vllm, llamacpp"]),
    ("tp_size = 2", 'tp_size = "2"', ["backend.tp_size", "'2'", "an integer"]),
    ("tp_size = 2", "tp_size = 0", ["backend.tp_size", "must be > 0"]),
    ("low = 1\n", "low = 12\n", ["speculative_num_steps", "low = 12 > high = 10"]),
    ('name = "t"', 'name = "t"\ncolour = 3', ["unknown key 'colour'"]),
    ("[measure]", "[measure]\nspeed = 1", ["unknown key 'measure.speed'"]),
    ("choices = [1, 2]", "choices = []", ["speculative_eagle_topk.choices", "at least one"]),
    ("concurrency = [1, 16]", "concurrency = [1, 0]", ["measure.concurrency", ">= 1"]),
    ("concurrency = [1, 16]", "concurrency = [1, 1]", ["must not repeat"]),
    ('"16" = 2.0', '"8" = 2.0', ["objective.weights.8", "not a measured level"]),
    ("duration_s = 5", "duration_s = -5", ["measure.duration_s", "> 0"]),
    ("duration_s = 5", "duration_s = 5\nprecision = 0.02",
     ["measure.duration_s", "give one: precision", "or duration_s (a fixed window)"]),
    ("duration_s = 5", "precision = 0.7", ["measure.precision", "(0, 0.5)"]),
    ("duration_s = 5", "duration_s = 5\nmin_rounds = 3",
     ["measure.min_rounds", "only used with measure.precision"]),
    ("duration_s = 5", "precision = 0.02\nmin_rounds = 1", ["measure.min_rounds", ">= 2"]),
    ("duration_s = 5", "precision = 0.02\nmax_duration_s = 0",
     ["measure.max_duration_s", "> 0"]),
    ("max_trials = 8", "max_trials = 8.5", ["search.max_trials", "an integer"]),
    ("mem_fraction_static = 0.85", "mem_fraction_static = [1]",
     ["backend.flags.mem_fraction_static"]),
    ("[measure]", "[workload]\ntemperature = -1\n[measure]", ["workload.temperature", ">= 0"]),
    ("[measure]", "[workload]\ninput_len = [10, 2]\n[measure]",
     ["workload.input_len", "low <= high"]),
    ("[measure]", '[workload]\nkind = "jsonl"\n[measure]', ["workload.path is required"]),
    ("speculative_num_steps = 4,", "speculative_num_steps = 40,",
     ["enqueue", "outside its search range"]),
    ("speculative_num_steps = 4,", "colour = 4,",
     ["enqueue", "'colour' is not a searched parameter"]),
    ('profile = "seed-qwen35-122b"', "profile = 3", ["backend.profile", "a string"]),
    ('kind = "sim"', 'kind = "sglang"\nmodel_path = "m"', ["backend.profile", "only allowed"]),
    ('[backend]\nkind = "sim"', '[backend]\nkind = "sim"\n[backend]', ["TOML syntax error"]),
    ("[search]", '[search]\nsampler = "grid"',
     ["search.sampler", "plateau, tpe, nsga2, random, model"]),
    ("[search]", "[search]\nnoise_band = 1.5", ["search.noise_band", "[0, 1]"]),
    ("type = \"int\"\nlow = 2", "type = \"float\"\nlow = 2",
     ["speculative_num_draft_tokens", "use int or categorical"]),
    ("high = 10", "high = 100", ["speculative_num_steps", "[0, 64]"]),
    ("[objective]", '[objective]\nkind = "pareto"\nmetrics = ["output_tok_s@1"]',
     ["at least two metrics"]),
    ("[objective]", '[objective]\nkind = "pareto"\nmetrics = ["speed@1", "output_tok_s@16"]',
     ["NAME@LEVEL"]),
]


@pytest.mark.parametrize("old,new,words", BAD, ids=[b[1][:30] for b in BAD])
def test_bad_experiment_gives_one_precise_line(tmp_path: Path, old: str, new: str,
                                               words: list[str]) -> None:
    assert old in GOOD
    with pytest.raises(ConfigError) as info:
        load_experiment(write(tmp_path, GOOD.replace(old, new, 1)))
    msg = str(info.value)
    assert "\n" not in msg
    assert str(tmp_path / "exp.toml") in msg
    for w in words:
        assert w in msg, msg


def test_measure_by_precision_or_by_a_fixed_window(tmp_path: Path) -> None:
    fixed = load_experiment(write(tmp_path, GOOD)).measure
    assert fixed.precision is None and fixed.window_s == 5.0
    rule = load_experiment(write(tmp_path, GOOD.replace(
        "duration_s = 5", "precision = 0.02\nmax_duration_s = 30"))).measure
    assert (rule.precision, rule.min_rounds, rule.window_s) == (0.02, 30, 30.0)


def test_space_with_no_valid_config(tmp_path: Path) -> None:
    text = GOOD.replace("choices = [1, 2]", "choices = [2]").replace(
        "low = 2\nhigh = 16", "low = 40\nhigh = 60").replace(
        "speculative_eagle_topk = 1 }", "speculative_eagle_topk = 2 }")
    with pytest.raises(ConfigError, match="allows no valid configuration"):
        load_experiment(write(tmp_path, text))


def test_missing_and_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such experiment file"):
        load_experiment(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="is a directory"):
        load_experiment(tmp_path)
    (tmp_path / "bin.toml").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_experiment(tmp_path / "bin.toml")


# ---------------------------------------------------------------------------------------------
# Files the experiment names: read and checked when it loads, relative ones made absolute


def with_workload(text: str, path: str) -> str:
    return text.replace("[measure]", f'[workload]\nkind = "jsonl"\npath = "{path}"\n[measure]', 1)


def test_a_bad_prompt_line_fails_the_load_naming_both_files_and_the_line(tmp_path: Path) -> None:
    (tmp_path / "p.jsonl").write_text('{"prompt": "fine"}\n{"prompt": 3}\n')
    with pytest.raises(ConfigError) as info:
        load_experiment(write(tmp_path, with_workload(GOOD, "p.jsonl")))
    msg = str(info.value)
    assert msg == (f"{tmp_path / 'exp.toml'}: workload.path {tmp_path / 'p.jsonl'}:2: "
                   f"prompt=3; allowed: a non-empty string"), msg


def test_a_prompt_path_that_is_a_directory(tmp_path: Path) -> None:
    (tmp_path / "prompts").mkdir()
    with pytest.raises(ConfigError, match=r"exp\.toml: workload\.path .*prompts: is a directory"):
        load_experiment(write(tmp_path, with_workload(GOOD, "prompts")))


def test_a_profile_path_is_found_from_the_experiment_s_folder(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "mine.toml").write_text("# a profile\n")
    monkeypatch.chdir(REPO)
    exp = load_experiment(write(tmp_path, GOOD.replace('"seed-qwen35-122b"',
                                                       '"profiles/mine.toml"')))
    assert exp.backend.profile == str(tmp_path / "profiles" / "mine.toml")


@pytest.mark.parametrize("value, words", [
    ("profiles/none.toml", "no such profile file; allowed: an existing profile TOML file"),
    ("profiles/", "is a directory; allowed: a profile TOML file"),
])
def test_a_bad_profile_path(tmp_path: Path, value: str, words: str) -> None:
    (tmp_path / "profiles").mkdir()
    with pytest.raises(ConfigError) as info:
        load_experiment(write(tmp_path, GOOD.replace('"seed-qwen35-122b"', f'"{value}"')))
    msg = str(info.value)
    assert msg.startswith(f"{tmp_path / 'exp.toml'}: backend.profile = {value!r}: ")
    assert words in msg and "\n" not in msg


def test_local_model_paths_are_made_absolute_hub_ids_are_kept(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    (tmp_path / "models" / "draft").mkdir(parents=True)
    (tmp_path / "tiny.gguf").write_text("")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "server").write_text("")
    monkeypatch.chdir(REPO)
    text = GOOD.replace('profile = "seed-qwen35-122b"',
                        'model_path = "tiny.gguf"\ndraft_model_path = "models/draft"\n'
                        'binary = "bin/server"')
    b = load_experiment(write(tmp_path, text)).backend
    assert (b.model_path, b.draft_model_path, b.binary) == (
        str(tmp_path / "tiny.gguf"), str(tmp_path / "models" / "draft"),
        str(tmp_path / "bin" / "server"))
    text = GOOD.replace('profile = "seed-qwen35-122b"',
                        'model_path = "Qwen/Qwen3.5-122B"\ndraft_model_path = "gone/draft"\n'
                        'binary = "llama-server"')
    b = load_experiment(write(tmp_path, text)).backend
    assert (b.model_path, b.draft_model_path, b.binary) == (
        "Qwen/Qwen3.5-122B", "gone/draft", "llama-server")
