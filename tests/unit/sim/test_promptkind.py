"""The simulator's acceptance by prompt kind: classification, per-kind factors, and profiles
without the table drawing what they drew before."""

from __future__ import annotations

import random
import statistics

from specdecode_tune.config import WorkloadSpec
from specdecode_tune.load import make_prompts
from specdecode_tune.sim.profile import load_profile, profile_from_dict
from specdecode_tune.sim.promptkind import CAP, classify, scaled


def test_kinds_from_the_text() -> None:
    assert classify("Write a function:\n```python\ndef f(x):\n    return x\n```") == "code"
    assert classify("int main() {\n  int x = 1;\n  return x;\n}\n") == "code"
    assert classify("What is the capital of France? Please answer briefly, thanks.") == "chat"
    words = " ".join(make_prompts(WorkloadSpec(input_len=64), 1)[0].text.split())
    assert classify(words) == "repetitive"          # the random workload's word lists
    assert classify("again and again. " * 20) == "repetitive"


def test_factors_scale_code_and_chat_and_leave_repetitive_as_fitted() -> None:
    probs = (0.9, 0.8, 0.5)
    rng = random.Random(0)
    f = {"code": 0.9, "chat": 0.5}
    assert scaled(probs, "repetitive", f, 0.2, rng) == probs
    assert scaled(probs, None, f, 0.2, rng) == probs
    assert scaled(probs, "chat", f, 0.0, rng) == (0.45, 0.4, 0.25)
    assert scaled(probs, "code", {"code": 2.0}, 0.0, rng)[0] == CAP
    spread = [scaled(probs, "chat", f, 0.2, rng)[0] for _ in range(200)]
    assert statistics.pstdev(spread) > 0.02 and 0.35 < statistics.median(spread) < 0.55


def test_the_seed_profile_has_prompt_kinds_and_others_need_not() -> None:
    seed = load_profile("seed-qwen35-122b")
    assert seed.prompt_kinds is not None and seed.prompt_kinds.chat < seed.prompt_kinds.code < 1
    assert load_profile("bench-noisy").prompt_kinds is None


def test_a_bad_prompt_kinds_table_is_one_line() -> None:
    import tomllib

    from specdecode_tune.errors import ConfigError
    from specdecode_tune.sim.profile import resolve_profile_path
    data = tomllib.loads(resolve_profile_path("seed-qwen35-122b").read_text())
    data["prompt_kinds"] = {"code": 0.9, "chat": 0.0, "request_sigma": 0.1}
    try:
        profile_from_dict(data)
    except ConfigError as e:
        assert "[prompt_kinds] chat" in str(e) and "\n" not in str(e)
    else:
        raise AssertionError("chat = 0 was accepted")
