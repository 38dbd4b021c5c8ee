#!/usr/bin/env bash
# cave_any trained further on one GPU, in one call (about 9 minutes): the fit_camera recipe for camera=many, its U-Net
# (stage 1), then a second one grown on it and both trained together on the same GAP-TV pool, at a larger batch.
# The shipped two-U-Net pretrained/cave_any came from this script: run on the one-U-Net cave_any of then, then with
# S2=0 ARGS="model.stages=2 data.train.stages=1" (both U-Nets together from the start) on that model (its card).
# Prepared here: .gpu/ as benchmarks/gpu_fit/setup.sh says.
# Run:  bash benchmarks/gpu_fit/run.sh   (env: S1 stage 1's seconds, END the whole run's, S2 a cap on stage 2's,
#       POOL scenes, B batch, ACCEL, INIT stage 1's start: default pretrained/cave_any, its first U-Net; TESTS_S the
#       device tests' seconds, 0 for none;
#       results in $OUT or ./gpu_out: each stage's best as weights only, metrics, logs)
S1=${S1:-150}; END=${END:-520}; POOL=${POOL:-768}; B=${B:-32}; ACCEL=${ACCEL:-gpu}; INIT=${INIT:-pretrained/cave_any}; TESTS_S=${TESTS_S:-60}
source "$(dirname "$0")/setup.sh"
hms() { printf "00:00:%02d:%02d" $(($1 / 60)) $(($1 % 60)); }  # Lightning's DD:HH:MM:SS

COMMON=(experiment=cave_tsa model.mask_input=true camera=many "data.train.cubes.samples_per_epoch=$POOL"
  data.train.cubes.spectral_shift=10 data.train.cubes.spectral_stretch=0.05 test=false data.test=null callbacks.progress=null
  model.project=false trainer.max_steps=-1 "trainer.accelerator=$ACCEL" "data.batch_size=$B"
  "data.train.samples_per_epoch=$((1024 * B))" "data.num_workers=${WORKERS:-6}" ${ARGS:-})
stage() {  # name seconds overrides...
  local name=$1 secs=$2; shift 2
  log "$name: training for $secs s"
  timeout $((secs + 200)) $PY scripts/train.py "${COMMON[@]}" "$@" "hydra.run.dir=$R/$name" "paths.output_dir=$R/$name" \
    "trainer.max_time=$(hms "$secs")" > "$R/$name.log" 2>&1
  log "$name: exit $?"
  grep -E "first iterates|Error|error|best val" "$R/$name.log" | tail -8 | tee -a "$OUT/log.txt"
  cp "$R/$name/logs/version_0/metrics.csv" "$OUT/$name.metrics.csv" 2>/dev/null
  tail -c 20000 "$R/$name.log" > "$OUT/$name.log"
  BEST=$(ls -t "$R/$name"/checkpoints/best-*.ckpt 2>/dev/null | head -1)
  [ -n "$BEST" ] && $PY -c "import sys; from cassi.models.checkpoint import export_weights as e; e(sys.argv[1], sys.argv[2])" \
    "$BEST" "$OUT/$name.ckpt" && log "$name: best $(basename "$BEST") -> $OUT/$name.ckpt"
}

stage stage1 "$S1" "init_weights=$INIT"
if [ -n "${BEST:-}" ]; then
  LEFT=$((END - ($(date +%s) - T0) - 50)); [ -n "${S2:-}" ] && [ "$S2" -lt "$LEFT" ] && LEFT=$S2
  [ "$LEFT" -ge 60 ] && stage stage2 "$LEFT" "init_weights=$BEST" model.stages=2 data.train.stages=1 "data.train.cache=$R/stage1/first_iterates.pt"
fi
log "3. tests on the device"
[ "$TESTS_S" = 0 ] || timeout "$TESTS_S" $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_refine.py 2>&1 | tail -4 | tee -a "$OUT/log.txt"
log done
