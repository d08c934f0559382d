"""How a parameter set is identified and stored: canonical JSON, `config_key`, typed columns.

`params_json` is the canonical JSON every table row carries; `config_key` is the stable id of
a parameter set that groups a configuration's first measurement with its re-measurements;
`param_columns` gives the parameters of `schemas.PARAM_COLUMNS` their typed columns.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from ..space import SHORT_NAMES
from .schemas import PARAM_COLUMNS


def plain(value: Any) -> Any:
    """numpy scalars and arrays (Ray Tune and Optuna hand them out) -> plain Python values;
    a `json.dumps(default=...)` hook."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return value.tolist()
    raise TypeError(f"not JSON-serializable: {value!r} ({type(value).__name__})")


def params_json(params: Mapping[str, Any]) -> str:
    """Canonical JSON of the parameters: sorted keys, no spaces, finite numbers only."""
    try:
        return json.dumps(dict(params), sort_keys=True, separators=(",", ":"),
                          allow_nan=False, default=plain)
    except (TypeError, ValueError) as e:
        raise ValueError(f"params must be JSON values with finite numbers, got {params!r}: "
                         f"{e}") from None


def _normalized(value: Any) -> Any:
    # 4 and 4.0 are the same server setting; a config's identity must not depend on which one
    # the sampler produced.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        return {k: _normalized(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normalized(v) for v in value]
    return value


def config_key(params: Mapping[str, Any], *, readable: bool = False) -> str:
    """A stable id of a parameter set: the first 12 hex digits of the SHA-256 of its canonical
    JSON. Keys whose value is None are left out (unset == not given) and integral floats count
    as ints. With `readable=True` the values come first: "steps=4,topk=1,draft=5,mem=0.8#<hash>".
    """
    canon = {k: _normalized(v) for k, v in json.loads(params_json(params)).items()
             if v is not None}
    digest = hashlib.sha256(params_json(canon).encode()).hexdigest()[:12]
    if not readable:
        return digest
    parts = [f"{SHORT_NAMES.get(k, k)}={json.dumps(v, separators=(',', ':'))}"
             for k, v in sorted(canon.items())]
    return f"{','.join(parts)}#{digest}"


def param_columns(params: Mapping[str, Any]) -> dict[str, Any]:
    """The typed parameter columns' values (None where a parameter is not given); ValueError
    for a value of the wrong kind."""
    out: dict[str, Any] = {}
    for name, type_ in PARAM_COLUMNS.items():
        value = plain(params[name]) if hasattr(params.get(name), "tolist") else params.get(name)
        if value is None:
            out[name] = None
        elif pa.types.is_integer(type_):
            if isinstance(value, bool) or not (
                    isinstance(value, numbers.Integral)
                    or (isinstance(value, float) and value.is_integer())):
                raise ValueError(f"params[{name!r}] must be an integer, got {value!r}")
            out[name] = int(value)
        else:
            if isinstance(value, bool) or not isinstance(value, numbers.Real) \
                    or not math.isfinite(value):
                raise ValueError(f"params[{name!r}] must be a finite number, got {value!r}")
            out[name] = float(value)
    return out
