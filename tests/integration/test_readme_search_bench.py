"""benchmarks/readme_search.py: the README's main command run for real (Ray, the simulator's
server, the load generator, the tables), read back and judged against the profile's optimum.
One small search; the benchmark's own figures come from `--seeds 10` on sim-default."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.slow

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "readme_search.py"

EXPERIMENT = """
name = "bench-tiny"
[backend]
kind = "sim"
model_path = "Qwen/Qwen3.5-122B-A10B"
speculative_algorithm = "EAGLE3"
tp_size = 2
profile = "seed-qwen35-122b"
boot_time_s = 0.2
boot_timeout_s = 30
[backend.flags]
cuda_graph_max_bs = 64
disable_radix_cache = true
[space.speculative_num_steps]
type = "int"
low = 2
high = 5
[space.speculative_eagle_topk]
type = "categorical"
choices = [1]
[space.speculative_num_draft_tokens]
type = "int"
low = 2
high = 8
[space.mem_fraction_static]
type = "float"
low = 0.90
high = 0.92
step = 0.01
[workload]
input_len = 128
output_len = 128
[measure]
concurrency = [1, 16]
warmup_s = 0.3
duration_s = 1.5
warmup_requests = 1
request_timeout_s = 30
[search]
max_trials = 3
max_concurrent = 2
gpus_per_trial = 2
repeats = 2
remeasure_top = 0
[cluster]
num_gpus = 4
num_cpus = 2
"""


@pytest.fixture(scope="module")
def rs() -> ModuleType:
    sys.path.insert(0, str(BENCH.parent))
    spec = importlib.util.spec_from_file_location("readme_search", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["readme_search"] = module
    spec.loader.exec_module(module)
    return module


def test_one_real_search_is_counted_read_back_and_judged(rs: ModuleType, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    exp_path = tmp_path / "tiny.toml"
    exp_path.write_text(EXPERIMENT)
    assert rs.main(["--seeds", "1", "--experiment", str(exp_path),
                    "--storage", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.strip().startswith("seed  0:"))
    boots = int(line.split(":")[1].split()[0])
    # The baseline, 3 explorations at most, the re-measurements (incumbent to 2, none else).
    assert 2 <= boots <= 1 + 3 + 2, line
    assert "of the model's optimum" in line and "vs the run's best median" in line
    assert "target: stops by itself" in out
    # The run dir is a real search's: its tables are there to read again.
    assert (tmp_path / "runs" / "w0" / "seed0" / "tables").is_dir()    # variant 0, seed 0
    assert "measuring" in line and "s a boot" in line


def test_a_real_engine_experiment_is_refused_before_any_run(rs: ModuleType) -> None:
    with pytest.raises(SystemExit) as e:
        rs.main(["--seeds", "1", "--experiment", "experiments/seed-sglang-eagle3.toml"])
    assert e.value.code == 2


def test_the_fixed_variant_and_another_profile(rs: ModuleType) -> None:
    text = (Path(__file__).resolve().parents[2] / "experiments" / "sim-default.toml").read_text()
    fixed = rs.variant(text, "fixed", "bench-two-regime")
    measure = fixed.split("[measure]")[1].split("\n[")[0]
    assert "warmup_s = 1.0" in measure and "duration_s = 4.0" in measure
    assert "precision" not in measure and "max_duration_s" not in measure
    assert 'profile = "bench-two-regime"' in fixed and "seed-qwen35-122b\"" not in fixed
    assert rs.variant(text, "rule", None).rstrip("\n") == text.rstrip("\n")
