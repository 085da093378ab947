#!/usr/bin/env bash
# Every benchmark suite at the large (GPU) sizes, float32 then bfloat16, on one GPU; writes per
# dtype a JSON (every sample, the environment) and a PNG, plus one markdown summary, into $OUT.
#
#   bench/run_h200.sh                                # all suites, about 8 minutes on an H200
#   bench/run_h200.sh --suite algebra,merge,streams  # a split: any `jaxrw bench` option passes through
#   bench/run_h200.sh --suite models
#   DTYPES=bfloat16 bench/run_h200.sh --case 'llama*'
#
# Environment: PYTHON (python3), OUT (bench/out), DTYPES ("float32 bfloat16"), REPEATS (5 samples
# per variant), OPT_TIMEOUT (20 s of jaxrw optimization per case: past it jaxrw is not timed for
# that case; 20x the issue-9 target of 1 s per 1,000 equations), BUDGET (190 s per dtype: no case
# starts after it; skipped cases are listed in the table and the summary, split the run with
# --suite to get them).
# Needs the repository's Python dependencies (jax with CUDA, egglog, rich, matplotlib); nothing is
# downloaded. Exit status: 1 if any case failed (the others are still recorded), else 0.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-bench/out}
STAMP=${STAMP:-$(date -u +%Y%m%d-%H%M)}
mkdir -p "$OUT"

"$PY" -c 'import jax, jaxlib, egglog, rich, matplotlib; print("jax", jax.__version__, "| devices", jax.devices())' \
  || { echo "run_h200.sh: the Python dependencies are missing for $PY" >&2; exit 2; }

status=0
files=()
for dtype in ${DTYPES:-float32 bfloat16}; do
  base="$OUT/h200-$STAMP-$dtype"
  "$PY" -m jaxrw.cli bench --size large --dtype "$dtype" --repeats "${REPEATS:-5}" \
    --opt-timeout "${OPT_TIMEOUT:-20}" --budget "${BUDGET:-190}" \
    --json "$base.json" --plot "$base.png" "$@" || status=$?
  [ -f "$base.json" ] && files+=("$base.json")
done
if [ ${#files[@]} -gt 0 ]; then
  "$PY" -m jaxrw.bench.summarize "${files[@]}" > "$OUT/h200-$STAMP-summary.md"
  echo "wrote ${files[*]} (+ .png) and $OUT/h200-$STAMP-summary.md"
fi
exit $status
