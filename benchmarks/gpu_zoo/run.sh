#!/usr/bin/env bash
# Issue 33's GPU check, one script (about 9 minutes on an H100): the zoo's speed table on the GPU (fp32 and bf16,
# forward and training step, cassi against the MST toolbox's code in one process), then DAUHST-2stg trained for
# the same wall-clock seconds by cassi's scripts/train.py and by the toolbox's train.py on the same CAVE crops,
# both final models scored by one evaluator on the same validation crops.
# Prepared here (the GPU machine sees neither ../shared nor PyPI; .gpu/ is git-ignored and carried):
#   .gpu/site.zip hydra, omegaconf, antlr4 zipped from .venv (as benchmarks/gpu_fit/setup.sh says)
#   .gpu/mst      the toolbox's simulation/train_code (github:caiyuanhao1998/MST)
#   .gpu/cave28.npz, .gpu/mask_256.mat   python benchmarks/gpu_zoo/pack_cave.py ../shared/data/cave_train ...
# Run:  bash benchmarks/gpu_zoo/run.sh [seconds of training each, default 150]   (results in $OUT or ./gpu_out)
set -u
SECONDS_EACH=${1:-150}
MAX_TIME=$(printf "00:00:%02d:%02d" $((SECONDS_EACH / 60)) $((SECONDS_EACH % 60)))  # Lightning's DD:HH:MM:SS
OUT=${OUT:-$PWD/gpu_out}; mkdir -p "$OUT"
R=${GPU_ZOO_ROOT:-/tmp/gpu_zoo}; rm -rf "$R"; mkdir -p "$R"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.gpu/site.zip:$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-python3}
TB=$PWD/.gpu/mst/train_code
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/log.txt"; }
{ nvidia-smi -L; $PY -c "import torch, lightning; print('torch', torch.__version__, 'lightning', lightning.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')"; } 2>&1 | tee -a "$OUT/log.txt"

log "1. speed table"
timeout ${SPEED_TIMEOUT:-240} $PY scripts/benchmark_zoo.py toolbox=$TB device=${DEVICE:-cuda} threads=[8] \
  precisions=[fp32,bf16] repeats=${REPEATS:-20} ${SPEED_ARGS:-} output_dir=$R/speed hydra.run.dir=$R/speed \
  hydra.output_subdir=null 2>&1 | grep -v Warning | tail -30 | tee -a "$OUT/log.txt"
cp $R/speed/benchmark_zoo.json "$OUT/speed.json" 2>/dev/null; cp $R/speed/benchmark_zoo.md "$OUT/speed.md" 2>/dev/null

log "2. data"
$PY benchmarks/gpu_zoo/prepare.py .gpu/cave28.npz .gpu/mask_256.mat $R 2>&1 | tee -a "$OUT/log.txt"

log "3. cassi: scripts/train.py experiment=toolbox model=dauhst_2stg for $SECONDS_EACH s"
timeout $((SECONDS_EACH + 150)) $PY scripts/train.py experiment=toolbox model=dauhst_2stg paths.data_dir=$R/data \
  data.num_workers=0 data.train.cache=true data.train.samples_per_epoch=500 trainer.max_time=$MAX_TIME \
  trainer.accelerator=${ACCEL:-gpu} logger=csv callbacks.progress=null test=false data.test=null ${CASSI_ARGS:-} \
  hydra.run.dir=$R/cassi > $R/cassi.log 2>&1
echo "exit $?" >> $R/cassi.log; tail -15 $R/cassi.log | tee -a "$OUT/log.txt"
cp $R/cassi/logs/version_0/metrics.csv "$OUT/cassi_metrics.csv" 2>/dev/null

log "4. toolbox: train.py --method dauhst_2stg for $SECONDS_EACH s"
timeout $((SECONDS_EACH + 150)) $PY benchmarks/gpu_zoo/toolbox_train.py $TB $SECONDS_EACH $R/tb_out -- \
  --template dauhst_2stg --method dauhst_2stg --data_root $R/tb --epoch_sam_num 500 --batch_size 5 ${TB_ARGS:-} \
  > $R/tb.log 2>&1
echo "exit $?" >> $R/tb.log; grep -v "is loaded" $R/tb.log | tail -12 | tee -a "$OUT/log.txt"
cp $R/tb_out/curve.json "$OUT/toolbox_curve.json" 2>/dev/null

log "5. one evaluator"
$PY benchmarks/gpu_zoo/evaluate.py $R/cassi/checkpoints/last.ckpt $R/tb_out/final.pth dauhst_2stg $R "$OUT/eval.json" \
  2>&1 | tail -5 | tee -a "$OUT/log.txt"
log done
