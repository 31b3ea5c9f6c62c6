"""Shared fixtures: synthetic checkpoints made once per test session."""
from __future__ import annotations

import pytest

from builder.synth import SynthOptions, synth_checkpoint


@pytest.fixture(scope="session")
def make_checkpoint(tmp_path_factory):
    """make_checkpoint(**SynthOptions fields) -> folder, cached per option set."""
    cache = {}

    def make(**kw):
        opts = SynthOptions(**kw)
        if opts not in cache:
            folder = tmp_path_factory.mktemp("ckpt")
            synth_checkpoint(folder, opts)
            cache[opts] = folder
        return cache[opts]

    return make


@pytest.fixture(scope="session")
def tiny_checkpoint(make_checkpoint):
    return make_checkpoint()
