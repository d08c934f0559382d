"""Simulator profiles: every coefficient of the performance model, loaded from TOML.

A profile describes one (model, draft, GPU) combination: memory sizes, acceptance probabilities
per draft position, the cost of draft and verify passes, boot time and measurement noise. The
code in `model.py` holds formulas only; the numbers live here, in
`specdecode_tune/sim/profiles/NAME.toml`, so a new hardware or model is a new file, not a patch.

Loading validates every key: an unknown key, a missing key or a value out of range raises
`ConfigError` with one line naming the file, the key, the value and what is allowed.
Profiles are frozen dataclasses, so they hash, pickle into Ray actors and can key caches.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import tomllib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from specdecode_tune.errors import ConfigError
from specdecode_tune.sim.faults import parse_faults

PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
DEFAULT_PROFILE = "seed-qwen35-122b"


_BOUNDS = {"gt": (operator.gt, ">"), "ge": (operator.ge, ">="), "lt": (operator.lt, "<"),
           "le": (operator.le, "<=")}


def _rule(**limits: float) -> dict[str, dict[str, float]]:
    """Field metadata for validation: gt / ge / lt / le bounds (numbers, or each list element)."""
    return {"rule": limits}


@dataclass(frozen=True, slots=True)
class Hardware:
    """The GPUs one server runs on, and how the cost coefficients scale with tensor parallelism."""

    gpu_memory_bytes: int = field(metadata=_rule(gt=0))       # per GPU, as the driver reports it
    tp_size: int = field(metadata=_rule(ge=1))                # default --tp-size (the costs' fit)
    # Bandwidth-bound costs scale as (tp_size / tp) ** exponent when --tp-size differs
    # (1.0 = perfect scaling; below 1 accounts for all-reduce overhead).
    tp_scaling_exponent: float = field(metadata=_rule(ge=0, le=1))


@dataclass(frozen=True, slots=True)
class Defaults:
    """Server defaults used when a launch flag is not given."""

    mem_fraction_static: float = field(metadata=_rule(gt=0, lt=1))
    cuda_graph_max_bs: int = field(metadata=_rule(ge=1))
    max_new_tokens: int = field(metadata=_rule(ge=1))
    # What the server picks when --speculative-algorithm is set without the three numbers.
    speculative_num_steps: int = field(metadata=_rule(ge=1))
    speculative_eagle_topk: int = field(metadata=_rule(ge=1))
    speculative_num_draft_tokens: int = field(metadata=_rule(ge=2))


@dataclass(frozen=True, slots=True)
class Memory:
    """Memory budget per GPU. Totals (weights, KV per token) are split evenly over TP ranks."""

    target_weight_bytes: int = field(metadata=_rule(gt=0))       # whole model, all ranks
    draft_weight_bytes: int = field(metadata=_rule(ge=0))        # loaded only with a draft
    kv_bytes_per_token: int = field(metadata=_rule(gt=0))        # target KV, all layers, all ranks
    draft_kv_bytes_per_token: int = field(metadata=_rule(ge=0))  # draft KV, added with a draft
    # Inside the static pool (mem_fraction_static): reserved before the KV pool is sized.
    pool_fixed_bytes: int = field(metadata=_rule(ge=0))
    # ... plus this much per (cuda_graph_max_bs x tokens verified per request): buffers and
    # per-draft-token states sized for the largest captured batch. This is what makes the KV
    # pool shrink as draft tokens grow.
    pool_bytes_per_graph_token: int = field(metadata=_rule(ge=0))
    # Outside the pool, in the (1 - mem_fraction_static) headroom: CUDA context, NCCL,
    # activations and cuda-graph memory. Too little headroom = OOM at start-up.
    headroom_fixed_bytes: int = field(metadata=_rule(ge=0))
    headroom_bytes_per_graph_token: int = field(metadata=_rule(ge=0))
    # The derived running limit is max_total_num_tokens // request_reserve_tokens; a KV pool
    # smaller than one reservation is "Not enough memory" at start-up.
    request_reserve_tokens: int = field(metadata=_rule(ge=1))
    context_length: int = field(metadata=_rule(ge=2))
    # Optional. The share of the per-graph-token need that start-up uses only for a while (the
    # warm-up passes before each capture) and frees before SGLang reads the free memory it
    # logs after the capture ("Capture cuda graph end. ... mem usage=K GB. avail mem=X GB"):
    # the OOM rule checks the whole need, the log shows what stays, so the logged room
    # overstates the real one, as a real server's does, by s / (1 - s) of what the graphs keep.
    # 0.49 (0.97): a stand-in capture on an H200 with SGLang's own batch-size list overstated
    # it by 0.97 of the graphs' per-token part (the second-largest batch's warm-up; powers of
    # two: 0.5), and these graphs have no fixed part (docs/engines-sglang.md section 6b). Not
    # calibrated on SGLang itself.
    capture_transient_share: float = field(default=0.49, metadata=_rule(ge=0, lt=1))


@dataclass(frozen=True, slots=True)
class Acceptance:
    """Conditional acceptance per draft position: entry i = P(position i+1 accepted | all before).

    Positions past the end of a list reuse its last entry. `sibling_hit` is, for tree drafts
    (topk > 1), the chance that the next-ranked draft candidate at a depth is right when the
    ones ranked above it were wrong (see `model.tree_acceptance`).
    """

    greedy: tuple[float, ...] = field(metadata=_rule(ge=0, le=1))
    sampled: tuple[float, ...] = field(metadata=_rule(ge=0, le=1))
    sibling_hit: float = field(metadata=_rule(ge=0, le=1))


@dataclass(frozen=True, slots=True)
class PromptKinds:
    """Optional `[prompt_kinds]`: acceptance factors by prompt kind (sim/promptkind.py)."""

    code: float = field(metadata=_rule(gt=0, le=2))
    chat: float = field(metadata=_rule(gt=0, le=2))
    request_sigma: float = field(metadata=_rule(ge=0, lt=1))   # per-request log-normal factor

    def factors(self) -> dict[str, float]:
        return {"code": self.code, "chat": self.chat}


@dataclass(frozen=True, slots=True)
class Cost:
    """Time of one scheduler iteration, in seconds, at `hardware.tp_size` (see
    `model.step_time`)."""

    decode_fixed_s: float = field(metadata=_rule(ge=0))        # launch + attention + dense, a step
    verify_moe_s: float = field(metadata=_rule(ge=0))          # streaming every routed expert once
    moe_route_fraction: float = field(metadata=_rule(gt=0, le=1))   # experts per token / experts
    verify_per_token_s: float = field(metadata=_rule(ge=0))    # per (padded) token verified
    verify_token_tile: int = field(metadata=_rule(ge=1))       # tokens in a pass pad to a multiple
    spec_fixed_s: float = field(metadata=_rule(ge=0))          # draft extend, tree build, sampling
    draft_step_fixed_s: float = field(metadata=_rule(ge=0))    # one draft forward
    draft_step_per_token_s: float = field(metadata=_rule(ge=0))    # per (batch x topk) token
    eager_factor: float = field(metadata=_rule(ge=1))          # batch above cuda_graph_max_bs
    prefill_fixed_s: float = field(metadata=_rule(ge=0))
    prefill_per_token_s: float = field(metadata=_rule(ge=0))


@dataclass(frozen=True, slots=True)
class Boot:
    seconds: float = field(metadata=_rule(ge=0))
    # Start-up failures surface where SGLang hits them: memory checks after the weights load,
    # at this fraction of the boot time.
    fail_at_fraction: float = field(metadata=_rule(ge=0, le=1))


@dataclass(frozen=True, slots=True)
class Noise:
    boot_sigma: float = field(metadata=_rule(ge=0, lt=1))   # log-normal speed factor per boot
    step_sigma: float = field(metadata=_rule(ge=0, lt=1))   # log-normal jitter per iteration


@dataclass(frozen=True, slots=True)
class Eos:
    # Without ignore_eos a request also stops at a random EOS with this mean length
    # (geometric); 0 disables EOS, so every request runs to max_new_tokens.
    mean_output_tokens: float = field(metadata=_rule(ge=0))


@dataclass(frozen=True, slots=True)
class Calibration:
    """The workload the profile's reference figures are assumed to come from."""

    input_len: int = field(metadata=_rule(ge=1))
    output_len: int = field(metadata=_rule(ge=1))
    temperature: float = field(metadata=_rule(ge=0))


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    description: str
    model_path: str
    hardware: Hardware
    defaults: Defaults
    memory: Memory
    acceptance: Acceptance
    cost: Cost
    boot: Boot
    noise: Noise
    eos: Eos
    calibration: Calibration
    source: str = ""   # the file it came from (for messages)
    faults: tuple[str, ...] = ()   # injected faults (see sim/faults.py); none in real profiles
    # The target's `architectures[0]` in its config.json: SGLang's start-up rules that depend
    # on the model (a hybrid model's radix-cache refusal, see boot.py); "" = none of those.
    architecture: str = ""
    prompt_kinds: PromptKinds | None = None   # acceptance by prompt kind; None: one table


