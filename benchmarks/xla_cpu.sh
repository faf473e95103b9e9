#!/usr/bin/env bash
# The TPU path (trainer=xla) run once on the CPU through XLA (PJRT_DEVICE=CPU), in an environment of its own
# (torch_xla's newest release is built for torch 2.9, not the 2.13 the project pins), and its loss compared with
# the same job on the plain CPU. Not part of CI. Usage: bash benchmarks/xla_cpu.sh [work dir]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK="${1:-/tmp/nas-xla}"
mkdir -p "$WORK"
if [ ! -x "$WORK/venv/bin/python" ]; then
  python3 -m venv "$WORK/venv"
  "$WORK/venv/bin/pip" install -q "torch==2.9.0" "torch_xla==2.9.0"
  "$WORK/venv/bin/pip" install -q -e "$ROOT"
fi
. "$WORK/venv/bin/activate"
python -c "import torch, torch_xla; print('torch', torch.__version__, 'torch_xla', torch_xla.__version__)"
# training only: XLA compiles a program per tensor shape, and greedy decoding (validation, test) has a new shape at
# every step, which on XLA's CPU device took longer than 15 minutes for the first validation of this tiny job
COMMON=(debug=fast progress_bar=false logger=csv trainer.max_steps=20 trainer.limit_val_batches=0 run_test=false
        trainer.log_every_n_steps=1 threads=1 seed=1 trainer.precision=32-true diagnostics.enabled=false
        model.dropout=0.0)  # dropout masks come from the XLA device's own generator: without it the steps compare
cd "$WORK"
rm -rf xla cpu
# Lightning's XLAAccelerator counts TPU devices only (lightning_fabric: tpu.num_available_devices()), so on a machine
# without a TPU it refuses trainer=xla before anything runs ("XLAAccelerator can not run on your system"). To run the
# rest of Lightning's XLA path (XLA strategy, device placement, the XLA optimizer step) on XLA's CPU device, this
# check makes the accelerator count PJRT's devices instead; nothing else is changed.
cat > run_xla.py <<'PY'
import sys

import torch_xla.runtime as xr
from lightning_fabric.accelerators import xla as fabric_xla


def count() -> int:
    return xr.global_runtime_device_count()


for cls in {fabric_xla.XLAAccelerator, *fabric_xla.XLAAccelerator.__subclasses__()}:
    cls.auto_device_count = staticmethod(count)
    cls.is_available = staticmethod(lambda: count() > 0)
import pytorch_lightning.accelerators.xla as pl_xla  # noqa: E402
for cls in (pl_xla.XLAAccelerator,):
    cls.auto_device_count = staticmethod(count)
    cls.is_available = staticmethod(lambda: count() > 0)
from nas_cli.commands.nas_run import main  # noqa: E402

sys.argv = ["nas-run", *sys.argv[1:]]
main()
PY
PJRT_DEVICE=CPU python run_xla.py "${COMMON[@]}" trainer=xla trainer.devices=1 hydra.run.dir=xla > xla.log 2>&1 \
  || { tail -30 xla.log; exit 1; }
nas-run "${COMMON[@]}" trainer=cpu hydra.run.dir=cpu > cpu.log 2>&1 || { tail -30 cpu.log; exit 1; }
python - <<'PY'
import csv, glob
def losses(d):
    rows = list(csv.DictReader(open(glob.glob(f"{d}/csv/**/metrics.csv", recursive=True)[0])))
    return {int(r["step"]): float(r["train/loss"]) for r in rows if r.get("train/loss")}
x, c = losses("xla"), losses("cpu")
steps = sorted(set(x) & set(c))
for s in steps:
    print(f"step {s:3d}: train/loss xla {x[s]:.6f}  cpu {c[s]:.6f}  diff {x[s] - c[s]:+.2e}")
print("largest |difference|:", max(abs(x[s] - c[s]) for s in steps), "over", len(steps), "steps")
PY
