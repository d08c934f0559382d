#!/usr/bin/env bash
# Call 2 (carry .dev1): join the ray wheel, install every staged wheel into /tmp/site.
set -euo pipefail
cp .dev1/* /tmp/w/
cat /tmp/w/ray.part-aa /tmp/w/ray.part-ab > /tmp/w/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl
rm /tmp/w/ray.part-*
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site /tmp/w/*.whl
PYTHONPATH=/tmp/site python3 -c 'import ray, optuna, aiohttp, pynvml; print("ray", ray.__version__, "optuna", optuna.__version__)'
tail -3 /tmp/build.log
