"""Workloads: determinism, length ranges, JSONL formats and the errors for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdecode_tune.config import WorkloadSpec
from specdecode_tune.errors import ConfigError
from specdecode_tune.load import iter_prompts, make_prompts


def write_jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_random_prompts_have_exactly_input_len_words_and_the_settings() -> None:
    spec = WorkloadSpec(input_len=50, output_len=20, temperature=0.7, ignore_eos=False)
    prompts = make_prompts(spec, 5)
    assert len(prompts) == 5
    for p in prompts:
        assert len(p.text.split()) == 50 == p.input_len
        assert (p.output_len, p.temperature, p.ignore_eos, p.messages) == (20, 0.7, False, None)
    assert len({p.text for p in prompts}) == 5


def test_same_seed_same_prompts_other_seed_or_stream_different() -> None:
    spec = WorkloadSpec(input_len=(10, 40), output_len=(5, 9), seed=3)
    a = make_prompts(spec, 20)
    assert a == make_prompts(WorkloadSpec(input_len=(10, 40), output_len=(5, 9), seed=3), 20)
    assert a != make_prompts(WorkloadSpec(input_len=(10, 40), output_len=(5, 9), seed=4), 20)
    other_stream = make_prompts(spec, 20, stream=1)
    assert not {p.text for p in a} & {p.text for p in other_stream}


def test_ranges_are_inclusive_and_covered() -> None:
    prompts = make_prompts(WorkloadSpec(input_len=(3, 5), output_len=(1, 2)), 300)
    assert {p.input_len for p in prompts} == {3, 4, 5}
    assert {p.output_len for p in prompts} == {1, 2}
    assert all(len(p.text.split()) == p.input_len for p in prompts)


def test_max_prompts_cycles_over_that_many() -> None:
    it = iter_prompts(WorkloadSpec(input_len=8, max_prompts=3))
    first = [next(it) for _ in range(7)]
    assert first[3:6] == first[:3] and first[6] == first[0]


def test_lists_from_toml_become_tuples() -> None:
    spec = WorkloadSpec.from_mapping({"input_len": [8, 16], "output_len": 4})
    assert spec.input_len == (8, 16)
    hash(spec)   # stays usable as a key and picklable for Ray


def test_jsonl_accepts_the_three_shapes(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [
        {"messages": [{"role": "system", "content": "be brief"},
                      {"role": "user", "content": "what is two plus two"},
                      {"role": "assistant", "content": "four"}]},
        {"conversations": [{"from": "human", "value": "hi there"},
                           {"from": "gpt", "value": "hello"},
                           {"from": "human", "value": "tell me a joke"},
                           {"from": "gpt", "value": "no"}]},
        "",
        {"prompt": "plain prompt text"},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "parts"}]}]},
    ])
    spec = WorkloadSpec(kind="jsonl", path=str(path), output_len=(10, 12), seed=1)
    prompts = make_prompts(spec, 4)
    by_text = {p.text: p for p in prompts}
    assert set(by_text) == {
        "be brief\n\nwhat is two plus two",
        "hi there\n\nhello\n\ntell me a joke",
        "plain prompt text",
        "parts",
    }
    chat = by_text["hi there\n\nhello\n\ntell me a joke"]
    assert chat.messages == ({"role": "user", "content": "hi there"},
                             {"role": "assistant", "content": "hello"},
                             {"role": "user", "content": "tell me a joke"})
    assert chat.input_len == 7
    assert by_text["plain prompt text"].messages is None
    assert all(10 <= p.output_len <= 12 for p in prompts)
    # deterministic order per (seed, stream); a second pass cycles over the same four
    assert make_prompts(spec, 8)[:4] == prompts
    assert {p.text for p in make_prompts(spec, 8)[4:]} == set(by_text)


def test_jsonl_max_prompts_takes_the_first_lines(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"p{i}"} for i in range(10)])
    spec = WorkloadSpec(kind="jsonl", path=str(path), max_prompts=3)
    assert {p.text for p in make_prompts(spec, 30)} == {"p0", "p1", "p2"}


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({"kind": "csv"}, "workload.kind: got 'csv'; allowed: one of random, jsonl"),
        ({"input_len": 0}, "workload.input_len: got 0; allowed: an integer >= 1 or [low, high]"),
        ({"output_len": (9, 3)}, "workload.output_len: got [9, 3]; allowed"),
        ({"output_len": [1, 2, 3]}, "workload.output_len: got [1, 2, 3]; allowed"),
        ({"input_len": 2.5}, "workload.input_len: got 2.5"),
        ({"seed": "x"}, "workload.seed: got 'x'; allowed: an integer"),
        ({"temperature": -0.1}, "workload.temperature: got -0.1; allowed: a number >= 0"),
        ({"ignore_eos": 1}, "workload.ignore_eos: got 1; allowed: true or false"),
        ({"max_prompts": 0}, "workload.max_prompts: got 0"),
        ({"kind": "jsonl"}, "workload.path: got None; allowed: a JSONL prompt file"),
        ({"kind": "jsonl", "path": "/nonexistent.jsonl"},
         "workload.path: got '/nonexistent.jsonl'; allowed: an existing JSONL file"),
        ({"path": "x.jsonl"}, "workload.path: got 'x.jsonl'; allowed: unset for kind random"),
    ],
)
def test_bad_specs_name_key_value_and_what_is_allowed(kwargs: dict, expected: str) -> None:
    with pytest.raises(ConfigError) as exc:
        WorkloadSpec(**kwargs)
    assert expected in str(exc.value) and "\n" not in str(exc.value)


def test_unknown_key_is_named() -> None:
    expected = "workload.input_length: unknown key, value 8; allowed: kind, input_len, "
    with pytest.raises(ConfigError, match=expected):
        WorkloadSpec.from_mapping({"input_length": 8})


@pytest.mark.parametrize(
    "line, expected",
    [
        ("{not json", ":1: not valid JSON"),
        ("[1, 2]", ":1: got list; allowed: an object"),
        ('{"text": "x"}', ":1: keys ['text']"),
        ('{"messages": []}', ":1: messages=[]"),
        ('{"messages": [{"role": "robot", "content": "x"}]}', ":1: turn {'role': 'robot'"),
        ('{"conversations": [{"from": "alien", "value": "x"}]}', ":1: turn {'from': 'alien'"),
        ('{"conversations": [{"from": "gpt", "value": "only an answer"}]}', ":1: no user turn"),
        ('{"prompt": ""}', ":1: prompt=''"),
    ],
)
def test_bad_jsonl_lines_name_file_line_and_shape(tmp_path: Path, line: str, expected: str) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [line])
    with pytest.raises(ConfigError) as exc:
        make_prompts(WorkloadSpec(kind="jsonl", path=str(path)), 1)
    assert expected in str(exc.value)
    assert str(path) in str(exc.value) and "\n" not in str(exc.value)


def test_empty_jsonl_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n")
    with pytest.raises(ConfigError, match="holds no prompts; allowed"):
        make_prompts(WorkloadSpec(kind="jsonl", path=str(path)), 1)


# ---------------------------------------------------------------------------------------------
# A prompt file is read and checked when the spec is made (the experiment loads), not in a trial


def test_a_bad_line_fails_when_the_spec_is_made_not_when_prompts_are_drawn(
        tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "fine"}, "{broken"])
    with pytest.raises(ConfigError, match=r"p\.jsonl:2: not valid JSON"):
        WorkloadSpec(kind="jsonl", path=str(path))


def test_blank_lines_are_skipped_and_still_counted(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "a"}\n\n   \r\n{"prompt": "b"}\r\n\n[3]\n')
    with pytest.raises(ConfigError, match=r"p\.jsonl:6: got list"):
        WorkloadSpec(kind="jsonl", path=str(path))


def test_not_utf8_names_the_line_and_the_byte(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"prompt": "a"}\n{"prompt": "caf\xe9"}\n')
    with pytest.raises(ConfigError) as exc:
        WorkloadSpec(kind="jsonl", path=str(path))
    msg = str(exc.value)
    assert f"{path}:2: not UTF-8 (byte 0xe9 at column 16); allowed: UTF-8 text" in msg, msg


def test_a_utf8_byte_order_mark_on_the_first_line_is_allowed(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"prompt": "from a Windows editor"}\n')
    spec = WorkloadSpec(kind="jsonl", path=str(path))
    assert make_prompts(spec, 1)[0].text == "from a Windows editor"


@pytest.mark.parametrize(
    "line, expected",
    [
        ("[" * 100_000 + "]" * 100_000, ":1: JSON nested too deeply to read"),
        ('{"prompt": ' + "7" * 5000 + "}", ":1: not valid JSON (Exceeds the limit"),
        ('{"messages": [{"role": "user", "content": ""}]}',
         ":1: messages whose turns are all empty"),
    ],
    ids=["deep", "huge-int", "empty-turns"],
)
def test_lines_json_itself_chokes_on_are_one_line_errors(tmp_path: Path, line: str,
                                                         expected: str) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [line])
    with pytest.raises(ConfigError) as exc:
        WorkloadSpec(kind="jsonl", path=str(path))
    assert expected in str(exc.value) and "\n" not in str(exc.value)


def test_a_directory_is_not_a_prompt_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a directory; allowed: a JSONL prompt file"):
        WorkloadSpec(kind="jsonl", path=str(tmp_path))


def test_an_unreadable_file_is_a_config_error(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a"}])
    real_open = builtins.open

    def deny(file: object, *args: object, **kwargs: object) -> object:
        if str(file) == str(path):
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)  # type: ignore[call-overload]  # open's own args

    monkeypatch.setattr(builtins, "open", deny)
    with pytest.raises(ConfigError, match=r"p\.jsonl: cannot read \(Permission denied\)"):
        make_prompts(WorkloadSpec(kind="jsonl", path=str(path)), 1)


def test_max_prompts_bounds_the_read(tmp_path: Path) -> None:
    # Lines after the first max_prompts prompts are read by nobody, so not checked either.
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a"}, {"prompt": "b"}, "{broken"])
    spec = WorkloadSpec(kind="jsonl", path=str(path), max_prompts=2)
    assert {p.text for p in make_prompts(spec, 4)} == {"a", "b"}


def test_the_file_is_parsed_once_per_process(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"p{i}"} for i in range(5)])
    spec = WorkloadSpec(kind="jsonl", path=str(path), seed=3)   # reads and checks it
    opened: list[str] = []
    real_open = builtins.open

    def counting(file: object, *args: object, **kwargs: object) -> object:
        opened.append(str(file))
        return real_open(file, *args, **kwargs)  # type: ignore[call-overload]  # open's own args

    monkeypatch.setattr(builtins, "open", counting)
    for stream in range(3):
        assert len(make_prompts(spec, 5, stream=stream)) == 5
    assert str(path) not in opened