_SECTIONS: dict[str, type] = {
    "hardware": Hardware,
    "defaults": Defaults,
    "memory": Memory,
    "acceptance": Acceptance,
    "cost": Cost,
    "boot": Boot,
    "noise": Noise,
    "eos": Eos,
    "calibration": Calibration,
}
_TOP_KEYS = ("name", "description", "model_path")
_OPTIONAL_KEYS = ("faults", "architecture", "prompt_kinds")


def resolve_profile_path(name_or_path: str | Path) -> Path:
    """A bare name means `profiles/NAME.toml`; anything with a slash or `.toml` is a path."""
    text = str(name_or_path)
    if "/" in text or text.endswith(".toml"):
        return Path(text)
    return PROFILE_DIR / f"{text}.toml"


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))


def load_profile(name_or_path: str | Path = DEFAULT_PROFILE) -> Profile:
    """Load and validate a profile by bare name or by path; cached, since profiles are frozen."""
    return _load(resolve_profile_path(name_or_path).resolve())


@lru_cache(maxsize=32)
def _load(path: Path) -> Profile:
    allowed = f"a profile TOML file, or a bundled profile: {', '.join(available_profiles())}"
    if path.is_dir():
        raise ConfigError(f"profile {path}: is a directory; allowed: {allowed}")
    if not path.is_file():
        raise ConfigError(
            f"profile {str(path)!r} not found; bundled profiles: {', '.join(available_profiles())}"
        )
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"profile {path}: cannot read ({e.strerror}); allowed: {allowed}") \
            from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise ConfigError(f"profile {path}: line {line}: not UTF-8 (byte 0x{raw[e.start]:02x}); "
                          f"allowed: UTF-8 TOML") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"profile {path}: not valid TOML: {e}") from None
    except RecursionError:
        raise ConfigError(f"profile {path}: TOML nested too deeply to read") from None
    return profile_from_dict(data, source=str(path))


