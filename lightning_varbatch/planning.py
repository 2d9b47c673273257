"""Temporary shim."""

import sys

import lightning_varbatch.planner.epoch_planner as _m

sys.modules[__name__] = _m
