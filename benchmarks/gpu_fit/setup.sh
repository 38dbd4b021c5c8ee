# Sourced by run.sh and fit.sh: what both do first on the GPU machine, which sees neither ../shared nor PyPI.
# Prepared here (.gpu/ is git-ignored; carry it):
#   .gpu/site.zip    hydra, omegaconf, antlr4 from .venv, whole but without __pycache__ (pure Python, imported from
#                    the zip; 0.4 MB, the data and the tracked tree leave about 1 MiB of the 64 carried)
#   .gpu/shared.npz  python benchmarks/gpu_fit/pack_shared.py pack ../shared/data .gpu/shared.npz
# Sets T0, OUT (results: $OUT or ./gpu_out), R (a scratch root), PY, log(); prints the device; unpacks the data into
# $R/shared (CASSI_SHARED_DATA).
set -u
T0=$(date +%s)
OUT=${OUT:-$PWD/gpu_out}; mkdir -p "$OUT"
R=${GPU_FIT_ROOT:-/tmp/gpu_fit}; rm -rf "$R"; mkdir -p "$R"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.gpu/site.zip:$PWD${PYTHONPATH:+:$PYTHONPATH} CASSI_SHARED_DATA=$R/shared
PY=${PYTHON:-python3}
log() { echo "[$(date +%T) +$(($(date +%s) - T0))s] $*" | tee -a "$OUT/log.txt"; }
{ nvidia-smi -L; $PY -c "import torch, lightning; print('torch', torch.__version__, 'lightning', lightning.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')"; } 2>&1 | tee -a "$OUT/log.txt"
log "data"
$PY benchmarks/gpu_fit/pack_shared.py unpack .gpu/shared.npz "$R/shared" 2>&1 | tee -a "$OUT/log.txt"
