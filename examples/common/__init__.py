"""What both examples share: the run around the model and the data.

The translation example (:mod:`examples.translation`) and the decoder-only LM example
(:mod:`examples.lm`) build their data and model themselves and take everything else from here,
by public names:

- :mod:`~examples.common.config_checks`: :class:`~examples.common.config_checks.ConfigError`
  and the checks of single settings, of the ``trainer`` group and of the run settings both
  entry configs hold (``seed``, ``output_dir``, ``ckpt_path``, ...);
- :mod:`~examples.common.checkpoints`: ``ckpt_path`` loaded safely, and a saved sampler
  position checked against the current data before anything is written;
- :mod:`~examples.common.building`: the strategy, callbacks, logger and Trainer of a config,
  and the process settings (seed, CPU threads);
- :mod:`~examples.common.preemption`: a resumable checkpoint on SIGTERM/SIGINT
  (``callbacks.preemption`` in ``conf/``);
- :mod:`~examples.common.fitting`: ``fit`` (and ``test``) with the signal and resume outcomes
  turned into an exit status and ``metrics.json``;
- :mod:`~examples.common.summary`: ``<output_dir>/metrics.json`` and what goes in it;
- :mod:`~examples.common.oversize`: what ``data.oversize`` left out or cut, reported
  (``callbacks.oversize_report`` in ``conf/``);
- :mod:`~examples.common.cli`: the Hydra entry around ``train(cfg)``: exit status 2 for a bad
  setting or override, one output folder per job of a multirun.

Example:
    >>> from examples.common.config_checks import ConfigError, check_choice
    >>> try:
    ...     check_choice("data.tail", "spill", ("spread", "drop", "pad"))
    ... except ConfigError as error:
    ...     print(error)
    data.tail must be one of spread, drop, pad; got 'spill'.
"""
