"""Write a run dir's trials, levels and telemetry summary as one small JSON (for $OUT)."""

from __future__ import annotations

import json
import sys

from specdecode_tune import store


def main(run_dir: str, out: str) -> None:
    tables = store.read_tables(run_dir)
    data = {"trials": tables.trials.drop_columns(["facts_json"]).to_pylist(),
            "levels": tables.levels.drop_columns(["params_json"]).to_pylist()}
    try:
        tele = store.read_table(run_dir, "telemetry")
        rows = tele.to_pylist()
        by_trial = {}
        for t in sorted({r["trial_id"] for r in rows}):
            mine = [r for r in rows if r["trial_id"] == t]
            clocks = sorted(r["sm_clock_mhz"] for r in mine if r["sm_clock_mhz"] is not None)
            by_trial[t] = {"gpus": sorted({r["uuid"] for r in mine}), "samples": len(mine),
                           "sm_clock_min": clocks[0] if clocks else None,
                           "sm_clock_median": clocks[len(clocks) // 2] if clocks else None,
                           "max_power_w": max((r["power_w"] or 0) for r in mine),
                           "events": sorted({e for r in mine for e in r["clock_events"]}),
                           "foreign": sorted({f["pid"] for r in mine for f in r["foreign"]})}
        data["telemetry"] = {"rows": len(rows), "by_trial": by_trial}
    except Exception as e:  # noqa: BLE001 - a summary, best effort
        data["telemetry"] = str(e)
    with open(out, "w") as f:
        json.dump(data, f, default=str, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
