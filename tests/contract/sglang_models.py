"""Model stand-ins for SGLang's argument checks: `config.json` files only, written locally.

SGLang's `prepare_server_args` reads the target's `config.json` (through `ModelConfig`, for
the architecture, the hybrid layer layout and the context length) and nothing else of the
model: no weights, no tokenizer (checked against sglang 0.5.10.post1; see
docs/engines-sglang.md). The draft model's folder is not opened at all at that stage, but a
stand-in is written so that a later check that does open it finds a real EAGLE-3 config.

- `qwen35_moe`: shaped like Qwen/Qwen3.5-122B-A10B (`Qwen3_5MoeForConditionalGeneration`,
  model_type `qwen3_5_moe`: a vision tower plus a hybrid text model of 48 layers, three
  Gated-DeltaNet linear-attention layers to each full-attention layer, 256 experts, 8 routed);
  the field names are those of transformers' `Qwen3_5MoeTextConfig` / SGLang's
  `sglang/srt/configs/qwen3_5.py`.
- `llama`: a small `LlamaForCausalLM`.
- `eagle3`: a one-layer `LlamaForCausalLMEagle3` draft for the Qwen target.

Runs with the standard library only (the SGLang venv's python imports it too):

    python tests/contract/sglang_models.py OUT_DIR     # writes OUT_DIR/{qwen35_moe,llama,eagle3}
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

QWEN35_LAYERS = 48
QWEN35_FULL_ATTENTION_INTERVAL = 4


def qwen35_moe_config() -> dict:
    layer_types = ["full_attention" if (i + 1) % QWEN35_FULL_ATTENTION_INTERVAL == 0
                   else "linear_attention" for i in range(QWEN35_LAYERS)]
    text = {
        "model_type": "qwen3_5_moe_text",
        "architectures": ["Qwen3_5MoeForCausalLM"],
        "vocab_size": 248320,
        "hidden_size": 3072,
        "num_hidden_layers": QWEN35_LAYERS,
        "layer_types": layer_types,
        "full_attention_interval": QWEN35_FULL_ATTENTION_INTERVAL,
        "num_attention_heads": 32,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "attn_output_gate": True,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 64,
        "num_experts": 256,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 1024,
        "shared_expert_intermediate_size": 1024,
        "decoder_sparse_step": 1,
        "norm_topk_prob": True,
        "mlp_only_layers": [],
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 262144,
        "mtp_num_hidden_layers": 1,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000,
                            "partial_rotary_factor": 0.25, "mrope_interleaved": True,
                            "mrope_section": [11, 11, 10]},
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
        "eos_token_id": 248044,
    }
    vision = {
        "model_type": "qwen3_5_moe",
        "depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16,
        "in_channels": 3, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
        "out_hidden_size": 3072, "num_position_embeddings": 2304,
        "hidden_act": "gelu_pytorch_tanh", "deepstack_visual_indexes": [],
    }
    return {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "text_config": text,
        "vision_config": vision,
        "image_token_id": 248056,
        "video_token_id": 248057,
        "vision_start_token_id": 248053,
        "vision_end_token_id": 248054,
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
    }


def llama_config() -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 32000,
        "hidden_size": 256,
        "intermediate_size": 688,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "head_dim": 64,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }


def eagle3_config(target: dict) -> dict:
    """A one-layer EAGLE-3 draft for `target` (its hidden size and vocabulary)."""
    text = target.get("text_config", target)
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "vocab_size": text["vocab_size"],
        "draft_vocab_size": 32000,
        "hidden_size": text["hidden_size"],
        "intermediate_size": 4 * text["hidden_size"],
        "num_hidden_layers": 1,
        "num_attention_heads": text["num_attention_heads"],
        "num_key_value_heads": text["num_key_value_heads"],
        "head_dim": text.get("head_dim", text["hidden_size"] // text["num_attention_heads"]),
        "hidden_act": "silu",
        "max_position_embeddings": text["max_position_embeddings"],
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }


def write_models(out: Path) -> dict[str, Path]:
    """Write the three stand-ins under `out`; returns {name: folder}."""
    qwen = qwen35_moe_config()
    models = {"qwen35_moe": qwen, "llama": llama_config(), "eagle3": eagle3_config(qwen)}
    paths = {}
    for name, config in models.items():
        folder = Path(out) / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        paths[name] = folder
    return paths


if __name__ == "__main__":
    for name, path in write_models(Path(sys.argv[1])).items():
        print(name, path)
