"""What must hold of docker-compose.yml and deploy/: loopback-only ports, token authentication,
GPU pairs, the shared run dir and model cache, the search command, and metrics wired from every
Ray node through Prometheus to Grafana and the Ray dashboard.

Each check runs twice: on the file itself (PyYAML, with compose's `${VAR:-default}`
interpolation applied here) and on what `docker-compose config` makes of it (skipped when
docker-compose is not installed; CI installs Debian's docker-compose 1.29, which needs no engine
for `config`).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from specdecode_tune.config import load_experiment
from tests.conftest import REPO

yaml = pytest.importorskip("yaml")

COMPOSE = REPO / "docker-compose.yml"
DEPLOY = REPO / "deploy"
TOKEN = "token-for-the-test"
IMAGE_ROOT = PurePosixPath("/opt/specdecode_tune")   # WORKDIR of deploy/Dockerfile


# ---------------------------------------------------------------------------------------------
# Loading the two ways

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's variable substitution, enough for this file: ${V}, ${V:-d}, ${V-d}, ${V:?m}."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match) -> str:
        name, op, arg = m.group(1), m.group(2), m.group(3)
        got = env.get(name)
        if op in (":-", "-"):
            return got if (got if op == ":-" else got is not None) else arg
        if op in (":?", "?"):
            if not got:
                raise KeyError(f"{name}: {arg}")
            return got
        return got or ""

    return _VAR.sub(sub, value)


def from_file() -> dict:
    return interpolate(yaml.safe_load(COMPOSE.read_text()), {"RAY_AUTH_TOKEN": TOKEN})


def docker_compose(*args: str, env: dict[str, str] | None = None
                   ) -> subprocess.CompletedProcess:
    # Only the variables the file uses from the caller; nothing from the developer's shell.
    base = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.run(["docker-compose", "-f", str(COMPOSE), "--profile", "search", *args],
                          cwd=REPO, env={**base, **(env or {})}, capture_output=True,
                          text=True, timeout=60, check=False)


def from_docker_compose() -> dict:
    if shutil.which("docker-compose") is None:
        pytest.skip("docker-compose is not installed (CI installs Debian's 1.29)")
    out = docker_compose("config", env={"RAY_AUTH_TOKEN": TOKEN})
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout)


@pytest.fixture(scope="module", params=["file", "docker-compose-config"])
def compose(request: pytest.FixtureRequest) -> dict:
    return from_file() if request.param == "file" else from_docker_compose()


# ---------------------------------------------------------------------------------------------
# Reading services, whatever syntax (short or long) the source uses


def argv(svc: dict, key: str = "command") -> list[str]:
    value = svc.get(key) or []
    return shlex.split(value) if isinstance(value, str) else [str(v) for v in value]


def option(args: list[str], name: str) -> str | None:
    """The value of `--name=value` or `--name value`."""
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def ports(svc: dict) -> list[tuple[str, str, str]]:
    """(host ip, published, target) of each published port."""
    out = []
    for p in svc.get("ports", []):
        if isinstance(p, dict):
            out.append((str(p.get("host_ip", "")), str(p.get("published", "")),
                        str(p["target"])))
            continue
        parts = str(p).split("/")[0].split(":")
        if len(parts) == 3:
            out.append((parts[0], parts[1], parts[2]))
        else:
            out.append(("", parts[0] if len(parts) == 2 else "", parts[-1]))
    return out


def mounts(svc: dict) -> dict[str, str]:
    """Container path -> source (a volume name, or a bind source made absolute)."""
    out = {}
    for v in svc.get("volumes", []):
        if isinstance(v, dict):
            src, dst = str(v.get("source", "")), str(v["target"])
        else:
            src, dst = str(v).split(":")[:2]
        if src.startswith((".", "/")):
            src = str((REPO / src).resolve())
        out[dst] = src
    return out


def env(svc: dict) -> dict[str, str]:
    e = svc.get("environment") or {}
    if isinstance(e, list):
        e = dict(item.split("=", 1) for item in e)
    return {k: "" if v is None else str(v) for k, v in e.items()}


def ray_nodes(compose: dict) -> dict[str, dict]:
    return {name: s for name, s in compose["services"].items()
            if argv(s)[:2] == ["ray", "start"]}


def head(compose: dict) -> tuple[str, dict]:
    heads = [(n, s) for n, s in ray_nodes(compose).items() if "--head" in argv(s)]
    assert len(heads) == 1, heads
    return heads[0]


def workers(compose: dict) -> dict[str, dict]:
    return {n: s for n, s in ray_nodes(compose).items() if "--head" not in argv(s)}


def gpu_devices(svc: dict) -> list[dict]:
    return (((svc.get("deploy") or {}).get("resources") or {}).get("reservations")
            or {}).get("devices") or []


def search_service(compose: dict) -> dict:
    found = [s for s in compose["services"].values()
             if "specdecode_tune.search" in argv(s, "entrypoint") + argv(s)]
    assert len(found) == 1, "expected one service running the search"
    return found[0]


def search_args(compose: dict) -> list[str]:
    s = search_service(compose)
    return argv(s, "entrypoint") + argv(s)


# ---------------------------------------------------------------------------------------------
# What must hold


def test_every_published_port_is_bound_to_loopback(compose: dict) -> None:
    published = 0
    for name, svc in compose["services"].items():
        assert svc.get("network_mode") != "host", name
        for host_ip, _, target in ports(svc):
            published += 1
            assert host_ip == "127.0.0.1", f"{name} publishes {target} on {host_ip or 'all'}"
    assert published >= 3            # the Ray dashboard, Prometheus, Grafana


def test_the_dashboard_prometheus_and_grafana_are_published(compose: dict) -> None:
    targets = {name: {t for _, _, t in ports(svc)} for name, svc in compose["services"].items()}
    head_name, head_svc = head(compose)
    assert option(argv(head_svc), "--dashboard-port") in targets[head_name]
    assert option(argv(head_svc), "--dashboard-host") == "0.0.0.0"   # reachable via the port
    assert "9090" in targets["prometheus"] and "3000" in targets["grafana"]


def test_ray_token_authentication_on_every_node_and_the_driver(compose: dict) -> None:
    for name, svc in [*ray_nodes(compose).items(), ("search", search_service(compose))]:
        e = env(svc)
        assert e.get("RAY_AUTH_MODE") == "token", name
        assert e.get("RAY_AUTH_TOKEN") == TOKEN, name


def test_no_default_token_in_the_file() -> None:
    raw = yaml.safe_load(COMPOSE.read_text())
    tokens = {str(v) for v in _walk(raw, "RAY_AUTH_TOKEN")}
    assert tokens and all(re.fullmatch(r"\$\{RAY_AUTH_TOKEN:\?[^}]+\}", t) for t in tokens)


def _walk(node: Any, key: str) -> list[Any]:
    if isinstance(node, dict):
        return [v for k, v in node.items() if k == key] + \
            [x for v in node.values() for x in _walk(v, key)]
    if isinstance(node, list):
        return [x for v in node for x in _walk(v, key)]
    return []


def test_gpu_workers_reserve_disjoint_gpu_pairs(compose: dict) -> None:
    ws = workers(compose)
    assert len(ws) >= 2
    head_name, head_svc = head(compose)
    seen: set[str] = set()
    for name, svc in ws.items():
        devices = gpu_devices(svc)
        assert len(devices) == 1, name
        d = devices[0]
        assert "gpu" in d["capabilities"] and d.get("driver") == "nvidia", name
        # Named devices: Docker does not share out `count`, two workers would get the same GPUs.
        ids = [str(i) for i in d.get("device_ids", [])]
        assert len(ids) == 2 and "count" not in d, name
        assert not seen & set(ids), f"{name} shares GPUs {sorted(seen & set(ids))}"
        seen |= set(ids)
        args = argv(svc)
        assert option(args, "--num-gpus") == "2", name
        assert option(args, "--address") == f"{head_name}:{option(argv(head_svc), '--port')}"
        assert svc.get("shm_size"), f"{name}: SGLang with TP=2 needs a large /dev/shm"
    assert not gpu_devices(head_svc) and option(argv(head_svc), "--num-gpus") == "0"


def test_the_image_is_sglang_with_this_package(compose: dict) -> None:
    images = {s.get("image") for s in [*ray_nodes(compose).values(), search_service(compose)]}
    assert len(images) == 1, "every Ray node and the driver must run one image (Ray versions)"
    for svc in ray_nodes(compose).values():
        build = svc.get("build")
        if build:
            context = Path(build["context"])
            assert (context if context.is_absolute() else REPO / context).resolve() == REPO
            assert Path(build["dockerfile"]).name == "Dockerfile"
    text = (DEPLOY / "Dockerfile").read_text()
    default_tag = re.search(r"^ARG SGLANG_TAG=(\S+)$", text, re.MULTILINE)
    assert default_tag and default_tag.group(1) != "latest"
    assert re.search(r"^FROM \$\{SGLANG_IMAGE\}:\$\{SGLANG_TAG\}$", text, re.MULTILINE)
    assert re.search(r"^ARG SGLANG_IMAGE=lmsysorg/sglang$", text, re.MULTILINE)
    assert re.search(r"pip install [^\n]*\s\.\s", text)
    for src in re.findall(r"^COPY (.+) \S+$", text, re.MULTILINE):
        for path in src.split():
            assert (REPO / path).exists(), f"COPY {path}: not in the repository"


def test_one_run_dir_and_one_model_cache_for_every_node(compose: dict) -> None:
    storage = option(search_args(compose), "--storage")
    assert storage and storage.startswith("/")
    run_volumes = set()
    for name, svc in [*ray_nodes(compose).items(), ("search", search_service(compose))]:
        m = mounts(svc)
        assert storage in m, f"{name} does not mount the run dir at {storage}"
        run_volumes.add(m[storage])
    assert len(run_volumes) == 1, f"the nodes mount different run dirs: {run_volumes}"
    caches = {frozenset((t, s) for t, s in mounts(svc).items() if t.startswith("/models"))
              for svc in workers(compose).values()}
    assert len(caches) == 1 and next(iter(caches)), "workers must share one model cache"
    hf_homes = {env(svc).get("HF_HOME") for svc in workers(compose).values()}
    assert len(hf_homes) == 1 and next(iter(hf_homes)).startswith("/models")


def test_the_search_command_drives_the_cluster_from_the_head(compose: dict) -> None:
    args = search_args(compose)
    assert args[:3] == ["python3", "-m", "specdecode_tune.search"]
    assert option(args, "--address") == "auto"
    svc = search_service(compose)
    head_name, head_svc = head(compose)
    # A Ray driver needs a local raylet: the search shares the head's namespaces and temp dir.
    for key in ("network_mode", "ipc", "pid"):
        assert svc.get(key) == f"service:{head_name}", key
    assert mounts(svc)["/tmp/ray"] == mounts(head_svc)["/tmp/ray"]
    # The default experiment is shipped, is for the GPU pairs the workers hold, and the image
    # sees the repository's experiments folder where the search looks for it.
    exp_arg = option(args, "--experiment")
    assert exp_arg and not exp_arg.startswith("/")
    exp = load_experiment(REPO / exp_arg)
    assert exp.backend.kind == "sglang" and exp.search.gpus_per_trial == 2
    exp_dir = str(IMAGE_ROOT / "experiments")
    for name, s in [*workers(compose).items(), ("search", svc)]:
        assert mounts(s).get(exp_dir) == str((REPO / "experiments").resolve()), name


def test_every_ray_node_exports_metrics_that_prometheus_scrapes(compose: dict) -> None:
    nodes = ray_nodes(compose)
    metric_ports = {option(argv(s), "--metrics-export-port") for s in nodes.values()}
    assert len(metric_ports) == 1 and None not in metric_ports
    _, head_svc = head(compose)
    ray_tmp = mounts(head_svc)["/tmp/ray"]
    prom = compose["services"]["prometheus"]
    pm = mounts(prom)
    config_path = option(argv(prom), "--config.file")
    assert pm[config_path] == str((DEPLOY / "prometheus.yml").resolve())
    prom_cfg = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    files = [f for job in prom_cfg["scrape_configs"] for sd in job.get("file_sd_configs", [])
             for f in sd["files"]]
    # Ray's head writes every node's metrics address into its temp dir; Prometheus reads it
    # from the same volume.
    assert files == ["/tmp/ray/prom_metrics_service_discovery.json"]
    assert pm["/tmp/ray"] == ray_tmp


def test_grafana_shows_ray_s_dashboards_and_the_dashboard_embeds_them(compose: dict) -> None:
    _, head_svc = head(compose)
    he = env(head_svc)
    graf = compose["services"]["grafana"]
    gm = mounts(graf)
    prov = DEPLOY / "grafana" / "provisioning"
    assert gm["/etc/grafana/provisioning"] == str(prov.resolve())
    ds = yaml.safe_load((prov / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert len(ds) == 1 and ds[0]["isDefault"]
    # The dashboard asks the same Prometheus Grafana reads, under the same name.
    assert he["RAY_PROMETHEUS_HOST"] == ds[0]["url"] == "http://prometheus:9090"
    assert he["RAY_PROMETHEUS_NAME"] == ds[0]["name"]
    assert he["RAY_GRAFANA_HOST"] == "http://grafana:3000"
    grafana_published = {p for _, p, t in ports(graf) if t == "3000"}
    assert he["RAY_GRAFANA_IFRAME_HOST"] in {f"http://127.0.0.1:{p}" for p in grafana_published}
    genv = env(graf)
    assert genv["GF_SECURITY_ALLOW_EMBEDDING"] == "true"
    assert genv["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert genv["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    providers = {p["name"]: p["options"]["path"] for p in yaml.safe_load(
        (prov / "dashboards" / "dashboards.yml").read_text())["providers"]}
    # Ray's own dashboards, as the head generates them under its session dir.
    assert providers["ray"] == "/tmp/ray/session_latest/metrics/grafana/dashboards"
    assert gm["/tmp/ray"] == mounts(head_svc)["/tmp/ray"]
    assert gm[providers["specdecode_tune"]] == str((DEPLOY / "grafana" / "dashboards").resolve())


def test_the_trial_dashboard_reads_the_gauges_the_search_exports() -> None:
    source = "\n".join(p.read_text() for p in (REPO / "specdecode_tune" / "search").glob("*.py"))
    gauges = {f"ray_{name}" for name in re.findall(r'Gauge\(\s*"([a-z_]+)"', source)}
    assert gauges, "the search exports no gauges any more"
    exprs = " ".join(t["expr"] for p in json.loads(
        (DEPLOY / "grafana" / "dashboards" / "specdecode-tune.json").read_text())["panels"]
        for t in p["targets"])
    for g in gauges:
        assert g in exprs, f"no panel shows {g}"
    names = set(re.findall(r"\bray_specdecode_[a-z_]+", exprs))
    assert names <= gauges, f"panels query metrics the search does not export: {names - gauges}"


# ---------------------------------------------------------------------------------------------
# docker-compose itself


@pytest.mark.skipif(shutil.which("docker-compose") is None,
                    reason="docker-compose is not installed (CI installs Debian's 1.29)")
def test_docker_compose_refuses_to_start_without_a_token() -> None:
    out = docker_compose("config", "-q")
    assert out.returncode != 0
    assert "RAY_AUTH_TOKEN" in out.stderr
