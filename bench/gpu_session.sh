#!/usr/bin/env bash
# The H200 runs recorded in bench/results/, one step per call (each fits a 10-minute command).
#
#   bench/gpu_session.sh install DIR   # wheels in DIR (*.whl): jax 0.12 (+ plugins) into /tmp/site12,
#                                      # everything else (egglog, highspy, ...) into /tmp/site
#   bench/gpu_session.sh bench         # every suite, large sizes, float32 and bfloat16 (the image's jax)
#   bench/gpu_session.sh schedule      # the scheduler cases with jax 0.12 + thunky
#   bench/gpu_session.sh costcheck     # cost-model check (built-in profile), calibrate, check again
#   bench/gpu_session.sh focus         # the hoisting cases (issue 10) and the slowest of issue 4,
#                                      # jax 0.12, float32 and bfloat16, 9 samples per variant
#   bench/gpu_session.sh modes         # XLA's command-buffer settings on jax.jit and hand programs
#                                      # (bench/xla_options_h200.py), then jaxrw's hoisted calls
#   bench/gpu_session.sh variance      # separate compilations of one program, with and without
#                                      # XLA's autotuning (bench/compile_variance_h200.py), jax 0.12
#   bench/gpu_session.sh aa            # the kept programs left unresolved against 0.98x: copies,
#                                      # the same executable twice (A/A), jax.jit and optimize(),
#                                      # 31 rounds, both dtypes; then with one autotune cache, jax 0.12
#   bench/gpu_session.sh transpose     # the cases Profile.transpose_folded decides, with it off and on
#   bench/gpu_session.sh chains        # the cases Profile.concat_chains decides, with it off and on
#   bench/gpu_session.sh fusedshare    # the cases Profile.fused_share=0.1 decides, at 0.5 and 0.1
#   bench/gpu_session.sh batching      # experts and small_decoders batched, vs jax.jit and hand
#   bench/gpu_session.sh iterations    # the cases 48 saturation iterations change, at 12 and at 48
#   bench/gpu_session.sh thunkycost    # a thunky call's cost per input and per view, jax 0.12
#   bench/gpu_session.sh pick          # auto's thunky pick taken apart (bench/thunky_pick_h200.py:
#                                      # auto, streams, streams with constants bound), then the
#                                      # GPU-only tests of jaxrw.schedule, jax 0.12
#
# Set JAXRW_COMMIT to the commit the tree was copied from: the device's copy of .git can be stale,
# and the JSON records it as the run's commit.
# Results go to $OUT (default bench/out). The image's jax (0.11.2 on the H200 here) serves bench and
# costcheck; schedule needs jax >= 0.12 for jax.experimental.thunky.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
base_path="/tmp/site:$PWD"
# profile_ab FIELD=VALUE CASES SUITE STAMP [ARGS]: CASES under the built-in h200 profile and under
# one with Profile.FIELD set to VALUE (True, False or a number; saved to a fresh cache directory,
# which jaxrw then loads). PROFILES="builtin" or "FIELD=VALUE" runs one half.
profile_ab() {
  local setting=$1 cases=$2 suite=$3 stamp=$4
  shift 4
  export PYTHONPATH=/tmp/site12:$base_path
  for profile in ${PROFILES:-builtin $setting}; do
    local cache
    cache=$(mktemp -d)
    if [ "$profile" = "$setting" ]; then
      JAXRW_CACHE_DIR=$cache "${PYTHON:-python3}" -c "import dataclasses; from jaxrw.rewrite import profiles as p; \
p.save_profile(dataclasses.replace(p.H200, $setting))"
    fi
    JAXRW_CACHE_DIR=$cache OUT=$OUT REPEATS=${REPEATS:-11} BUDGET=0 STAMP=$stamp-${profile//=/-} \
      bash bench/run_h200.sh --suite "$suite" --case "$cases" "$@"
  done
}

case "${1:-}" in
  install)
    dir=${2:?wheel directory}
    mkdir -p /tmp/site /tmp/site12
    pip_in() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$@"; }
    pip_in /tmp/site $(ls "$dir"/*.whl | grep -v '/jax') && pip_in /tmp/site12 "$dir"/jax*.whl
    PYTHONPATH=$base_path python3 -c "import jax, egglog, highspy; print('jax', jax.__version__, jax.devices()[0])"
    PYTHONPATH=/tmp/site12:$base_path python3 -c "import jax; from jax.experimental import thunky; print('jax', jax.__version__, 'thunky ok')"
    ;;
  bench)
    PYTHONPATH=$base_path OUT=$OUT BUDGET=${BUDGET:-140} bash bench/run_h200.sh "${@:2}"
    ;;
  schedule)
    PYTHONPATH=/tmp/site12:$base_path OUT=$OUT python3 bench/schedule_h200.py "${@:2}"
    ;;
  costcheck)
    export PYTHONPATH=$base_path JAXRW_CACHE_DIR=/tmp/jaxrw-cache
    python3 -m jaxrw.bench.costcheck --size large --profile h200 --json "$OUT/costcheck-h200-builtin.json" \
      > "$OUT/costcheck-builtin.txt" 2>&1; tail -1 "$OUT/costcheck-builtin.txt"
    python3 -m jaxrw.cli calibrate --output "$JAXRW_CACHE_DIR/profile-cuda.json"
    cp "$JAXRW_CACHE_DIR/profile-cuda.json" "$OUT/profile-h200-calibrated.json"
    python3 -m jaxrw.bench.costcheck --size large --json "$OUT/costcheck-h200-calibrated.json" \
      > "$OUT/costcheck-calibrated.txt" 2>&1; tail -1 "$OUT/costcheck-calibrated.txt"
    ;;
  focus)
    cases=nasrnn_args,nasrnn_args_hoist,nasrnn_const,llama288,llama288_hoist,llama4096_hoist,stacked_matvec_16,per_head_proj
    PYTHONPATH=/tmp/site12:$base_path OUT=$OUT REPEATS=9 BUDGET=0 STAMP=${STAMP:-focus} \
      bash bench/run_h200.sh --suite all --case "$cases" "${@:2}"
    PYTHONPATH=/tmp/site12:$base_path python3 bench/hoist_h200.py --json "$OUT/h200-${STAMP:-focus}-hoist-diag.json"
    ;;
  modes)
    export PYTHONPATH=$base_path
    python3 bench/xla_options_h200.py --json "$OUT/h200-${STAMP:-modes}-xla-options.json" "${@:2}"
    python3 bench/hoist_h200.py --case llama288_hoist nasrnn_args_hoist --calls 100 --repeats 5 \
      --json "$OUT/h200-${STAMP:-modes}-hoist-diag.json"
    ;;
  variance)
    export PYTHONPATH=/tmp/site12:$base_path
    cases="experts_mixed_8 qkv_args_decode multibranch_cell experts_mixed_64"
    python3 bench/compile_variance_h200.py --case $cases --json "$OUT/h200-${STAMP:-v}-variance-bf16.json"
    XLA_FLAGS=--xla_gpu_autotune_level=0 python3 bench/compile_variance_h200.py --case $cases \
      --json "$OUT/h200-${STAMP:-v}-variance-bf16-noautotune.json"
    python3 bench/compile_variance_h200.py --case $cases --dtype float32 --json "$OUT/h200-${STAMP:-v}-variance-f32.json"
    ;;
  aa)
    export PYTHONPATH=/tmp/site12:$base_path
    cases=${CASES:-qkv_args_decode per_head_proj experts_mixed_64 experts_mixed_32 multibranch_cell}
    for dtype in float32 bfloat16; do
      python3 bench/compile_variance_h200.py --case $cases --dtype $dtype --copies 3 --repeats 31 \
        --json "$OUT/h200-${STAMP:-aa}-aa-$dtype.json"
    done
    # every compilation after the first reads the first's GEMM autotuning from one cache directory
    XLA_FLAGS=--xla_gpu_per_fusion_autotune_cache_dir=$(mktemp -d) python3 bench/compile_variance_h200.py \
      --case $cases --dtype bfloat16 --copies 3 --repeats 31 --no-optimize --json "$OUT/h200-${STAMP:-aa}-aa-bfloat16-atcache.json"
    ;;
  transpose)
    # Profile.transpose_folded: the four cases whose float32 decision it changes with the h200
    # profile, under the built-in profile (off) and under one with it on (bench/HISTORY.md,
    # twelfth lease), both dtypes. PROFILES="builtin" or "transpose_folded=True" runs one half (~4 min).
    profile_ab transpose_folded=True llama288,llama4096,llama4096_hoist,gpt_train_step models "${STAMP:-t}" "${@:2}"
    ;;
  chains)
    # Profile.concat_chains: the seven cases whose large-size decisions it changes with the h200
    # profile (bench/HISTORY.md, sixteenth session), under the built-in profile (on since the
    # seventeenth lease) and with it off, both dtypes. PROFILES="builtin" or "concat_chains=False"
    # runs one half (~4 min).
    profile_ab concat_chains=False \
      experts_equal,experts_packed,llama288,multibranch_cell,nasrnn_args,small_decoders,stacked_matvec_16 \
      all "${STAMP:-c}" "${@:2}"
    ;;
  fusedshare)
    # Profile.fused_share 0.5 (built-in) against 0.1: the four decisions it changes on this
    # project's CPU (ew_factor, gpt_train_step; bench/HISTORY.md, "A win jaxrw leaves") and a few it
    # should leave, both dtypes. PROFILES="builtin" or "fused_share=0.1" runs one half.
    profile_ab fused_share=0.1 ew_factor,gpt_train_step,llama288,nasrnn_args,experts_equal \
      all "${STAMP:-fs}" "${@:2}"
    ;;
  batching)
    # experts_equal, experts_packed and small_decoders rewritten at the default 12 iterations (more
    # with --iterations 12 48), concat_chains off and on, schedule="xla" (bench/batching_h200.py;
    # bench/HISTORY.md, "A win jaxrw leaves"), jax 0.12
    export PYTHONPATH=/tmp/site12:$base_path
    for dtype in ${DTYPES:-bfloat16 float32}; do
      python3 bench/batching_h200.py --dtype "$dtype" --json "$OUT/h200-${STAMP:-bt}-batching-$dtype.json" "${@:2}"
    done
    ;;
  iterations)
    # the eight cases whose decisions or optimization time 48 iterations change, predicted on a CPU
    # (bench/decisions_cpu.py; bench/results/cpu-2026-12-04-iterations-decisions.json), run at 12
    # (the default) and at 48, both dtypes. ITERATIONS=12 or 48 runs one half (~6 min each).
    cases=experts_equal,experts_packed,per_head_proj,nasrnn_args,nasrnn_const,nasrnn_args_hoist,small_decoders,stacked_matvec_16
    for it in ${ITERATIONS:-12 48}; do
      PYTHONPATH=/tmp/site12:$base_path OUT=$OUT REPEATS=${REPEATS:-11} BUDGET=0 STAMP=${STAMP:-it}-$it \
        bash bench/run_h200.sh --suite all --case "$cases" --iterations "$it" "${@:2}"
    done
    ;;
  thunkycost)
    # what a thunky call costs per input, per view and in all (bench/thunky_cost_h200.py), jax 0.12
    PYTHONPATH=/tmp/site12:$base_path python3 bench/thunky_cost_h200.py \
      --json "$OUT/h200-${STAMP:-tc}-thunky-cost.json" "${@:2}"
    ;;
  pick)
    export PYTHONPATH=/tmp/site12:$base_path
    # auto as the benchmark runs it; the thunky program forced, its constants embedded in the
    # regions' code (emit.py's default) and passed as packed buffers
    for variant in auto "streams" "streams --bind 65536"; do
      python3 bench/thunky_pick_h200.py --case ${CASES:-experts_equal} --dtype ${DTYPE:-bfloat16} \
        --schedule $variant --json "$OUT/h200-${STAMP:-p}-thunky-pick-${variant// --bind 65536/-bind}.json" "${@:2}"
    done
    python3 -m pytest -q -p no:cacheprovider tests/schedule -m gpu
    ;;
  *) echo "usage: bench/gpu_session.sh install DIR | bench | schedule | costcheck | focus | modes | variance | transpose | chains | fusedshare | batching | iterations | thunkycost | pick" >&2; exit 2 ;;
esac
