"""Ray for the search: a local cluster started here (logical GPUs for the simulator, the
experiment's `[cluster]` resources), or a running cluster joined (`--address`); whether its GPUs
can hold one trial; the dashboard's line; the node a task runs on.

The one module of the search that uses a private helper of Ray:
`ray._private.utils.get_dashboard_dependency_error()`. Ray has no public way to ask, before
`ray.init`, whether its dashboard can start (a minimal `ray[tune]` lacks `ray[default]`'s
packages), and `ray.init(include_dashboard=True)` fails the start-up without them.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ..config import ClusterConfig
from ..errors import ConfigError
from .progress import say


def start_ray(cluster: ClusterConfig, address: str | None) -> Any:
    """Join the cluster at `address`, or start a local one; returns Ray's context."""
    import ray

    kwargs: dict[str, Any] = dict(logging_level=logging.WARNING, log_to_driver=False,
                                  configure_logging=True)
    if address:
        return ray.init(address=address, **kwargs)
    # A minimal Ray (plain ray[tune], no ray[default]) has no dashboard: run without one and
    # say so, rather than fail the search.
    missing = ray._private.utils.get_dashboard_dependency_error()
    if missing:
        say(f"dashboard: not available ({missing}); install ray[default] for it")
    return ray.init(address="local", num_gpus=cluster.num_gpus, num_cpus=cluster.num_cpus,
                    include_dashboard=not missing, dashboard_host="127.0.0.1", **kwargs)


def check_gpus(gpus_per_trial: int) -> None:
    """ConfigError where the cluster has fewer GPUs than one trial asks for."""
    import ray

    have = int(ray.cluster_resources().get("GPU", 0))
    if gpus_per_trial > have:
        raise ConfigError(f"search.gpus_per_trial = {gpus_per_trial}: the Ray cluster has "
                          f"{have} GPU(s); declare logical GPUs with [cluster] num_gpus for the "
                          f"simulator, or join a cluster with GPUs (--address)")


def dashboard_lines(ctx: Any) -> list[str]:
    url = getattr(ctx, "dashboard_url", None)
    if not url:
        return ["dashboard: not started (install ray[default] for it)"]
    url = url if url.startswith("http") else f"http://{url}"
    token = Path.home() / ".ray" / "auth_token"
    how = (f"authenticate with the token in {token}" if token.exists()
           else "token authentication as configured for this cluster")
    return [f"dashboard: {url}  ({how}; trials run as ImplicitFunc actors, live metrics "
            f"ray_specdecode_output_tok_s / ray_specdecode_accept_length by trial_id)"]


def node_id() -> str | None:
    """The Ray node this process runs on (None outside Ray: a trainable called directly)."""
    import ray
    try:
        return ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001 - outside Ray (tests calling the trainable directly)
        return None
