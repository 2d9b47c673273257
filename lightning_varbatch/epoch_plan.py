"""Temporary shim."""

import sys

import lightning_varbatch.planner.epoch_plan as _m

sys.modules[__name__] = _m
