"""`python -m specdecode_tune.sim --check-args`: the boot's argument checks, one line, nothing
started; and the sim backend's pre-flight, which runs it and names where the arguments came
from."""

from __future__ import annotations

import subprocess
import sys

import pytest

from specdecode_tune.backends import simargs
from specdecode_tune.errors import ConfigError
from specdecode_tune.sim.__main__ import check_args

UNSET = "SPECDECODE_TEST_CHECK_ARGS_UNSET"


@pytest.mark.parametrize("argv, problem", [
    ([], None),
    # (the default profile is the seed's hybrid model: speculation needs radix cache off)
    (["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
      "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
      "--disable-radix-cache"], None),
    (["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
      "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"],
     "the simulator refuses its arguments: ValueError: Speculative decoding for "
     "Qwen3_5MoeForConditionalGeneration is not compatible with radix cache when using "
     "--mamba-scheduler-strategy no_buffer.To use radix cache with speculative decoding, "
     "please use --mamba-scheduler-strategy extra_buffer and set SGLANG_ENABLE_SPEC_V2=1."),
    (["--no-such-flag", "x"], "the simulator does not know the argument(s) --no-such-flag x"),
    (["--cuda-graph-max-bs", "0"],
     "the simulator refuses its arguments: --cuda-graph-max-bs = 0: must be an integer >= 1"),
    (["--port"], "the simulator refuses its arguments: argument --port: expected one argument"),
    (["--boot-time", "-1"],
     "the simulator refuses its arguments: --boot-time = -1.0: must be >= 0"),
    (["--api-key-env", UNSET],
     f"--api-key-env {UNSET}: that environment variable is not set or empty"),
])
def test_check_args_says_what_a_boot_would_refuse(argv: list[str], problem: str | None,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(UNSET, raising=False)
    assert check_args(["--check-args", *argv]) == problem


def test_a_bad_profile_is_said_in_the_profile_readers_words() -> None:
    problem = check_args(["--check-args", "--profile", "/nonexistent/x.profile.toml"])
    assert problem is not None and problem.startswith("profile '/nonexistent/x.profile.toml'")


def test_the_check_mode_prints_one_line_and_exits_2_or_0() -> None:
    bad = subprocess.run([sys.executable, "-m", "specdecode_tune.sim", "--check-args",
                          "--fault", "explode"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and bad.stderr.startswith(
        "error: the simulator refuses its arguments: argument --fault: ")
    good = subprocess.run([sys.executable, "-m", "specdecode_tune.sim", "--check-args"],
                          capture_output=True, text=True, timeout=60)
    assert (good.returncode, good.stdout, good.stderr) == (0, "", "")


@pytest.mark.parametrize("problem, error", [
    ("the simulator does not know the argument(s) --x",
     "backend: the simulator does not know the argument(s) --x (from backend.flags or "
     "backend.extra_args)"),
    ("the simulator refuses its arguments: why", "backend: the simulator refuses its arguments: "
                                                 "why"),
    (f"--api-key-env {UNSET}: that environment variable is not set or empty",
     f"backend.extra_args: --api-key-env {UNSET}: that environment variable is not set or "
     f"empty"),
    ("profile 'x' not found", "profile 'x' not found"),
])
def test_the_backend_names_where_the_arguments_came_from(problem: str, error: str) -> None:
    assert simargs.message(problem) == error


def test_the_backend_check_raises_the_one_line() -> None:
    with pytest.raises(ConfigError, match=r"^backend: the simulator does not know the "
                                          r"argument\(s\) --nope \(from backend"):
        simargs.check("specdecode_tune.sim", ["--nope"])
    simargs.check("specdecode_tune.sim", ["--tp-size", "2"])


def test_the_registry_says_each_points_refusal_in_order() -> None:
    """`backends.refusals` over several points (the simulator through `common.each_refusal`):
    per point, None or its one line, in the points' order."""
    from specdecode_tune.backends import refusals
    from specdecode_tune.config import BackendConfig

    cfg = BackendConfig(kind="sim", model_path="m", speculative_algorithm="EAGLE")
    spec = {"speculative_num_steps": 3, "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": 4, "disable_radix_cache": True}
    found = refusals(cfg, [spec, {**spec, "cuda_graph_max_bs": 0}, {"speculative_num_steps": 0}])
    assert found[0] is None and found[2] is None
    assert found[1] is not None and found[1].startswith("backend: the simulator refuses its "
                                                        "arguments: --cuda-graph-max-bs = 0")
