"""On a GPU: how SGLang's memory readings around a CUDA graph capture relate to where the capture
runs out of memory. Plain PyTorch in SGLang's pattern (no SGLang: it does not install there).

    python benchmarks/capture_memory.py [--tokens 2,4,8,16] [--out FILE.json]

SGLang (0.5.10.post1; docs/engines-sglang.md section 6b) sizes a static pool against the memory
free at start-up, then captures CUDA graphs into one private pool, largest batch first
(`CudaGraphRunner.capture`): before each batch size it reads the free memory WITHOUT emptying
the allocator's cache (its tqdm progress), runs the forward twice eagerly (the warm-up), then
captures it inside `torch.cuda.graph`, which empties the cache as it starts; after the whole
capture it reads the free memory again AFTER `empty_cache` (the "Capture cuda graph end ...
avail mem" line). The search's KV model bounds the out-of-memory boundary with the end reading
(`samplers/model/oom.py`): at most mem + the end reading, at least that less the graphs' memory
(it assumes the warm-up needs no more than the graphs keep).

Here a stand-in model (MLP blocks of a 4096-wide, 14336-intermediate transformer, bf16, the
verify pass of `tokens` draft tokens per request at each batch size) is captured that way with
a filler tensor standing in for the static pool. For each draft-token count it finds, by
bisection in separate processes, the largest filler the capture survives (the true room, in
bytes, above a reference filler), and takes the readings at the reference filler. It prints
and writes per count: the true room, the least progress reading, the end reading, the graphs'
memory (before less after the capture), and the warm-up over the graphs' memory (end reading
less true room, over the graphs' memory: the model assumes at most 1; the simulator's
`capture_transient_share` s corresponds to s / (1 - s)). `--capture-bs sglang-spec` captures
SGLang's own batch-size list under speculative decoding instead of powers of two.

Run on one H200 (torch 2.11, 2026-12-05; docs/engines-sglang.md section 6b has the table):
powers of two, 2/4/8/16 tokens: warm-up over graphs 0.22/0.26/0.36/0.42 (198 s);
`--capture-bs sglang-spec`: 0.33/0.48/0.69/0.79 (two calls of 133 s, 2 counts each); the
least progress reading at most 2 MB above the end reading, both above the true room.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

GiB = 1 << 30
HIDDEN, INTER, LAYERS = 4096, 14336, 8
POW2_BS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# SGLang's own list under speculative decoding, to cuda_graph_max_bs 256
# (`ServerArgs._generate_cuda_graph_batch_sizes`, 0.5.10.post1): dense near the top, so the
# second-largest warm-up is nearly as large as the largest.
SGLANG_SPEC_BS = (tuple(range(1, 9)) + tuple(range(10, 33, 2)) + tuple(range(40, 65, 4))
                  + tuple(range(72, 257, 8)))
BS_LISTS = {"pow2": POW2_BS, "sglang-spec": SGLANG_SPEC_BS}
REFERENCE_FREE = 24 * GiB        # what the reference filler leaves free before the capture


def probe(tokens: int, leave: int, bs_list: str = "pow2") -> dict:
    """One capture in this process with `leave` bytes left free before it: its readings, or
    {"oom": True}."""
    capture_bs = BS_LISTS[bs_list]
    import torch

    dev = torch.device("cuda")
    torch.manual_seed(0)
    weights = [(torch.randn(HIDDEN, INTER, device=dev, dtype=torch.bfloat16) * 0.01,
                torch.randn(INTER, HIDDEN, device=dev, dtype=torch.bfloat16) * 0.01)
               for _ in range(LAYERS)]
    max_tokens = max(capture_bs) * tokens
    static_in = torch.zeros(max_tokens, HIDDEN, device=dev, dtype=torch.bfloat16)
    torch.cuda.synchronize()
    free, _ = torch.cuda.mem_get_info()
    filler = torch.empty(max(0, free - leave), dtype=torch.uint8, device=dev)  # the static pool

    def forward(n: int) -> torch.Tensor:
        x = static_in[:n]
        for up, down in weights:
            h = torch.nn.functional.silu(x @ up) * (x @ up)      # two intermediates, as SwiGLU
            x = x + h @ down
        return x

    stream = torch.cuda.Stream()
    pool = torch.cuda.graph_pool_handle()
    graphs, progress = [], []
    torch.cuda.empty_cache()
    before = torch.cuda.mem_get_info()[0]
    try:
        with torch.cuda.stream(stream):
            for bs in reversed(capture_bs):
                progress.append(torch.cuda.mem_get_info()[0])      # no empty_cache, as tqdm's
                for _ in range(2):                                 # the warm-up, eager
                    torch.cuda.synchronize()
                    forward(bs * tokens)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    forward(bs * tokens)
                graphs.append(graph)
        torch.cuda.synchronize()
    except torch.OutOfMemoryError:
        return {"oom": True}
    torch.cuda.empty_cache()
    after = torch.cuda.mem_get_info()[0]
    del filler
    return {"oom": False, "before": before, "after": after, "least_progress": min(progress)}


def run_probe(tokens: int, leave: int, bs_list: str = "pow2") -> dict:
    out = subprocess.run([sys.executable, __file__, "--probe", str(tokens), str(leave), bs_list],
                         capture_output=True, text=True, timeout=300, check=False)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(tokens: int, bs_list: str = "pow2") -> dict:
    ref = run_probe(tokens, REFERENCE_FREE, bs_list)
    if ref["oom"]:
        raise RuntimeError(f"the reference capture ran out of memory at {tokens} tokens")
    # The true room: the most the free memory before the capture can shrink by (bisection to
    # 16 MiB), above the reference.
    lo, hi = 0, REFERENCE_FREE
    while hi - lo > 16 << 20:
        mid = (lo + hi) // 2
        if run_probe(tokens, REFERENCE_FREE - mid, bs_list)["oom"]:
            hi = mid
        else:
            lo = mid
    graphs = ref["before"] - ref["after"]
    end_room = ref["after"]              # free after the capture, at the reference filler
    return {
        "batch_sizes": bs_list,
        "tokens": tokens,
        "true_room_gib": lo / GiB,
        "least_progress_gib": ref["least_progress"] / GiB,
        "end_reading_gib": end_room / GiB,
        "graphs_gib": graphs / GiB,
        "warm_up_over_graphs": (end_room - lo) / graphs if graphs > 0 else None,
        "progress_over_true_gib": (ref["least_progress"] - lo) / GiB,
    }


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--probe":
        print(json.dumps(probe(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="2,4,8,16")
    ap.add_argument("--capture-bs", choices=sorted(BS_LISTS), default="pow2",
                    help="the batch sizes captured: powers of two, or SGLang's speculative list")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = []
    for tokens in (int(t) for t in args.tokens.split(",")):
        row = measure(tokens, args.capture_bs)
        rows.append(row)
        print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                       for k, v in row.items()), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
