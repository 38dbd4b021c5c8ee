#!/usr/bin/env bash
# fit_camera.py on one GPU in one call (machine=gpu: the pool's GAP-TV 32 scenes at a time, batch 32), the command a
# user runs; the device tests first. Prepared here (the GPU machine sees neither ../shared nor PyPI; .gpu/ is
# git-ignored and carried):
#   .gpu/site.zip      hydra, omegaconf, antlr4 from .venv (pure Python): cd .venv/lib/python3.*/site-packages && python -m zipfile -c <repo>/.gpu/site.zip hydra omegaconf antlr4
#   .gpu/shared.npz    python benchmarks/gpu_fit/pack_shared.py pack ../shared/data .gpu/shared.npz
# Run:  FIT="camera=tsa_simulation budget_hours=0.13 pool=768" bash benchmarks/gpu_fit/fit.sh
# Back in $OUT (or ./gpu_out): log.txt, fit.log (fit_camera's own output), model.ckpt and card.md (the fit's), plan.json,
# each stage's validation metrics and the last stage's best checkpoint as weights only (to score again on the exact scenes: the
# training scenes there are rounded to 8 bits, pack_shared.py)
set -u
T0=$(date +%s)
OUT=${OUT:-$PWD/gpu_out}; mkdir -p "$OUT"
R=${GPU_FIT_ROOT:-/tmp/gpu_fit}; rm -rf "$R"; mkdir -p "$R"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.gpu/site.zip:$PWD${PYTHONPATH:+:$PYTHONPATH} CASSI_SHARED_DATA=$R/shared
PY=${PYTHON:-python3}
log() { echo "[$(date +%T) +$(($(date +%s) - T0))s] $*" | tee -a "$OUT/log.txt"; }
{ nvidia-smi -L; $PY -c "import torch, lightning; print('torch', torch.__version__, 'lightning', lightning.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')"; } 2>&1 | tee -a "$OUT/log.txt"
$PY benchmarks/gpu_fit/pack_shared.py unpack .gpu/shared.npz "$R/shared" 2>&1 | tee -a "$OUT/log.txt"
log "device tests"
timeout ${TESTS_S:-60} $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_refine.py 2>&1 | tail -4 | tee -a "$OUT/log.txt"
log "fit_camera.py machine=gpu ${FIT:-} ${ARGS:-}"
FIT_S=${FIT_S:-$((530 - $(date +%s) + T0))}  # what is left of the call's 600 s, less the copies
set -f  # FIT and ARGS split into overrides, their [..] not globbed
timeout "$FIT_S" $PY scripts/fit_camera.py machine=gpu ${FIT:-} "output_dir=$R/fit" ${ARGS:-} > "$OUT/fit.log" 2>&1
RC=$?; set +f
log "fit_camera exit $RC"
grep -hE "first iterates: [0-9]+/|best val" "$R"/fit/stage*/console.log | tee -a "$OUT/log.txt"
cp "$R/fit/model.ckpt" "$R/fit/card.md" "$R/fit/plan.json" "$OUT/" 2>/dev/null
for s in stage1 stage2; do cp "$R/fit/$s/logs/version_0/metrics.csv" "$OUT/$s.metrics.csv" 2>/dev/null; done
for s in stage2 stage1; do  # 8 files come back: the last stage's best, as weights only
  BEST=$(ls -t "$R/fit/$s"/checkpoints/best-*.ckpt 2>/dev/null | head -1)
  [ -n "$BEST" ] && $PY -c "import sys; from cassi.models.checkpoint import export_weights as e; e(sys.argv[1], sys.argv[2])" \
    "$BEST" "$OUT/$s.ckpt" && log "$s: best $(basename "$BEST") -> $s.ckpt" && break
done
log done
