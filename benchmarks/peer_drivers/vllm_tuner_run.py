"""vllm-tuner's own search code on a replayed landscape (issue 34). Runs in vllm-tuner's venv.

    VENV/bin/python benchmarks/peer_drivers/vllm_tuner_run.py CONFIG.yaml ORACLE_CMD_JSON

What runs is vllm-tuner's (PyPI 0.1.6) `vllm-tuner run --config CONFIG.yaml` path with the
local backend, minus its HTTP transport and wall clock: the CLI's `_load_study_config`, the
baseline boot (`TrialConfig` 0 with the static parameters, as `BaselineRunner` builds it), its
`StudyController` (its sampler, its `n_startup_trials`, its recommended-trial enqueue, its
objective that suggests each parameter and turns a failed trial into 0) and `VLLMLauncher.
build_command`, which builds each boot's real `vllm serve` argv. That argv goes to the stand-in
engine's replay (`benchmarks/peer_engine.py oracle`, the same replay the `vllm` stand-in
executable serves over HTTP), which answers the tok/s the HTTP benchmark would measure at the
config's `concurrent_requests` (50 by default): `BenchmarkResult.output_tokens_per_sec`. A
refused boot is what `TrialRunner` returns when the server does not come up: a FAILED trial.

vllm-tuner's samplers take no seed: each run is a fresh draw of its randomness, as a user's is.

Prints one JSON object: the boots in order (argv, the landscape's key, what was measured), the
study's best trial's boot (vllm-tuner's recommendation) and the sampler.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from vllm_tuner.cli.main import _load_study_config
from vllm_tuner.core.models import BenchmarkResult, TrialConfig, TrialResult, TrialStatus
from vllm_tuner.core.study_controller import StudyController
from vllm_tuner.vllm.launcher import VLLMLauncher


def main(config_path: str, oracle_cmd: list[str]) -> int:
    cfg = _load_study_config(config=config_path)
    oracle = subprocess.Popen(oracle_cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    launcher = VLLMLauncher(model=cfg.model)
    boots: list[dict[str, Any]] = []

    def boot(tc: TrialConfig) -> dict[str, Any]:
        argv = launcher.build_command(tc)
        assert oracle.stdin is not None and oracle.stdout is not None
        oracle.stdin.write(json.dumps({"argv": argv,
                                       "concurrency": cfg.benchmark.concurrent_requests}) + "\n")
        oracle.stdin.flush()
        ans = json.loads(oracle.stdout.readline())
        ans["argv"] = argv
        ans["trial"] = tc.trial_number
        return ans

    class ReplayRunner:
        def run_trial(self, tc: TrialConfig) -> TrialResult:
            ans = boot(tc)
            boots.append(ans)
            if ans["status"] != "ok":
                return TrialResult(trial_number=tc.trial_number, status=TrialStatus.FAILED,
                                   config=tc, error_message=f"Server failed to start: "
                                                           f"{ans['reason']}")
            out = cfg.benchmark.output_tokens
            tok_s = float(ans["at"])
            return TrialResult(trial_number=tc.trial_number, status=TrialStatus.COMPLETED,
                               config=tc, benchmark=BenchmarkResult(
                                   output_tokens_per_sec=tok_s,
                                   throughput_req_per_sec=tok_s / out,
                                   total_requests=1, successful_requests=1))

    baseline = boot(TrialConfig(trial_number=0, parameters={},
                                static_parameters=cfg.static_parameters))
    controller = StudyController(cfg)
    controller.create_study(storage_url=None)
    controller.enqueue_recommended_trial()
    controller.optimize(trial_runner=ReplayRunner())
    study = controller.study
    best = study.best_trial
    by_trial = {b["trial"]: b for b in boots}
    print(json.dumps({"sampler": cfg.optimization.sampler.value,
                      "n_trials": cfg.optimization.n_trials,
                      "concurrency": cfg.benchmark.concurrent_requests,
                      "baseline": baseline, "boots": boots,
                      "best": {"trial": best.number, "value": best.value,
                               "key": by_trial[best.number]["key"],
                               "params": best.params}}))
    oracle.stdin.close()  # type: ignore[union-attr]
    oracle.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], json.loads(sys.argv[2])))
