#!/usr/bin/env bash
# Build .gpu_site/ (git-ignored), the packages benchmarks/gpu/session.sh needs that the GPU
# image lacks (it has no network): deepspeed and its pydantic/hjson, datasets and its dill and
# multiprocess, plus a stand-in `datasets` used only if the carried one does not import there.
# Pure-Python packages are copied from this venv; the compiled ones are cp312 manylinux wheels.
#
#   bash benchmarks/gpu/site.sh          # here (venv built by the README's test command)
#   then: run(command="bash benchmarks/gpu/session.sh", carry=[".gpu_site"], timeout_s=360)
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.gpu_site/' .git/info/exclude 2>/dev/null || echo '/.gpu_site/' >> .git/info/exclude
SITE=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
rm -rf .gpu_site /tmp/gpu_site_wheels && mkdir -p .gpu_site/_stubs/datasets
for p in deepspeed hjson pydantic annotated_types typing_inspection datasets dill; do
    cp -r "$SITE/$p" "$SITE/$p"-*.dist-info .gpu_site/
done
cp -r "$SITE/typing_extensions.py" "$SITE"/typing_extensions-*.dist-info .gpu_site/
core=$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("pydantic-core"))')
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d /tmp/gpu_site_wheels "pydantic-core==$core" "multiprocess==0.70.19"
for w in /tmp/gpu_site_wheels/*.whl; do .venv/bin/python -m zipfile -e "$w" .gpu_site; done
cat > .gpu_site/_stubs/datasets/__init__.py <<'STUB'
"""Stand-in for `datasets` on the GPU host: only tests/test_documented_behaviour.py's module-level
import needs it; the CUDA-gated tests never use it."""

__version__ = "0.0.0-stub"


class Dataset:
    @classmethod
    def from_list(cls, *args, **kwargs):
        raise ImportError("datasets is a stub on this host")

    from_dict = from_list
STUB
du -sh .gpu_site
