"""The catalogue of bad inputs and faults, run as tests and rendered as docs/bad-inputs.md."""
