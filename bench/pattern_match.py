"""Pattern-graph match time (``priority.patterns``): p50/p99 of one match at N stored graphs.

    python bench/pattern_match.py [--graphs 500] [--matches 5000] [--models 2] [--seed 0]

The history holds ``--graphs`` random workflows of 1-8 stages (each stage's model one of
``--models``, tokens log-uniform 10-10,000, times 0.1-10 s); each timed match is a random partial
workflow at a random stage (stages before it whole, the current one's model and input), the way
the gateway and the simulator call it. JITServe reports < 5 ms at 500 graphs.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from priority.patterns import KnownStage, PatternGraph, PatternHistory, PatternStage, model_hash


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--graphs", type=int, default=500)
    parser.add_argument("--matches", type=int, default=5000)
    parser.add_argument("--models", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    models = [model_hash(f"model-{i}") for i in range(args.models)]

    def tokens() -> int:
        return int(10 ** rng.uniform(1, 4))

    def stages(n: int) -> list[PatternStage]:
        return [
            PatternStage(
                models[int(rng.integers(args.models))],
                tokens(),
                tokens(),
                float(rng.uniform(0.1, 10)),
            )
            for _ in range(n)
        ]

    history = PatternHistory(capacity=args.graphs)
    for _ in range(args.graphs):
        history.add(PatternGraph(tuple(stages(int(rng.integers(1, 9))))))
    times = []
    for _ in range(args.matches):
        partial = stages(int(rng.integers(1, 9)))
        known = [KnownStage(s.model, s.input_tokens, s.output_tokens) for s in partial[:-1]]
        known.append(KnownStage(partial[-1].model, partial[-1].input_tokens))
        started = time.perf_counter()
        history.match(known)
        times.append(time.perf_counter() - started)
    ms = np.array(times) * 1e3
    print(
        json.dumps(
            {
                "graphs": len(history),
                "matches": args.matches,
                "p50_ms": round(float(np.percentile(ms, 50)), 4),
                "p99_ms": round(float(np.percentile(ms, 99)), 4),
                "max_ms": round(float(ms.max()), 4),
            }
        )
    )


if __name__ == "__main__":
    main()
