"""The generators of a :class:`~tdreplay.ensembles.SamplerEnsemble`'s samplers in its state.

A member sampler draws with its generator (the one set on its buffer or sampler, or the
ensemble's); its state is part of the ensemble's ``state_dict`` (under ``"generators"``) and
of its checkpoint (``generators.pt``): one state per sampler, ``None`` for a sampler without a
generator. A saved state is checked against the sampler's generator before anything changes,
and restored only into a sampler that has a generator.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from tdreplay.core import Sampler

#: the state_dict entry holding the samplers' generator states
GENERATORS = "generators"
#: the checkpoint file holding them
GENERATORS_FILE = "generators.pt"


def generator_states(samplers: Sequence[Sampler]) -> list[torch.Tensor | None]:
    """The state of each sampler's generator (``None`` for a sampler without one).

    Examples
    --------
    >>> from tdreplay.core import RandomSampler
    >>> seeded = RandomSampler()
    >>> seeded.set_rng(torch.Generator().manual_seed(0))
    >>> [state is None for state in generator_states([seeded, RandomSampler()])]
    [False, True]
    """
    return [None if s.generator is None else s.generator.get_state() for s in samplers]


def check_generator_states(samplers: Sequence[Sampler], states: Any) -> None:
    """Raise ``ValueError`` naming the entry unless ``states`` is ``None`` (none saved) or
    holds one entry per sampler, each ``None`` or a state the sampler's generator accepts;
    changes nothing.

    Examples
    --------
    >>> from tdreplay.core import RandomSampler
    >>> sampler = RandomSampler()
    >>> sampler.set_rng(torch.Generator().manual_seed(0))
    >>> check_generator_states([sampler], generator_states([sampler]))
    >>> check_generator_states([sampler], [torch.zeros(3)])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: state_dict['generators'][0] is not a state of sampler 0's generator: ...
    """
    if states is None:
        return
    if not isinstance(states, (list, tuple)) or len(states) != len(samplers):
        raise ValueError(f"state_dict[{GENERATORS!r}] must be a list with one generator state "
                         f"(or None) per sampler ({len(samplers)}), got {states!r:.80}.")
    for position, (sampler, state) in enumerate(zip(samplers, states)):
        if state is None or sampler.generator is None:
            continue
        try:
            torch.Generator(device=sampler.generator.device).set_state(state)
        except (TypeError, RuntimeError, ValueError) as err:
            raise ValueError(f"state_dict[{GENERATORS!r}][{position}] is not a state of sampler "
                             f"{position}'s generator: {err}") from err


def restore_generators(samplers: Sequence[Sampler], states: Sequence[Any] | None) -> None:
    """Set each sampler's generator to its saved state (checked by
    :func:`check_generator_states`); a sampler without a generator, or without a saved state,
    is left as it is (all of them when ``states`` is ``None``)."""
    for sampler, state in zip(samplers, states or ()):
        if state is not None and sampler.generator is not None:
            sampler.generator.set_state(state)
