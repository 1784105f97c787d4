#!/usr/bin/env bash
# Rehearses experiments/gpu/run.sh on this machine's CPU under the lent machines' software, so that a lent session's
# minutes go to measuring rather than to an import or an API that fails there: Python 3.12 with torch 2.11.0, Triton
# 3.6.0 and the other versions the device tool's KINDS.md lists for their image, the wheels prepare.sh made installed
# as run.sh installs them. Both calls of run.sh's header run as dry runs (--device cpu: small workloads, the CUDA tests
# skipped), the first with fast-plaid on a small workload so that the peers' code and the matched-recall table run
# too. The virtual environment is made once (torch 2.11's PyPI build with its CUDA libraries: about 5 GiB, a few
# minutes); the dry runs took about 1 and 5 minutes on 2 cores. Each call's report lands in $OUT/first and
# $OUT/second; run.sh installs the wheels into /tmp/site, as it does there.
#   bash experiments/gpu/prepare.sh && bash experiments/gpu/rehearse.sh [VENV]      (default /tmp/gpu-rehearsal)
# (PYTHON312: the Python 3.12 that makes the environment, python3.12 unless set; under pyenv, for example,
# PYTHON312=$(pyenv root)/versions/3.12.1/bin/python)
set -euo pipefail
cd "$(dirname "$0")/../.."
venv="${1:-/tmp/gpu-rehearsal}"
out="${OUT:-/tmp/gpu-rehearsal-out}"
[ -d .whl/core ] || { echo "no .whl/core: run experiments/gpu/prepare.sh first" >&2; exit 1; }
if [ ! -x "$venv/bin/python3" ]; then
  "${PYTHON312:-python3.12}" -m venv "$venv"
  "$venv/bin/python3" -m pip install -q torch==2.11.0 triton==3.6.0 numpy==2.5.2 transformers==5.17.0 \
    sentence-transformers==6.0.1 tokenizers==0.23.2 safetensors==0.8.0 huggingface_hub==1.33.0 pandas scipy \
    scikit-learn statsmodels matplotlib tabulate tqdm pytest requests joblib pyyaml jinja2 pyarrow psutil wrapt lxml \
    filelock packaging typing-extensions
fi
export PATH="$venv/bin:$PATH"
rm -rf /tmp/site "$out" && mkdir -p "$out"
OUT="$out/first" TESTS_LIMIT=600 BENCH_LIMIT=900 bash experiments/gpu/run.sh --device cpu --repeats 1 --peers \
  --peer-workloads clustered-2k --approximate --approximate-candidates 64 256 --workloads ragged-1k clustered-2k
OUT="$out/second" GPU_TESTS=0 BENCH_LIMIT=900 bash experiments/gpu/run.sh --device cpu --repeats 1 \
  --workloads minilm-scifact
summary=$(tail -1 "$out/first/tests.log") && echo "$summary"
[[ $summary == *passed* && $summary != *failed* && $summary != *error* ]] \
  || { echo "run.sh's tests did not pass on the CPU" >&2; exit 1; }
for call in first second; do
  grep -q "s in all" "$out/$call/bench.log" || { echo "the $call call's benchmark did not finish" >&2; exit 1; }
  tail -1 "$out/$call/bench.log"
done
