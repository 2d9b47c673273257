"""Temporary shim."""

import sys

import lightning_varbatch.planner.costs as _m

sys.modules[__name__] = _m
