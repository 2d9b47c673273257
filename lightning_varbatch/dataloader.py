"""Temporary shim."""

import sys

import lightning_varbatch.data.loader as _m

sys.modules[__name__] = _m
