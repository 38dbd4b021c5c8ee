"""The MST toolbox's own train.py for a fixed wall-clock budget (on the GPU machine):

    python benchmarks/gpu_zoo/toolbox_train.py <train_code> <seconds> <out_dir> -- <train.py's own arguments>

Runs train.py's module code unchanged (its options, data loading, model, optimizer, scheduler, train() and test()
functions) and replaces only its main(): epochs of train() then test() until ``seconds`` have passed since the
first epoch began (checked after each epoch, as Lightning's max_time counts training and validation). Writes
<out_dir>/curve.json ([elapsed s, iterations, the toolbox's own test PSNR]) and <out_dir>/final.pth (the weights
at the end).
"""
import json
import os
import runpy
import sys
import time
from pathlib import Path

import torch

code, seconds, out = Path(sys.argv[1]).resolve(), float(sys.argv[2]), Path(sys.argv[3]).resolve()
args = sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else []
out.mkdir(parents=True, exist_ok=True)
if not torch.cuda.is_available():  # a dry run on a CPU: the toolbox's .cuda() calls become no-ops
    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.nn.Module.cuda = lambda self, *a, **k: self
    torch.cuda.is_available = lambda: True
os.chdir(code)
sys.path.insert(0, str(code))
sys.argv = [str(code / "train.py"), *args, "--outf", str(out) + "/"]
g = runpy.run_path(str(code / "train.py"), run_name="toolbox_train")  # everything but main()
opt, logger = g["opt"], g["gen_log"](str(out))
steps_per_epoch = int(opt.epoch_sam_num // opt.batch_size)
curve, epoch, t0 = [], 0, time.perf_counter()
while time.perf_counter() - t0 < seconds:
    epoch += 1
    g["train"](epoch, logger)
    psnr = float(g["test"](epoch, logger)[4])
    g["scheduler"].step()
    curve.append([time.perf_counter() - t0, epoch * steps_per_epoch, psnr])
    (out / "curve.json").write_text(json.dumps(curve))
torch.save(g["model"].state_dict(), out / "final.pth")
print(f"toolbox: {epoch} epochs, {epoch * steps_per_epoch} iterations in {time.perf_counter() - t0:.1f} s")
