"""Loading and validating simulator profiles."""

from __future__ import annotations

import copy
import pickle
import tomllib
from pathlib import Path

import pytest

from specdecode_tune.errors import ConfigError
from specdecode_tune.sim.profile import (
    PROFILE_DIR,
    Profile,
    available_profiles,
    load_profile,
    profile_from_dict,
)

SEED_TOML = PROFILE_DIR / "seed-qwen35-122b.toml"


def seed_dict() -> dict:
    with SEED_TOML.open("rb") as f:
        return tomllib.load(f)


def test_bare_name_and_path_load_the_same_profile() -> None:
    by_name = load_profile("seed-qwen35-122b")
    assert isinstance(by_name, Profile) and by_name.name == "seed-qwen35-122b"
    assert load_profile(str(SEED_TOML)) == by_name
    assert load_profile() == by_name
    assert "seed-qwen35-122b" in available_profiles()


def test_profile_is_frozen_hashable_and_pickles() -> None:
    p = load_profile("seed-qwen35-122b")
    with pytest.raises(AttributeError):
        p.name = "x"  # type: ignore[misc]  # frozen: the assignment must fail
    assert pickle.loads(pickle.dumps(p)) == p
    assert hash(p) == hash(pickle.loads(pickle.dumps(p)))


def test_seed_profile_noise_is_one_to_two_percent_and_sampled_below_greedy() -> None:
    p = load_profile("seed-qwen35-122b")
    assert 0.01 <= p.noise.boot_sigma <= 0.02 and 0.005 <= p.noise.step_sigma <= 0.02
    assert all(s < g for s, g in zip(p.acceptance.sampled, p.acceptance.greedy))
    assert p.hardware.tp_size == 2


def test_unknown_profile_names_the_bundled_ones() -> None:
    with pytest.raises(ConfigError, match="seed-qwen35-122b"):
        load_profile("no-such-profile")


def test_a_profile_file_can_live_anywhere(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(SEED_TOML.read_text().replace('name = "seed-qwen35-122b"', 'name = "mine"'))
    assert load_profile(path).name == "mine"


def test_invalid_toml_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("name = [unclosed")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_profile(path)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["memory"].__setitem__("kv_bytes_per_token", -1),
         "[memory] kv_bytes_per_token = -1: must be > 0"),
        (lambda d: d["defaults"].__setitem__("mem_fraction_static", 1.0),
         "[defaults] mem_fraction_static = 1.0: must be > 0 and < 1"),
        (lambda d: d["acceptance"].__setitem__("greedy", [0.9, 1.2]),
         "[acceptance] greedy[1] = 1.2: must be >= 0 and <= 1"),
        (lambda d: d["acceptance"].__setitem__("sampled", []),
         "[acceptance] sampled = []: must be a non-empty list"),
        (lambda d: d["cost"].__setitem__("verify_token_tile", 2.5),
         "[cost] verify_token_tile = 2.5: must be an integer"),
        (lambda d: d["cost"].__setitem__("eager_factor", True),
         "[cost] eager_factor = True: must be a number"),
        (lambda d: d["cost"].__setitem__("decode_fixed_s", "fast"),
         "[cost] decode_fixed_s = 'fast': must be a number"),
        (lambda d: d["cost"].__setitem__("verify_tile", 8), "unknown key [cost] 'verify_tile'"),
        (lambda d: d["noise"].pop("boot_sigma"), "missing key [noise] boot_sigma"),
        (lambda d: d.pop("boot"), "[boot] = None: must be a table"),
        (lambda d: d.__setitem__("extra", 1), "unknown key 'extra'"),
        (lambda d: d.__setitem__("name", 3), "name = 3: must be a string"),
        (lambda d: d.__setitem__("architecture", ["Llama"]),
         "architecture = ['Llama']: must be a string (the model's config.json"),
    ],
)
def test_validation_names_key_value_and_allowed(edit, message: str) -> None:
    data = copy.deepcopy(seed_dict())
    edit(data)
    with pytest.raises(ConfigError) as e:
        profile_from_dict(data, source="x.toml")
    text = str(e.value)
    assert message in text and text.startswith("profile x.toml: ")
    assert "\n" not in text


def test_a_directory_is_not_a_profile(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"is a directory; allowed: a profile TOML file"):
        load_profile(str(tmp_path) + "/")


def test_a_profile_that_is_not_utf8_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'name = "x"\ndescription = "caf\xe9"\n')
    with pytest.raises(ConfigError) as exc:
        load_profile(path)
    assert str(exc.value) == f"profile {path}: line 2: not UTF-8 (byte 0xe9); allowed: UTF-8 TOML"


def test_an_unreadable_profile_is_a_config_error(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "locked.toml"
    path.write_text(SEED_TOML.read_text())

    def deny(self: Path) -> bytes:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", deny)
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: deny(self))
    with pytest.raises(ConfigError, match=r"locked\.toml: cannot read \(Permission denied\)"):
        load_profile(path)


def test_a_profile_nested_too_deeply_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "deep.toml"
    path.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ConfigError, match=r"deep\.toml: (TOML nested too deeply|not valid TOML)"):
        load_profile(path)


def test_architecture_is_optional() -> None:
    data = copy.deepcopy(seed_dict())
    assert profile_from_dict(data).architecture == "Qwen3_5MoeForConditionalGeneration"
    data.pop("architecture")
    assert profile_from_dict(data).architecture == ""


def test_the_capture_transient_share_is_optional_and_checked() -> None:
    """[memory] capture_transient_share: the default where a profile leaves it out, its value
    where one sets it, and one error line for a share outside [0, 1)."""
    data = seed_dict()
    data["memory"].pop("capture_transient_share", None)
    assert profile_from_dict(data).memory.capture_transient_share == 0.49
    data["memory"]["capture_transient_share"] = 0.4
    assert profile_from_dict(data).memory.capture_transient_share == 0.4
    data["memory"]["capture_transient_share"] = 1.0
    with pytest.raises(ConfigError, match=r"\[memory\] capture_transient_share"):
        profile_from_dict(data, source="x.toml")
