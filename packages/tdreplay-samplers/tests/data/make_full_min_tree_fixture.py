"""Writes ``prioritized_full_min_tree.pkl``, the fixture of ``test_min_over_sum.py``.

Run with the samplers as they were before the min tree shared the sum tree's leaves (issue 19,
parent of that commit), e.g. ``PYTHONPATH=<old packages/tdreplay-samplers/src> python
make_full_min_tree_fixture.py prioritized_full_min_tree.pkl``: pickled samplers of both
backends whose state holds a full min tree, their ``min_priority``, and a ``state_dict``.
"""

import pickle
import sys

import torch

from tdreplay.samplers import PrioritizedSampler


def main(path: str) -> None:
    out: dict[str, object] = {}
    sampler = None
    for backend in ("numba", "torch"):
        sampler = PrioritizedSampler(40, alpha=0.7, beta=0.6, backend=backend)
        sampler.extend(torch.arange(30))
        g = torch.Generator().manual_seed(3)
        sampler.update_priority(torch.arange(30), torch.rand(30, generator=g) * 5)
        sampler.update_priority(torch.tensor([7]), torch.tensor([0.0]))  # the least priority
        out[backend] = pickle.dumps(sampler)
        out[backend + "_min"] = sampler.min_priority
    assert sampler is not None
    out["state_dict"] = sampler.state_dict()
    with open(path, "wb") as f:
        pickle.dump(out, f)


if __name__ == "__main__":
    main(sys.argv[1])
