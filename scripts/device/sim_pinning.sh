#!/usr/bin/env bash
# On a GPU machine of 2+ GPUs, after gpu_search.py's route has installed the wheels (its work
# dir /tmp/specdecode-gpu): the simulator experiment with one real GPU per trial and two trials
# at a time; each trial's server reports the GPU ids it was given; telemetry reads real NVML.
export PYTHONPATH="/tmp/specdecode-gpu/site:$PWD" PYTHONUNBUFFERED=1
sed -e 's/^gpus_per_trial = 2/gpus_per_trial = 1/' -e '/^num_gpus = 4/d' -e '/^num_cpus = 2/d' \
  tests/data/sim-small.toml > /tmp/sim-gpu.toml
timeout 280 python3 -m specdecode_tune.search --experiment /tmp/sim-gpu.toml --storage /tmp/runs \
  --max-trials "${1:-4}" 2>&1 | grep -v WARNING | tail -25
python3 scripts/device/dump_run.py /tmp/runs/sim-small "$OUT/sim_pinning.json"
python3 - "$OUT/sim_pinning.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for t in d["trials"]:
    print(t["trial_id"], t["status"], t["gpu_ids"], t["started_at"], t["finished_at"])
print(json.dumps(d["telemetry"])[:1500])
PY
