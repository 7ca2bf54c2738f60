"""How many MiniLM vectors differ between torch's CPU kernels, before and after int8 quantization.

    python benchmarks/bench_kernel_vectors.py [--limit N] [--json OUT]

Every text of the shared benchmark data (`../shared/data`: ChestAgentBench, AgentClinic, MedAgentBench;
string fields of at least 20 characters, deduplicated) and of `examples/`, embedded at batch size 1 (as
runs embed) in one child process per `ATEN_CPU_CAPABILITY` this CPU can run (avx512, avx2, default; a
kernel it lacks is skipped with the reason, store/cpu_kernels.py: torch would die of SIGILL), each with the model
loaded fresh and no cache. The parent compares the float32 vectors (bitwise) and the quantized ones
(`store/vectors.py`: round(128 x) in int8, straight from float32, as a naive quantizer would), and the
vectors the embedder gives runs (float64 again for a text with a component near a rounding boundary): a text whose quantized vector differs between two kernels is
one whose fresh embedding depends on the machine (a recorded run re-executes with its recorded vectors
anyway). `--limit` takes an evenly spaced sample of the texts (the sample is a pure function of the data).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"


def _walk(value, out: set[str]) -> None:
    if isinstance(value, str):
        if len(value) >= 20:
            out.add(value)
    elif isinstance(value, dict):
        for v in value.values():
            _walk(v, out)
    elif isinstance(value, list):
        for v in value:
            _walk(v, out)


def texts(limit: int | None) -> dict[str, list[str]]:
    """Texts by source file (sorted, so the sample does not depend on set order)."""
    files = sorted(glob.glob(str(DATA / "chestagentbench_evomedagent" / "*.json"))
                   + glob.glob(str(DATA / "agentclinic" / "*.jsonl"))
                   + glob.glob(str(DATA / "medagentbench" / "test_data_v2.json"))
                   + glob.glob(str(DATA / "medagentbench_rl_fork" / "training_tasks_v2.json"))
                   + glob.glob(str(ROOT / "examples" / "*.jsonl")))
    by_file: dict[str, list[str]] = {}
    seen: set[str] = set()
    for f in files:
        found: set[str] = set()
        with open(f, encoding="utf-8") as fh:
            if f.endswith(".jsonl"):
                for line in fh:
                    if line.strip():
                        _walk(json.loads(line), found)
            else:
                _walk(json.load(fh), found)
        new = sorted(found - seen)
        seen |= found
        by_file[os.path.relpath(f, ROOT.parent)] = new
    total = sum(len(v) for v in by_file.values())
    if limit and total > limit:
        step = total / limit
        flat = [(k, t) for k, v in by_file.items() for t in v]
        keep = [flat[int(i * step)] for i in range(limit)]
        by_file = {}
        for k, t in keep:
            by_file.setdefault(k, []).append(t)
    return by_file


def child(texts_file: str, out_file: str) -> None:
    from grandrounds.store.embeddings import MiniLMEmbedder

    import torch

    items = json.loads(Path(texts_file).read_text())
    emb = MiniLMEmbedder()
    model = emb._load()
    t0 = time.perf_counter()
    raw = np.stack([model.encode([t], batch_size=1, normalize_embeddings=True, convert_to_numpy=True,
                                 show_progress_bar=False)[0] for t in items]).astype(np.float32)
    t_raw = time.perf_counter() - t0
    t0 = time.perf_counter()
    grid = np.stack([emb.embed_one(t) for t in items])  # what runs use: float64 again near a boundary
    t_grid = time.perf_counter() - t0
    np.save(out_file, raw)
    np.save(out_file.replace(".npy", "-grid.npy"), grid)
    print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(),
                      "float32_ms_per_text": round(1000 * t_raw / len(items), 2),
                      "embedder_ms_per_text": round(1000 * t_grid / len(items), 2),
                      "float64_passes": emb.double_passes}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--json", default=None, help="write the results here too")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    from grandrounds.store.cpu_kernels import machine_kernels
    from grandrounds.store.vectors import quantize

    found = machine_kernels()
    capabilities = found.runnable
    for missing in found.missing:
        print(f"skipped: {found.skip_reason(missing)}", file=sys.stderr)

    by_file = texts(args.limit)
    flat = [t for v in by_file.values() for t in v]
    tmp = Path(tempfile.mkdtemp(prefix="kernel-vectors-"))
    (tmp / "texts.json").write_text(json.dumps(flat))
    vecs, kernels, grids = {}, {}, {}
    for cap in capabilities:
        out = tmp / f"{cap}.npy"
        env = {**os.environ, "ATEN_CPU_CAPABILITY": cap, "GRANDROUNDS_EMBEDDING_CACHE": str(tmp / f"cache-{cap}")}
        proc = subprocess.run([sys.executable, __file__, "--child", str(tmp / "texts.json"), str(out)],
                              env=env, capture_output=True, text=True, check=True)
        kernels[cap] = json.loads(proc.stdout.strip().splitlines()[-1])
        vecs[cap] = np.load(out)
        grids[cap] = np.stack([quantize(v) for v in np.load(str(out).replace(".npy", "-grid.npy"))])
    q = {cap: np.stack([quantize(v) for v in vecs[cap]]) for cap in capabilities}
    pairs = {}
    for i, a in enumerate(capabilities):
        for b in capabilities[i + 1:]:
            float_diff = np.any(vecs[a] != vecs[b], axis=1)
            q_diff = np.any(q[a] != q[b], axis=1)
            pairs[f"{a} vs {b}"] = {
                "float32_vectors_differing": int(float_diff.sum()),
                "max_abs_float_difference": float(np.abs(vecs[a] - vecs[b]).max()),
                "int8_vectors_differing": int(q_diff.sum()),
                "int8_components_differing": int((q[a] != q[b]).sum()),
                "int8_max_component_difference": int(np.abs(q[a].astype(int) - q[b].astype(int)).max()),
                "embedder_vectors_differing": int(np.any(grids[a] != grids[b], axis=1).sum()),
            }
    examples = [t for k, v in by_file.items() if k.startswith("main/examples") or "/examples/" in k for t in v]
    ex_idx = [flat.index(t) for t in examples]
    example_diff = int(sum(bool(np.any(grids[a][ex_idx] != grids[b][ex_idx], axis=1).sum())
                           for i, a in enumerate(capabilities) for b in capabilities[i + 1:])) if ex_idx else 0
    result = {"texts": len(flat), "by_file": {k: len(v) for k, v in by_file.items()}, "kernels": kernels,
              "skipped_kernels": {k: found.skip_reason(k) for k in found.missing},
              "pairs": pairs, "example_texts": len(ex_idx), "example_pairs_with_a_differing_embedder_vector": example_diff}
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(as_table(result), indent=2) + "\n")


def as_table(r: dict) -> dict:
    """The results file docs/benchmarks.md renders (scripts/bench_docs.py), the raw figures under "raw"."""
    rows = []
    for pair, p in r["pairs"].items():
        rows.append([pair, p["float32_vectors_differing"], f"{p['max_abs_float_difference']:.2e}",
                     p["int8_vectors_differing"], p["embedder_vectors_differing"]])
    return {
        "title": "MiniLM vectors that differ between torch's CPU kernels",
        "about": (f"{r['texts']} texts of the shared data and examples/ (an evenly spaced sample), embedded at "
                  "batch size 1 in a fresh process per ATEN_CPU_CAPABILITY, no cache. Columns: vectors whose "
                  "float32 bits differ; the largest component difference; vectors whose int8 quantization "
                  "differs when quantized straight from float32; vectors the embedder gives runs (float64 "
                  "again near a rounding boundary) that differ."),
        "source": "python benchmarks/bench_kernel_vectors.py --limit 3000 --json benchmarks/results/kernel_vectors.json",
        "columns": ["kernels", "float32 vectors differing", "max component difference",
                    "int8 from float32 differing", "embedder's vectors differing"],
        "rows": rows,
        "notes": [f"Texts of examples/ in the sample: {r['example_texts']}; pairs of kernels with a differing "
                  f"embedder vector among them: {r['example_pairs_with_a_differing_embedder_vector']}.",
                  "Float64 passes per kernel: " + ", ".join(f"{k} {v.get('float64_passes')}" for k, v in r["kernels"].items())],
        "raw": r,
    }


if __name__ == "__main__":
    main()
