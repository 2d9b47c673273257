"""Temporary shim."""

import sys

import lightning_varbatch.planner.mixture as _m

sys.modules[__name__] = _m
