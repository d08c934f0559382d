#!/usr/bin/env bash
# On a GPU machine of 2+ GPUs, after gpu_search.py's route has installed the wheels, built the
# server and made the model (its work dir /tmp/specdecode-gpu): the same six llama-server trials
# with one GPU per trial, run one at a time and then two at a time; prints each trial's GPUs and
# trials per hour.
W=/tmp/specdecode-gpu
export PYTHONPATH="$W/site:$PWD" SPECDECODE_CACHE="$W/cache" PYTHONUNBUFFERED=1
for n in 1 2; do
  sed -e 's/^gpus_per_trial = 2/gpus_per_trial = 1/' -e "s/^max_concurrent = 1/max_concurrent = $n/" \
      -e 's/^repeats = 2/repeats = 1/' -e "s/^name = \"llamacpp-gpu\"/name = \"pairs-$n\"/" \
      -e 's/^enqueue = .*/enqueue = [{speculative_num_steps = 2}, {speculative_num_steps = 4}, {speculative_num_steps = 8}, {speculative_num_steps = 12}, {speculative_num_steps = 16}, {speculative_num_steps = 20}]/' \
      experiments/llamacpp-gpu.toml > /tmp/pairs-$n.toml
  python3 -m specdecode_tune.search --experiment /tmp/pairs-$n.toml --storage /tmp/runs \
    --max-trials 6 2>&1 | grep -E "^trial|finished in" 
  python3 scripts/device/dump_run.py /tmp/runs/pairs-$n "$OUT/pairs-$n.json"
  python3 - "$OUT/pairs-$n.json" "$n" <<'PY'
import json, sys
from datetime import datetime
d = json.load(open(sys.argv[1]))
rows = [t for t in d["trials"] if t["trial_id"] != "baseline"]
ts = lambda s: datetime.fromisoformat(s).timestamp()
span = max(ts(t["finished_at"]) for t in rows) - min(ts(t["started_at"]) for t in rows)
print(f"concurrent={sys.argv[2]}: {len(rows)} trials in {span:.1f}s -> {len(rows) * 3600 / span:.0f} trials/hour")
for t in sorted(rows, key=lambda t: t["started_at"]):
    tele = d["telemetry"]["by_trial"].get(t["trial_id"], {}) if isinstance(d["telemetry"], dict) else {}
    print(" ", t["trial_id"], t["status"], "gpus", t["gpu_ids"], "telemetry", tele.get("gpus"), "sm", tele.get("sm_clock_median"), t["started_at"][11:19], t["finished_at"][11:19])
PY
done
