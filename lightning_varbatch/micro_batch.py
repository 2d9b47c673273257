"""Temporary shim."""

import sys

import lightning_varbatch.data.micro_batch as _m

sys.modules[__name__] = _m
