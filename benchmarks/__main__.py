"""``python -m benchmarks``: run every CPU benchmark (see :mod:`benchmarks.run_all`)."""

from benchmarks.run_all import main

raise SystemExit(main())