def profile_from_dict(data: dict[str, Any], source: str = "<dict>") -> Profile:
    """Build a Profile from parsed TOML, validating every key (also used by tests and fits)."""
    where = f"profile {source}"
    unknown = set(data) - set(_TOP_KEYS) - set(_OPTIONAL_KEYS) - set(_SECTIONS)
    if unknown:
        allowed = ", ".join([*_TOP_KEYS, *_OPTIONAL_KEYS, *_SECTIONS])
        raise ConfigError(f"{where}: unknown key {min(unknown)!r}; allowed: {allowed}")
    top: dict[str, Any] = {}
    for key in _TOP_KEYS:
        value = data.get(key)
        if not isinstance(value, str) or (key == "name" and not value):
            raise ConfigError(f"{where}: {key} = {value!r}: must be a string")
        top[key] = value
    sections = {}
    for name, cls in _SECTIONS.items():
        table = data.get(name)
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: [{name}] = {table!r}: must be a table")
        sections[name] = _build_section(where, name, cls, table)
    faults = data.get("faults", [])
    if not isinstance(faults, list) or not all(isinstance(f, str) for f in faults):
        raise ConfigError(f"{where}: faults = {faults!r}: must be a list of fault specs "
                          f"(strings, see specdecode_tune/sim/faults.py)")
    try:
        parse_faults(faults)
    except ConfigError as e:
        raise ConfigError(f"{where}: faults: {e}") from None
    architecture = data.get("architecture", "")
    if not isinstance(architecture, str):
        raise ConfigError(f"{where}: architecture = {architecture!r}: must be a string (the "
                          f"model's config.json architectures[0], e.g. LlamaForCausalLM)")
    kinds = data.get("prompt_kinds")
    if kinds is not None and not isinstance(kinds, dict):
        raise ConfigError(f"{where}: [prompt_kinds] = {kinds!r}: must be a table")
    prompt_kinds = _build_section(where, "prompt_kinds", PromptKinds, kinds) \
        if kinds is not None else None
    return Profile(**top, **sections, source=source, faults=tuple(faults),
                   architecture=architecture, prompt_kinds=prompt_kinds)


def _build_section(where: str, section: str, cls: type, table: dict[str, Any]) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(table) - set(fields)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key [{section}] {min(unknown)!r}; allowed: {', '.join(fields)}"
        )
    values = {}
    for name, f in fields.items():
        key = f"[{section}] {name}"
        if name not in table:
            if f.default is not dataclasses.MISSING:
                continue            # an optional key: the dataclass's default
            raise ConfigError(f"{where}: missing key {key}")
        values[name] = _check_value(where, key, table[name], f)
    return cls(**values)


def _check_value(where: str, key: str, value: Any, f: dataclasses.Field) -> Any:
    kind = f.type if isinstance(f.type, str) else f.type.__name__
    if kind == "str":
        if not isinstance(value, str):
            raise ConfigError(f"{where}: {key} = {value!r}: must be a string")
        return value
    if kind.startswith("tuple"):
        if not isinstance(value, list) or not value:
            raise ConfigError(f"{where}: {key} = {value!r}: must be a non-empty list of numbers")
        return tuple(_check_number(where, f"{key}[{i}]", v, float, f) for i, v in enumerate(value))
    return _check_number(where, key, value, int if kind == "int" else float, f)


def _check_number(where: str, key: str, value: Any, kind: type, f: dataclasses.Field) -> Any:
    # bool is an int in Python; a `true` in a numeric key is a mistake, not a 1.
    ok_types = (int,) if kind is int else (int, float)
    if isinstance(value, bool) or not isinstance(value, ok_types) or not math.isfinite(value):
        raise ConfigError(f"{where}: {key} = {value!r}: must be "
                          f"{'an integer' if kind is int else 'a number'}")
    limits = f.metadata.get("rule", {})
    if not all(_BOUNDS[name][0](value, bound) for name, bound in limits.items()):
        allowed = " and ".join(f"{_BOUNDS[name][1]} {bound}" for name, bound in limits.items())
        raise ConfigError(f"{where}: {key} = {value!r}: must be {allowed}")
    return kind(value)
