"""The cycling test models: weights whose greedy output cycles, and the GGUF writer."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from specdecode_tune.testing.models import (
    CycleModelSpec,
    cycle_weights,
    hf_state_names,
    made_up_words,
    main,
    read_gguf_spec,
    reference_greedy,
)


def small_spec(**kw: object) -> CycleModelSpec:
    base: dict[str, object] = {
        "vocab_size": 300, "cycle_tokens": tuple(range(50, 66)), "dim": 64, "layers": 2,
        "heads": 4, "kv_heads": 2, "ffn": 96, "noise": 0.0, "seed": 3}
    base.update(kw)
    return CycleModelSpec(**base)  # type: ignore[arg-type]  # a dict of mixed field values


def test_shapes_follow_the_llama_layout() -> None:
    spec = small_spec()
    w = cycle_weights(spec)
    assert w["token_embd.weight"].shape == (300, 64)
    assert w["output.weight"].shape == (300, 64)
    assert w["blk.1.attn_q.weight"].shape == (64, 64)
    assert w["blk.1.attn_k.weight"].shape == (32, 64)        # 2 kv heads of 16
    assert w["blk.0.ffn_down.weight"].shape == (64, 96)
    assert w["blk.0.ffn_gate.weight"].shape == (96, 64)
    assert w["output_norm.weight"].shape == (64,)
    assert all(a.dtype == np.float32 for a in w.values())
    assert sum(a.size for a in w.values()) == spec.n_params
    assert hf_state_names("blk.1.attn_output.weight") == "model.layers.1.self_attn.o_proj.weight"
    assert hf_state_names("output.weight") == "lm_head.weight"


def test_noiseless_greedy_output_enters_the_cycle_and_follows_it() -> None:
    spec = small_spec()
    w = cycle_weights(spec)
    assert not w["blk.0.attn_output.weight"].any() and not w["blk.1.ffn_down.weight"].any()
    out = reference_greedy(w, [7, 123, 250], 40)     # a prompt of tokens outside the cycle
    nxt = spec.next_token()
    assert all(t in nxt for t in out)
    assert all(nxt[a] == b for a, b in itertools.pairwise(out))
    assert out[16:32] == out[:16]                          # period = cycle length


def test_noise_only_touches_attention_output_and_ffn_down() -> None:
    quiet, noisy = cycle_weights(small_spec()), cycle_weights(small_spec(noise=0.5))
    changed = {k for k in quiet if not np.array_equal(quiet[k], noisy[k])}
    assert changed == {f"blk.{i}.{n}.weight" for i in range(2)
                       for n in ("attn_output", "ffn_down")}
    o = noisy["blk.0.attn_output.weight"]
    assert o.std() == pytest.approx(0.5 / np.sqrt(64), rel=0.1)


@pytest.mark.parametrize("kw,words", [
    ({"cycle_tokens": (5,)}, "at least 2"),
    ({"cycle_tokens": (5, 6, 5)}, "must not repeat"),
    ({"cycle_tokens": (5, 300)}, "in [0, 300)"),
    ({"dim": 60, "heads": 8}, "multiple of heads"),
    ({"noise": -1.0}, "noise must be"),
    ({"layers": 0}, "layers must be"),
])
def test_bad_specs_name_the_value(kw: dict, words: str) -> None:
    with pytest.raises(ValueError) as e:
        small_spec(**kw)
    assert words in str(e.value)


def test_made_up_words_are_distinct_and_seeded() -> None:
    words = made_up_words(40, seed=1)
    assert len(set(words)) == 40 and words == made_up_words(40, seed=1)
    assert words != made_up_words(40, seed=2)


def _vocab_gguf(path: Path) -> None:
    gguf = pytest.importorskip("gguf")
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(8)] + \
        ["\u2581" + w for w in made_up_words(120, seed=9)] + ["\u2581A1", "ing"]
    types = [2, 3, 3] + [6] * 8 + [1] * 122
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(pieces)
    w.add_token_scores([0.0] * len(pieces))
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_gguf_cli_writes_a_model_with_the_vocabulary_and_its_spec(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture
                                                                  ) -> None:
    gguf = pytest.importorskip("gguf")
    vocab = tmp_path / "vocab.gguf"
    _vocab_gguf(vocab)
    out = tmp_path / "m.gguf"
    rc = main(["gguf", "--out", str(out), "--vocab-gguf", str(vocab), "--cycle", "12",
               "--noise", "0.25", "--dim", "32", "--layers", "1", "--heads", "2"])
    assert rc == 0
    assert "cycle 12, noise 0.25" in capsys.readouterr().out
    r = gguf.GGUFReader(str(out))
    assert r.fields["general.architecture"].contents() == "llama"
    assert r.fields["llama.embedding_length"].contents() == 32
    assert len(r.fields["tokenizer.ggml.tokens"].contents()) == 133
    tensors = {t.name: t for t in r.tensors}
    assert tensors["token_embd.weight"].tensor_type == gguf.GGMLQuantizationType.F16
    assert tensors["output_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    spec = read_gguf_spec(out)
    assert spec.noise == 0.25 and len(spec.cycle_tokens) == 12 and spec.vocab_size == 133
    # the cycle uses ordinary word pieces only
    pieces = r.fields["tokenizer.ggml.tokens"].contents()
    assert all(pieces[t].startswith("\u2581") and pieces[t][1:].isalpha()
               for t in spec.cycle_tokens)
    assert not list(tmp_path.glob("*.tmp"))


def test_gguf_cli_without_vocabulary_is_a_one_line_error(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    rc = main(["gguf", "--out", str(tmp_path / "m.gguf"), "--vocab-gguf",
               str(tmp_path / "none.gguf")])
    assert rc == 2
    assert "no vocabulary GGUF" in capsys.readouterr().err


def test_hf_model_loads_in_transformers_and_cycles(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from specdecode_tune.testing.models import write_hf

    spec = write_hf(tmp_path / "hf", cycle=8, dim=32, layers=1, heads=2, dtype="float32")
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    ids = tok("the water of", return_tensors="pt").input_ids
    assert tok.convert_ids_to_tokens(ids[0]) == ["\u2581the", "\u2581water", "\u2581of"]
    out = model.generate(ids, max_new_tokens=20, do_sample=False)[0, ids.shape[1]:].tolist()
    nxt = spec.next_token()
    assert all(nxt[a] == b for a, b in itertools.pairwise(out))
