"""Temporary shim."""

import sys

import lightning_varbatch.planner.lengths as _m

sys.modules[__name__] = _m
