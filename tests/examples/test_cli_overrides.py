"""Overrides that do not compose (unknown key or option, bad syntax) exit 2, as bad values do."""

from __future__ import annotations

import pytest

from examples.common.cli import check_overrides
from examples.translation.train import CONF_DIR


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["strategy=horovod"], "Available options in 'strategy'"),
        (["data.max_tokens=[1,2"], "data.max_tokens=[1,2"),
        (["data.foo=1"], "Could not override 'data.foo'"),
    ],
)
def test_overrides_that_do_not_compose_exit_2(
    overrides: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """What ``python train.py OVERRIDES`` checks before Hydra runs (exit 2, not Hydra's 1)."""
    with pytest.raises(SystemExit) as info:
        check_overrides(["train.py", *overrides], CONF_DIR)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("Configuration error:") and message in err
